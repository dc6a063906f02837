"""The sweep on a multi-node Ray cluster on this machine (platform/cluster_demo.py: a head without CPUs and worker
nodes with their own raylets): where trials can be placed, the record of every trial attempt and its node, and
(slow) the loss of a worker node mid-run and of the head.

The slow tests start their cluster's node processes from the test process without connecting it to Ray (the
sweep runs in a subprocess with --address), and stop only those processes: the killed node's by their PIDs, the
rest with the cluster's shutdown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from cluster_host import below
from conftest import ROOT

from plumbing.errors import InputError
from run_results.records import write_parquet
from sweeps.results_dir import (
    ATTEMPTS_SCHEMA,
    LOST,
    attempts_path,
    end_attempt,
    read_results,
    start_attempt,
    trial_attempts,
    write_record,
    write_tables,
)
from sweeps.runner import placement_problem, trial_resources
from sweeps.spec import SweepSpec, Trial

HEAD = {"CPU": 0.0, "GPU": 0.0}


def spec(resources: dict, **changes) -> SweepSpec:
    return SweepSpec.from_dict(
        {
            "sizes": [1],
            "seeds": 1,
            "methods": ["hpo"],
            "resources": {"all": resources},
            "baselines": {"classical_best": False, "dp_optimal": False},
            **changes,
        }
    )


# ---- placement: what a cluster of given nodes can hold ------------------------------------------------


def test_a_trial_on_ray_train_holds_no_cpu_of_its_worker_and_tune_accepts_its_request():
    """On a 1-CPU node the trial's process and its 1-CPU Train worker both fit only if the process holds no CPU
    (it held 0.01, leaving 0.99: the worker never started). Tune refuses a request of nothing ({'cpu': 0});
    the trial's request is memory alone, which every node has."""
    from ray.tune.execution.placement_groups import resource_dict_to_pg_factory

    config = {"workers": 1, "cpus_per_worker": 1.0, "gpus_per_worker": 0.0}
    request = resource_dict_to_pg_factory(trial_resources(config))
    assert request.required_resources.get("CPU", 0.0) == 0.0 and request.required_resources["memory"] > 0
    assert 1.0 - request.required_resources.get("CPU", 0.0) >= config["cpus_per_worker"]
    with pytest.raises(ValueError, match="empty head"):
        resource_dict_to_pg_factory({"cpu": 0})
    # a trial that trains in its own process holds its learner's CPUs
    assert resource_dict_to_pg_factory(trial_resources({**config, "workers": 0, "cpus_per_worker": 2.0})).required_resources == {"CPU": 2.0}


@pytest.mark.parametrize(
    "nodes, resources, problem",
    [
        # a head without CPUs and two 1-CPU workers: one Train worker of 1 CPU fits, on either node
        ([HEAD, {"CPU": 1.0}, {"CPU": 1.0}], {"workers": 1, "cpus_per_worker": 1}, None),
        # two workers of 1 CPU spread over the two nodes; three do not fit
        ([HEAD, {"CPU": 1.0}, {"CPU": 1.0}], {"workers": 2, "cpus_per_worker": 1}, None),
        (
            [HEAD, {"CPU": 1.0}, {"CPU": 1.0}],
            {"workers": 3, "cpus_per_worker": 1},
            "a hpo trial trains on 3 Ray Train workers of 1 CPU and 0 GPU on one node each; the cluster's 3 nodes: 1 with 0 CPU and 0 GPU, "
            "2 with 1 CPU and 0 GPU, room for 2",
        ),
        # 1.5 CPUs on each of two nodes: 3 CPUs in all, but room for one 1-CPU worker per node, and for no 2-CPU worker
        ([{"CPU": 1.5}, {"CPU": 1.5}], {"workers": 3, "cpus_per_worker": 1}, "room for 2"),
        ([{"CPU": 1.5}, {"CPU": 1.5}], {"workers": 1, "cpus_per_worker": 2}, "room for 0"),
        # no CPUs besides the head's none
        ([HEAD], {"workers": 1, "cpus_per_worker": 1}, "the cluster's 1 node: 1 with 0 CPU and 0 GPU, room for 0"),
        # a trial that trains in its own process needs its CPUs on one node
        ([HEAD, {"CPU": 1.0}], {"workers": 0, "cpus_per_worker": 1}, None),
        (
            [HEAD, {"CPU": 1.0}, {"CPU": 1.0}],
            {"workers": 0, "cpus_per_worker": 2},
            "a hpo trial's process asks for 2 CPU and 0 GPU on one node; the cluster's 3 nodes",
        ),
        # GPUs: two half-GPU workers share one GPU; two whole-GPU workers need two
        ([{"CPU": 4.0, "GPU": 1.0}], {"workers": 2, "cpus_per_worker": 1, "gpus_per_worker": 0.5}, None),
        ([{"CPU": 4.0, "GPU": 1.0}], {"workers": 2, "cpus_per_worker": 1, "gpus_per_worker": 1}, "room for 1"),
    ],
)
def test_a_sweep_that_no_node_can_hold_is_refused_naming_what_it_needs_and_what_the_cluster_has(nodes, resources, problem):
    device = {"device": "cuda"} if resources.get("gpus_per_worker") else {}
    found = placement_problem(spec(resources, **device), nodes)
    assert found is None if problem is None else problem in found, found


def test_the_solver_pool_needs_a_node_with_a_cpu():
    milp = {"baselines": {"classical_best": False, "dp_optimal": False, "milp": [{"name": "m"}]}}
    assert placement_problem(spec({"workers": 1}, **milp), [HEAD, {"CPU": 1.0}]) is None
    gpu_trials = spec(
        {"workers": 1, "cpus_per_worker": 0.5, "gpus_per_worker": 1}, device="cuda", **milp
    )  # the trials fit, the pool does not
    assert placement_problem(gpu_trials, [HEAD, {"CPU": 0.5, "GPU": 1.0}]) == (
        "sweep: the solver workers of the baselines (m) ask for 1 CPU on one node; the cluster's 2 nodes: 1 with 0 CPU and 0 GPU, "
        "1 with 0.5 CPU and 1 GPU"
    )


# ---- the record of attempts ---------------------------------------------------------------------------


def test_every_attempt_is_recorded_with_its_node_and_a_lost_one_is_told_apart(tmp_path):
    trial = Trial("hpo", 1, 0)
    where = {"node_id": "a" * 56, "node_ip": "10.0.0.1", "node_name": "worker-1", "pid": 11, "trial_id": "t0"}
    assert start_attempt(tmp_path, trial.name, where) == 1  # killed with its node: no end line
    with open(attempts_path(tmp_path, trial.name), "a") as f:
        f.write('{"event": "end", "attem')  # a line torn by a crash mid-write is skipped and closed
    assert start_attempt(tmp_path, trial.name, {**where, "node_name": "worker-2", "pid": 12}) == 2
    end_attempt(tmp_path, trial.name, 2, "failed: TrainingFailedError", [{"node_id": "b" * 56, "node_name": "worker-3"}])
    assert start_attempt(tmp_path, trial.name, {**where, "node_name": "worker-2", "pid": 13}) == 3
    end_attempt(tmp_path, trial.name, 3, "completed", [])
    rows = trial_attempts(tmp_path, trial)
    assert [(r["attempt"], r["node_name"], r["pid"], r["outcome"], r["train_node_names"]) for r in rows] == [
        (1, "worker-1", 11, LOST, []),
        (2, "worker-2", 12, "failed: TrainingFailedError", ["worker-3"]),
        (3, "worker-2", 13, "completed", []),
    ]
    assert rows[0]["ended"] is None and rows[2]["ended"] is not None and pa.Table.from_pylist(rows, schema=ATTEMPTS_SCHEMA).num_rows == 3


def test_the_tables_carry_the_attempts_and_a_directory_of_version_1_still_reads(tmp_path):
    from envs.instance import paper_instance

    sweep = {"sizes": [1], "seeds": 1, "methods": ["hpo"], "baselines": {"classical_best": False, "dp_optimal": False}}
    s = SweepSpec.from_dict(sweep)
    trial = s.trials()[0]
    start_attempt(tmp_path, trial.name, {"node_id": "a" * 56, "node_ip": "10.0.0.1", "node_name": "worker-1", "pid": 1, "trial_id": "t"})
    start_attempt(tmp_path, trial.name, {"node_id": "b" * 56, "node_ip": "10.0.0.2", "node_name": "worker-2", "pid": 2, "trial_id": "t"})
    [row] = write_tables(s, tmp_path, {})
    assert (row["attempts"], row["node_name"], row["status"]) == (2, "worker-2", "pending")
    assert [a["node_name"] for a in pq.read_table(tmp_path / "attempts.parquet").to_pylist()] == ["worker-1", "worker-2"]
    record = {
        "format": "or-transformer-platform/sweep",
        "version": 2,
        "sweep": sweep,
        "instance_hashes": {"n1": paper_instance(1, 0).content_hash()},
    }
    write_record(tmp_path, record)
    results = read_results(tmp_path)
    assert results.trials[0]["attempts"] == 2 and len(results.attempts) == 2
    # version 1: no attempts/, no attempts.parquet, trials.parquet without the three columns
    old = pq.read_table(tmp_path / "trials.parquet").drop_columns(["attempts", "node_id", "node_name"])
    write_parquet(old, tmp_path / "trials.parquet")
    (tmp_path / "attempts.parquet").unlink()
    write_record(tmp_path, record | {"version": 1})
    results = read_results(tmp_path)
    assert results.attempts == [] and results.trials[0]["attempts"] is None and results.trials[0]["status"] == "pending"
    write_record(tmp_path, record | {"version": 3})
    with pytest.raises(InputError, match="field 'version' is 3, this code reads version 2"):
        read_results(tmp_path)


def test_every_solver_record_names_the_node_and_process_that_made_it(tmp_path, ray_session):
    from envs.exogenous import sample_paths
    from envs.instance import paper_instance
    from solver_workers.backends import SolverOptions
    from solver_workers.pool import Journal, Pool, bound_identity, episode_key, run_bounds

    inst, options = paper_instance(1, 0), SolverOptions(gap=0.0)
    pool = Pool(1)
    records = run_bounds(
        inst, sample_paths(inst, 1, 2, 4), options, pool, Journal(tmp_path / "b.jsonl", episode_key, bound_identity(inst, 1, 4, options))
    )
    node = ray_session.get_runtime_context().get_node_id()  # the embedded Ray's one node
    name = next(n["NodeName"] for n in ray_session.nodes() if n["NodeID"] == node)
    assert [(r["node_id"], r["node_name"], r["pid"]) for r in records] == [(node, name, ray_session.get(pool.actors[0].pid.remote()))] * 2
    journal = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()[1:]]
    assert [r["node_id"] for r in journal] == [node, node]


def test_loading_the_cluster_demo_imports_no_ray():
    """Ray reads its authentication mode (RAY_AUTH_MODE) once, when it is imported, so platform/cluster_demo.py, which
    tests/cluster_host.py loads, sets its cluster's token mode before Ray is imported: loading the module imports no Ray.
    The control, in the same process: ray_access.session, which cluster_demo needs once the mode is set, does."""
    demo = "s = u.spec_from_file_location('demo', 'platform/cluster_demo.py'); s.loader.exec_module(u.module_from_spec(s))"
    code = f"import importlib.util as u, sys; {demo}; print('ray' in sys.modules); import ray_access.session; print('ray' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["False", "True"], result.stderr[-2000:]


# ---- slow: a sweep on a cluster that loses nodes ------------------------------------------------------

UPDATES = 40
EPISODES, HORIZON = 4, 25
SWEEP = {
    "sizes": [1],
    "seeds": 2,
    "methods": ["hpo"],
    "overrides": {
        "all": {
            "batch": 8,
            "updates": UPDATES,
            "blocks": 1,
            "width": 16,
            "heads": 2,
            "feed_forward": 32,
            "hidden": 32,
            "checkpoint_every": 5,
            "imitation_updates": 0,
        }
    },
    "resources": {"all": {"workers": 1, "cpus_per_worker": 1}},
    "evaluation": {"episodes": 4, "horizon": 5},
    "baselines": {
        "classical_best": False,
        "dp_optimal": False,
        "solver_workers": 2,
        "milp": [{"name": "milp", "scenarios": 3, "plan_horizon": 4, "time_limit": 2, "episodes": EPISODES, "horizon": HORIZON}],
    },
    "concurrency": 2,
    "retries": 3,
}


class HostedCluster:
    """A cluster held by tests/cluster_host.py in a process of its own (the test process holds no second Ray). As a
    context, it stops the processes started on it (`launch`) and then itself, whatever happened."""

    def __init__(self, workers: int, cpus: int):
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "cluster_host.py"), str(workers), str(cpus)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.state = self.answer()
        self.launched: list[subprocess.Popen] = []

    def __enter__(self) -> HostedCluster:
        return self

    def __exit__(self, *failure) -> None:
        for process in self.launched:
            stop(process)
        self.stop()

    def launch(self, script: str, *arguments: str) -> subprocess.Popen:
        """platform/<script> against the cluster with its authentication settings, as a user would run it (its own process
        group, one BLAS thread, stdout and stderr together)."""
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "platform" / script), *arguments, "--address", self.address],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, **self.state["environment"], "OMP_NUM_THREADS": "1"},
        )
        self.launched.append(process)
        return process

    def answer(self) -> dict:
        line = self.process.stdout.readline()
        assert line, "the cluster's host ended"
        return json.loads(line)

    def send(self, command: str) -> None:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        self.state = self.answer()

    @property
    def address(self) -> str:
        return self.state["address"]

    def node(self, name: str) -> dict:
        return next(n for n in self.state["nodes"] if n["name"] == name)

    def running(self, actor: str):
        """The name of the worker node below whose raylet a process `ray::<actor>` runs, or None."""
        for node in self.state["nodes"][1:]:
            if any(command(pid).startswith(f"ray::{actor}") for pid in below(node["raylet"])):
                return node["name"]
        return None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()  # the host stops its cluster
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def command(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
    except OSError:
        return ""


def wait_for(condition, process, what: str, timeout: float = 400):
    end = time.time() + timeout
    while not (found := condition()):
        assert process.poll() is None, f"the sweep ended before {what}"
        assert time.time() < end, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def journal(results) -> list[dict]:
    lines = (
        (results / "baselines" / "n1" / "milp" / "decisions.jsonl").read_text().splitlines()[1:] if (results / "baselines").exists() else []
    )
    return [json.loads(line) for line in lines if line.endswith("}")]


def stop(process: subprocess.Popen) -> None:
    """End a process that a failed test left running (its own process group)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def start_sweep(tmp_path, cluster: HostedCluster, sweep: dict, *flags) -> subprocess.Popen:
    """platform/sweep.py --address against the cluster."""
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    return cluster.launch("sweep.py", "--config", str(tmp_path / "sweep.yaml"), "--out", str(tmp_path / "results"), *flags)


def check_every_update_and_decision_once(results) -> None:
    trials = pq.read_table(results / "trials.parquet").to_pylist()
    assert sorted((t["method"], t["seed"], t["status"], t["updates"]) for t in trials) == [
        ("hpo", 0, "completed", UPDATES),
        ("hpo", 1, "completed", UPDATES),
    ]
    curves = pq.read_table(results / "curves.parquet").to_pylist()
    for seed in (0, 1):
        assert [c["update"] for c in curves if c["seed"] == seed] == list(range(1, UPDATES + 1))
    keys = [(r["episode"], r["decision"]) for r in journal(results)]
    assert sorted(keys) == [(e, t) for e in range(EPISODES) for t in range(HORIZON)]  # every decision once: no repeat, no gap
    decisions = pq.read_table(results / "baselines" / "n1" / "milp" / "decisions.parquet")
    assert decisions.num_rows == EPISODES * HORIZON


@pytest.mark.slow
@pytest.mark.parametrize("cpus", [2, 1])
def test_a_worker_node_killed_mid_sweep_costs_no_trial_update_or_decision(tmp_path, cpus):
    """Head without CPUs, two worker nodes of `cpus` CPUs. The node of a solver worker is killed while MILP
    decisions run (a new node joins), then the node of a Train worker while its trial trains (after its first
    checkpoint). The sweep finishes with every trial, update and decision exactly once; the lost attempt and its
    retry are in attempts.parquet with their nodes and on the console."""
    results = tmp_path / "results"
    with HostedCluster(2, cpus) as cluster:
        process = start_sweep(tmp_path, cluster, SWEEP)
        first = wait_for(lambda: len(journal(results)) >= 3 and journal(results)[-1], process, "the first MILP decisions")
        solver_node = first["node_name"]
        solver_node_id = cluster.node(solver_node)["node_id"]
        cluster.send(f"kill {solver_node}")
        cluster.send("add")
        wait_for(
            lambda: any((results / "trials" / f"hpo-n1-s{s}" / "checkpoint.pt").exists() for s in (0, 1)),
            process,
            "a trial's first checkpoint",
        )
        train_node = wait_for(lambda: cluster.running("RayTrainWorker"), process, "a Train worker")
        train_node_id = cluster.node(train_node)["node_id"]
        cluster.send(f"kill {train_node}")
        output, _ = process.communicate(timeout=900)
        assert process.returncode == 0, output[-4000:]
    check_every_update_and_decision_once(results)
    nodes = {r["node_name"] for r in journal(results)}
    assert solver_node in nodes and len(nodes) >= 2  # decisions ran on the lost node and on the others
    attempts = pq.read_table(results / "attempts.parquet").to_pylist()
    retried = [a for a in attempts if a["outcome"] != "completed"]
    killed = {solver_node_id, train_node_id}
    assert retried and all(a["outcome"] == LOST or a["outcome"].startswith("failed:") for a in retried), attempts
    # every attempt that did not complete ran on a killed node (a failure of another cause on a live node fails
    # here), and the loss of the Train worker's node is one of them
    assert all(killed & {*a["train_node_ids"], a["node_id"]} for a in retried), attempts
    assert any(train_node_id in (a["train_node_ids"] + [a["node_id"]]) for a in retried), attempts
    assert len([a for a in attempts if a["outcome"] == "completed"]) == 2
    for seed in (0, 1):
        training = json.loads((results / "trials" / f"hpo-n1-s{seed}" / "training.json").read_text())
        assert training["attempts"][0] == 0 and all(a % 5 == 0 for a in training["attempts"])  # later attempts start at a checkpoint
    assert "took 2 attempts" in output, output[-4000:]


@pytest.mark.slow
def test_losing_the_head_ends_the_driver_and_resume_finishes_without_rerunning_finished_trials(tmp_path):
    """1-CPU worker nodes, one trial at a time: once the first trial has finished, the head (GCS, the driver's
    node) is killed; the driver ends. A new cluster comes up and --resume runs only the other trial."""
    results, sweep = tmp_path / "results", {**SWEEP, "concurrency": 1}
    with HostedCluster(2, 1) as cluster:
        process = start_sweep(tmp_path, cluster, sweep)
        done = wait_for(
            lambda: [s for s in (0, 1) if (results / "trials" / f"hpo-n1-s{s}" / "sampled" / "summary.json").exists()],
            process,
            "the first finished trial",
        )
        finished = {p: p.stat().st_mtime_ns for p in (results / "trials" / f"hpo-n1-s{done[0]}").rglob("*.json")}
        cluster.send("kill head")
        output, _ = process.communicate(timeout=300)
        assert process.returncode != 0, output[-4000:]
    with HostedCluster(2, 1) as cluster:
        resumed = start_sweep(tmp_path, cluster, sweep, "--resume")
        output, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, output[-4000:]
    assert "1 trials to run (1 finished)" in output, output[-4000:]
    assert {p: p.stat().st_mtime_ns for p in finished} == finished  # the finished trial was not run again
    check_every_update_and_decision_once(results)
    attempts = pq.read_table(results / "attempts.parquet").to_pylist()
    assert len([a for a in attempts if a["seed"] == done[0]]) == 1


# ---- slow: a catalogue on a cluster that loses a node ---------------------------------------------


def catalogue_inputs(folder) -> list[str]:
    """Four suppliers of one item each (paper items), 60 days of simulated demand: platform/recommend.py's flags."""
    import pyarrow.csv

    from demand.simulation import simulate_history
    from envs.instance import paper_instance

    names = ["north", "south", "east", "west"]
    history, costs = simulate_history(paper_instance(4, seed=3), seed=5, periods=60, start="2024-01-01", names=[f"{s}-1" for s in names])
    pyarrow.csv.write_csv(history, folder / "history.csv")
    pyarrow.csv.write_csv(costs.append_column("supplier", [names]), folder / "costs.csv")
    (folder / "suppliers.csv").write_text("supplier,K\n" + "".join(f"{s},{4 + k}\n" for k, s in enumerate(names)))
    files = ["--history", folder / "history.csv", "--costs", folder / "costs.csv", "--suppliers", folder / "suppliers.csv"]
    return [str(part) for part in files] + ["--episodes", "6", "--horizon", "8", "--window", "10", "--replicates", "2"]


def supplier_attempts(out) -> dict[str, list[dict]]:
    """Each supplier folder's attempts so far (catalogue.folders.ATTEMPTS), whole or `.partial`, by folder name."""
    found = {}
    for path in (out / "suppliers").glob("*/attempts.jsonl") if (out / "suppliers").exists() else []:
        lines = [line for line in path.read_text().splitlines() if line.endswith("}")]
        found[path.parent.name] = [json.loads(line) for line in lines]
    return found


@pytest.mark.slow
def test_a_catalogue_spreads_its_suppliers_over_the_nodes_and_a_lost_node_costs_only_its_running_supplier(tmp_path):
    """platform/recommend.py --address on a head without CPUs and two 1-CPU worker nodes, four suppliers: once a
    supplier has finished on a node and the next has started there, that node is killed. The catalogue finishes whole;
    the suppliers ran on both nodes; the finished one kept its folder (one attempt, its record untouched); the one that
    ran on the lost node took a second attempt on the other node; every other supplier took one."""
    out = tmp_path / "catalogue"
    with HostedCluster(2, 1) as cluster:
        process = cluster.launch("recommend.py", *catalogue_inputs(tmp_path), "--out", str(out))

        def finished_and_next():
            attempts = supplier_attempts(out)
            whole = {name: runs[-1]["node_name"] for name, runs in attempts.items() if not name.endswith(".partial")}
            running = {runs[-1]["node_name"]: name for name, runs in attempts.items() if name.endswith(".partial")}
            return next(((name, node, running[node]) for name, node in whole.items() if node in running), None)

        finished, node, lost = wait_for(finished_and_next, process, "a finished supplier and the next on its node")
        record = out / "suppliers" / finished / "supplier.json"
        kept = record.stat().st_mtime_ns
        cluster.send(f"kill {node}")
        output, _ = process.communicate(timeout=900)
        assert process.returncode == 0, output[-4000:]
    summary = json.loads((out / "catalogue.json").read_text())
    assert summary["complete"] and len(summary["suppliers"]) == 4
    attempts = supplier_attempts(out)
    assert sorted(attempts) == ["east", "north", "south", "west"]  # every folder whole, none left .partial
    assert record.stat().st_mtime_ns == kept and len(attempts[finished]) == 1
    retried = attempts[lost.removesuffix(".partial")]
    assert [a["node_name"] for a in retried][0] == node and len(retried) == 2 and retried[1]["node_name"] != node
    assert sum(len(runs) for runs in attempts.values()) == 5  # one attempt each, and the lost one's second
    assert {runs[0]["node_name"] for runs in attempts.values()} == {"worker-1", "worker-2"}
    assert json.loads(record.read_text())["attempts"] == attempts[finished]
    assert f"supplier '{lost.removesuffix('.partial')}' took 2 attempts (on {node}, " in output, output[-4000:]
