"""Pathwise training on Ray Train against the plain process: transitions per second (B x T_roll per update)
of the plain process (trainers.pathwise.train), of Ray Train with 1 worker and with 2 workers, all with the same
torch threads per worker, measured after start-up from the run's curve (its wall seconds of every update, the
first `--skip` left out); the overhead of the 1-worker Ray Train path against the plain process (goal: <= 10%
at n = 16, B = 128); and the fixed start-up seconds of a Ray Train run (the call's wall time less its updates').
OR-Transformer, cpu preset. With --device cuda: the same on GPU workers, and transitions/s at n = 1,024 with
the paper preset in the plain process, with the hours that 16,000 updates take. Prints one JSON line per figure.

  python bench/scaling.py [--n 16] [--batch 128] [--updates 80] [--threads 1] [--device cpu]
"""

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch

from envs.instance import paper_instance
from ray_access.session import init_ray
from trainers.pathwise import PathwiseTrainer, train
from trainers.ray_train import train_data_parallel
from trainers.registry import method_config


def steady_rate(run: Path, transitions: int, skip: int) -> tuple[float, float]:
    """(transitions/s over the updates after the first `skip`, wall seconds of all updates) from the run's curve."""
    wall = pq.read_table(run / "curve.parquet").column("wall_seconds").to_pylist()
    return (len(wall) - skip) * transitions / (wall[-1] - wall[skip - 1]), wall[-1]


def emit(**row):
    """One JSON line, with the machine's load at the time (other processes share the cores)."""
    row |= {"load_average_1min": os.getloadavg()[0], "cpu_cores": os.cpu_count()}
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--updates", type=int, default=80, help="updates per run")
    parser.add_argument("--skip", type=int, default=10, help="first updates of a run left out of its rate (warm-up)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (CPUs) per worker, and of the plain process")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    gpu = args.device == "cuda"
    torch.set_num_threads(args.threads)
    instance = paper_instance(args.n, 0)
    config = method_config(
        "or-transformer", "cpu", {"batch": args.batch, "updates": args.updates, "checkpoint_every": 0, "device": args.device}
    )
    transitions = config.batch * config.rollout
    common = {
        "n": args.n,
        "batch": config.batch,
        "rollout": config.rollout,
        "preset": "cpu",
        "device": args.device,
        "threads_per_worker": args.threads,
    }
    init_ray(2)
    with tempfile.TemporaryDirectory() as tmp:
        train(config, instance, Path(tmp) / "plain", progress=False)
        plain, _ = steady_rate(Path(tmp) / "plain", transitions, args.skip)
        emit(figure="transitions_per_s", path="plain process", workers=1, value=plain, **common)
        rates = {}
        for workers in (1, 2) if not gpu or torch.cuda.device_count() >= 2 else (1,):
            run = Path(tmp) / f"ray{workers}"
            start = time.perf_counter()
            train_data_parallel(
                config,
                instance,
                run,
                workers=workers,
                use_gpu=gpu,
                resources_per_worker={"CPU": args.threads, **({"GPU": 1} if gpu else {})},
                progress=False,
            )
            total = time.perf_counter() - start
            rates[workers], updating = steady_rate(run, transitions, args.skip)
            emit(
                figure="transitions_per_s",
                path="ray train",
                workers=workers,
                value=rates[workers],
                startup_seconds=total - updating,
                **common,
            )
    summary = {
        "goal": "Ray Train with 1 worker within 10% of the plain process after start-up (n = 16, B = 128)",
        "overhead_ray_train_1_worker": 1 - rates[1] / plain,
        "met": rates[1] >= 0.9 * plain,
    }
    if 2 in rates:
        summary["speedup_2_workers_vs_1"] = rates[2] / rates[1]
    emit(**summary, **common)
    if gpu:
        paper_scale(args.skip)


def paper_scale(skip: int, timed: int = 5):
    """Transitions/s at n = 1,024 with the paper preset on the GPU, in the plain process, and hours for 16,000 updates."""
    config = method_config("or-transformer", "paper", {"device": "cuda"})
    trainer = PathwiseTrainer(config, paper_instance(1024, 0).to_torch("cuda"))
    for _ in range(min(skip, 2)):
        trainer.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(timed):
        trainer.step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / timed
    emit(
        figure="transitions_per_s",
        path="plain process",
        n=1024,
        preset="paper",
        batch=config.batch,
        rollout=config.rollout,
        device="cuda",
        gpu=torch.cuda.get_device_name(),
        value=config.batch * config.rollout / seconds,
        seconds_per_update=seconds,
        hours_for_16000_updates=16_000 * seconds / 3600,
        peak_gpu_memory_gib=torch.cuda.max_memory_allocated() / 2**30,
    )


if __name__ == "__main__":
    main()
