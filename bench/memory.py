"""Peak memory and time of one pathwise update of the paper preset (B rollouts of T = 10 steps, four blocks of
width 128) at n = 1,024: with the default memory budget (micro-batches chosen by the trainer) against the whole
batch in one micro-batch (the reference: the memory an update took before it was bounded), each in a fresh
process, measured in the same run; with --checkpoint-activations, the quantity encoder's blocks recomputed in the
backward pass. On a CPU the peak is the process's peak resident memory during the update (the
kernel's record reset before it) less its resident memory before it; on a GPU, torch's peak allocation during the
update.

  python bench/memory.py [--n 1024] [--batch 8 64] [--reference-batch 8] [--device cpu] [--threads 2] [--checkpoint-activations]
"""

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from trainers.memory import GIB, proc_field_bytes


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def reset_peak_resident() -> None:
    """Start the kernel's record of this process's peak resident memory anew (Linux: /proc/self/clear_refs), so that
    the peak read after the update is the update's, not that of the imports before it; nothing where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        pass


def peak_resident_bytes() -> int:
    """The peak resident memory since the last reset (VmHWM), or over the process's life (ru_maxrss) without one."""
    peak = proc_field_bytes("/proc/self/status", "VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def one_update(
    n: int, batch: int, micro_batch: int, budget: float, device: str, threads: int, checkpoint_activations: bool = False
) -> dict:
    """One update of a fresh trainer, its peak memory and seconds."""
    import torch

    from envs.instance import paper_instance
    from trainers.pathwise import PathwiseTrainer
    from trainers.registry import method_config

    torch.set_num_threads(threads)
    overrides = {"batch": batch, "micro_batch": micro_batch, "memory_budget": budget, "device": device, "updates": 2}
    config = method_config("or-transformer", "paper", overrides | {"checkpoint_activations": checkpoint_activations})
    trainer = PathwiseTrainer(config, paper_instance(n, 0).to_torch(device))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = resident_bytes()
        reset_peak_resident()
    start = time.perf_counter()
    trainer.step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = peak_resident_bytes()
    return {
        "figure": "update_memory",
        "n": n,
        "batch": batch,
        "device": device,
        "checkpoint_activations": checkpoint_activations,
        "micro_batch": trainer.memory.rollouts,
        "readout_micro_batch": trainer.memory.readout_rollouts,
        "budget_gib": round(trainer.memory.budget_gib, 3),
        "rollout_gib": round(trainer.memory.state.rollout(config.rollout) / GIB, 4),
        "readout_gib": round(trainer.memory.state.readout(config.rollout) / GIB, 4),
        "stored_gib": round(trainer.memory.state.kept_until_the_end(batch, config.rollout) / GIB, 4),
        "seconds": round(time.perf_counter() - start, 2),
        "peak_gib": round(peak / GIB, 3),
        "update_gib": round((peak - before) / GIB, 3),
    }


def measured(
    n: int, batch: int, micro_batch: int, device: str, threads: int, budget: float = 0.0, checkpoint_activations: bool = False
) -> dict:
    """`one_update` in a fresh process (its own peak)."""
    command = [sys.executable, __file__, "--child", str(n), str(batch), str(micro_batch), str(budget), device, str(threads)]
    command += ["--checkpoint-activations"] if checkpoint_activations else []
    done = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    if done.returncode:
        return {
            "figure": "update_memory",
            "n": n,
            "batch": batch,
            "micro_batch": micro_batch or "default",
            "error": done.stderr.strip()[-400:],
        }
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        n, batch, micro_batch, budget, device, threads = sys.argv[2:8]
        recompute = "--checkpoint-activations" in sys.argv[8:]
        print(json.dumps(one_update(int(n), int(batch), int(micro_batch), float(budget), device, int(threads), recompute)), flush=True)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--reference-batch", type=int, nargs="*", default=[8], help="batches also measured in one micro-batch")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--checkpoint-activations", action="store_true", help="recompute the quantity encoder's blocks")
    args = parser.parse_args()
    recompute = args.checkpoint_activations
    for batch in args.batch:
        bounded = measured(args.n, batch, 0, args.device, args.threads, checkpoint_activations=recompute)
        if batch in args.reference_batch and "error" not in bounded:
            whole = measured(args.n, batch, batch, args.device, args.threads, checkpoint_activations=recompute)
            if "error" not in whole:
                bounded["whole_batch_update_gib"] = whole["update_gib"]
                bounded["whole_batch_seconds"] = whole["seconds"]
                bounded["memory_ratio_vs_whole_batch"] = round(bounded["update_gib"] / whole["update_gib"], 3)
                bounded["time_ratio_vs_whole_batch"] = round(bounded["seconds"] / whole["seconds"], 3)
        print(json.dumps(bounded), flush=True)


if __name__ == "__main__":
    main()
