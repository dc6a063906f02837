"""One training run on disk, for every trainer: the training curve (Parquet and TensorBoard), periodic
checkpoints, resumption, divergence as a recorded result, and a progress bar.

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
from typing import Any, Callable, Optional

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from envs.instance import Instance, atomic_write_text
from envs.results import manifest, write_parquet
from trainers.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from trainers.pathwise import PathwiseTrainer, TrainConfig


class RunRecorder:
    """Curve rows, TensorBoard scalars, the progress bar and training.json of one run."""

    def __init__(self, out: Path, method: str, n: int, seed: int, updates: int, done: int, progress: bool):
        from tensorboardX import SummaryWriter

        self.out, self.method, self.n, self.seed = out, method, n, seed
        self.rows: list[dict[str, Any]] = []
        if done and (out / "curve.parquet").exists():
            self.rows = [r for r in pq.read_table(out / "curve.parquet").to_pylist() if r["update"] <= done]
        self.wall_offset = self.rows[-1]["wall_seconds"] if self.rows else 0.0
        self.start = time.perf_counter()
        self.writer = SummaryWriter(str(out / "tensorboard"))
        self.bar = tqdm(total=updates, initial=done, desc=f"train {method} n={n}", disable=not progress)

    def record(self, update: int, metrics: dict[str, float]) -> None:
        wall = self.wall_offset + time.perf_counter() - self.start
        self.rows.append({"method": self.method, "n": self.n, "seed": self.seed, "update": update, "cost10": metrics["cost10"], "wall_seconds": wall})
        for key, value in metrics.items():
            self.writer.add_scalar(f"train/{key}", value, update)
        self.bar.update(1)
        self.bar.set_postfix(cost10=f"{metrics['cost10']:.4g}")

    def write_curve(self) -> None:
        rows = self.rows
        write_parquet(pa.table({
            "method": pa.array([r["method"] for r in rows], pa.string()),
            "n": pa.array([r["n"] for r in rows], pa.int64()),
            "seed": pa.array([r["seed"] for r in rows], pa.int64()),
            "update": pa.array([r["update"] for r in rows], pa.int64()),
            "cost10": pa.array([r["cost10"] for r in rows], pa.float64()),
            "wall_seconds": pa.array([r["wall_seconds"] for r in rows], pa.float64()),
        }), self.out / "curve.parquet")

    def finish(self, status: str, reason: Optional[str], updates_done: int, config: dict[str, Any]) -> dict[str, Any]:
        self.bar.close()
        self.writer.close()
        self.write_curve()
        summary = {
            "method": self.method, "n": self.n, "seed": self.seed, "status": status, "reason": reason, "updates_done": updates_done,
            "final_cost10": self.rows[-1]["cost10"] if self.rows else None,
            "wall_seconds": self.rows[-1]["wall_seconds"] if self.rows else 0.0,
            "manifest": manifest(config),
        }
        atomic_write_text(self.out / "training.json", json.dumps(summary, indent=1) + "\n")
        return summary


def training_loop(recorder: RunRecorder, done: int, updates: int, step: Callable[[], dict[str, float]],
                  diverged: Callable[[dict[str, float]], Optional[str]], save: Callable[[str], None], checkpoint_every: int) -> tuple[str, Optional[str], int]:
    """Run updates done+1..updates; returns (status, reason, updates done). `save(status)` checkpoints."""
    status, reason, update = "completed", None, done
    try:
        while update < updates:
            metrics = step()
            update += 1
            recorder.record(update, metrics)
            reason = diverged(metrics)
            if reason:
                status = "diverged"
                break
            if checkpoint_every and update % checkpoint_every == 0:
                recorder.write_curve()
                save("running")
    finally:
        recorder.bar.close()
    save(status)
    return status, reason, update


def check_resumable(ckpt: dict[str, Any], config_dict: dict[str, Any], instance: Instance, path: Path) -> None:
    """Only `updates` may change between a checkpoint and the run that resumes it."""
    if ckpt["config"].to_dict() | {"updates": 0} != config_dict | {"updates": 0}:
        raise CheckpointError(f"checkpoint '{path}': its config differs from this run's (only 'updates' may change on resume)")
    if ckpt["instance"].to_dict() != instance.to_dict():
        raise CheckpointError(f"checkpoint '{path}': it was trained on a different instance")


def train(config: TrainConfig, instance: Instance, out_dir: str | Path, resume: bool = False, progress: bool = True) -> dict[str, Any]:
    """Train (or resume) a pathwise run (OR-Transformer or HPO) in `out_dir`; returns training.json's content."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trainer = PathwiseTrainer(config, instance.to_torch(config.device))
    checkpoint_path = out / "checkpoint.pt"
    if resume and checkpoint_path.exists():
        ckpt = load_checkpoint(checkpoint_path, config.device)
        check_resumable(ckpt, config.to_dict(), instance, checkpoint_path)
        trainer.load_state_dict(ckpt["trainer"])
    recorder = RunRecorder(out, config.method, instance.n, config.seed, config.updates, trainer.update, progress)

    def save(status: str) -> None:
        save_checkpoint(checkpoint_path, config, instance, trainer.state_dict(), status)

    status, reason, done = training_loop(recorder, trainer.update, config.updates, trainer.step, trainer.diverged, save, config.checkpoint_every)
    return recorder.finish(status, reason, done, config.to_dict())
