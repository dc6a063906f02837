"""bench/gpu.py, the GPU readiness script, on this CPU machine: its "no CUDA" line, and its cost-agreement check,
which must pass float32 against float64 and catch a 1e-4 change of the model."""

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from envs.instance import paper_instance
from trainers.flops import NetworkFlops
from trainers.networks import TransformerShape
from trainers.pathwise_config import TrainConfig

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "gpu.py"


@pytest.fixture(scope="module")
def gpu_script():
    spec = importlib.util.spec_from_file_location("gpu_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the checks instead")
def test_without_cuda_it_prints_one_line_and_succeeds(gpu_script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["gpu.py"])
    assert gpu_script.main() == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["cuda_available"] is False and "no CUDA" in record["message"]


def test_float32_costs_agree_with_float64_within_the_tolerance(gpu_script):
    record = gpu_script.cost_agreement("cpu", 16, reference_dtype=torch.float64)
    assert record["passed"] and 0 < record["max_relative_difference"] <= gpu_script.AGREEMENT_RTOL


def test_the_agreement_check_sees_a_1e_4_change_of_a_holding_cost(gpu_script):
    instance = paper_instance(16, 0)
    changed = dataclasses.replace(instance, h=instance.h * (1 + 1e-4))
    ours, theirs = gpu_script.fixed_action_costs(changed, "cpu"), gpu_script.fixed_action_costs(instance, "cpu")
    assert np.max(np.abs(ours - theirs) / theirs) > gpu_script.AGREEMENT_RTOL


def test_the_checks_come_in_priority_order_with_compile_and_cuda_graphs_among_them(gpu_script, monkeypatch, capsys):
    """The paper update in bfloat16 comes first, then decisions and the simulator; compile and CUDA graphs each have a
    check of their own, and the CUDA graphs check run here without CUDA is skipped, not failed."""
    names = list(gpu_script.CHECKS)
    assert names[:3] == ["update-bf16", "decisions", "simulator"] and {"update-compile", "update-cuda-graphs"} <= set(names)
    monkeypatch.setattr(
        sys, "argv", ["gpu.py", "--device", "cpu", "--n", "2", "--preset", "cpu", "--updates", "1", "--only", "update-cuda-graphs"]
    )
    assert gpu_script.main() == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["skipped"] for r in records] == ["CUDA graphs need CUDA"]


def test_a_check_past_its_limit_is_killed_and_the_rest_skipped_once_the_budget_is_spent(gpu_script, monkeypatch, capsys):
    """On the CPU at a tiny size with a 1-second limit per check and a 4-second budget: the first check (a child that
    imports torch and builds the paper update: seconds) is killed and reported as timed out with its limit, the checks
    after the budget is spent are reported as skipped by name, the summary names both and the exit status is 1. The
    broken control is a check without its limit: the run would then wait for every check."""
    argv = ["gpu.py", "--device", "cpu", "--n", "2", "--preset", "cpu", "--updates", "1", "--check-limit", "1", "--budget", "4"]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(gpu_script, "LEAST_SECONDS", 1.0)
    assert gpu_script.main() == 1
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    first = next(r for r in records if r.get("figure") == "update-bf16")
    assert first["timed_out"] and first["limit_s"] == 1.0 and first["passed"] is False
    summary = records[-1]
    assert summary["figure"] == "summary" and "update-bf16" in summary["timed_out"]
    assert summary["skipped"] and summary["skipped"][-1] == "ray-train"
    assert [r["figure"] for r in records if "skipped" in r and "budget" in r["skipped"]] == summary["skipped"]
    assert set(summary["timed_out"]) | set(summary["skipped"]) | set(summary["failed"]) <= set(gpu_script.CHECKS)


def test_the_probe_runs_at_a_tiny_size_on_the_cpu(monkeypatch, capsys):
    """bench/gpu_probe.py at n = 8, B = 4 on the CPU: its kernel split's families add up to its total (and a kernel named
    like a GEMM or a flash-attention kernel goes to its family), every attention record is timed or says why its
    backend refused, the math kernel is timed at S = n + 1 and n in both precisions, the quickest kernel at S = n + 1 of
    each precision is named as the config value that selects it, the synchronisations are said to be
    CUDA's only, and the update's FLOPs are trainers/flops.py's."""
    spec = importlib.util.spec_from_file_location("gpu_probe", SCRIPT.parent / "gpu_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    assert probe.family("sm90_xmma_gemm_bf16bf16_bf16f32") == "matmul" and probe.family("pytorch_flash::flash_fwd_kernel") == "attention"
    assert probe.family("vectorized_elementwise_kernel") == "elementwise/norm" and probe.family("cudaMemsetAsync") == "other"
    monkeypatch.setattr(sys, "argv", ["gpu_probe.py", "--device", "cpu", "--n", "8", "--batch", "4", "--preset", "cpu"])
    probe.main()
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    split = next(r for r in records if r["figure"] == "kernel_split")
    assert split["total_seconds"] > 0 and abs(sum(split["seconds"].values()) - split["total_seconds"]) <= 1e-3
    attention = [r for r in records if r["figure"] == "attention"]
    assert all(("ms" in r) != ("refused" in r) for r in attention)
    timed = {(r["tokens"], r["dtype"]) for r in attention if r["backend"] == "math" and "ms" in r}
    assert timed == {(9, "bfloat16"), (8, "bfloat16"), (9, "float32"), (8, "float32")}
    for fastest in (r for r in records if r["figure"] == "fastest_attention"):  # the config value of the quickest at S = n + 1
        quickest = min((r for r in attention if r["dtype"] == fastest["dtype"] and r["tokens"] == 9 and "ms" in r), key=lambda r: r["ms"])
        assert fastest["config"] == {"attention": quickest["backend"]} and TrainConfig(**fastest["config"]).attention == quickest["backend"]
    assert {r["dtype"] for r in records if r["figure"] == "fastest_attention"} == {"bfloat16", "float32"}
    assert next(r for r in records if r["figure"] == "syncs")["host_syncs"] is None
    update = next(r for r in records if r["figure"] == "update")
    config = probe.trainer_for("cpu", 8, 4, "cpu")[1]
    flops = NetworkFlops.of(TransformerShape(config.blocks, config.width, config.heads, config.feed_forward), 8)
    assert update["tflop_per_update"] == round(flops.update(4, config.rollout) / 1e12, 4) and update["mfu"] is None
