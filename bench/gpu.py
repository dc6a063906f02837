"""GPU readiness in one run that always answers: each check runs in a process of its own under its own time limit,
in priority order (the paper update at n = 1,024 in bfloat16 first, then the paper network's decision time at batch 1
and 128, the simulator's throughput, the update in float32, with activation checkpointing, with torch.compile and with
CUDA graphs (seconds, transitions/s, micro-batch, peak memory within 80 GiB), the gpu-marked tests, the simulator's
costs on the GPU against the CPU, and a Ray Train run with use_gpu on one GPU), all within --budget seconds (default
480: 8 minutes). Each check's JSON lines are printed as it finishes; a check past its limit is killed and reported
as timed out (with what it printed by then), and a check that no longer fits the budget is reported as skipped. The
last line names the failed, timed-out and skipped checks. Exit status 0 when none failed or timed out, 1 otherwise,
and 0 with a single "no CUDA" line on a machine without CUDA (nothing to check there).

  python bench/gpu.py                      # on a CUDA machine: every check, within 8 minutes
  python bench/gpu.py --device cpu --n 8 --preset cpu --updates 2    # the same code path on a CPU, small
  python bench/gpu.py --only update-bf16   # one check, in this process, without a limit

`make gpu-check` runs the first line.
"""

import argparse
import contextlib
import gc
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from envs.dynamics import initial_state, step
from envs.exogenous import FactorDemandStream, sample_paths
from envs.instance import paper_instance
from plumbing.errors import first_line
from trainers.flops import UpdateArithmetic

AGREEMENT_RTOL = 1e-5
"""Largest relative difference of an episode's discounted cost between the device and the CPU (float32 both)."""
AGREEMENT_EPISODES, AGREEMENT_HORIZON = 64, 50
DECISION_REPEATS = 20
PEAK_LIMIT_GIB = 80.0
"""A paper update must fit an 80 GB card (an H100): the update check fails above this peak allocation."""
ROOT = Path(__file__).resolve().parent.parent


def emit(record: dict) -> dict:
    print(json.dumps(record), flush=True)
    return record


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def device_facts(device: str) -> dict:
    facts = {"figure": "device", "device": device, "torch": torch.__version__, "cuda_available": torch.cuda.is_available()}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(device)
        facts.update(
            name=props.name,
            memory_gib=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
            cuda=torch.version.cuda,
        )
    return facts


def gpu_test_files() -> list[str]:
    """The test files that hold gpu-marked tests: collecting only these, a machine without the solvers (HiGHS, Gurobi)
    runs the GPU tests without failing on modules it cannot import."""
    return sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").glob("test_*.py") if "mark.gpu" in path.read_text())


def gpu_tests(device: str) -> dict:
    """Every gpu-marked test, in a pytest of their own."""
    if not device.startswith("cuda"):
        return {"figure": "gpu_tests", "skipped": "the gpu-marked tests need CUDA"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", *gpu_test_files()],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    lines = done.stdout.strip().splitlines()
    return {
        "figure": "gpu_tests",
        "exit_status": done.returncode,
        "summary": lines[-1] if lines else done.stderr.strip()[-300:],
        "passed": done.returncode == 0,
    }


def fixed_action_costs(
    instance, device: str, dtype: torch.dtype = torch.float32, episodes: int = AGREEMENT_EPISODES, horizon: int = AGREEMENT_HORIZON
) -> np.ndarray:
    """Per-episode discounted cost [E] of one fixed sequence of orders (drawn on the CPU, seed 0) on the held-out-style
    paths of seed 1, stepped on `device`: the simulator alone, so no decision can flip between devices."""
    g = torch.Generator().manual_seed(0)
    opens = (torch.rand(horizon, episodes, generator=g) < 0.4).to(dtype)
    fractions = torch.rand(horizon, episodes, instance.n, generator=g).to(dtype)
    paths = sample_paths(instance, 1, episodes, horizon)
    tinst = instance.to_torch(device, dtype)
    factor, demand = paths.factor.to(device, dtype), paths.demand.to(device, dtype)
    state, total = initial_state(tinst, factor[:, 0]), torch.zeros(episodes, device=device, dtype=torch.float64)
    for t in range(horizon):
        state, cost = step(tinst, state, opens[t].to(device), fractions[t].to(device) * tinst.qbar, demand[:, t], factor[:, t + 1])
        total += instance.gamma**t * cost.double()
    return total.cpu().numpy()


def cost_agreement(device: str, n: int, reference: str = "cpu", reference_dtype: torch.dtype = torch.float32) -> dict:
    """The simulator's per-episode costs on `device` against `reference` (the check passes within AGREEMENT_RTOL)."""
    instance = paper_instance(n, 0)
    ours, theirs = fixed_action_costs(instance, device), fixed_action_costs(instance, reference, reference_dtype)
    relative = float(np.max(np.abs(ours - theirs) / np.abs(theirs)))
    return {
        "figure": "cost_agreement",
        "device": device,
        "reference": f"{reference}/{str(reference_dtype).removeprefix('torch.')}",
        "n": n,
        "episodes": AGREEMENT_EPISODES,
        "horizon": AGREEMENT_HORIZON,
        "max_relative_difference": relative,
        "rtol": AGREEMENT_RTOL,
        "passed": relative <= AGREEMENT_RTOL,
    }


def peak_memory_gib(device: str):
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.startswith("cuda") else None


def free_device_memory(device: str) -> None:
    """Return what the caching allocator holds to the device, so a later check starts from an empty GPU (after an
    out-of-memory error too: the caller has dropped the failed update's tensors and its traceback by then), with
    the compiled graphs dropped (CUDA graphs keep a memory pool of their own)."""
    torch._dynamo.reset()
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def paper_updates(device: str, n: int, preset: str, updates: int, settings: dict) -> dict:
    """`updates` timed updates of OR-Transformer's `preset` (after one untimed, which compiles with `compile` or
    `cuda_graphs`) with the config fields `settings`, without the warm start, with the default memory budget; passes
    when every loss is finite and the peak stays within PEAK_LIMIT_GIB. CUDA graphs are skipped without CUDA."""
    from trainers.pathwise import PathwiseTrainer
    from trainers.pathwise_config import NO_WARM_START
    from trainers.registry import method_config

    record = {"figure": "paper_updates", "preset": preset, **settings, "device": device, "n": n}
    if settings.get("cuda_graphs") and not device.startswith("cuda"):
        return {**record, "skipped": "CUDA graphs need CUDA"}
    config = method_config("or-transformer", preset, {"device": device, **NO_WARM_START, **settings})
    record.update(batch=config.batch, rollout=config.rollout)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    error = None
    try:
        trainer = PathwiseTrainer(config, paper_instance(n, 0).to_torch(device))
        memory = trainer.memory
        record.update(
            micro_batch=memory.rollouts, readout_micro_batch=memory.readout_rollouts, memory_budget_gib=round(memory.budget_gib, 1)
        )
        start = time.perf_counter()
        trainer.step()
        synchronize(device)
        record["first_update_seconds"] = round(time.perf_counter() - start, 2)
        start = time.perf_counter()
        losses = [trainer.step()["loss"] for _ in range(updates)]
        synchronize(device)
        seconds = (time.perf_counter() - start) / updates
    except Exception as e:  # out of memory, or a compiler's error: reported, and the later checks still run
        error = f"{type(e).__name__}: {first_line(e) if str(e).strip() else ''}"
    trainer = None
    peak = peak_memory_gib(device)
    free_device_memory(device)
    if error:
        return {**record, "error": error, "peak_memory_gib": peak, "passed": False}
    within = peak is None or peak <= PEAK_LIMIT_GIB
    return {
        **record,
        "updates": updates,
        "seconds_per_update": round(seconds, 4),
        **UpdateArithmetic.of(config, n, device).figures(seconds),
        "transitions_per_s": round(config.batch * config.rollout / seconds),
        "peak_memory_gib": peak,
        "peak_limit_gib": PEAK_LIMIT_GIB,
        "passed": bool(np.all(np.isfinite(losses))) and within,
    }


DECISION_SETTINGS = (("float32", False), ("bfloat16", False), ("bfloat16", True))
"""(precision, CUDA graphs) of the timed decisions; the graphs on a cuda device only."""
PAIRED_EPISODES = 64
"""Held-out episodes (paths of seed 1, 50 steps) of the bfloat16 against float32 greedy evaluation."""


def decision_time(device: str, n: int, preset: str, checkpoint: str | None = None) -> list[dict]:
    """The greedy decision of an (untrained) OR-Transformer network of `preset` at n items, or of the trained network
    of an OR-Transformer `checkpoint` on its own instance, at batch 1 and 128 in each of
    DECISION_SETTINGS, median of DECISION_REPEATS calls after a first (capturing) one; then the paired difference of
    its bfloat16 greedy evaluation from its float32 one on PAIRED_EPISODES held-out episodes (mean and s.e. of the
    per-episode differences) and the share of steps that open otherwise (an episode's states differ after its first)."""
    from envs.evaluation import evaluate, standard_error
    from trainers.pathwise_config import build_network
    from trainers.policy import LearnedPolicy
    from trainers.registry import load_policy, method_config

    torch.manual_seed(0)
    if checkpoint:
        policy, saved = load_policy(checkpoint, device=device)
        model, instance, network = policy.model, saved["instance"], f"{saved['config'].method} checkpoint {checkpoint}"
        n = instance.n
    else:
        instance, network = paper_instance(n, 0), f"or-transformer/{preset} (untrained, seed 0)"
        model = build_network(method_config("or-transformer", preset), n).to(device)
    tinst = instance.to_torch(device)
    records = []
    for precision, graphs in DECISION_SETTINGS:
        if graphs and not device.startswith("cuda"):
            continue
        policy = LearnedPolicy(model, "greedy", precision=precision, cuda_graphs=graphs)
        for batch in (1, 128):
            state = initial_state(tinst, FactorDemandStream(tinst, batch, 0).initial_factor())
            policy.decide(state, tinst)
            seconds = []
            for _ in range(DECISION_REPEATS):
                synchronize(device)
                start = time.perf_counter()
                policy.decide(state, tinst)
                synchronize(device)
                seconds.append(time.perf_counter() - start)
            ms = np.asarray(seconds) * 1e3
            records.append(
                {
                    "figure": "decision_ms",
                    "network": network,
                    "n": n,
                    "batch": batch,
                    "precision": precision,
                    "cuda_graphs": graphs,
                    "device": device,
                    "ms": round(float(np.median(ms)), 3),
                    "p90_ms": round(float(np.percentile(ms, 90)), 3),
                }
            )
    paths = sample_paths(instance, 1, PAIRED_EPISODES, 50, device=device)
    single, half = (evaluate(LearnedPolicy(model, "greedy", precision=p), tinst, paths, trace=True) for p in ("float32", "bfloat16"))
    difference = half.discounted_cost - single.discounted_cost
    flipped = float((half.trace.open != single.trace.open).mean())
    records.append(
        {
            "figure": "bfloat16_decisions",
            "network": network,
            "n": n,
            "episodes": PAIRED_EPISODES,
            "float32_mean": round(float(single.discounted_cost.mean()), 2),
            "paired_difference_mean": round(float(difference.mean()), 3),
            "paired_difference_se": round(standard_error(difference), 3),
            "steps_opening_otherwise": round(flipped, 5),
        }
    )
    return records


def ray_train(device: str, n: int, preset: str, updates: int) -> dict:
    """A Ray Train run of one worker (use_gpu on CUDA) on an embedded Ray, in a temporary run folder."""
    from ray_access.session import init_ray, stop_ray
    from trainers.pathwise_config import NO_WARM_START
    from trainers.ray_train import train_data_parallel
    from trainers.registry import method_config

    use_gpu = device.startswith("cuda")
    config = method_config(
        "or-transformer",
        preset,
        {"device": "cuda" if use_gpu else "cpu", **NO_WARM_START, "updates": updates, "checkpoint_every": 0},
    )
    init_ray(1)
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as folder:
            summary = train_data_parallel(config, paper_instance(n, 0), Path(folder) / "run", workers=1, use_gpu=use_gpu, progress=False)
    finally:
        stop_ray()
    return {
        "figure": "ray_train",
        "use_gpu": use_gpu,
        "n": n,
        "preset": preset,
        "updates_done": summary["updates_done"],
        "status": summary["status"],
        "seconds": round(time.perf_counter() - start, 1),
        "passed": summary["status"] == "completed" and summary["updates_done"] == updates,
    }


def simulator_throughput(device: str, n: int) -> list[dict]:
    """bench/simulator.py's forward and forward + backward item-steps per second at B = 1,024, T = 10, for n = 16, 64 and
    `n`, with the compiled step's forward (and on a GPU its CUDA graphs) against the eager one (its rows)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from simulator import bench

    modes = (None, "reduce-overhead") if device.startswith("cuda") else (None,)
    with contextlib.redirect_stdout(io.StringIO()):  # its own line per n; the records here are the check's
        rows = [bench(size, device, modes) for size in sorted({16, 64, n})]
    return [{"figure": "simulator", **row} for row in rows]


CHECKS = {
    "update-bf16": (150, lambda a: [paper_updates(a.device, a.n, a.preset, a.updates, {"precision": "bfloat16"})]),
    "decisions": (60, lambda a: decision_time(a.device, a.n, a.preset, a.checkpoint)),
    "simulator": (90, lambda a: simulator_throughput(a.device, a.n)),
    "update-fp32": (120, lambda a: [paper_updates(a.device, a.n, a.preset, a.updates, {"precision": "float32"})]),
    "update-checkpoint": (
        90,
        lambda a: [paper_updates(a.device, a.n, a.preset, a.updates, {"precision": "bfloat16", "checkpoint_activations": True})],
    ),
    "update-compile": (150, lambda a: [paper_updates(a.device, a.n, a.preset, a.updates, {"precision": "bfloat16", "compile": True})]),
    "update-cuda-graphs": (
        120,
        lambda a: [paper_updates(a.device, a.n, a.preset, a.updates, {"precision": "bfloat16", "cuda_graphs": True})],
    ),
    "gpu-tests": (120, lambda a: [gpu_tests(a.device)]),
    "agreement": (60, lambda a: [cost_agreement(a.device, a.n)]),
    "ray-train": (120, lambda a: [ray_train(a.device, a.n, a.preset, a.updates)]),
}
"""Every check in priority order: its time limit in seconds (a GPU's, start-up included) and what it runs."""
BUDGET = 480.0
"""Seconds for every check together (`make gpu-check`): a GPU lease of 15 minutes holds its start-up and this."""
LEAST_SECONDS = 5.0
"""A check is started only with at least this many seconds of the budget left."""


def run_checks(args) -> dict:
    """Every check of CHECKS in order, each in a child process (this script with --only) under min(its limit, the
    budget left); prints each record as its check finishes. Returns the summary record."""
    start = time.perf_counter()
    failed, timed_out, skipped = [], [], []
    passthrough = ["--device", args.device, "--n", str(args.n), "--preset", args.preset, "--updates", str(args.updates)]
    passthrough += ["--checkpoint", args.checkpoint] if args.checkpoint else []
    for name, (limit, _) in CHECKS.items():
        left = args.budget - (time.perf_counter() - start)
        if left < LEAST_SECONDS:
            skipped.append(name)
            emit({"figure": name, "skipped": f"the budget of {args.budget:g} s is spent ({left:.0f} s left)"})
            continue
        limit = min(args.check_limit or limit, left)
        child = subprocess.Popen(
            [sys.executable, __file__, "--only", name, *passthrough], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            out, err = child.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            timed_out.append(name)
        records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        for record in records:
            emit(record)
        if name in timed_out:
            emit({"figure": name, "timed_out": True, "limit_s": round(limit, 1), "passed": False})
        elif child.returncode != 0 or any(record.get("passed") is False for record in records):
            failed.append(name)
            if child.returncode != 0:
                emit({"figure": name, "passed": False, "exit_status": child.returncode, "error": err.strip()[-500:]})
    return {
        "figure": "summary",
        "device": args.device,
        "failed": failed,
        "timed_out": timed_out,
        "skipped": skipped,
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> int:
    from cli.scripts import device, positive_int, positive_real
    from trainers.registry import PRESETS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--device", type=device, help="cuda or cuda:K (default: cuda; without CUDA the script prints one line and exits 0) or cpu"
    )
    parser.add_argument("--n", type=positive_int, default=1024, help="items of the paper instance (default 1024)")
    parser.add_argument(
        "--preset", choices=list(PRESETS), default="paper", help="OR-Transformer preset of the updates and decisions (default paper)"
    )
    parser.add_argument("--updates", type=positive_int, default=3, help="timed updates (default 3); the Ray Train run makes as many")
    parser.add_argument("--checkpoint", help="a trained checkpoint whose network the decisions check times and compares in bfloat16")
    parser.add_argument("--budget", type=positive_real, default=BUDGET, help=f"seconds for every check together (default {BUDGET:g})")
    parser.add_argument("--check-limit", type=positive_real, help="seconds for each check (default: each check's own, CHECKS)")
    parser.add_argument("--only", choices=list(CHECKS), help="run this one check here, without a limit")
    args = parser.parse_args()
    if args.checkpoint and not Path(args.checkpoint).is_file():
        parser.error(f"argument --checkpoint: no such file '{args.checkpoint}'")
    if args.device is None and not torch.cuda.is_available():
        emit(
            {
                "figure": "device",
                "cuda_available": False,
                "torch": torch.__version__,
                "message": "no CUDA on this machine (torch.cuda.is_available() is False): nothing to check; run it on a GPU machine",
            }
        )
        return 0
    args.device = args.device or "cuda"
    if args.only:
        for record in CHECKS[args.only][1](args):
            emit(record)
        return 0
    emit(device_facts(args.device))
    summary = emit(run_checks(args))
    return 1 if summary["failed"] or summary["timed_out"] else 0


if __name__ == "__main__":
    sys.exit(main())
