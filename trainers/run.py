"""One training run on disk: the training curve (Parquet and TensorBoard), periodic checkpoints,
resumption, divergence as a recorded result, and a progress bar.

Files in the run directory:
  checkpoint.pt   latest checkpoint (trainers.checkpoint)
  curve.parquet   method, n, seed, update, cost10, wall_seconds (rewritten atomically with each checkpoint)
  tensorboard/    event files (every metric of every update)
  training.json   config, status (completed | diverged), reason, updates done, wall time, manifest
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from envs.instance import Instance, atomic_write_text
from envs.results import manifest, write_parquet
from trainers.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from trainers.pathwise import PathwiseTrainer, TrainConfig

CURVE_COLUMNS = ("method", "n", "seed", "update", "cost10", "wall_seconds")


def _curve_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.table({
        "method": pa.array([r["method"] for r in rows], pa.string()),
        "n": pa.array([r["n"] for r in rows], pa.int64()),
        "seed": pa.array([r["seed"] for r in rows], pa.int64()),
        "update": pa.array([r["update"] for r in rows], pa.int64()),
        "cost10": pa.array([r["cost10"] for r in rows], pa.float64()),
        "wall_seconds": pa.array([r["wall_seconds"] for r in rows], pa.float64()),
    })


def train(config: TrainConfig, instance: Instance, out_dir: str | Path, resume: bool = False, progress: bool = True) -> dict[str, Any]:
    """Train (or resume) a run in `out_dir`; returns the content of training.json."""
    from tensorboardX import SummaryWriter

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trainer = PathwiseTrainer(config, instance.to_torch(config.device))
    rows: list[dict[str, Any]] = []
    wall_offset = 0.0
    checkpoint_path = out / "checkpoint.pt"
    if resume and checkpoint_path.exists():
        ckpt = load_checkpoint(checkpoint_path, config.device)
        if ckpt["config"].to_dict() | {"updates": 0} != config.to_dict() | {"updates": 0}:
            raise CheckpointError(f"checkpoint '{checkpoint_path}': its config differs from this run's (only 'updates' may change on resume)")
        if ckpt["instance"].to_dict() != instance.to_dict():
            raise CheckpointError(f"checkpoint '{checkpoint_path}': it was trained on a different instance")
        trainer.load_state_dict(ckpt["trainer"])
        if (out / "curve.parquet").exists():
            rows = [r for r in pq.read_table(out / "curve.parquet").to_pylist() if r["update"] <= trainer.update]
            wall_offset = rows[-1]["wall_seconds"] if rows else 0.0

    writer = SummaryWriter(str(out / "tensorboard"))
    status, reason = "completed", None
    start = time.perf_counter()

    def save(state: str) -> None:
        write_parquet(_curve_table(rows), out / "curve.parquet")
        save_checkpoint(checkpoint_path, config, instance, trainer.state_dict(), state)

    bar = tqdm(total=config.updates, initial=trainer.update, desc=f"train {config.method} n={instance.n}", disable=not progress)
    try:
        while trainer.update < config.updates:
            metrics = trainer.step()
            wall = wall_offset + time.perf_counter() - start
            rows.append({"method": config.method, "n": instance.n, "seed": config.seed, "update": trainer.update, "cost10": metrics["cost10"], "wall_seconds": wall})
            for key, value in metrics.items():
                if key != "update":
                    writer.add_scalar(f"train/{key}", value, trainer.update)
            bar.update(1)
            bar.set_postfix(cost10=f"{metrics['cost10']:.4g}")
            reason = trainer.diverged(metrics)
            if reason:
                status = "diverged"
                break
            if config.checkpoint_every and trainer.update % config.checkpoint_every == 0:
                save("running")
    finally:
        bar.close()
        writer.close()
    save(status)
    summary = {
        "method": config.method,
        "n": instance.n,
        "seed": config.seed,
        "status": status,
        "reason": reason,
        "updates_done": trainer.update,
        "final_cost10": rows[-1]["cost10"] if rows else None,
        "wall_seconds": rows[-1]["wall_seconds"] if rows else 0.0,
        "manifest": manifest(config.to_dict()),
    }
    atomic_write_text(out / "training.json", json.dumps(summary, indent=1) + "\n")
    return summary
