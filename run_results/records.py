"""The one output format of every evaluated method: summary.json, costs.parquet and, on request,
the traces steps.parquet and items.parquet, plus any method-specific tables (a MILP's decisions.parquet).

A results folder is whole or it is not read. A writer first removes summary.json (from then on the
folder counts as incomplete), removes the previous run's result files and any temporary file left by
a killed writer, writes every file atomically (temporary name, then rename) and writes summary.json
last, with the SHA-256 of every file it vouches for. `read_evaluation` accepts a folder only when
summary.json is well formed and every listed file is present with its checksum; temporary files are
never read. summary.json also records the instance's content hash, so that evaluations of different
instances are never compared.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from envs.evaluation import Evaluation
from envs.instance import Instance
from plumbing import validate
from plumbing.errors import InputError
from plumbing.files import atomic_write, atomic_write_text, file_sha256, written_by_atomic_write

_PACKAGES = ("torch", "numpy", "pyarrow", "ray", "highspy", "gurobipy", "gymnasium")


def manifest(config: dict[str, Any]) -> dict[str, Any]:
    """Config, package versions, git commit and hardware, for every results file."""
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    repo = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {
        "config": config,
        "versions": {"python": sys.version.split()[0], **versions},
        "git_commit": commit or None,
        "git_dirty": dirty,
        "hardware": {
            "machine": platform.machine(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        },
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def write_parquet(table: pa.Table, path: Path) -> None:
    """Write a Parquet file atomically."""
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))


SUMMARY = "summary.json"
COSTS = "costs.parquet"
TRACES = ("steps.parquet", "items.parquet")
FORMAT = "or-transformer-platform/evaluation"
VERSION = 2
"""Version 2 added the file checksums and the instance hash; folders of version 1 are refused."""


EVALUATION = "an evaluation"
TRAINING = "a training run"
BACKTEST = "a backtest"
BACKTEST_FILE = "backtest.json"
BACKTEST_FORMAT = "or-transformer-platform/backtest"
BACKTEST_KIND = "backtest"
"""summary.json's `kind` in each policy's evaluation folder of a backtest (platform/backtest.py): its episodes are
windows of a history, not simulated paths."""
RUNS = {
    BACKTEST: (BACKTEST_FILE,),
    "a rolling-MILP run": ("decisions.jsonl", "decisions.parquet"),
    "a perfect-information bound": ("bounds.jsonl", "bounds.parquet"),
    "a decomposition bound": ("split.jsonl", "split.parquet", "equal-shares", "lookahead"),
    TRAINING: ("checkpoint.pt", "best.pt", "curve.parquet", "training.json", "tensorboard", "greedy", "sampled", "rllib", "ray_train"),
    EVALUATION: (SUMMARY, COSTS, *TRACES),
}
"""Each kind of run by the entries it writes in its folder. A solver run and a bound also write an evaluation's files,
so a kind is shown by its own entries, looked for in this order, and an evaluation by its files alone."""


def held_run(folder: str | os.PathLike) -> tuple[str, str] | None:
    """(kind, the entry that shows it) of the run that `folder` holds (RUNS, temporary files of atomic writes
    included), or None when it holds none."""
    folder = Path(folder)
    names = {written_by_atomic_write(p.name) or p.name for p in folder.iterdir()} if folder.is_dir() else set()
    return next(((kind, entry) for kind, entries in RUNS.items() for entry in entries if entry in names), None)


RUN_RECORDS = (".json", ".jsonl", ".pt")
"""The suffixes of the entries of RUNS that show a run above an output: its records (summary.json,
backtest.json, a solver's journal, training.json, a checkpoint). Its Parquet tables and subfolders do not: a user's
folder may hold an item table items.parquet, a cost table costs.parquet or a folder named greedy/ or lookahead/."""


def run_record(folder: Path) -> tuple[str, str] | None:
    """(kind, record file) of the run whose folder `folder` is, shown by a record (RUN_RECORDS) that
    RUNS names, or None."""
    records = [(kind, entry) for kind, entries in RUNS.items() for entry in entries if Path(entry).suffix in RUN_RECORDS]
    return next(((kind, entry) for kind, entry in records if (folder / entry).is_file()), None)


RECORD_FORMATS = {SUMMARY: FORMAT, BACKTEST_FILE: BACKTEST_FORMAT}
"""The records a run is recognised by whose content says so: a file of that name without its format is someone else's."""


def foreign_record(folder: Path) -> str | None:
    """The name of a file in `folder` named as a run's record (RECORD_FORMATS) that is not one (not a JSON object with
    the record's 'format'), or None."""
    for name, fmt in RECORD_FORMATS.items():
        path = folder / name
        if not path.is_file():
            continue
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            return name
        if not isinstance(record, dict) or record.get("format") != fmt:
            return name
    return None


def check_run_folder(out: str | os.PathLike, kind: str, *, overwrite: bool, resumable: bool) -> None:
    """Raises InputError, before any work, for an `out` that holds a run of another kind than `kind` (RUNS), or of this kind when it does
    not resume (`resumable` False), unless `overwrite`: a folder holds one run. Whatever `overwrite` says, refuses a file named as a run's
    record that is not one (`foreign_record`: the user's, never deleted) and, but for a backtest, a folder that holds no run itself but
    one in a subfolder (that run would lie inside this one)."""
    out = Path(out)
    if (name := foreign_record(out)) is not None:
        raise InputError(
            f"--out '{out}' holds a {name} that is not a record of this platform (not JSON with its field 'format' "
            f"'{RECORD_FORMATS[name]}'): a run never replaces or deletes a file it did not write, even with --overwrite; "
            "move the file away or give another --out"
        )
    held = held_run(out)
    if held is None and kind != BACKTEST and out.is_dir():  # a backtest's folder holds its policies' evaluations
        for child in sorted(p for p in out.iterdir() if p.is_dir()):
            if (inner := run_record(child)) is not None:
                raise InputError(
                    f"--out '{out}' holds {inner[0]} in '{child}' ({inner[1]}): a run's folder holds that run alone, and "
                    f"'{child}' would then lie inside it, never to be written again; give the run a folder of its own"
                )
    if held is None or overwrite or (held[0] == kind and resumable):
        return
    what, entry = held
    this = "" if what == kind else f"; this run is {kind}"
    raise InputError(f"--out '{out}' holds {what} ({entry}){this}: a folder holds one run; give --overwrite to replace it or another --out")


def clear_run(out: str | os.PathLike) -> None:
    """Remove from `out` every entry of the run it holds (RUNS, the files summary.json lists, temporary files of atomic
    writes), so that no file of it is left beside the next run; anything else in the folder stays."""
    out = Path(out)
    if not out.is_dir():
        return
    entries = {entry for kind in RUNS.values() for entry in kind}
    try:
        entries |= set(json.loads((out / SUMMARY).read_text(encoding="utf-8")).get("files", {}))
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    for path in out.iterdir():
        if path.name in entries or written_by_atomic_write(path.name):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()


def append_json_line(path: Path, record: dict[str, Any]) -> None:
    """Append `record` as one JSON line, flushed to disk (journals, a trial's attempts); a torn last line (its writer
    was killed mid-write) is ended first, so the record starts a line of its own."""
    with open(path, "ab+") as f:  # appends at the end, wherever it has read
        size = f.seek(0, os.SEEK_END)
        torn = size > 0 and f.seek(size - 1) >= 0 and f.read(1) != b"\n"
        f.write((b"\n" if torn else b"") + json.dumps(record).encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())


def json_line(text: str) -> Any:
    """The JSON value of one line of a JSON-lines file, or None for a torn or malformed line (skipped by readers)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def remove_leftovers(folder: Path) -> None:
    """Delete temporary files that a killed writer left in `folder` (see atomic_write)."""
    for stale in folder.iterdir():
        if written_by_atomic_write(stale.name) and stale.is_file():
            stale.unlink()


def check_finite(evaluation: Evaluation, policy: str) -> None:
    """An InputError when an episode's discounted cost, the mean or its standard error is NaN or infinite."""
    costs = np.asarray(evaluation.discounted_cost, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(costs))
    if bad.size or not (math.isfinite(evaluation.mean) and math.isfinite(evaluation.se)):
        where = (
            f"{bad.size} of {costs.size} episodes (first: episode {evaluation.episodes[bad[0]]}, {costs[bad[0]]})"
            if bad.size
            else "its standard error"
        )
        raise InputError(
            f"the evaluation of {policy} has a non-finite discounted cost in {where}; no results are written. The "
            "instance's fields h, b, K, qbar, lam and beta must keep one-step costs finite in float32 "
            "(envs.exogenous.check_cost_range), and the policy's orders must be numbers"
        )


def write_evaluation(
    out_dir: str | os.PathLike,
    policy: str,
    evaluation: Evaluation,
    seed: int,
    config: dict[str, Any],
    parameters: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    *,
    instance: Instance,
    tables: dict[str, pa.Table] | None = None,
) -> dict[str, Any]:
    """Write the evaluation of `policy` on `instance` to `out_dir`, whole or not at all (module docstring);
    `tables` are further Parquet files by name. Returns the summary dict. An evaluation with a non-finite cost is
    refused before the folder is touched: no results folder holds a NaN or infinite mean."""
    check_finite(evaluation, policy)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tables = dict(tables or {})
    (out / SUMMARY).unlink(missing_ok=True)
    remove_leftovers(out)
    for name in (COSTS, *TRACES, *tables):
        (out / name).unlink(missing_ok=True)

    episodes = np.asarray(evaluation.episodes, dtype=np.int64)
    tables[COSTS] = pa.table({"episode": episodes, "discounted_cost": evaluation.discounted_cost})
    if evaluation.trace is not None:
        tr = evaluation.trace
        E, T, n = tr.inventory.shape
        ep = np.repeat(episodes, T)
        t = np.tile(np.arange(T, dtype=np.int64), E)
        # one factor: a 'factor' column; k factors: factor1..factork
        factors = (
            {"factor": tr.factor.ravel()}
            if tr.factor.ndim == 2
            else {f"factor{j + 1}": tr.factor[..., j].ravel() for j in range(tr.factor.shape[2])}
        )
        tables["steps.parquet"] = pa.table(
            {"episode": ep, "t": t, **factors, "open": tr.open.ravel().astype(np.int8), "cost": tr.cost.ravel()}
        )
        tables["items.parquet"] = pa.table(
            {
                "episode": np.repeat(ep, n),
                "t": np.repeat(t, n),
                "item": np.tile(np.arange(n, dtype=np.int64), E * T),
                "inventory": tr.inventory.ravel(),
                "demand": tr.demand.ravel(),
                "quantity": tr.quantity.ravel(),
            }
        )
    for name, table in tables.items():
        write_parquet(table, out / name)
    summary = {
        "format": FORMAT,
        "version": VERSION,
        "policy": policy,
        "mean": evaluation.mean,
        "se": evaluation.se,
        "episodes": len(evaluation.episodes),
        "horizon": evaluation.horizon,
        "seed": int(seed),
        "n": instance.n,
        "instance_hash": instance.content_hash(),
        "parameters": parameters or {},
        **(extra or {}),
        "files": {name: file_sha256(out / name) for name in sorted(tables)},
        "manifest": manifest(config),
    }
    atomic_write_text(out / SUMMARY, json.dumps(summary, indent=1) + "\n")
    return summary


def read_record(path: Path, fmt: str, version: int, what: str, hint: str) -> dict[str, Any]:
    """A JSON record of this platform (summary.json, sweep.json) with its 'format' and 'version' checked;
    anything else is one InputError naming the file (`hint` says what to do about another version)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"'{path}' is not valid JSON ({exc})") from None
    except RecursionError:
        raise InputError(f"'{path}' {validate.NESTED_TOO_DEEPLY}") from None
    if not isinstance(record, dict) or record.get("format") != fmt:
        raise InputError(f"'{path}': not a {what} of this platform (field 'format' should be '{fmt}')")
    if record.get("version") != version:
        raise InputError(f"'{path}': field 'version' is {record.get('version')!r}, this code reads version {version}; {hint}")
    return record


def read_evaluation(folder: str | os.PathLike) -> dict[str, Any]:
    """Read a whole results folder: {'summary': dict, 'episodes': int64 [E] (sorted), 'cost': float64 [E]}.
    An incomplete, modified or foreign folder is one InputError naming the folder and what is wrong."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"results folder '{folder}' does not exist or is not a directory")
    path = folder / SUMMARY
    if not path.is_file():
        raise InputError(
            f"results folder '{folder}' has no {SUMMARY}: the evaluation is incomplete (interrupted or still running), or this "
            f"is not a results folder"
        )
    summary = read_record(path, FORMAT, VERSION, "results summary", "re-run the evaluation")
    required = {
        "policy": str,
        "mean": float,
        "se": float,
        "episodes": int,
        "horizon": int,
        "seed": int,
        "n": int,
        "instance_hash": str,
        "files": dict,
    }
    for key, kind in required.items():
        value = summary.get(key)
        allowed = (int, float) if kind is float else kind
        if isinstance(value, bool) or not isinstance(value, allowed):
            raise InputError(f"'{path}': field '{key}' is missing or not a {kind.__name__} (got {value!r})")
    if COSTS not in summary["files"]:
        raise InputError(f"'{path}': field 'files' does not list {COSTS}")
    for name, digest in summary["files"].items():
        file = folder / name
        if not file.is_file():
            raise InputError(f"results folder '{folder}': {name} is missing (listed in {SUMMARY}); the folder is incomplete")
        if file_sha256(file) != digest:
            raise InputError(
                f"results folder '{folder}': {name} does not match its checksum in {SUMMARY}; it was modified or replaced after "
                f"the evaluation"
            )
    costs = pq.read_table(folder / COSTS)
    if set(costs.column_names) != {"episode", "discounted_cost"} or costs.num_rows != summary["episodes"]:
        raise InputError(f"results folder '{folder}': {COSTS} should have columns episode, discounted_cost and {summary['episodes']} rows")
    episodes = np.asarray(costs.column("episode").to_numpy(), dtype=np.int64)
    order = np.argsort(episodes)
    return {
        "summary": summary,
        "episodes": episodes[order],
        "cost": np.asarray(costs.column("discounted_cost").to_numpy(), dtype=np.float64)[order],
    }
