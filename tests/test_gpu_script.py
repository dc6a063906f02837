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


def test_one_run_measures_the_updates_with_compile_and_cuda_graphs(gpu_script, monkeypatch, capsys):
    """`main` makes one paper_updates check per setting, torch.compile and CUDA graphs among them (the other checks
    stubbed); without CUDA the CUDA graphs check is skipped, not failed, and the summary names no failure."""
    measured = []

    def paper_updates(device, n, preset, updates, settings):
        measured.append(settings)
        if settings.get("cuda_graphs"):
            return real_paper_updates(device, n, preset, updates, settings)
        return {"figure": "paper_updates", **settings, "passed": True}

    real_paper_updates = gpu_script.paper_updates
    monkeypatch.setattr(gpu_script, "paper_updates", paper_updates)
    for check in ("cost_agreement", "ray_train"):
        monkeypatch.setattr(gpu_script, check, lambda *args, check=check: {"figure": check, "passed": True})
    monkeypatch.setattr(gpu_script, "decision_time", lambda *args: [])
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--device", "cpu", "--n", "2", "--preset", "cpu", "--updates", "1"])
    assert gpu_script.main() == 0
    assert {"precision": "bfloat16", "compile": True} in measured and {"precision": "bfloat16", "cuda_graphs": True} in measured
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["skipped"] for r in records if r.get("cuda_graphs")] == ["CUDA graphs need CUDA"]
    assert records[-1]["failed"] == []
