"""A multi-node Ray cluster on this one machine, and a small sweep on it, as the sweep runs on a real cluster:
a head node without CPUs (it holds the sweep's driver and Tune, no training and no solving) and --workers
worker nodes of --cpus CPUs each, built as Ray's own tests build clusters (ray.cluster_utils.Cluster: separate
raylets, object stores and worker processes per node, one GCS on the head, token authentication). Then
`platform/sweep.py --address` against it, and the cluster is stopped: only the processes this script started,
also after Ctrl-C, SIGTERM or a failure (and, if this script is killed outright, by Ray's reaper process).

  python platform/cluster_demo.py [--workers 2] [--cpus 2] [--config tune_configs/cluster-demo.yaml] [--out results/cluster-demo] [--resume]

The nodes are named head, worker-1, worker-2, ...: the results record on which node each trial attempt ran
(attempts.parquet) and each solver task (the baselines' journals). docs/cluster.md says what a real cluster
needs and what survives the loss of a node.
"""

from __future__ import annotations

import os
import secrets
import shlex
import subprocess
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

from cli.output_folders import out_argument, resolve_out
from cli.scripts import positive_int, run_cli, script_parser
from plumbing.errors import InputError, Interrupted
from sweeps.results_dir import open_results
from sweeps.runner import RESUME_COMMAND, read_spec

ROOT = Path(__file__).resolve().parent.parent
NODE_MIB = 140
"""Memory of an idle worker node: its raylet, dashboard agent and runtime-env agent (3 processes), measured on
this project's development machine (2 CPU cores, no GPU) as 134 MiB of PSS for each of the 2 worker nodes of
`python tests/cluster_host.py 2 1` (the sum of /proc/PID/smaps_rollup's Pss over the raylet and its children)."""
PROCESS_MIB = 410
"""Memory of one busy CPU of a node: a Ray worker process that has imported what a trial or solver task imports,
measured as 405 MiB RSS (`python -c "import ray, torch, trainers.registry, solver_workers.pool"`, then
/proc/self/smaps_rollup), on the same machine."""
CORE_OVERSUBSCRIPTION = 2
"""The nodes' CPUs may add up to at most this many times the cores this process may use: the default demo (2
nodes of 2 CPUs on 2 cores) runs in 86 s (docs/cluster.md); far more CPUs than cores only make every process
wait for a core, and each node adds its own processes."""


def cluster_environment() -> dict[str, str]:
    """Token authentication for the cluster's processes and every client, set explicitly (without RAY_AUTH_MODE
    `ray start` and the cluster utilities turn it on or off depending on whether ~/.ray/auth_token exists); the
    token is this cluster's own, so no file is written."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": os.environ.get("RAY_AUTH_TOKEN") or secrets.token_hex(32)}


def machine_room() -> tuple[int, int]:
    """The cores this process may use and the memory available now (MemAvailable), in MiB."""
    available = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemAvailable:"))
    return len(os.sched_getaffinity(0)), available // 1024


def capacity_problem(workers: int, cpus: int, cores: int, available_mib: int) -> str | None:
    """Why a machine of `cores` cores and `available_mib` MiB of free memory cannot hold a head and `workers` worker
    nodes of `cpus` CPUs each, or None: their CPUs against the cores (CORE_OVERSUBSCRIPTION), their memory
    (NODE_MIB per node, PROCESS_MIB per CPU, each running a worker process) against the memory."""
    needed = NODE_MIB + workers * (NODE_MIB + cpus * PROCESS_MIB)
    asked = f"--workers {workers} --cpus {cpus}"
    if workers * cpus > CORE_OVERSUBSCRIPTION * cores:
        return (
            f"{asked}: {workers * cpus} CPUs in all, and this machine has {cores} cores: expected --workers x --cpus <= "
            f"{CORE_OVERSUBSCRIPTION} x {cores} = {CORE_OVERSUBSCRIPTION * cores} (every CPU of a node runs a worker process)"
        )
    if needed > available_mib:
        return (
            f"{asked}: the nodes need about {needed:,} MiB of memory (each node {NODE_MIB} MiB for its raylet and 2 agents, "
            f"each CPU {PROCESS_MIB} MiB for its worker process), and this machine has {available_mib:,} MiB available: "
            "give fewer or smaller worker nodes"
        )
    return None


def start_cluster(workers: int, cpus: int, log=print):
    """A head without CPUs and `workers` worker nodes of `cpus` CPUs each, on this machine's address (as a real
    cluster's nodes reach each other; token authentication keeps others out) with the dashboard's HTTP server (its
    pages, the jobs API and the state API) on a free loopback port; returns the ray.cluster_utils.Cluster (its `address`
    is the GCS address for --address, `node_names` maps node ids to names, `add_worker()` adds a worker node).
    The caller stops it with `cluster.shutdown()`. This process gets the cluster's authentication settings and
    its address (RAY_ADDRESS), and so do the processes it starts afterwards."""
    os.environ.update(cluster_environment())  # before Ray is imported (this module imports nothing that imports it): it reads the mode once
    from ray.cluster_utils import Cluster

    from ray_access.private import node_ip_address
    from ray_access.session import free_port

    # Ray Train's placement-group cleaner asks the state API whether its controller still lives, and frees the
    # workers' CPUs of a lost one only on an answer: the state API is the dashboard's HTTP server (without it a
    # retried trial waited for ever for a CPU that the lost controller's group held on the last node), and Ray's own
    # clients inside the cluster find it through RAY_ADDRESS, else the most recent Ray on the machine, which need not
    # be this one. So the dashboard runs, the head's port is chosen first and every node process inherits the address.
    port = free_port()
    os.environ["RAY_ADDRESS"] = f"{node_ip_address()}:{port}"
    log(f"starting a head node without CPUs and {workers} worker nodes of {cpus} CPU{'s' if cpus > 1 else ''} each")
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "node_name": "head",
            "gcs_server_port": port,
            "include_dashboard": True,
            "dashboard_host": "127.0.0.1",
            "dashboard_port": free_port(),
        },
    )
    cluster.node_names = {cluster.head_node.node_id: "head"}
    cluster.add_worker = lambda: add_worker(cluster, cpus, log)
    try:
        for _ in tqdm(range(workers), desc="starting worker nodes", unit="node"):
            cluster.add_worker()
        cluster.wait_for_nodes()
    except BaseException:
        cluster.shutdown()
        raise
    return cluster


def add_worker(cluster, cpus: int, log=print):
    """One more worker node of `cpus` CPUs, named worker-<k> (k counts every worker node started); returns its
    ray._private.node.Node."""
    name = f"worker-{len(cluster.node_names)}"
    node = cluster.add_node(num_cpus=cpus, node_name=name)
    cluster.node_names[node.node_id] = name
    log(f"  {name}: {cpus} CPU{'s' if cpus > 1 else ''}, node id {node.node_id[:8]}")
    return node


def say(text: str) -> None:
    """One console line, written above the progress bar while one is shown."""
    tqdm.write(text, file=sys.stdout)
    sys.stdout.flush()


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--workers", type=positive_int, default=2, help="worker nodes (default 2)")
    parser.add_argument("--cpus", type=positive_int, default=2, help="CPUs of each worker node (default 2; 1 works too)")
    parser.add_argument(
        "--config", default=str(ROOT / "tune_configs" / "cluster-demo.yaml"), help="sweep file (default tune_configs/cluster-demo.yaml)"
    )
    parser.add_argument("--out", type=out_argument, default="results/cluster-demo", help="results directory (default results/cluster-demo)")
    parser.add_argument("--resume", action="store_true", help="continue the sweep in --out")
    args = parser.parse_args()
    # everything that would refuse the run, before a node starts: the machine's room, --out, the sweep file and --out's sweep
    if problem := capacity_problem(args.workers, args.cpus, *machine_room()):
        raise InputError(problem)
    out = resolve_out(args.out, inputs={"--config": args.config})
    os.environ.update(cluster_environment())  # before read_spec imports Ray, which reads the mode once (start_cluster keeps it)
    _, data = read_spec(args.config)
    open_results(out.resolve(), data, args.resume)
    resume = shlex.join(
        ["python", "platform/cluster_demo.py", "--workers", str(args.workers), "--cpus", str(args.cpus), "--config", args.config]
        + ["--out", args.out, "--resume"]
    )
    start = time.monotonic()
    cluster = start_cluster(args.workers, args.cpus, say)
    sweep = None
    try:
        say(f"cluster up at {cluster.address} after {time.monotonic() - start:.0f} s; running the sweep on it")
        command = [sys.executable, str(ROOT / "platform" / "sweep.py"), "--config", args.config, "--out", str(out)]
        command += ["--address", cluster.address, *(["--resume"] if args.resume else [])]
        # the sweep's own Ctrl-C message would name this cluster's address, which is gone once this script stops it
        sweep = subprocess.Popen(command, env={**os.environ, RESUME_COMMAND: resume})
        code = sweep.wait()
    except KeyboardInterrupt:  # Ctrl-C reaches the sweep too (the terminal's process group): let it save its work
        if sweep is not None:
            try:
                sweep.wait(timeout=60)
            except subprocess.TimeoutExpired:
                sweep.kill()
                sweep.wait()
        say("stopping the cluster")
        cluster.shutdown()
        cluster = None
        if not (out / "sweep.json").exists():
            raise Interrupted(f"stopped the cluster before the sweep began; nothing was written to '{out}'") from None
        raise Interrupted(f"stopped the cluster; the sweep's results so far are kept in '{out}'; continue with: {resume}") from None
    finally:
        if cluster is not None:
            say("stopping the cluster")
            cluster.shutdown()
    if code != 0:
        sys.exit(code)
    say(
        f"results in {out}: trials.parquet, attempts.parquet (the node of every trial attempt), curves.parquet, baselines.parquet; "
        f"the solver journals under baselines/ ({time.monotonic() - start:.0f} s in all)"
    )


if __name__ == "__main__":
    run_cli(main)
