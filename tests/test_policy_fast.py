"""The fast decision path of trainers/policy.py against the full computation (both networks on every state,
every block on every token, outside inference mode): same Y, same Q where Y = 1, same evaluation costs."""

import numpy as np
import pytest
import torch

from envs.dynamics import State
from envs.evaluation import evaluate
from envs.exogenous import sample_paths
from envs.features import global_token, item_tokens
from envs.instance import paper_instance
from trainers.pathwise_config import build_network
from trainers.policy import LearnedPolicy
from trainers.registry import method_config

N = 8


def random_state(n: int, batch: int, seed: int) -> State:
    g = torch.Generator().manual_seed(seed)
    return State(torch.randn(batch, n, generator=g) * 5, torch.rand(batch, n, 3, generator=g) * 4, torch.randn(batch, generator=g))


def full_decision(model, tinst, state: State):
    """Today's path, written out: both networks on every state, gradients tracked (so no inference-mode
    shortcut): (open logit [B], Q [B, n])."""
    items, glob = item_tokens(tinst, state), global_token(tinst, state)
    return model.open_logit(items, glob).detach(), (tinst.qbar * model.quantity_fraction(items, glob)).detach()


MARGIN = 1e-4
"""Two computation paths (kernels, operation order) move p = sigmoid(logit) by about 1e-7 here: decisions are
compared only where |p - 0.5| exceeds this margin, and p itself to a tolerance."""


def half_opening(model, tinst, state: State) -> torch.Tensor:
    """Shift the open head's bias so that half of the batch (even size) opens; returns the open logits."""
    logit, _ = full_decision(model, tinst, state)
    middle = logit.sort().values[len(logit) // 2 - 1 : len(logit) // 2 + 1].mean()
    with torch.no_grad():
        model.open_net.head.bias -= middle
    logit, _ = full_decision(model, tinst, state)
    return logit


def clear(logit: torch.Tensor) -> torch.Tensor:
    """The states whose open decision no rounding can flip: |p - 0.5| > MARGIN; both decisions must occur among them."""
    mask = (torch.sigmoid(logit) - 0.5).abs() > MARGIN
    assert (logit[mask] > 0).any() and (logit[mask] < 0).any(), logit
    return mask


@pytest.mark.parametrize("preset", ["paper", "cpu"])
def test_fast_path_decides_as_the_full_computation(preset):
    """The fast path's open decision equals the full computation's on every state where |p - 0.5| > MARGIN, p and
    the quantities to 1e-6 relative, and closed states order nothing. Breaks if the fast path reads another
    head, skips a block on a state that needs it, or returns quantities of closed states."""
    torch.manual_seed(0)
    tinst = paper_instance(N, 0).to_torch()
    model = build_network(method_config("or-transformer", preset), N)
    state = random_state(N, batch=12, seed=1)
    logit = half_opening(model, tinst, state)
    _, quantity = full_decision(model, tinst, state)
    sure = clear(logit)

    policy = LearnedPolicy(model, "greedy")
    open_order, fast_quantity = policy(state, tinst)
    assert open_order[sure].tolist() == (logit[sure] > 0).float().tolist()
    opened = open_order.bool()
    torch.testing.assert_close(fast_quantity[opened], quantity[opened], rtol=1e-6, atol=0)
    assert fast_quantity[~opened].eq(0).all()

    decision = policy.decide(state, tinst)  # all quantities, as platform/decide.py reports them
    assert decision.open[sure].tolist() == open_order[sure].tolist()
    torch.testing.assert_close(decision.probability, torch.sigmoid(logit), rtol=1e-6, atol=0)
    torch.testing.assert_close(decision.quantity, quantity, rtol=1e-6, atol=0)


def test_sampled_mode_draws_the_same_stream_with_and_without_the_quantities_of_closed_states():
    """Same seed, same draws: the sampled decisions with and without the closed states' quantities agree, so
    the quantities' computation consumes no random numbers. Both calls take the same computation path for p."""
    torch.manual_seed(2)
    tinst = paper_instance(N, 0).to_torch()
    model = build_network(method_config("or-transformer", "cpu"), N)
    state = random_state(N, batch=12, seed=3)
    half_opening(model, tinst, state)
    policy = LearnedPolicy(model, "sampled", seed=5)
    policy.reset()
    full = policy.decide(state, tinst)
    policy.reset()
    open_order, quantity = policy(state, tinst)
    opens = open_order.bool()
    assert open_order.tolist() == full.open.tolist() and 0 < opens.sum() < len(opens)
    torch.testing.assert_close(quantity[opens], full.quantity[opens], rtol=1e-6, atol=0)
    assert quantity[~opens].eq(0).all()


def test_inference_mode_global_readouts_equal_the_full_encoders_with_padding():
    """h_0 from a last block that updates only h_0 (inference mode) against every row updated, for the open
    logit and the value, with padded item slots that must not change them."""
    torch.manual_seed(3)
    tinst = paper_instance(N, 0).to_torch()
    model = build_network(method_config("or-transformer", "cpu"), N)
    state = random_state(N, batch=3, seed=4)
    items, glob = item_tokens(tinst, state), global_token(tinst, state)
    padded = torch.cat([items, torch.randn(3, 5, 11) * 100], dim=1)
    mask = torch.cat([torch.ones(3, N, dtype=torch.bool), torch.zeros(3, 5, dtype=torch.bool)], dim=1)
    full_logit, full_value = model.open_logit(items, glob).detach(), model.value(items, glob).detach()
    with torch.inference_mode():
        for args in ((items, glob), (padded, glob, mask)):
            torch.testing.assert_close(model.open_logit(*args), full_logit, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(model.value(*args), full_value, rtol=1e-5, atol=1e-6)


def test_evaluation_costs_equal_the_full_path():
    """20 steps of 6 episodes: at every state the rollout meets, the fast path opens as the full computation does
    wherever |p - 0.5| > MARGIN (there the full decision is used, so that one rounding cannot split the two
    rollouts), and the costs and quantities agree to 1e-6. Breaks if the fast path decides or orders otherwise."""
    torch.manual_seed(4)
    instance = paper_instance(4, 0)
    tinst = instance.to_torch()
    model = build_network(method_config("or-transformer", "cpu"), 4)
    with torch.no_grad():
        model.open_net.head.bias -= 0.45  # opens in about half of the steps (checked below)
    paths = sample_paths(instance, 11, 6, 20)
    fast_policy, compared = LearnedPolicy(model, "greedy"), []

    def full_policy(state, inst):
        logit, quantity = full_decision(model, inst, state)
        return (logit > 0).float(), quantity

    def checked_fast_policy(state, inst):
        open_order, quantity = fast_policy(state, inst)
        logit, full_quantity = full_decision(model, inst, state)
        sure = (torch.sigmoid(logit) - 0.5).abs() > MARGIN
        assert open_order[sure].tolist() == (logit[sure] > 0).float().tolist()
        compared.append(int(sure.sum()))
        full_open = (logit > 0).float()
        return torch.where(sure, open_order, full_open), torch.where(sure[:, None], quantity, full_quantity * full_open[:, None])

    fast = evaluate(checked_fast_policy, tinst, paths, trace=True)
    full = evaluate(full_policy, tinst, paths, trace=True)
    assert 0.2 < fast.trace.open.mean() < 0.8 and sum(compared) >= 0.9 * 6 * 20
    np.testing.assert_array_equal(fast.trace.open, full.trace.open)
    np.testing.assert_allclose(fast.discounted_cost, full.discounted_cost, rtol=1e-6, atol=0)
    opened = fast.trace.open.astype(bool)
    np.testing.assert_allclose(fast.trace.quantity[opened], full.trace.quantity[opened], rtol=1e-6, atol=0)
    assert not fast.trace.quantity[~opened].any()


def test_a_bfloat16_decision_keeps_the_float32_openings_clear_of_its_rounding_and_q_within_it():
    """The paper network (seed 0) at n = 8 on 64 states, half of them opening: in bfloat16 the open logit is within
    5% of float32's largest |logit| (bfloat16 keeps 8 bits of mantissa; about 4% is measured here), the greedy Y is
    float32's wherever |logit| exceeds that, and Q is within 1% of qbar (0.3% measured); and bfloat16 was applied (the
    logits differ beyond float32 rounding). A precision outside the two, and CUDA graphs on a CPU, are refused."""
    torch.manual_seed(0)
    tinst = paper_instance(N, 0).to_torch()
    model = build_network(method_config("or-transformer", "paper"), N)
    state = random_state(N, batch=64, seed=2)
    half_opening(model, tinst, state)
    single, half = (LearnedPolicy(model, "greedy", precision=p).decide(state, tinst) for p in ("float32", "bfloat16"))
    logit, rounded = torch.logit(single.probability.double()), torch.logit(half.probability.double())
    tolerance = 0.05 * logit.abs().max()
    assert 1e-5 < (rounded - logit).abs().max() <= tolerance
    sure = logit.abs() > tolerance
    assert 0 < single.open[sure].mean() < 1
    torch.testing.assert_close(half.open[sure], single.open[sure])
    assert ((half.quantity - single.quantity) / tinst.qbar).abs().max() <= 0.01
    with pytest.raises(ValueError, match=r"precision: expected one of \['float32', 'bfloat16'\], got 'float16'"):
        LearnedPolicy(model, precision="float16")
    with pytest.raises(ValueError, match="cuda_graphs: CUDA graphs need the network on a cuda device, it is on 'cpu'"):
        LearnedPolicy(model, cuda_graphs=True)
