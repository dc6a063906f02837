"""The one output format of every evaluated method: summary.json, costs.parquet and, on request,
the traces steps.parquet and items.parquet. Files are written atomically (temporary name, then
rename), summary.json last, so a directory with a summary.json is complete."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from envs.evaluation import Evaluation
from envs.instance import atomic_write, atomic_write_text

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


def write_evaluation(
    out_dir: str | os.PathLike,
    policy: str,
    evaluation: Evaluation,
    seed: int,
    config: dict[str, Any],
    parameters: Optional[dict[str, Any]] = None,
    extra: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """Write the evaluation of `policy` to `out_dir`; return the summary dict."""
    out = Path(out_dir)
    episodes = np.asarray(evaluation.episodes, dtype=np.int64)
    write_parquet(pa.table({"episode": episodes, "discounted_cost": evaluation.discounted_cost}), out / "costs.parquet")
    if evaluation.trace is not None:
        tr = evaluation.trace
        E, T, n = tr.inventory.shape
        ep = np.repeat(episodes, T)
        t = np.tile(np.arange(T, dtype=np.int64), E)
        write_parquet(
            pa.table({"episode": ep, "t": t, "factor": tr.factor.ravel(), "open": tr.open.ravel().astype(np.int8), "cost": tr.cost.ravel()}),
            out / "steps.parquet",
        )
        write_parquet(
            pa.table({
                "episode": np.repeat(ep, n),
                "t": np.repeat(t, n),
                "item": np.tile(np.arange(n, dtype=np.int64), E * T),
                "inventory": tr.inventory.ravel(),
                "demand": tr.demand.ravel(),
                "quantity": tr.quantity.ravel(),
            }),
            out / "items.parquet",
        )
    summary = {
        "policy": policy,
        "mean": evaluation.mean,
        "se": evaluation.se,
        "episodes": len(evaluation.episodes),
        "horizon": evaluation.horizon,
        "seed": int(seed),
        "parameters": parameters or {},
        **(extra or {}),
        "manifest": manifest(config),
    }
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    return summary
