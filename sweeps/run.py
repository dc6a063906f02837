"""Run a sweep into one results directory (the contract that platform/report.py reads):

  sweep.json          the sweep file, package versions, git commit, hardware, start and end time, the
                      instance hash of every size
  instances/n<N>.json the paper instance of every size
  trials/<method>-n<N>-s<seed>/   a run folder (trainers/run.py) with greedy/ and sampled/ evaluations
  baselines/n<N>/<name>/          an evaluation folder (classical-best, dp-optimal, bound, MILPs)
  trials.parquet      one row per trial: method, n, seed, status, reason, updates, wall_seconds,
                      transitions_per_second, greedy_mean, greedy_se, sampled_mean, sampled_se, checkpoint
  curves.parquet      every trial's curve: method, n, seed, update, cost10, wall_seconds
  baselines.parquet   n, name, mean, se, episodes, horizon, seconds_per_decision
  tune/trials-<k>/    Tune's experiment folders (TensorBoard event files of every trial)

A results directory holds one sweep: another sweep file is refused. Finished trials and baselines are
never run again (a baseline is finished when its folder reads whole; a trial when training.json and
both evaluations do); interrupted trials continue from their checkpoints. The three tables are rebuilt
from the folders at the end of every run, so a killed driver leaves no duplicate rows.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Optional

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import yaml

from envs.cli import read_text
from envs.errors import InputError
from envs.evaluation import evaluate
from envs.exogenous import HELDOUT_SEED, sample_paths
from envs.instance import Instance, atomic_write_text, paper_instance
from envs.results import manifest, read_evaluation, read_record, write_evaluation, write_parquet
from sweeps.spec import MilpBaseline, SweepSpec, Trial

SWEEP_FORMAT = "or-transformer-platform/sweep"
SCHEMA_VERSION = 1


def read_spec(path) -> tuple[SweepSpec, dict]:
    """The validated spec and the file's content (kept in sweep.json)."""
    text = read_text(path, "sweep file")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"sweep file '{path}' is not valid YAML: {str(exc).splitlines()[0]}") from None
    try:
        data = json.loads(json.dumps(data))  # as sweep.json will hold it (mapping keys become strings)
    except (TypeError, ValueError) as exc:
        raise InputError(f"sweep file '{path}': holds a value that is not plain data ({exc})") from None
    return SweepSpec.from_dict(data), data


def open_results(out: Path, data: dict, resume: bool) -> dict:
    """Check that `out` can hold this sweep; return sweep.json's content (the existing one on resume)."""
    path = out / "sweep.json"
    if path.exists():
        old = read_record(path, SWEEP_FORMAT, SCHEMA_VERSION, "sweep record", "use another --out")
        if old.get("sweep") != data:
            raise InputError(f"results directory '{out}' holds another sweep (its sweep file differs from this one): use another --out")
        if not resume:
            raise InputError(f"results directory '{out}' already holds this sweep: continue it with --resume, or use another --out")
        return old
    if resume:
        raise InputError(f"results directory '{out}' holds no sweep to resume (no sweep.json): run without --resume")
    if out.exists() and any(out.iterdir()):
        raise InputError(f"results directory '{out}' is not empty and holds no sweep: use a new or empty --out")
    return {"format": SWEEP_FORMAT, "version": SCHEMA_VERSION, "sweep": data, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def instances(spec: SweepSpec, out: Path) -> dict[int, Instance]:
    result = {}
    for n in spec.sizes:
        inst = paper_instance(n, spec.instance_seed)
        path = out / "instances" / f"n{n}.json"
        if not path.exists():
            inst.save(path)
        result[n] = inst
    return result


# ---- baselines ------------------------------------------------------------------------------------


def finished(folder: Path, instance: Instance, episodes: int, horizon: int) -> bool:
    """A whole evaluation folder of this instance, episodes and horizon (anything else is redone)."""
    try:
        s = read_evaluation(folder)["summary"]
    except InputError:
        return False
    return s["instance_hash"] == instance.content_hash() and s["episodes"] == episodes and s["horizon"] == horizon


def run_baselines(spec: SweepSpec, out: Path, insts: dict[int, Instance], log) -> None:
    """Every size's baselines, each skipped when its folder is already whole (the solver journals resume)."""
    from envs.classical import tuned_policy
    from envs.dp_optimal import dp_optimal_policy
    from solver_workers.backends import SolverOptions
    from solver_workers.runs import bound_journal, milp_journal, run_bound, run_milp

    b, episodes, horizon = spec.baselines, spec.episodes, spec.horizon
    for n, inst in insts.items():
        base = out / "baselines" / f"n{n}"
        named = []
        if b.classical_best:
            named.append(("classical-best", lambda inst=inst: tuned_policy(inst, "classical-best", horizon)))
        if b.dp_optimal and n == 1:
            named.append(("dp-optimal", lambda inst=inst: dp_optimal_policy(inst, horizon)))
        for name, make in named:
            if finished(base / name, inst, episodes, horizon):
                continue
            log(f"baseline n={n} {name}")
            policy, params = make()
            result = evaluate(policy, inst.to_torch(), sample_paths(inst, HELDOUT_SEED, episodes, horizon))
            write_evaluation(base / name, name, result, HELDOUT_SEED, {"sweep": True, "n": n}, params, instance=inst)
        if b.bound is not None and not finished(base / "bound", inst, episodes, horizon):
            log(f"baseline n={n} perfect-information bound")
            options = SolverOptions(b.bound["solver"], b.bound["time_limit"], 0.0, b.bound["threads"])
            journal = bound_journal(base / "bound", inst, HELDOUT_SEED, horizon, options)
            run_bound(base / "bound", inst, journal, options, HELDOUT_SEED, episodes, horizon, b.solver_workers)
        for m in b.milp:
            if m.sizes is not None and n not in m.sizes:
                continue
            m_episodes, m_horizon = m.episodes or episodes, m.horizon or horizon
            if finished(base / m.name, inst, m_episodes, m_horizon):
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


def trial_done(folder: Path) -> bool:
    if not (folder / "training.json").is_file():
        return False
    try:
        for mode in ("greedy", "sampled"):
            read_evaluation(folder / mode)
    except InputError:
        return False
    return True


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
    unused by them and starve them: shared/notes on Ray 2.60)."""
    if config["workers"]:
        return {"cpu": 0.01}
    return {"cpu": config["cpus_per_worker"], "gpu": config["gpus_per_worker"]}


def trial_config(spec: SweepSpec, out: Path, trial: Trial) -> dict:
    res = spec.resources_of(trial.method)
    return {"name": trial.name, "method": trial.method, "n": trial.n, "seed": trial.seed, "folder": str(out / "trials" / trial.name),
            "instance": str(out / "instances" / f"n{trial.n}.json"), "preset": spec.preset, "overrides": spec.overrides_of(trial.method),
            "episodes": spec.episodes, "horizon": spec.horizon, "device": spec.device,
            "workers": res.workers if spec.uses_ray_train(trial.method) else 0, "use_gpu": res.gpus_per_worker > 0,
            "cpus_per_worker": res.cpus_per_worker, "gpus_per_worker": res.gpus_per_worker}


def run_trials(spec: SweepSpec, out: Path, log) -> dict[str, str]:
    """Run the trials that are not finished in one Tune experiment; returns the error of each failed trial."""
    from ray import tune

    pending = [trial_config(spec, out, t) for t in spec.trials() if not trial_done(out / "trials" / t.name)]
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
    results = tuner.fit()
    return {r.config["name"]: str(r.error).strip().splitlines()[-1] for r in results if r.error is not None}


# ---- tables ---------------------------------------------------------------------------------------


def trial_row(spec: SweepSpec, out: Path, trial: Trial, errors: dict[str, str]) -> dict[str, Any]:
    folder = out / "trials" / trial.name
    row: dict[str, Any] = {"method": trial.method, "n": trial.n, "seed": trial.seed, "status": "pending", "reason": None, "updates": 0,
                           "wall_seconds": None, "transitions_per_second": None, "greedy_mean": None, "greedy_se": None,
                           "sampled_mean": None, "sampled_se": None, "checkpoint": None}
    training = None
    if (folder / "training.json").is_file():
        training = json.loads((folder / "training.json").read_text())
        config = training["manifest"]["config"]
        row.update(status=training["status"], reason=training["reason"], updates=training["updates_done"], wall_seconds=training["wall_seconds"])
        if training["wall_seconds"]:
            row["transitions_per_second"] = training["updates_done"] * config["batch"] * config["rollout"] / training["wall_seconds"]
        row["checkpoint"] = str((folder / "checkpoint.pt").relative_to(out))
    if training is not None and trial_done(folder):
        for mode in ("greedy", "sampled"):
            s = read_evaluation(folder / mode)["summary"]
            row[f"{mode}_mean"], row[f"{mode}_se"] = s["mean"], s["se"]
    elif trial.name in errors:
        row.update(status="failed", reason=errors[trial.name])
    elif training is not None or (folder / "checkpoint.pt").exists():
        row.update(status="interrupted", reason="the sweep stopped before this trial finished; --resume continues it")
    return row


def write_tables(spec: SweepSpec, out: Path, errors: dict[str, str]) -> list[dict[str, Any]]:
    rows = [trial_row(spec, out, t, errors) for t in spec.trials()]
    write_parquet(pa.Table.from_pylist(rows, schema=TRIALS_SCHEMA), out / "trials.parquet")
    curves = []
    for t in spec.trials():
        path = out / "trials" / t.name / "curve.parquet"
        if path.is_file():
            curves.append(pq.read_table(path).select(["method", "n", "seed", "update", "cost10", "wall_seconds"]).cast(CURVES_SCHEMA))
    write_parquet(pa.concat_tables(curves) if curves else CURVES_SCHEMA.empty_table(), out / "curves.parquet")
    baselines = []
    for folder in sorted((out / "baselines").glob("n*/*")):
        try:
            s = read_evaluation(folder)["summary"]
        except InputError:
            continue
        decisions = s.get("decisions", {})
        baselines.append({"n": s["n"], "name": folder.name, "mean": s["mean"], "se": s["se"], "episodes": s["episodes"], "horizon": s["horizon"],
                          "seconds_per_decision": decisions.get("solve_seconds_mean")})
    write_parquet(pa.Table.from_pylist(baselines, schema=BASELINES_SCHEMA), out / "baselines.parquet")
    return rows


TRIALS_SCHEMA = pa.schema([("method", pa.string()), ("n", pa.int64()), ("seed", pa.int64()), ("status", pa.string()), ("reason", pa.string()),
                           ("updates", pa.int64()), ("wall_seconds", pa.float64()), ("transitions_per_second", pa.float64()),
                           ("greedy_mean", pa.float64()), ("greedy_se", pa.float64()), ("sampled_mean", pa.float64()), ("sampled_se", pa.float64()),
                           ("checkpoint", pa.string())])
CURVES_SCHEMA = pa.schema([("method", pa.string()), ("n", pa.int64()), ("seed", pa.int64()), ("update", pa.int64()), ("cost10", pa.float64()),
                           ("wall_seconds", pa.float64())])
BASELINES_SCHEMA = pa.schema([("n", pa.int64()), ("name", pa.string()), ("mean", pa.float64()), ("se", pa.float64()), ("episodes", pa.int64()),
                              ("horizon", pa.int64()), ("seconds_per_decision", pa.float64())])


def run_sweep(spec: SweepSpec, data: dict, out: Path, resume: bool = False, log=print, connect=lambda: None) -> Optional[list[dict[str, Any]]]:
    """Run (or continue) the sweep in `out`; returns the trial rows, or None when a resumed sweep had nothing left.
    `connect()` reaches Ray (solver_workers.ray_session.init_ray) once there is work to do."""
    out = out.resolve()  # trials run in other working directories
    record = open_results(out, data, resume)
    insts = instances(spec, out)
    if resume and record.get("finished") and all(trial_done(out / "trials" / t.name) for t in spec.trials()):
        log(f"the sweep in '{out}' is finished: nothing to do")
        return None
    connect()
    for line in dry_run(spec, cluster_resources()):
        log(line)
    record.update(manifest(data) | {"instance_hashes": {f"n{n}": inst.content_hash() for n, inst in insts.items()}})
    record.pop("finished", None)
    atomic_write_text(out / "sweep.json", json.dumps(record, indent=1) + "\n")
    run_baselines(spec, out, insts, log)
    errors = run_trials(spec, out, log)
    rows = write_tables(spec, out, errors)
    if all(r["status"] in ("completed", "diverged") for r in rows):
        record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    atomic_write_text(out / "sweep.json", json.dumps(record, indent=1) + "\n")
    return rows


def dry_run(spec: SweepSpec, cluster: dict[str, float]) -> list[str]:
    """What the sweep would run, and the resources each trial asks for; refuses a trial that no node of
    `cluster` (total CPUs and GPUs) could ever hold."""
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
        + (["perfect-information bound"] if b.bound else []) + [m.name for m in b.milp]
    lines.append(f"baselines per size: {', '.join(names) or 'none'}; solver pool of {b.solver_workers} workers")
    hours = sum(training_hours(spec, t) for t in spec.trials())
    lines.append(f"training: about {hours:,.1f} learner-hours on CPU cores (from THROUGHPUT, measured on this project's 2-core machine; a GPU is far faster)")
    milp_hours = sum((m.episodes or spec.episodes) * (m.horizon or spec.horizon) * m.time_limit / 3600
                     for m in b.milp for n in spec.sizes if m.sizes is None or n in m.sizes)
    lines.append(f"MILP decisions at most {milp_hours:,.1f} solver-hours (every decision at its time limit)")
    return lines


THROUGHPUT = {"or-transformer": 1662.0, "hpo": 25375.0, "ppo": 4381.0, "transformer-ppo": 536.0}
"""Transitions per second of one CPU learner at n = 16, B = 128 (`python bench/rllib.py`, README); taken as
inversely proportional to n above 16, for the dry run's estimate only."""


def training_hours(spec: SweepSpec, trial: Trial) -> float:
    from trainers.registry import method_config

    config = method_config(trial.method, spec.preset, spec.overrides_of(trial.method))
    rate = THROUGHPUT[trial.method] * min(1.0, 16 / trial.n)
    return config.updates * config.batch * config.rollout / rate / 3600


def cluster_resources() -> dict[str, float]:
    """Total CPUs and GPUs of the cluster Ray is connected to (or of this machine, without Ray)."""
    import ray

    if ray.is_initialized():
        return {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
    return {"CPU": float(os.cpu_count() or 1), "GPU": float(torch.cuda.device_count())}
