"""OR-Transformer and HPO on Ray Train: a `TorchTrainer` of W workers, each simulating B / W of the
rollouts on its device (a GPU each with `use_gpu`) with a replica of the networks. Gradients, advantage
statistics and metrics are averaged across the workers and every rollout's randomness depends on the seed and
its index only (trainers.pathwise), so W workers give the curve of one process.

  train_data_parallel(method_config("or-transformer", "cpu"), paper_instance(16, 0), "runs/ort-n16", workers=2)

The run folder is trainers.run_folder's (modes new / resume / overwrite; checkpoint.pt, curve.parquet, tensorboard/,
training.json), written by rank 0 alone, with every update. The metrics go to `ray.train.report` (and on to
Tune inside a Tune trial, by TuneReportCallback): with a Train checkpoint (checkpoint.pt and the curve) every
checkpoint_every updates and at the end, and in between those of the latest update every REPORT_SECONDS. Ray
Train's own storage is OUT/ray_train/<folder name>, a name without timestamps, so a retried or restored run
finds it; on a cluster, OUT must be on storage that every node sees.

Fault tolerance: when a worker dies, Ray Train starts the worker group again (`max_failures` times). Every start
of the workers continues from the run folder's checkpoint.pt when there is one (rank 0 reads it and sends it to
the other ranks), so a retried run's curve holds every update exactly once. Ctrl-C aborts the run at once (Ray
Train's handler) and raises KeyboardInterrupt: the folder keeps the last periodic checkpoint, to resume from.
"""

from __future__ import annotations

import re
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import ray.train
import torch
import torch.distributed as dist
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from ray.tune.integration.ray_train import TuneReportCallback

from envs.instance import Instance
from plumbing.errors import InputError
from ray_access.private import in_tune_session
from ray_access.session import init_ray
from trainers.checkpoint import BEST, LAST
from trainers.collectives import rank_and_world
from trainers.config import ConfigError
from trainers.pathwise import PathwiseRun, PathwiseTrainer
from trainers.pathwise_config import TrainConfig
from trainers.run_folder import RunAttempt, open_run, run_start

STORAGE = "ray_train"
"""Ray Train's storage inside the run folder (one of trainers.run_folder.RUN_FILES)."""
REPORT_SECONDS = 2.0
"""Least time between two reports without a checkpoint. Ray Train's controller takes one report per worker each
time it polls them (every 2 s: RAY_TRAIN_HEALTH_CHECK_INTERVAL_S) and ray.train.report waits until it has taken
the previous one, so a report every update would hold fast updates up to 2 s each (measured: 8 updates/s became
0.6). The run folder's curve and TensorBoard hold every update."""


def train_data_parallel(
    config: TrainConfig,
    instance: Instance,
    out_dir,
    mode: str = "new",
    workers: int = 1,
    use_gpu: bool = False,
    resources_per_worker: dict[str, float] | None = None,
    progress: bool = True,
    max_failures: int = 0,
) -> dict[str, Any]:
    """Train a pathwise run in `out_dir` on `workers` Ray Train workers (`mode` and the run folder: trainers.run_folder);
    returns training.json's content. With `use_gpu` (config device cuda) each worker takes a GPU;
    `resources_per_worker` as in ScalingConfig (e.g. {"CPU": 2}, or {"GPU": 0.25} to share a GPU); a worker
    group that fails is started again up to `max_failures` times, from the last checkpoint."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise InputError(f"workers: expected an integer >= 1, got {workers!r}")
    if config.batch % workers:
        raise ConfigError(f"config field 'batch': {config.batch} rollouts do not split evenly over {workers} workers")
    if use_gpu != config.device.startswith("cuda"):
        raise ConfigError(
            f"config field 'device': {config.device!r} with use_gpu={use_gpu}: Ray Train gives each worker a GPU exactly when "
            "use_gpu, so train on cuda with use_gpu and on cpu without"
        )
    if not isinstance(max_failures, int) or isinstance(max_failures, bool) or max_failures < -1:
        raise InputError(f"max_failures: expected an integer >= 0 (or -1: retry without limit), got {max_failures!r}")
    with open_run(out_dir, mode, config, instance, PathwiseRun(config, instance)) as (out, start):
        if start.ended is not None:
            return start.ended
        fit(config, instance, out, workers, use_gpu, resources_per_worker, progress, max_failures)
        if (ended := run_start(out, config, instance).ended) is not None:
            return ended
    raise KeyboardInterrupt  # fit also returns when Ray's SIGINT handler has aborted the run


def fit(
    config: TrainConfig,
    instance: Instance,
    out: Path,
    workers: int,
    use_gpu: bool,
    resources_per_worker: dict[str, float] | None,
    progress: bool,
    max_failures: int,
) -> None:
    """Run `worker_loop` on a TorchTrainer of `workers` workers until the run ends, fails or Ctrl-C aborts it."""
    init_ray(workers)
    trainer = TorchTrainer(
        worker_loop,
        train_loop_config={"config": config.to_dict(), "instance": instance.to_dict(), "out": str(out), "progress": progress},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=use_gpu, resources_per_worker=resources_per_worker),
        run_config=RunConfig(
            name=re.sub(r"[^\w.-]", "_", out.name) or "run",
            storage_path=str(out / STORAGE),
            failure_config=FailureConfig(max_failures=max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=1),
            callbacks=[TuneReportCallback()] if in_tune_session() else None,
        ),
    )
    main_thread = threading.current_thread() is threading.main_thread()  # not in a Tune trial
    handler = signal.getsignal(signal.SIGINT)
    try:
        trainer.fit()
    except SystemExit:  # Ray's SIGINT handler aborted the run and exits
        raise KeyboardInterrupt from None
    finally:  # in the main thread, fit installs that handler and leaves it
        if main_thread:
            signal.signal(signal.SIGINT, handler)


def worker_loop(loop_config: dict[str, Any]) -> None:
    """One Ray Train worker: its shard of the run, from the run folder's checkpoint when there is one (module
    docstring); rank 0 reads the folder and sends its start to the other ranks."""
    config = TrainConfig.from_dict(loop_config["config"])
    instance = Instance.from_dict(loop_config["instance"])
    out = Path(loop_config["out"])
    method = WorkerRun(config, instance)
    start = [run_start(out, config, instance) if method.lead else None]
    if rank_and_world()[1] > 1:
        dist.broadcast_object_list(start, src=0)
    RunAttempt(out, config, instance, start[0], method, loop_config["progress"], method.report.hold).run()


class WorkerRun(PathwiseRun):
    """A Ray Train worker's part of the run (trainers.run_folder.MethodRun): its shard on its device; rank 0 writes the
    run folder, and every save goes to ray.train.report with a Train checkpoint (checkpoint.pt, best.pt and the curve)."""

    def __init__(self, config: TrainConfig, instance: Instance):
        device = ray.train.torch.get_device() if config.device != "cpu" else torch.device("cpu")
        super().__init__(config, instance, device)
        self.rank = ray.train.get_context().get_world_rank()
        self.report = UpdateReport(device)

    @property
    def lead(self) -> bool:
        return self.rank == 0

    def build(self, out: Path, checkpoint: dict[str, Any] | None) -> PathwiseTrainer:
        self.out = out
        return super().build(out, checkpoint)

    def after_checkpoint(self) -> None:
        """A Train checkpoint of checkpoint.pt, best.pt and the curve (written before them: trainers.run_folder.RunAttempt.save)."""
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if self.lead:
                for name in (LAST, BEST, "curve.parquet"):
                    if (self.out / name).exists():  # best.pt: a run that validates
                        shutil.copy2(self.out / name, tmp)
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            self.report.send(checkpoint)


class UpdateReport:
    """Sends the metrics of the updates to ray.train.report, as every rank must call it (it is a barrier): each
    checkpointed update with its checkpoint (`send`, from the save), and the last update done when REPORT_SECONDS
    have passed since the last report (`hold`, called after each update; rank 0's clock decides for every rank)."""

    def __init__(self, device):
        self.device = device
        self.pending: dict[str, float] | None = None
        self.last = time.monotonic()

    def hold(self, update: int, metrics: dict[str, float]) -> None:
        if self.pending is not None and self.due():
            self.send()
        self.pending = metrics  # sent by the save when this update is checkpointed

    def due(self) -> bool:
        due = torch.tensor([float(time.monotonic() - self.last >= REPORT_SECONDS)], device=self.device)
        if rank_and_world()[1] > 1:
            dist.broadcast(due, src=0)
        return bool(due)

    def send(self, checkpoint: ray.train.Checkpoint | None = None) -> None:
        if self.pending is not None:
            ray.train.report(self.pending, checkpoint=checkpoint)
            self.pending = None
            self.last = time.monotonic()
