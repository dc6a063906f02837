"""CUDA checks (skipped without a GPU): the step and an evaluation on the GPU match the CPU, a training update
runs there, TF32 stays within the updates that use it, and CUDA graphs give the eager update."""

import numpy as np
import pytest
import torch

from envs.dynamics import State, step
from envs.evaluation import evaluate
from envs.exogenous import sample_paths
from envs.features import global_token, item_tokens
from envs.instance import paper_instance
from policies.classical import RULES, make_policy
from trainers import pathwise
from trainers.pathwise import PathwiseTrainer
from trainers.pathwise_config import TrainConfig, build_network
from trainers.policy import LearnedPolicy

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
    cpu = evaluate(make_policy(inst.to_torch(), RULES["base-stock-factor"], params), inst.to_torch(), sample_paths(inst, 1, 16, 20))
    gpu = evaluate(
        make_policy(inst.to_torch("cuda"), RULES["base-stock-factor"], params), inst.to_torch("cuda"), sample_paths(inst, 1, 16, 20, "cuda")
    )
    np.testing.assert_allclose(gpu.discounted_cost, cpu.discounted_cost, rtol=1e-4)


def test_a_training_update_runs_on_cuda():
    trainer = PathwiseTrainer(
        TrainConfig(batch=32, rollout=5, blocks=1, width=32, heads=2, feed_forward=64, device="cuda"),
        paper_instance(16, 0).to_torch("cuda"),
    )
    metrics = trainer.step()
    assert np.isfinite(metrics["loss"]) and next(trainer.model.parameters()).is_cuda


def test_the_policy_call_on_cuda_masks_the_quantities_the_cpu_skips():
    """The policy call computes Q on every state on a GPU and masks those that do not open (no host synchronisation);
    on the CPU it runs the quantity network only on the states that open. Both give Y and Y Q alike, and Q = 0
    where Y = 0."""
    torch.manual_seed(0)
    inst = paper_instance(16, 0)
    model = build_network(TrainConfig(blocks=1, width=32, heads=2, feed_forward=64), 16)
    g = torch.Generator().manual_seed(1)
    state = State(torch.randn(64, 16, generator=g) * 5, torch.rand(64, 16, 3, generator=g) * 3, torch.randn(64, generator=g))
    with torch.no_grad():  # half of the states open, none of them near the threshold
        logits = model.open_logit(item_tokens(inst.to_torch(), state), global_token(inst.to_torch(), state)).sort().values
        model.open_net.head.bias -= (logits[31] + logits[32]) / 2
    cpu_open, cpu_quantity = LearnedPolicy(model)(state, inst.to_torch())
    cuda_state = State(*(x.cuda() for x in (state.inv, state.pipe, state.factor)))
    gpu_open, gpu_quantity = LearnedPolicy(model.cuda())(cuda_state, inst.to_torch("cuda"))
    assert 0 < cpu_open.mean() < 1
    torch.testing.assert_close(gpu_open.cpu(), cpu_open)
    torch.testing.assert_close(gpu_quantity.cpu(), cpu_quantity, rtol=1e-4, atol=1e-4)
    assert bool((gpu_quantity[gpu_open == 0] == 0).all())


def test_a_bfloat16_update_on_cuda_leaves_tf32_off_for_a_later_float32_run():
    """A bfloat16 update uses TF32 (its default) during the update only: a float32 run after it in the same process,
    and the process itself, have TF32 as before."""
    before = torch.backends.cuda.matmul.allow_tf32
    config = {"batch": 8, "rollout": 3, "blocks": 1, "width": 32, "heads": 2, "feed_forward": 64, "device": "cuda"}
    inside, losses = [], pathwise.hybrid_losses

    def recording(*args, **kwargs):
        inside.append(torch.backends.cuda.matmul.allow_tf32)
        return losses(*args, **kwargs)

    instance = paper_instance(16, 0).to_torch("cuda")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pathwise, "hybrid_losses", recording)
        for precision in ("bfloat16", "float32"):
            PathwiseTrainer(TrainConfig(**config, precision=precision), instance).step()
    assert inside == [True, False] and torch.backends.cuda.matmul.allow_tf32 == before


def test_cuda_graphs_give_the_eager_update_on_cuda():
    """Two updates (float64, micro-batches of 2 rollouts) with the networks replayed as CUDA graphs leave the
    parameters of the eager updates to float64 rounding."""
    instance = paper_instance(4, 0).to_torch("cuda", torch.float64)
    config = {"batch": 4, "rollout": 3, "blocks": 1, "width": 16, "heads": 2, "feed_forward": 32, "micro_batch": 2, "device": "cuda"}

    def parameters_after_two_updates(cuda_graphs: bool) -> torch.Tensor:
        trainer = PathwiseTrainer(TrainConfig(**config, cuda_graphs=cuda_graphs), instance)
        for _ in range(2):
            trainer.step()
        return torch.cat([p.detach().flatten() for p in trainer.model.parameters()])

    torch.testing.assert_close(parameters_after_two_updates(True), parameters_after_two_updates(False), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_a_decision_replayed_as_a_cuda_graph_is_the_eager_decision(precision):
    """LearnedPolicy with cuda_graphs: at batch 1 and 16, for a state seen at capture and for other states replayed
    through the same graph, p and Q equal the eager decision's at the same precision (the same kernels: to 1e-6), and
    the quantities of states that do not open are 0 as a policy."""
    torch.manual_seed(0)
    inst = paper_instance(16, 0).to_torch("cuda")
    model = build_network(TrainConfig(blocks=2, width=32, heads=4, feed_forward=64), 16).cuda()
    eager, graphed = LearnedPolicy(model, precision=precision), LearnedPolicy(model, precision=precision, cuda_graphs=True)
    g = torch.Generator().manual_seed(3)
    for batch in (1, 16):
        for _ in range(3):
            state = State(
                *(x.cuda() for x in (torch.randn(batch, 16, generator=g) * 5, torch.rand(batch, 16, 3, generator=g) * 3)),
                torch.zeros(batch, device="cuda"),
            )
            want, got = eager.decide(state, inst), graphed.decide(state, inst)
            torch.testing.assert_close(got.probability, want.probability, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(got.quantity, want.quantity, rtol=1e-6, atol=1e-5)
            open_order, quantity = graphed(state, inst)
            assert bool((quantity[open_order == 0] == 0).all())
    assert sorted(graphed.captured) == [(1, 16, 11), (16, 16, 11)]
