"""A sweep's results directory: its layout and schema, the writer (sweeps/runner.py) and the reader
(sweeps/report.py), in one place.

  sweep.json          the sweep file, package versions, git commit, hardware, start and end time, the
                      instance hash of every size
  instances/n<N>.json the paper instance of every size
  trials/<method>-n<N>-s<seed>/   a run folder (trainers/run_folder.py) with greedy/ and sampled/ evaluations
  baselines/n<N>/<name>/          an evaluation folder (classical-best, dp-optimal, bound, MILPs)
  attempts/<method>-n<N>-s<seed>.jsonl   every attempt of the trial (retries and resumed runs): a start line
                      written by the attempt's process when it begins, with its node, and an end line when it
                      ends (`start_attempt`, `end_attempt`)
  trials.parquet      one row per trial: method, n, seed, status, reason, updates, wall_seconds,
                      transitions_per_second, greedy_mean, greedy_se, sampled_mean, sampled_se, checkpoint,
                      attempts, node_id, node_name (of the last attempt)
  attempts.parquet    one row per attempt: method, n, seed, attempt, trial_id, node_id, node_ip, node_name, pid (of
                      the trial's process), started, ended, outcome (completed | failed: <error> | lost),
                      train_node_ids, train_node_names (its Ray Train workers' nodes, known when it ended)
  curves.parquet      every trial's curve: method, n, seed, update, cost10, wall_seconds
  baselines.parquet   n, name, mean, se, episodes, horizon, seconds_per_decision (a MILP's: `seconds_per_decision`)
  tune/trials-<k>/    Tune's experiment folders (TensorBoard event files of every trial)

A results directory holds one sweep: another sweep file is refused. A baseline is finished when its
folder reads whole, a trial when training.json and both evaluations do. The three tables are rebuilt
from the folders at the end of every run, so a killed driver leaves no duplicate rows.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from envs.instance import Instance, paper_instance
from plumbing.errors import InputError
from plumbing.files import atomic_write_text, read_parquet
from plumbing.validate import differences
from run_results.records import append_json_line, json_line, read_evaluation, read_record, write_parquet
from sweeps.spec import SweepSpec, Trial
from trainers.checkpoint import LAST, checkpoint_file

SWEEP_FORMAT = "or-transformer-platform/sweep"
SCHEMA_VERSION = 2
"""Version 2 added the attempts (attempts/, attempts.parquet, trials.parquet's attempts, node_id, node_name).
A directory of version 1 reads with those empty, and a resumed one becomes version 2 (its tables are rebuilt)."""
READ_VERSIONS = (1, SCHEMA_VERSION)
OPENINGS = ("greedy", "sampled")
"""The held-out evaluations of a trial (trainers.experiment), each a folder of the trial's run folder."""
FINISHED = ("completed", "diverged")
"""Trial statuses that have a checkpoint and both evaluations (a diverged run keeps its last checkpoint)."""

TRIALS_SCHEMA = pa.schema(
    [
        ("method", pa.string()),
        ("n", pa.int64()),
        ("seed", pa.int64()),
        ("status", pa.string()),
        ("reason", pa.string()),
        ("updates", pa.int64()),
        ("wall_seconds", pa.float64()),
        ("transitions_per_second", pa.float64()),
        ("greedy_mean", pa.float64()),
        ("greedy_se", pa.float64()),
        ("sampled_mean", pa.float64()),
        ("sampled_se", pa.float64()),
        ("checkpoint", pa.string()),
        ("attempts", pa.int64()),
        ("node_id", pa.string()),
        ("node_name", pa.string()),
    ]
)
ATTEMPTS_SCHEMA = pa.schema(
    [
        ("method", pa.string()),
        ("n", pa.int64()),
        ("seed", pa.int64()),
        ("attempt", pa.int64()),
        ("trial_id", pa.string()),
        ("node_id", pa.string()),
        ("node_ip", pa.string()),
        ("node_name", pa.string()),
        ("pid", pa.int64()),
        ("started", pa.string()),
        ("ended", pa.string()),
        ("outcome", pa.string()),
        ("train_node_ids", pa.list_(pa.string())),
        ("train_node_names", pa.list_(pa.string())),
    ]
)
ADDED_IN_2 = ("attempts", "node_id", "node_name")
"""The columns of trials.parquet that version 1 lacked."""
LOST = "lost"
"""The outcome of an attempt without an end line: its process died (its node was lost, or the driver was killed)."""
CURVES_SCHEMA = pa.schema(
    [
        ("method", pa.string()),
        ("n", pa.int64()),
        ("seed", pa.int64()),
        ("update", pa.int64()),
        ("cost10", pa.float64()),
        ("wall_seconds", pa.float64()),
    ]
)
BASELINES_SCHEMA = pa.schema(
    [
        ("n", pa.int64()),
        ("name", pa.string()),
        ("mean", pa.float64()),
        ("se", pa.float64()),
        ("episodes", pa.int64()),
        ("horizon", pa.int64()),
        ("seconds_per_decision", pa.float64()),
    ]
)


def trial_folder(out: Path, trial: Trial) -> Path:
    return out / "trials" / trial.name


def baseline_folder(out: Path, n: int, name: str) -> Path:
    return out / "baselines" / f"n{n}" / name


def instance_path(out: Path, n: int) -> Path:
    return out / "instances" / f"n{n}.json"


def attempts_path(out: Path, name: str) -> Path:
    return out / "attempts" / f"{name}.jsonl"


# ---- writing --------------------------------------------------------------------------------------


def open_results(out: Path, data: dict, resume: bool) -> dict:
    """Check that `out` can hold this sweep; return sweep.json's content (the existing one on resume)."""
    path = out / "sweep.json"
    if path.exists():
        old = read_sweep_record(path, "use another --out")
        if old.get("sweep") != data:
            raise InputError(
                f"results directory '{out}' holds another sweep; its sweep file differs from this one in "
                f"{'; '.join(differences(old.get('sweep'), data))}: resume with that file, or use another --out"
            )
        if not resume:
            raise InputError(f"results directory '{out}' already holds this sweep: continue it with --resume, or use another --out")
        return {**old, "version": SCHEMA_VERSION}  # the tables are rebuilt in this version's schema
    if resume:
        raise InputError(f"results directory '{out}' holds no sweep to resume (no sweep.json): run without --resume")
    if out.exists() and any(out.iterdir()):
        raise InputError(f"results directory '{out}' is not empty and holds no sweep: use a new or empty --out")
    return {"format": SWEEP_FORMAT, "version": SCHEMA_VERSION, "sweep": data, "started": _now()}


def read_sweep_record(path: Path, hint: str) -> dict:
    """sweep.json of a version this code reads (READ_VERSIONS); another is refused naming this code's version."""
    for version in READ_VERSIONS[:-1]:
        try:
            return read_record(path, SWEEP_FORMAT, version, "sweep record", hint)
        except InputError:
            pass
    return read_record(path, SWEEP_FORMAT, SCHEMA_VERSION, "sweep record", hint)


def write_record(out: Path, record: dict) -> None:
    atomic_write_text(out / "sweep.json", json.dumps(record, indent=1) + "\n")


def write_instances(spec: SweepSpec, out: Path) -> dict[int, Instance]:
    """The paper instance of every size, saved once into instances/."""
    result = {}
    for n in spec.sizes:
        inst = paper_instance(n, spec.instance_seed)
        path = instance_path(out, n)
        if not path.exists():
            inst.save(path)
        result[n] = inst
    return result


def baseline_done(folder: Path, instance: Instance, episodes: int, horizon: int) -> bool:
    """A whole evaluation folder of this instance, episodes and horizon (anything else is redone)."""
    try:
        s = read_evaluation(folder)["summary"]
    except InputError:
        return False
    return s["instance_hash"] == instance.content_hash() and s["episodes"] == episodes and s["horizon"] == horizon


def seconds_per_decision(folder: Path) -> float | None:
    """MILP seconds per decision (docs/formats.md): the mean over the decisions in the baseline folder's
    decisions.parquet of build_seconds + solve_seconds, since the rolling MILP samples its scenarios and
    builds its model anew at every decision (solver_workers.rolling.decide); None without decisions.parquet."""
    path = folder / "decisions.parquet"
    if not path.is_file():
        return None
    table = pq.read_table(path, columns=["build_seconds", "solve_seconds"])
    return float(np.mean(table.column("build_seconds").to_numpy() + table.column("solve_seconds").to_numpy()))


def trial_done(folder: Path) -> bool:
    if not (folder / "training.json").is_file():
        return False
    try:
        for mode in OPENINGS:
            read_evaluation(folder / mode)
    except InputError:
        return False
    return True


# ---- attempts -------------------------------------------------------------------------------------


def start_attempt(out: Path, name: str, where: dict[str, Any]) -> int:
    """Append the start line of a new attempt of trial `name`, run by a process on the node `where` describes
    (node_id, node_ip, node_name, pid, trial_id); returns the attempt's number, 1 for the first. Tune runs the
    attempts of a trial one after another, so the next number is one more than the start lines so far."""
    path = attempts_path(out, name)
    attempt = 1 + sum(line.get("event") == "start" for line in _jsonl(path))
    _append(path, {"event": "start", "attempt": attempt, "time": _now(), **where})
    return attempt


def end_attempt(out: Path, name: str, attempt: int, outcome: str, train_nodes: list[dict[str, str]]) -> None:
    """Append the end line of attempt `attempt`: its outcome, `completed` or `failed: <error>`, and the nodes
    (node_id, node_name) of the Ray Train workers it ran (none for a trial that trains in its own process)."""
    _append(attempts_path(out, name), {"event": "end", "attempt": attempt, "time": _now(), "outcome": outcome, "train_nodes": train_nodes})


def trial_attempts(out: Path, trial: Trial) -> list[dict[str, Any]]:
    """Every attempt of `trial` in order, as rows of ATTEMPTS_SCHEMA; an attempt without an end line is LOST."""
    starts, ends = {}, {}
    for line in _jsonl(attempts_path(out, trial.name)):
        (starts if line.get("event") == "start" else ends).setdefault(line.get("attempt"), line)
    rows = []
    for number, start in sorted((k, v) for k, v in starts.items() if isinstance(k, int)):
        end = ends.get(number, {})
        rows.append(
            {
                "method": trial.method,
                "n": trial.n,
                "seed": trial.seed,
                "attempt": number,
                **{k: start.get(k) for k in ("trial_id", "node_id", "node_ip", "node_name", "pid")},
                "started": start.get("time"),
                "ended": end.get("time"),
                "outcome": end.get("outcome", LOST),
                "train_node_ids": [t.get("node_id") for t in end.get("train_nodes", [])],
                "train_node_names": [t.get("node_name") for t in end.get("train_nodes", [])],
            }
        )
    return rows


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _append(path: Path, line: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    append_json_line(path, line)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, skipping a torn line; none when the file does not exist."""
    if not path.is_file():
        return []
    lines = (json_line(text) for text in path.read_text(encoding="utf-8", errors="replace").splitlines())
    return [line for line in lines if isinstance(line, dict)]


# ---- tables ---------------------------------------------------------------------------------------


def trial_row(out: Path, trial: Trial, errors: dict[str, str], attempts: list[dict[str, Any]]) -> dict[str, Any]:
    folder = trial_folder(out, trial)
    last = attempts[-1] if attempts else {}
    row: dict[str, Any] = {
        "method": trial.method,
        "n": trial.n,
        "seed": trial.seed,
        "status": "pending",
        "reason": None,
        "updates": 0,
        "wall_seconds": None,
        "transitions_per_second": None,
        "greedy_mean": None,
        "greedy_se": None,
        "sampled_mean": None,
        "sampled_se": None,
        "checkpoint": None,
        "attempts": len(attempts),
        "node_id": last.get("node_id"),
        "node_name": last.get("node_name"),
    }
    training = None
    if (folder / "training.json").is_file():
        training = json.loads((folder / "training.json").read_text())
        config = training["manifest"]["config"]
        row.update(
            status=training["status"], reason=training["reason"], updates=training["updates_done"], wall_seconds=training["wall_seconds"]
        )
        if training["wall_seconds"]:
            row["transitions_per_second"] = training["updates_done"] * config["batch"] * config["rollout"] / training["wall_seconds"]
        if (folder / LAST).is_file():
            row["checkpoint"] = str(checkpoint_file(folder).relative_to(out))  # best.pt of a run that validates
    if training is not None and trial_done(folder):
        for mode in OPENINGS:
            s = read_evaluation(folder / mode)["summary"]
            row[f"{mode}_mean"], row[f"{mode}_se"] = s["mean"], s["se"]
    elif trial.name in errors:
        row.update(status="failed", reason=errors[trial.name])
    elif training is not None or (folder / "checkpoint.pt").exists():
        row.update(status="interrupted", reason="the sweep stopped before this trial finished; --resume continues it")
    return row


def write_tables(spec: SweepSpec, out: Path, errors: dict[str, str]) -> list[dict[str, Any]]:
    """Rebuild trials.parquet, attempts.parquet, curves.parquet and baselines.parquet from the folders; returns the trial rows."""
    attempts = {t.name: trial_attempts(out, t) for t in spec.trials()}
    rows = [trial_row(out, t, errors, attempts[t.name]) for t in spec.trials()]
    write_parquet(pa.Table.from_pylist(rows, schema=TRIALS_SCHEMA), out / "trials.parquet")
    write_parquet(
        pa.Table.from_pylist([a for t in spec.trials() for a in attempts[t.name]], schema=ATTEMPTS_SCHEMA), out / "attempts.parquet"
    )
    curves = []
    for t in spec.trials():
        path = trial_folder(out, t) / "curve.parquet"
        if path.is_file():
            curves.append(pq.read_table(path).select(CURVES_SCHEMA.names).cast(CURVES_SCHEMA))
    write_parquet(pa.concat_tables(curves) if curves else CURVES_SCHEMA.empty_table(), out / "curves.parquet")
    baselines = []
    for folder in sorted((out / "baselines").glob("n*/*")):
        try:
            s = read_evaluation(folder)["summary"]
        except InputError:
            continue
        baselines.append(
            {
                "n": s["n"],
                "name": folder.name,
                "mean": s["mean"],
                "se": s["se"],
                "episodes": s["episodes"],
                "horizon": s["horizon"],
                "seconds_per_decision": seconds_per_decision(folder),
            }
        )
    write_parquet(pa.Table.from_pylist(baselines, schema=BASELINES_SCHEMA), out / "baselines.parquet")
    return rows


# ---- reading --------------------------------------------------------------------------------------


@dataclass
class Results:
    root: Path
    record: dict[str, Any]
    """sweep.json: the sweep file, manifest, dates, instance hashes."""
    spec: SweepSpec
    trials: list[dict[str, Any]]
    attempts: list[dict[str, Any]]
    """attempts.parquet's rows: every attempt of every trial, with its node (none in a directory of version 1)."""
    curves: dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray]]
    """(method, n, seed) -> (update, cost10) from curves.parquet, by update."""

    def instance(self, n: int) -> Instance:
        """The sweep's instance of size n (the paper's family), checked against sweep.json's hash."""
        inst = paper_instance(n, self.spec.instance_seed)
        if inst.content_hash() != self.record["instance_hashes"][f"n{n}"]:
            raise InputError(
                f"'{self.root / 'sweep.json'}': the instance hash of n = {n} is not that of the paper instance (n = {n}, "
                f"seed {self.spec.instance_seed}); the results were written by another version of the instance family"
            )
        return inst


def _read_table(root: Path, name: str, schema: pa.Schema, version: int = SCHEMA_VERSION) -> pa.Table:
    """A table of the results directory with the columns of `schema`; those that version 1 lacked (the attempts) are
    empty in a directory of that version."""
    path = root / name
    if version == 1 and schema is ATTEMPTS_SCHEMA:
        return schema.empty_table()
    if not path.is_file():
        raise InputError(
            f"results directory '{root}' has no {name}: the sweep has not finished a run yet (platform/sweep.py writes "
            "its tables at the end of every run; continue it with --resume)"
        )
    table = read_parquet(path, lambda reason: InputError(f"'{path}' is not a readable Parquet file ({reason})"))
    missing = [c for c in schema.names if c not in table.column_names]
    if version == 1 and schema is TRIALS_SCHEMA:
        for column in [c for c in missing if c in ADDED_IN_2]:
            table = table.append_column(schema.field(column), pa.nulls(table.num_rows, schema.field(column).type))
        missing = [c for c in missing if c not in ADDED_IN_2]
    if missing:
        raise InputError(f"'{path}' lacks the columns {missing} (expected {schema.names})")
    return table.select(schema.names)


def read_results(root) -> Results:
    """A results directory of platform/sweep.py: sweep.json of a version this code reads (READ_VERSIONS), the
    spec it ran and the trials, attempts and curves tables; anything else is one InputError saying what is wrong."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"results directory '{root}' does not exist or is not a directory")
    path = root / "sweep.json"
    if not path.is_file():
        raise InputError(f"'{root}' holds no sweep.json: not a results directory of platform/sweep.py")
    record = read_sweep_record(path, "report it with the code that wrote it, or run the sweep again")
    try:
        spec = SweepSpec.from_dict(record.get("sweep"))
    except InputError as exc:
        raise InputError(f"'{path}', field 'sweep': {exc}") from None
    hashes = record.get("instance_hashes")
    if not isinstance(hashes, dict) or any(f"n{n}" not in hashes for n in spec.sizes):
        raise InputError(f"'{path}': field 'instance_hashes' should name the instance of every size {list(spec.sizes)}")
    trials = _read_table(root, "trials.parquet", TRIALS_SCHEMA, record["version"]).to_pylist()
    attempts = _read_table(root, "attempts.parquet", ATTEMPTS_SCHEMA, record["version"]).to_pylist()
    curves = curve_groups(_read_table(root, "curves.parquet", CURVES_SCHEMA))
    _read_table(root, "baselines.parquet", BASELINES_SCHEMA)  # written with the others; the folders are read whole by the report
    return Results(root, record, spec, trials, attempts, curves)


def curve_groups(table: pa.Table) -> dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray]]:
    """Split the curves table (millions of rows in a paper sweep) by (method, n, seed) with one sort."""
    method = table.column("method").combine_chunks().dictionary_encode()
    codes, names = method.indices.to_numpy(zero_copy_only=False), method.dictionary.to_pylist()
    n, seed, update, cost = (table.column(c).to_numpy() for c in ("n", "seed", "update", "cost10"))
    order = np.lexsort((update, seed, n, codes))
    keys = np.stack([codes[order], n[order], seed[order]])
    starts = np.flatnonzero(np.concatenate([[True], (keys[:, 1:] != keys[:, :-1]).any(0)])) if order.size else np.array([], np.int64)
    ends = np.append(starts[1:], order.size)
    return {
        (names[keys[0, a]], int(keys[1, a]), int(keys[2, a])): (update[order[a:b]].astype(np.float64), cost[order[a:b]].astype(np.float64))
        for a, b in zip(starts, ends)
    }
