"""CUDA checks (skipped without a GPU): the step and an evaluation on the GPU match the CPU, and a
training update runs there."""

import numpy as np
import pytest
import torch

from envs.classical import make_policy
from envs.dynamics import State, step
from envs.evaluation import evaluate
from envs.exogenous import sample_paths
from envs.instance import paper_instance
from trainers.pathwise import PathwiseTrainer, TrainConfig

pytestmark = pytest.mark.gpu


def test_step_and_evaluation_match_the_cpu():
    inst = paper_instance(16, 0)
    g = torch.Generator().manual_seed(0)
    state = State(
        torch.randn(8, 16, generator=g, dtype=torch.float64),
        torch.rand(8, 16, 3, generator=g, dtype=torch.float64),
        torch.zeros(8, dtype=torch.float64),
    )
    args = (
        torch.ones(8, dtype=torch.float64),
        torch.rand(8, 16, generator=g, dtype=torch.float64) * 10,
        torch.rand(8, 16, generator=g, dtype=torch.float64) * 5,
        torch.zeros(8, dtype=torch.float64),
    )
    cpu_next, cpu_cost = step(inst.to_torch(dtype=torch.float64), state, *args)
    cuda_state = State(*(x.cuda() for x in (state.inv, state.pipe, state.factor)))
    gpu_next, gpu_cost = step(inst.to_torch("cuda", torch.float64), cuda_state, *(a.cuda() for a in args))
    torch.testing.assert_close(gpu_cost.cpu(), cpu_cost)
    torch.testing.assert_close(gpu_next.inv.cpu(), cpu_next.inv)
    params = {"reorder_z": -0.5, "cover": 2, "order_up_to_z": 0.5, "cycle_stock": 0.0}
    cpu = evaluate(make_policy(inst.to_torch(), "base-stock-factor", params), inst.to_torch(), sample_paths(inst, 1, 16, 20))
    gpu = evaluate(
        make_policy(inst.to_torch("cuda"), "base-stock-factor", params), inst.to_torch("cuda"), sample_paths(inst, 1, 16, 20, "cuda")
    )
    np.testing.assert_allclose(gpu.discounted_cost, cpu.discounted_cost, rtol=1e-4)


def test_a_training_update_runs_on_cuda():
    trainer = PathwiseTrainer(
        TrainConfig(batch=32, rollout=5, blocks=1, width=32, heads=2, feed_forward=64, device="cuda"),
        paper_instance(16, 0).to_torch("cuda"),
    )
    metrics = trainer.step()
    assert np.isfinite(metrics["loss"]) and next(trainer.model.parameters()).is_cuda
