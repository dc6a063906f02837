"""Run a sweep into one results directory (layout, writer and reader: sweeps/results_dir.py).

Finished trials and baselines are never run again; interrupted trials continue from their checkpoints.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from envs.evaluation import evaluate
from envs.exogenous import HELDOUT_SEED, sample_paths
from envs.instance import Instance
from plumbing.errors import InputError
from plumbing.files import read_text
from plumbing.validate import load_yaml
from policies.classical import CLASSICAL_BEST
from policies.joint_dp import SWEEP_ITEMS
from run_results.records import manifest, write_evaluation
from sweeps.results_dir import (
    FINISHED,
    baseline_done,
    end_attempt,
    instance_path,
    open_results,
    start_attempt,
    trial_attempts,
    trial_done,
    trial_folder,
    write_instances,
    write_record,
    write_tables,
)
from sweeps.spec import MilpBaseline, SweepSpec, Trial

RESUME_COMMAND = "SWEEP_RESUME_COMMAND"
"""The environment variable in which a script that runs platform/sweep.py for the user (platform/cluster_demo.py,
on a cluster it starts and stops) gives the command that continues the sweep, for sweep.py's Ctrl-C message."""


def read_spec(path) -> tuple[SweepSpec, dict]:
    """The validated spec and the file's content (kept in sweep.json)."""
    data = load_yaml(read_text(path, "sweep file"), "sweep file", path)
    try:
        data = json.loads(json.dumps(data))  # as sweep.json will hold it (mapping keys become strings)
    except (TypeError, ValueError) as exc:
        raise InputError(f"sweep file '{path}': holds a value that is not plain data ({exc})") from None
    return SweepSpec.from_dict(data), data


# ---- baselines ------------------------------------------------------------------------------------


def run_baselines(spec: SweepSpec, out: Path, insts: dict[int, Instance], log) -> None:
    """Every size's baselines, each skipped when its folder is already whole (the solver journals resume)."""
    from policies.classical import CLASSICAL_BEST
    from policies.decomposition import NAME as DECOMPOSITION
    from policies.decomposition import DecompositionOptions
    from policies.dp_optimal import NAME as DP_OPTIMAL
    from policies.lookahead import NAME as LOOKAHEAD
    from policies.names import PolicySpec, parse_policy, tables_spec
    from solver_workers.backends import SolverOptions
    from solver_workers.solver_run import (
        SolverRun,
        bound_journal,
        decomposition_journal,
        milp_journal,
        run_bound,
        run_decomposition_bound,
        run_milp,
    )
    from trainers.resolver import resolve

    b, episodes, horizon = spec.baselines, spec.episodes, spec.horizon

    def named_baseline(inst: Instance, base: Path, label: str, spec: PolicySpec) -> None:
        """Evaluate the named policy `spec` (trainers.resolver) into base/label, unless it is already there."""
        if baseline_done(base / label, inst, episodes, horizon):
            return
        log(f"baseline n={inst.n} {label}")
        resolved = resolve(spec, inst, horizon)
        result = evaluate(resolved.policy, inst.to_torch(), sample_paths(inst, HELDOUT_SEED, episodes, horizon))
        write_evaluation(base / label, label, result, HELDOUT_SEED, {"sweep": True, "n": inst.n}, resolved.parameters, instance=inst)

    for n, inst in insts.items():
        base = out / "baselines" / f"n{n}"
        if b.classical_best:
            named_baseline(inst, base, CLASSICAL_BEST, parse_policy(CLASSICAL_BEST))
        if b.dp_optimal and n <= SWEEP_ITEMS:
            named_baseline(inst, base, DP_OPTIMAL, parse_policy(DP_OPTIMAL))
        if b.bound is not None and not baseline_done(base / "bound", inst, episodes, horizon):
            log(f"baseline n={n} perfect-information bound")
            options = SolverOptions(b.bound["solver"], b.bound["time_limit"], 0.0, b.bound["threads"])
            run = SolverRun(base / "bound", HELDOUT_SEED, episodes, horizon, b.solver_workers)
            run_bound(run, inst, bound_journal(run, inst, options), options)
        if b.decomposition is not None and not baseline_done(base / DECOMPOSITION, inst, episodes, horizon):
            log(f"baseline n={n} decomposition bound")
            options = DecompositionOptions(**b.decomposition)
            run = SolverRun(base / DECOMPOSITION, HELDOUT_SEED, episodes, horizon, b.solver_workers)
            run_decomposition_bound(run, inst, decomposition_journal(run, inst, options), options)
        if b.lookahead:  # on the tables of the decomposition bound's run above
            named_baseline(inst, base, LOOKAHEAD, tables_spec(base / DECOMPOSITION))
        for m in b.milp:
            if m.sizes is not None and n not in m.sizes:
                continue
            m_episodes, m_horizon = m.episodes or episodes, m.horizon or horizon
            if baseline_done(base / m.name, inst, m_episodes, m_horizon):
                continue
            log(f"baseline n={n} {m.name}")
            options = milp_options(m)
            run = SolverRun(base / m.name, HELDOUT_SEED, m_episodes, m_horizon, b.solver_workers)
            run_milp(run, inst, milp_journal(run, inst, options), options)


def milp_options(m: MilpBaseline):
    from solver_workers.backends import SolverOptions
    from solver_workers.rolling import RollingOptions

    return RollingOptions(m.scenarios, m.plan_horizon, SolverOptions(m.solver, m.time_limit, m.gap, m.threads))


# ---- trials ---------------------------------------------------------------------------------------


def run_trial(config: dict, trials: dict[str, dict], out: str) -> None:
    """Tune's function trainable: one (method, n, seed) run and its held-out evaluation, continuing from
    the trial folder's checkpoint when a retry or a resumed sweep finds one. Each call is an attempt, recorded
    with its node in the results directory (sweeps.results_dir.start_attempt) before anything else."""
    from ray import tune

    from ray_access.session import this_node
    from trainers.experiment import run_experiment

    torch.set_num_threads(1)
    config = trials[config["name"]]
    where = this_node()
    attempt = start_attempt(Path(out), config["name"], where | {"trial_id": tune.get_context().get_trial_id()})
    folder = Path(config["folder"])
    mode = "resume" if (folder / "checkpoint.pt").exists() else ("overwrite" if folder.exists() else "new")
    if attempt > 1:
        print(
            f"trial {config['name']}: attempt {attempt} on node {where['node_name']} ({where['node_id'][:8]}), "
            f"{'from its checkpoint' if mode == 'resume' else 'from the start (no checkpoint yet)'}",
            flush=True,
        )

    def on_update(update: int, metrics: dict[str, float]) -> None:
        validated = {"validation_cost": metrics["validation_cost"]} if "validation_cost" in metrics else {}
        tune.report({"update": update, "cost10": metrics["cost10"], **validated})

    try:
        summary = run_experiment(
            config["method"],
            Instance.load(config["instance"]),
            folder,
            preset=config["preset"],
            seed=config["seed"],
            overrides=config["overrides"],
            mode=mode,
            episodes=config["episodes"],
            horizon=config["horizon"],
            device=config["device"],
            progress=False,
            workers=config["workers"] or None,
            use_gpu=config["use_gpu"],
            on_update=on_update,
            resources_per_worker={k: v for k, v in (("CPU", config["cpus_per_worker"]), ("GPU", config["gpus_per_worker"])) if v},
        )
    except Exception as exc:  # anything else (the process stopped from outside) leaves the attempt without an end: lost
        end_attempt(
            Path(out),
            config["name"],
            attempt,
            f"failed: {(str(exc).strip().splitlines() or [type(exc).__name__])[-1]}",
            train_nodes() if config["workers"] else [],
        )
        raise
    end_attempt(Path(out), config["name"], attempt, "completed", train_nodes() if config["workers"] else [])
    tune.report(
        {
            "update": summary["training"]["updates_done"],
            "greedy_mean": summary["greedy"]["mean"],
            "sampled_mean": summary["sampled"]["mean"],
        }
    )


def train_nodes() -> list[dict[str, str]]:
    """The nodes (node_id, node_name) of the Ray Train workers that this trial process has run, alive or not, from
    Ray's actor table: the workers are actors of the Train controller, an actor of this process (Ray Train's
    own record of its workers is internal to it). Ray keeps dead actors in the table with their node."""
    import ray

    from ray_access.private import actor_table

    table = actor_table(job_id=ray.get_runtime_context().get_job_id()).values()
    me = actor_table(actor_id=ray.get_runtime_context().get_actor_id())["Address"]

    def owned_by(address: dict, kind: str) -> list[dict]:
        return [a for a in table if a["ActorClassName"] == kind and a["OwnerAddress"] == address]

    ids = sorted({w["Address"]["NodeID"] for c in owned_by(me, "TrainController") for w in owned_by(c["Address"], "RayTrainWorker")})
    names = {node["NodeID"]: node["NodeName"] for node in ray.nodes()}
    return [{"node_id": i, "node_name": names.get(i)} for i in ids]


TRIAL_MEMORY = 256 * 2**20
"""Bytes of Ray's `memory` resource that the process of a trial on Ray Train workers reserves: a trial must
reserve something, and this one holds no CPU (trial_resources)."""


def trial_resources(config: dict) -> dict[str, float]:
    """The trial process holds the CPUs/GPUs of its learner. With Ray Train it only coordinates (its Train
    workers ask Ray for their own CPUs and GPUs, outside the trial's placement group), so it holds no CPU: a
    fraction of one would leave 0.99 CPU on a 1-CPU node, where its Train worker needs 1 and would wait forever.
    Tune refuses a trial that reserves nothing; every Ray node has the `memory` resource, so it reserves memory."""
    if config["workers"]:
        return {"cpu": 0, "memory": TRIAL_MEMORY}
    return {"cpu": config["cpus_per_worker"], "gpu": config["gpus_per_worker"]}


def trial_config(spec: SweepSpec, out: Path, trial: Trial) -> dict:
    res = spec.resources_of(trial.method)
    return {
        "name": trial.name,
        "method": trial.method,
        "n": trial.n,
        "seed": trial.seed,
        "folder": str(trial_folder(out, trial)),
        "instance": str(instance_path(out, trial.n)),
        "preset": spec.preset,
        "overrides": spec.overrides_of(trial.method),
        "episodes": spec.episodes,
        "horizon": spec.horizon,
        "device": spec.device,
        "workers": res.workers if spec.uses_ray_train(trial.method) else 0,
        "use_gpu": res.gpus_per_worker > 0,
        "cpus_per_worker": res.cpus_per_worker,
        "gpus_per_worker": res.gpus_per_worker,
    }


def run_trials(spec: SweepSpec, out: Path, log, verbose: bool = False) -> dict[str, str]:
    """Run the trials that are not finished in one Tune experiment; returns the error of each failed trial.
    What Tune prints: sweeps.console.tune_output."""
    from ray import tune

    from sweeps.console import tune_output

    pending = [trial_config(spec, out, t) for t in spec.trials() if not trial_done(trial_folder(out, t))]
    if not pending:
        return {}
    storage = (out / "tune").resolve()
    attempt = 1 + (len(list(storage.glob("trials-*"))) if storage.exists() else 0)
    log(f"{len(pending)} trials to run ({len(spec.trials()) - len(pending)} finished), {spec.concurrency} at a time")
    trials = {c["name"]: c for c in pending}
    tuner = tune.Tuner(
        tune.with_resources(
            tune.with_parameters(run_trial, trials=trials, out=str(out)), lambda config: trial_resources(trials[config["name"]])
        ),
        param_space={"name": tune.grid_search(list(trials))},
        tune_config=tune.TuneConfig(
            max_concurrent_trials=spec.concurrency,
            trial_name_creator=lambda t: t.config["name"],
            trial_dirname_creator=lambda t: t.config["name"],
        ),
        run_config=tune.RunConfig(
            name=f"trials-{attempt}",
            storage_path=str(storage),
            failure_config=tune.FailureConfig(max_failures=spec.retries),
            **tune_output(log, spec.retries, verbose),
        ),
    )
    # Tune's own SIGINT handler would end fit() normally, with its Tuner.restore hint; without it Ctrl-C raises
    # KeyboardInterrupt here, and platform/sweep.py says how to go on with --resume (exit status 130).
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    results = tuner.fit()
    return {r.config["name"]: str(r.error).strip().splitlines()[-1] for r in results if r.error is not None}


def run_sweep(
    spec: SweepSpec, data: dict, out: Path, resume: bool = False, log=print, connect=lambda: None, verbose: bool = False
) -> list[dict[str, Any]] | None:
    """Run (or continue) the sweep in `out`; returns the trial rows, or None when a resumed sweep had nothing left.
    `connect()` reaches Ray (ray_access.session.init_ray) once there is work to do; `verbose` keeps Tune's
    own progress reports (sweeps.console)."""
    out = out.resolve()  # trials run in other working directories
    record = open_results(out, data, resume)
    if resume and record.get("finished") and all(trial_done(trial_folder(out, t)) for t in spec.trials()):
        log(f"the sweep in '{out}' is finished: nothing to do")
        return None
    connect()
    for line in dry_run(spec, cluster_nodes()):
        log(line)
    check_shared(out)
    insts = write_instances(spec, out)
    record.update(manifest(data) | {"instance_hashes": {f"n{n}": inst.content_hash() for n, inst in insts.items()}})
    record.pop("finished", None)
    write_record(out, record)
    run_baselines(spec, out, insts, log)
    errors = run_trials(spec, out, log, verbose)
    rows = write_tables(spec, out, errors)
    for trial, row in zip(spec.trials(), rows):
        if row["attempts"] > 1:
            log(f"trial {trial.name} took {row['attempts']} attempts: {'; '.join(map(describe_attempt, trial_attempts(out, trial)))}")
    if all(r["status"] in FINISHED for r in rows):
        record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_record(out, record)
    return rows


def describe_attempt(attempt: dict[str, Any]) -> str:
    """'2 completed (node worker-2; Ray Train on worker-2)' for a row of attempts.parquet."""
    train = f"; Ray Train on {', '.join(map(str, attempt['train_node_names']))}" if attempt["train_node_names"] else ""
    return f"{attempt['attempt']} {attempt['outcome']} (node {attempt['node_name']}{train})"


def check_shared(out: Path) -> None:
    """Refuse a results directory that a node of the cluster does not see: trials write their run folders and
    checkpoints on the node they run on, so on a node-local path their results would land on that node's disk
    and be lost to the sweep. The driver writes a file with a random content into `out`; a task on every live
    node reads it back."""
    import secrets

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [node for node in ray.nodes() if node["Alive"]] if ray.is_initialized() else []
    if len(nodes) < 2:
        return
    token, made = secrets.token_hex(16), not out.exists()
    marker = out / f".shared-{token}"
    out.mkdir(parents=True, exist_ok=True)
    marker.write_text(token)
    reads_back = ray.remote(num_cpus=0)(_reads_back)
    try:
        reads = [
            reads_back.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(str(marker), token)
            for node in nodes
        ]
        blind = [f"{node['NodeName']} ({node['NodeID'][:8]})" for node, seen in zip(nodes, ray.get(reads)) if not seen]
    finally:
        marker.unlink()
    if blind:
        if made:
            out.rmdir()
        raise InputError(
            f"--out '{out}': the nodes {', '.join(blind)} of the cluster do not see it; their trials would write their results "
            "to their own disks: give a path that every node mounts (docs/cluster.md)"
        )


def _reads_back(path: str, token: str) -> bool:
    try:
        return Path(path).read_text() == token
    except OSError:
        return False


SOME_FAILED_EXIT = 3
"""sweep.py's exit status when some trials finished and others failed."""
NONE_FINISHED_EXIT = 4
"""sweep.py's exit status when no trial finished."""


def exit_status(rows: list[dict]) -> int:
    """sweep.py's exit status for the trial rows of a sweep that ran to its end: 0 when every trial finished (completed or
    diverged), SOME_FAILED_EXIT when only some did, NONE_FINISHED_EXIT when none did."""
    done = sum(r["status"] in FINISHED for r in rows)
    return 0 if done == len(rows) else SOME_FAILED_EXIT if done else NONE_FINISHED_EXIT


def dry_run(spec: SweepSpec, nodes: list[dict[str, float]]) -> list[str]:
    """What the sweep would run, and the resources each trial asks for; refuses a sweep whose trials or solver
    pool no node of the cluster (`nodes`: the CPUs and GPUs of each) could ever hold (placement_problem), and
    notes a Gurobi baseline above the licence's size limit (run_sweep prints these lines too, so a run refuses
    and warns exactly as its dry run)."""
    from solver_workers.backends import licence_note
    from solver_workers.model import stock_columns

    if problem := placement_problem(spec, nodes):
        raise InputError(problem)
    lines = [
        f"{len(spec.trials())} trials ({len(spec.methods)} methods x {len(spec.sizes)} sizes x {len(spec.seeds)} seeds), "
        f"{spec.concurrency} at a time, {spec.retries} retries each; preset '{spec.preset}' on {spec.device}"
    ]
    for method in spec.methods:
        res = spec.resources_of(method)
        workers = res.workers if spec.uses_ray_train(method) else 0
        cpus, gpus = max(workers, 1) * res.cpus_per_worker, max(workers, 1) * res.gpus_per_worker
        where = f"{workers} Ray Train workers" if workers else "the trial process"
        lines.append(f"  {method}: {cpus:g} CPU, {gpus:g} GPU per trial ({where})")
    b = spec.baselines
    names = (
        ([CLASSICAL_BEST] if b.classical_best else [])
        + ([f"dp-optimal (n <= {SWEEP_ITEMS})"] if b.dp_optimal and spec.has_dp_optimal else [])
        + (["perfect-information bound"] if b.bound else [])
        + (["decomposition bound"] if b.decomposition else [])
        + (["decomposition-lookahead"] if b.lookahead else [])
        + [m.name for m in b.milp]
    )
    lines.append(f"baselines per size: {', '.join(names) or 'none'}; solver pool of {b.solver_workers} workers")
    hours = sum(training_hours(spec, t) for t in spec.trials())
    lines.append(
        f"training: about {hours:,.1f} learner-hours on CPU cores "
        "(each method's throughput in trainers/registry.py, measured on this project's 2-core machine; a GPU is far faster)"
    )
    milp_runs = [(m, n) for m in b.milp for n in spec.milp_sizes(m)]
    if milp_runs:  # a sweep without MILP baselines has no MILP decisions to estimate
        milp_hours = sum((m.episodes or spec.episodes) * (m.horizon or spec.horizon) * m.time_limit / 3600 for m, _ in milp_runs)
        amount = f"{milp_hours:,.1f} solver-hours" if milp_hours >= 0.1 else f"{milp_hours * 3600:,.0f} solver-seconds"
        lines.append(f"MILP decisions at most {amount} (every decision at its time limit)")
    for m, n in milp_runs:
        if note := licence_note(m.solver, stock_columns(n, m.scenarios, m.plan_horizon)):
            lines.append(f"{m.name} at n = {n}: {note}")
    return lines


def training_hours(spec: SweepSpec, trial: Trial) -> float:
    """Learner-hours of one trial on CPU cores: the method's throughput (trainers.registry.Method), taken as
    inversely proportional to n above 16."""
    from trainers.registry import method, method_config

    config = method_config(trial.method, spec.preset, spec.overrides_of(trial.method))
    rate = method(trial.method).throughput * min(1.0, 16 / trial.n)
    return config.updates * config.batch * config.rollout / rate / 3600


def cluster_nodes() -> list[dict[str, float]]:
    """The CPUs and GPUs of every live node of the cluster Ray is connected to (without Ray: this machine, as the
    embedded Ray would have it)."""
    import ray

    if ray.is_initialized():
        return [{k: float(node["Resources"].get(k, 0.0)) for k in ("CPU", "GPU")} for node in ray.nodes() if node["Alive"]]
    return [{"CPU": float(os.cpu_count() or 1), "GPU": float(torch.cuda.device_count())}]


def placement_problem(spec: SweepSpec, nodes: list[dict[str, float]]) -> str | None:
    """Returns why a cluster of `nodes` (the CPUs and GPUs of each) can never run part of the sweep, or None when it can. Ray places each
    request on one node: a trial's own process (its learner's CPUs and GPUs; nothing but memory on Ray Train workers), each Ray Train
    worker (cpus_per_worker, gpus_per_worker; spread over nodes when they must) and each solver worker of the baselines (1 CPU). A
    request no node can hold waits forever, so the sweep is refused before anything runs."""

    def fits(cpus: float, gpus: float) -> int:  # how many such requests the cluster holds at once
        return sum(
            int(min(n.get("CPU", 0.0) / cpus if cpus else math.inf, n.get("GPU", 0.0) / gpus if gpus else math.inf) + 1e-9)
            if cpus or gpus
            else 1
            for n in nodes
        )

    have = f"the cluster's {describe_nodes(nodes)}"
    for method in spec.methods:
        res = spec.resources_of(method)
        ask = f"{res.cpus_per_worker:g} CPU and {res.gpus_per_worker:g} GPU on one node"
        if spec.uses_ray_train(method):
            if (room := fits(res.cpus_per_worker, res.gpus_per_worker)) < res.workers:
                return (
                    f"sweep: a {method} trial trains on {res.workers} Ray Train workers of {ask} each; {have}, room for {room}: "
                    "give the cluster such nodes, or change the sweep file's resources"
                )
        elif not fits(res.cpus_per_worker, res.gpus_per_worker):
            return (
                f"sweep: a {method} trial's process asks for {ask}; {have}: give the cluster such a node, or change the "
                f"sweep file's resources"
            )
    b = spec.baselines
    solved = (
        (["bound"] if b.bound else [])
        + (["decomposition bound"] if b.decomposition else [])
        + (["decomposition-lookahead"] if b.lookahead else [])
        + [m.name for m in b.milp if spec.milp_sizes(m)]
    )
    if solved and not fits(1.0, 0.0):
        return f"sweep: the solver workers of the baselines ({', '.join(solved)}) ask for 1 CPU on one node; {have}"
    return None


def describe_nodes(nodes: list[dict[str, float]]) -> str:
    """'3 nodes: 1 with 0 CPU and 0 GPU, 2 with 1 CPU and 0 GPU'."""
    shapes = Counter((n.get("CPU", 0.0), n.get("GPU", 0.0)) for n in nodes)
    parts = [f"{count} with {cpu:g} CPU and {gpu:g} GPU" for (cpu, gpu), count in sorted(shapes.items())]
    return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}: {', '.join(parts) or 'none'}"
