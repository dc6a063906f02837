"""Run a sweep into one results directory (layout, writer and reader: sweeps/results_dir.py).

Finished trials and baselines are never run again; interrupted trials continue from their checkpoints.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Optional

import torch

from envs.cli import read_text
from envs.errors import InputError
from envs.evaluation import evaluate
from envs.exogenous import HELDOUT_SEED, sample_paths
from envs.instance import Instance
from envs.results import manifest, write_evaluation
from envs.validate import load_yaml
from sweeps.results_dir import (FINISHED, baseline_done, instance_path, open_results, trial_done, trial_folder, write_instances, write_record,
                                write_tables)
from sweeps.spec import MilpBaseline, SweepSpec, Trial


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
    from envs.classical import tuned_policy
    from envs.dp_optimal import dp_optimal_policy
    from solver_workers.backends import SolverOptions
    from solver_workers.decomposition import NAME as DECOMPOSITION, DecompositionOptions
    from solver_workers.runs import bound_journal, decomposition_journal, milp_journal, run_bound, run_decomposition_bound, run_milp

    b, episodes, horizon = spec.baselines, spec.episodes, spec.horizon
    for n, inst in insts.items():
        base = out / "baselines" / f"n{n}"
        named = []
        if b.classical_best:
            named.append(("classical-best", lambda inst=inst: tuned_policy(inst, "classical-best", horizon)))
        if b.dp_optimal and n == 1:
            named.append(("dp-optimal", lambda inst=inst: dp_optimal_policy(inst, horizon)))
        for name, make in named:
            if baseline_done(base / name, inst, episodes, horizon):
                continue
            log(f"baseline n={n} {name}")
            policy, params = make()
            result = evaluate(policy, inst.to_torch(), sample_paths(inst, HELDOUT_SEED, episodes, horizon))
            write_evaluation(base / name, name, result, HELDOUT_SEED, {"sweep": True, "n": n}, params, instance=inst)
        if b.bound is not None and not baseline_done(base / "bound", inst, episodes, horizon):
            log(f"baseline n={n} perfect-information bound")
            options = SolverOptions(b.bound["solver"], b.bound["time_limit"], 0.0, b.bound["threads"])
            journal = bound_journal(base / "bound", inst, HELDOUT_SEED, horizon, options)
            run_bound(base / "bound", inst, journal, options, HELDOUT_SEED, episodes, horizon, b.solver_workers)
        if b.decomposition is not None and not baseline_done(base / DECOMPOSITION, inst, episodes, horizon):
            log(f"baseline n={n} decomposition bound")
            options = DecompositionOptions(**b.decomposition)
            journal = decomposition_journal(base / DECOMPOSITION, inst, HELDOUT_SEED, horizon, episodes, options)
            run_decomposition_bound(base / DECOMPOSITION, inst, journal, options, HELDOUT_SEED, episodes, horizon, b.solver_workers)
        for m in b.milp:
            if m.sizes is not None and n not in m.sizes:
                continue
            m_episodes, m_horizon = m.episodes or episodes, m.horizon or horizon
            if baseline_done(base / m.name, inst, m_episodes, m_horizon):
                continue
            log(f"baseline n={n} {m.name}")
            options = milp_options(m)
            journal = milp_journal(base / m.name, inst, HELDOUT_SEED, options)
            run_milp(base / m.name, inst, journal, options, HELDOUT_SEED, m_episodes, m_horizon, b.solver_workers)


def milp_options(m: MilpBaseline):
    from solver_workers.backends import SolverOptions
    from solver_workers.rolling import RollingOptions

    return RollingOptions(m.scenarios, m.plan_horizon, SolverOptions(m.solver, m.time_limit, m.gap, m.threads))


# ---- trials ---------------------------------------------------------------------------------------


def run_trial(config: dict, trials: dict[str, dict]) -> None:
    """Tune's function trainable: one (method, n, seed) run and its held-out evaluation, continuing from
    the trial folder's checkpoint when a retry or a resumed sweep finds one."""
    from ray import tune

    from trainers.experiment import run_experiment

    torch.set_num_threads(1)
    config = trials[config["name"]]
    out = Path(config["folder"])
    mode = "resume" if (out / "checkpoint.pt").exists() else ("overwrite" if out.exists() else "new")

    def on_update(update: int, metrics: dict[str, float]) -> None:
        tune.report({"update": update, "cost10": metrics["cost10"]})

    summary = run_experiment(config["method"], Instance.load(config["instance"]), out, preset=config["preset"], seed=config["seed"],
                             overrides=config["overrides"], mode=mode, episodes=config["episodes"], horizon=config["horizon"],
                             device=config["device"], progress=False, workers=config["workers"] or None, use_gpu=config["use_gpu"],
                             on_update=on_update, resources_per_worker={k: v for k, v in (("CPU", config["cpus_per_worker"]), ("GPU", config["gpus_per_worker"])) if v})
    tune.report({"update": summary["training"]["updates_done"], "greedy_mean": summary["greedy"]["mean"], "sampled_mean": summary["sampled"]["mean"]})


def trial_resources(config: dict) -> dict[str, float]:
    """The trial process holds the CPUs/GPUs of its learner; with Ray Train it holds almost nothing, since the
    Train workers ask Ray for their own resources (a reservation in the trial's placement group would stay
    unused by them: on a 2-CPU machine two trials holding a CPU each leave their Train workers none)."""
    if config["workers"]:
        return {"cpu": 0.01}
    return {"cpu": config["cpus_per_worker"], "gpu": config["gpus_per_worker"]}


def trial_config(spec: SweepSpec, out: Path, trial: Trial) -> dict:
    res = spec.resources_of(trial.method)
    return {"name": trial.name, "method": trial.method, "n": trial.n, "seed": trial.seed, "folder": str(trial_folder(out, trial)),
            "instance": str(instance_path(out, trial.n)), "preset": spec.preset, "overrides": spec.overrides_of(trial.method),
            "episodes": spec.episodes, "horizon": spec.horizon, "device": spec.device,
            "workers": res.workers if spec.uses_ray_train(trial.method) else 0, "use_gpu": res.gpus_per_worker > 0,
            "cpus_per_worker": res.cpus_per_worker, "gpus_per_worker": res.gpus_per_worker}


def run_trials(spec: SweepSpec, out: Path, log) -> dict[str, str]:
    """Run the trials that are not finished in one Tune experiment; returns the error of each failed trial."""
    from ray import tune

    pending = [trial_config(spec, out, t) for t in spec.trials() if not trial_done(trial_folder(out, t))]
    if not pending:
        return {}
    storage = (out / "tune").resolve()
    attempt = 1 + (len(list(storage.glob("trials-*"))) if storage.exists() else 0)
    log(f"{len(pending)} trials to run ({len(spec.trials()) - len(pending)} finished), {spec.concurrency} at a time")
    trials = {c["name"]: c for c in pending}
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(run_trial, trials=trials), lambda config: trial_resources(trials[config["name"]])),
        param_space={"name": tune.grid_search(list(trials))},
        tune_config=tune.TuneConfig(max_concurrent_trials=spec.concurrency, trial_name_creator=lambda t: t.config["name"],
                                    trial_dirname_creator=lambda t: t.config["name"]),
        run_config=tune.RunConfig(name=f"trials-{attempt}", storage_path=str(storage), failure_config=tune.FailureConfig(max_failures=spec.retries),
                                  verbose=1),
    )
    # Tune's own SIGINT handler would end fit() normally, with its Tuner.restore hint; without it Ctrl-C raises
    # KeyboardInterrupt here, and platform/sweep.py says how to go on with --resume (exit status 130).
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    results = tuner.fit()
    return {r.config["name"]: str(r.error).strip().splitlines()[-1] for r in results if r.error is not None}


def run_sweep(spec: SweepSpec, data: dict, out: Path, resume: bool = False, log=print, connect=lambda: None) -> Optional[list[dict[str, Any]]]:
    """Run (or continue) the sweep in `out`; returns the trial rows, or None when a resumed sweep had nothing left.
    `connect()` reaches Ray (solver_workers.ray_session.init_ray) once there is work to do."""
    out = out.resolve()  # trials run in other working directories
    record = open_results(out, data, resume)
    insts = write_instances(spec, out)
    if resume and record.get("finished") and all(trial_done(trial_folder(out, t)) for t in spec.trials()):
        log(f"the sweep in '{out}' is finished: nothing to do")
        return None
    connect()
    for line in dry_run(spec, cluster_resources()):
        log(line)
    record.update(manifest(data) | {"instance_hashes": {f"n{n}": inst.content_hash() for n, inst in insts.items()}})
    record.pop("finished", None)
    write_record(out, record)
    run_baselines(spec, out, insts, log)
    errors = run_trials(spec, out, log)
    rows = write_tables(spec, out, errors)
    if all(r["status"] in FINISHED for r in rows):
        record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_record(out, record)
    return rows


def dry_run(spec: SweepSpec, cluster: dict[str, float]) -> list[str]:
    """What the sweep would run, and the resources each trial asks for; refuses a trial that no node of
    `cluster` (total CPUs and GPUs) could ever hold, and notes a Gurobi baseline above the licence's size limit
    (run_sweep prints these lines too, so a run refuses and warns exactly as its dry run)."""
    from solver_workers.backends import licence_note
    from solver_workers.model import stock_columns

    lines = [f"{len(spec.trials())} trials ({len(spec.methods)} methods x {len(spec.sizes)} sizes x {len(spec.seeds)} seeds), "
             f"{spec.concurrency} at a time, {spec.retries} retries each; preset '{spec.preset}' on {spec.device}"]
    for method in spec.methods:
        res = spec.resources_of(method)
        workers = res.workers if spec.uses_ray_train(method) else 0
        cpus, gpus = max(workers, 1) * res.cpus_per_worker, max(workers, 1) * res.gpus_per_worker
        if gpus > cluster.get("GPU", 0) or cpus > cluster.get("CPU", 0):
            raise InputError(f"sweep: a {method} trial asks for {cpus:g} CPUs and {gpus:g} GPUs; the cluster has "
                             f"{cluster.get('CPU', 0):g} CPUs and {cluster.get('GPU', 0):g} GPUs")
        where = f"{workers} Ray Train workers" if workers else "the trial process"
        lines.append(f"  {method}: {cpus:g} CPU, {gpus:g} GPU per trial ({where})")
    b = spec.baselines
    names = (["classical-best"] if b.classical_best else []) + (["dp-optimal (n = 1)"] if b.dp_optimal and 1 in spec.sizes else []) \
        + (["perfect-information bound"] if b.bound else []) + (["decomposition bound"] if b.decomposition else []) + [m.name for m in b.milp]
    lines.append(f"baselines per size: {', '.join(names) or 'none'}; solver pool of {b.solver_workers} workers")
    hours = sum(training_hours(spec, t) for t in spec.trials())
    lines.append(f"training: about {hours:,.1f} learner-hours on CPU cores "
                 "(each method's throughput in trainers/registry.py, measured on this project's 2-core machine; a GPU is far faster)")
    milp_hours = sum((m.episodes or spec.episodes) * (m.horizon or spec.horizon) * m.time_limit / 3600 for m in b.milp for n in spec.milp_sizes(m))
    lines.append(f"MILP decisions at most {milp_hours:,.1f} solver-hours (every decision at its time limit)")
    for m in b.milp:
        for n in spec.milp_sizes(m):
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


def cluster_resources() -> dict[str, float]:
    """Total CPUs and GPUs of the cluster Ray is connected to (or of this machine, without Ray)."""
    import ray

    if ray.is_initialized():
        return {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
    return {"CPU": float(os.cpu_count() or 1), "GPU": float(torch.cuda.device_count())}
