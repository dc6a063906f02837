"""Where one paper update's time goes, in about two minutes on a GPU: one bfloat16 update of the paper preset at n =
1,024 (B = 1,024, T = 10) under torch.profiler, its device time by kernel family (attention, matmul,
elementwise/norm, other); the attention kernels (flash, cuDNN, memory-efficient, math) timed at the model's shapes
and layout ([B, 8 heads, S, 16] for S = n + 1 and n tokens), in bfloat16 and float32; the host synchronisations
inside one update (torch.cuda.set_sync_debug_mode); the allocator's retries; and the update's FLOPs, achieved
FLOP/s and MFU (trainers/flops.py). One JSON line per figure.

  python bench/gpu_probe.py                                   # on a CUDA machine
  python bench/gpu_probe.py --device cpu --n 8 --batch 4      # the same code at a tiny size on the CPU

On the CPU the profiler times the CPU's operators, no synchronisation or allocator is counted, and only the math
attention kernel runs.
"""

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.nn.attention import sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from envs.instance import paper_instance
from trainers.flops import UpdateArithmetic
from trainers.networks import TransformerShape
from trainers.pathwise_config import ATTENTION_KERNELS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu import emit, synchronize  # noqa: E402  (bench/gpu.py, beside this script)

from plumbing.errors import first_line

FAMILIES = (
    ("attention", ("attention", "flash", "fmha", "sdpa", "softmax")),
    ("matmul", ("gemm", "matmul", "addmm", "aten::mm", "aten::bmm", "cutlass", "sm90_", "sm80_", "cublas")),
    (
        "elementwise/norm",
        ("elementwise", "layer_norm", "gelu", "aten::add", "aten::mul", "aten::copy", "aten::to", "vectorized", "reduce", "norm"),
    ),
)
"""A kernel's family: the first whose name fragments its name holds (lower case), else "other"."""
ATTENTION_BACKENDS = {name: kernel for name, kernel in ATTENTION_KERNELS.items() if kernel is not None}


def family(name: str) -> str:
    lower = name.lower()
    return next((kind for kind, fragments in FAMILIES if any(fragment in lower for fragment in fragments)), "other")


def trainer_for(device: str, n: int, batch: int, preset: str):
    from trainers.pathwise import PathwiseTrainer
    from trainers.pathwise_config import NO_WARM_START
    from trainers.registry import method_config

    config = method_config("or-transformer", preset, {"device": device, "precision": "bfloat16", "batch": batch, **NO_WARM_START})
    return PathwiseTrainer(config, paper_instance(n, 0).to_torch(device)), config


def kernel_split(trainer, device: str) -> dict:
    """One update under the profiler: self time of the device's kernels (the CPU's operators on a CPU) by family."""
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        trainer.step()
        synchronize(device)
    totals: dict[str, float] = {kind: 0.0 for kind, _ in FAMILIES} | {"other": 0.0}
    for event in prof.key_averages():
        seconds = (event.self_device_time_total if cuda else event.self_cpu_time_total) / 1e6
        if seconds > 0:
            totals[family(event.key)] += seconds
    total = sum(totals.values())
    return {
        "figure": "kernel_split",
        "seconds": {kind: round(value, 4) for kind, value in totals.items()},
        "share": {kind: round(value / total, 4) if total else None for kind, value in totals.items()},
        "total_seconds": round(total, 4),
    }


def attention_timings(device: str, n: int, batch: int, shape: TransformerShape, repeats: int = 5) -> list[dict]:
    """Forward and backward of one attention call at the model's layout, each backend, S = n + 1 and n, bfloat16 and
    float32 (milliseconds, median of `repeats`), or why the backend refused."""
    records = []
    head = shape.width // shape.heads
    for dtype in (torch.bfloat16, torch.float32):
        for tokens in (n + 1, n):
            for name, backend in ATTENTION_BACKENDS.items():
                record = {"figure": "attention", "backend": name, "dtype": str(dtype).split(".")[1], "tokens": tokens, "batch": batch}
                q, k, v = (torch.randn(batch, shape.heads, tokens, head, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
                times = []
                try:
                    with sdpa_kernel(backend):
                        for _ in range(repeats + 1):
                            synchronize(device)
                            start = time.perf_counter()
                            torch.nn.functional.scaled_dot_product_attention(q, k, v).sum().backward()
                            synchronize(device)
                            times.append(time.perf_counter() - start)
                except RuntimeError as e:
                    records.append({**record, "refused": (first_line(e) if str(e).strip() else "")[:200]})
                    continue
                records.append({**record, "ms": round(1e3 * sorted(times[1:])[len(times[1:]) // 2], 3)})
    return records


def syncs_and_retries(trainer, device: str) -> dict:
    """Host synchronisations inside one update (each a warning under sync debug mode 'warn') and the allocator's
    retries during it; None on a CPU."""
    if not device.startswith("cuda"):
        return {"figure": "syncs", "host_syncs": None, "alloc_retries": None, "why": "counted on CUDA only"}
    before = torch.cuda.memory_stats(device).get("num_alloc_retries", 0)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    synchronize(device)
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]
    return {
        "figure": "syncs",
        "host_syncs": len(syncs),
        "first": syncs[:3],
        "alloc_retries": torch.cuda.memory_stats(device).get("num_alloc_retries", 0) - before,
    }


def update_rate(trainer, config, device: str, n: int) -> dict:
    """One timed update after the profiled ones: seconds, FLOPs, achieved FLOP/s and MFU (trainers/flops.py)."""
    synchronize(device)
    start = time.perf_counter()
    trainer.step()
    synchronize(device)
    seconds = time.perf_counter() - start
    return {"figure": "update", "seconds": round(seconds, 4), **UpdateArithmetic.of(config, n, device).figures(seconds)}


def main() -> None:
    from cli.scripts import device as device_flag
    from cli.scripts import positive_int

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", type=device_flag, default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--n", type=positive_int, default=1024, help="items (default 1024)")
    parser.add_argument("--batch", type=positive_int, default=1024, help="rollouts per update (default 1024)")
    parser.add_argument("--preset", default="paper", help="OR-Transformer preset (default paper)")
    args = parser.parse_args()
    trainer, config = trainer_for(args.device, args.n, args.batch, args.preset)
    trainer.step()  # the first update: allocations and kernels' first use, untimed
    emit(
        {
            "figure": "probe",
            "device": args.device,
            "n": args.n,
            "batch": config.batch,
            "rollout": config.rollout,
            "torch": torch.__version__,
        }
    )
    emit(kernel_split(trainer, args.device))
    emit(syncs_and_retries(trainer, args.device))
    emit(update_rate(trainer, config, args.device, args.n))
    shape = TransformerShape(config.blocks, config.width, config.heads, config.feed_forward)
    timings = attention_timings(args.device, args.n, min(config.batch, 64), shape)
    for record in timings:
        emit(record)
    for dtype in ("bfloat16", "float32"):
        timed = [r for r in timings if r["dtype"] == dtype and r["tokens"] == args.n + 1 and "ms" in r]
        if timed:
            fastest = min(timed, key=lambda r: r["ms"])
            emit(
                {
                    "figure": "fastest_attention",
                    "dtype": dtype,
                    "tokens": args.n + 1,
                    "ms": fastest["ms"],
                    "config": {"attention": fastest["backend"]},
                }
            )


if __name__ == "__main__":
    main()
