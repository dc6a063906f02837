"""The step against hand-worked examples and a slow per-episode reference loop."""

import numpy as np
import pytest
import torch
from conftest import single_item

from envs.dynamics import State, initial_state, step
from envs.evaluation import evaluate
from envs.exogenous import ExogenousPaths
from envs.instance import LMAX, Instance


def run(instance: Instance, opens, quantities, demands):
    """Roll the batched step on one episode; return per-step (I before demand, P, cost)."""
    ti = instance.to_torch(dtype=torch.float64)
    state = initial_state(ti, torch.zeros(1, dtype=torch.float64))
    rows = []
    for y, q, d in zip(opens, quantities, demands):
        args = [torch.tensor([[v]], dtype=torch.float64) for v in (q, d)]
        nxt, cost = step(ti, state, torch.tensor([float(y)], dtype=torch.float64), *args, torch.zeros(1, dtype=torch.float64))
        rows.append((state.inv.item(), state.pipe[0, 0].tolist(), cost.item()))
        state = nxt
    rows.append((state.inv.item(), state.pipe[0, 0].tolist(), None))
    return rows


def test_hand_worked_lead_one():
    # h=1, b=10, K=5, lam=3, L=1: I_0 = mu = lam (L + 1) = 6.
    # t0: I=6, order 4, D=5 -> Z=1, C=5+1=6, I1 = 1 + 4 (arrives at once for L=1) = 5
    # t1: I=5, no order (Q=7 proposed), D=8 -> Z=-3, C=30, I2=-3
    # t2: I=-3, order 10, D=2 -> Z=-5, C=5+50=55, I3=5
    rows = run(single_item(lead=1, lam=3.0), [1, 0, 1], [4, 7, 10], [5, 8, 2])
    assert [r[0] for r in rows] == [6, 5, -3, 5]
    assert [r[2] for r in rows[:-1]] == [6, 30, 55]
    assert all(r[1] == [0, 0, 0] for r in rows)


def test_hand_worked_lead_three():
    # lam=2, L=3: I_0 = 8. Orders of 6 at t0 and 4 at t1 enter slot L-1 = 2.
    # t0: D=3 -> Z=5, C=5+5=10; I1=5, P1=[0,6,0]
    # t1: D=4 -> Z=1, C=5+1=6; I2=1, P2=[6,4,0]
    # t2: no order, D=2 -> Z=-1, C=10; I3=-1+6=5 (the t0 order, usable from t0+L=3), P3=[4,0,0]
    # t3: D=3 -> Z=2, C=2; I4=2+4=6, P4=0
    rows = run(single_item(lead=3), [1, 1, 0, 0], [6, 4, 9, 0], [3, 4, 2, 3])
    assert [r[0] for r in rows] == [8, 5, 1, 5, 6]
    assert [r[1] for r in rows] == [[0, 0, 0], [0, 6, 0], [6, 4, 0], [4, 0, 0], [0, 0, 0]]
    assert [r[2] for r in rows[:-1]] == [10, 6, 10, 2]


@pytest.mark.parametrize("lead", range(1, LMAX + 1))
def test_order_first_usable_after_lead_time(lead):
    steps = LMAX + 2
    rows = run(single_item(lead=lead), [1] + [0] * (steps - 1), [5] + [0] * (steps - 1), [0] * steps)
    mu = 2.0 * (lead + 1)
    inventory = [r[0] for r in rows]
    assert inventory[: lead + 1] == [mu] * lead + [mu + 5]
    assert inventory[lead:] == [mu + 5] * (len(inventory) - lead)


def reference_step(h, b, lead, K, inv, pipe, y, q, d):
    """Slow per-episode, per-item transcription of eqs. (post_demand)-(in_transit_transition)."""
    n = len(h)
    cost = K * y
    new_inv, new_pipe = np.zeros(n), np.zeros((n, LMAX - 1))
    for i in range(n):
        z = inv[i] - d[i]
        cost += h[i] * max(z, 0.0) + b[i] * max(-z, 0.0)
        o = y * q[i]
        new_inv[i] = z + pipe[i, 0] + (o if lead[i] == 1 else 0.0)
        for slot in range(LMAX - 1):  # slot = l - 1
            later = pipe[i, slot + 1] if slot + 1 < LMAX - 1 else 0.0
            new_pipe[i, slot] = later + (o if slot + 1 == lead[i] - 1 else 0.0)
    return new_inv, new_pipe, cost


@pytest.mark.parametrize("n", [1, 5, 16])
def test_batched_step_matches_reference_loop(n):
    rng = np.random.default_rng(n)
    B = 7
    inst = Instance(
        h=rng.uniform(0.5, 2, n),
        b=rng.uniform(5, 12, n),
        lam=rng.uniform(1, 8, n),
        beta=rng.uniform(0, 0.6, n),
        lead=np.resize(np.arange(1, LMAX + 1), n),
        qbar=rng.uniform(5, 30, n),
        K=10.0 * n,
        gamma=0.95,
        rho=0.8,
    )
    ti = inst.to_torch(dtype=torch.float64)
    inv = rng.normal(0, 10, (B, n))
    pipe = rng.uniform(0, 10, (B, n, LMAX - 1))
    for _ in range(4):
        y = rng.integers(0, 2, B).astype(float)
        q = rng.uniform(0, 1, (B, n)) * inst.qbar
        d = rng.poisson(5, (B, n)).astype(float)
        state = State(torch.tensor(inv), torch.tensor(pipe), torch.zeros(B, dtype=torch.float64))
        nxt, cost = step(ti, state, torch.tensor(y), torch.tensor(q), torch.tensor(d), torch.ones(B, dtype=torch.float64))
        for e in range(B):
            r_inv, r_pipe, r_cost = reference_step(inst.h, inst.b, inst.lead, inst.K, inv[e], pipe[e], y[e], q[e], d[e])
            np.testing.assert_allclose(nxt.inv[e].numpy(), r_inv, rtol=0, atol=1e-12)
            np.testing.assert_allclose(nxt.pipe[e].numpy(), r_pipe, rtol=0, atol=1e-12)
            assert cost[e].item() == pytest.approx(r_cost, abs=1e-9)
        inv, pipe = nxt.inv.numpy(), nxt.pipe.numpy()


def test_cost_gradient_matches_finite_differences():
    rng = np.random.default_rng(3)
    n, T = 4, 6
    inst = Instance(
        h=[1.0, 0.7, 1.5, 2.0],
        b=[9.0, 6.0, 11.0, 8.0],
        lam=[3.0, 5.0, 2.0, 4.0],
        beta=[0.3] * 4,
        lead=[1, 2, 3, 4],
        qbar=[12.0, 20.0, 8.0, 16.0],
        K=40.0,
        gamma=0.95,
        rho=0.8,
    )
    ti = inst.to_torch(dtype=torch.float64)
    # Non-integer demands keep Z away from the kink at 0, where the cost is not differentiable.
    demand = torch.tensor(rng.uniform(0, 8, (1, T, n)) + 0.37)
    opens = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    q0 = torch.tensor(rng.uniform(1, 7, (T, n)))
    inv0 = torch.tensor(rng.normal(5, 3, (1, n)))
    pipe0 = torch.tensor(rng.uniform(0, 4, (1, n, LMAX - 1)))

    def total(q, inv, pipe):
        state = State(inv, pipe, torch.zeros(1, dtype=torch.float64))
        acc = 0.0
        for t in range(T):
            state, cost = step(ti, state, opens[t : t + 1], q[t : t + 1], demand[:, t], torch.zeros(1, dtype=torch.float64))
            acc = acc + 0.95**t * cost.sum()
        return acc

    args = [x.clone().requires_grad_(True) for x in (q0, inv0, pipe0)]
    grads = torch.autograd.grad(total(*args), args)
    eps = 1e-6
    for k, (x, g) in enumerate(zip((q0, inv0, pipe0), grads)):
        flat = x.flatten()
        for j in range(flat.numel()):
            plus, minus = [a.clone() for a in (q0, inv0, pipe0)], [a.clone() for a in (q0, inv0, pipe0)]
            plus[k].view(-1)[j] += eps
            minus[k].view(-1)[j] -= eps
            fd = (total(*plus) - total(*minus)).item() / (2 * eps)
            assert g.flatten()[j].item() == pytest.approx(fd, abs=1e-5), (k, j)
    # Quantities at closed periods receive no gradient: O = Y Q.
    assert torch.all(grads[0][opens == 0] == 0)


def test_evaluate_discounts_hand_worked_costs():
    inst = single_item(lead=3)
    paths = ExogenousPaths(factor=torch.zeros(1, 5), demand=torch.tensor([[[3.0], [4.0], [2.0], [3.0]]]), seed=0, episodes=(0,))
    plan = iter([(1, 6), (1, 4), (0, 9), (0, 0)])

    def policy(state, instance):
        y, q = next(plan)
        return torch.tensor([float(y)]), torch.tensor([[float(q)]])

    result = evaluate(policy, inst.to_torch(), paths, trace=True)
    expected = sum(0.9**t * c for t, c in enumerate([10, 6, 10, 2]))
    assert result.discounted_cost[0] == pytest.approx(expected)
    assert result.trace.inventory[0, :, 0].tolist() == [8, 5, 1, 5]
    assert result.trace.quantity[0, :, 0].tolist() == [6, 4, 9, 0]


def test_the_compiled_step_gives_the_eager_states_costs_and_gradients():
    """Six steps of 3 episodes at n = 5 (float64, Inductor on the CPU) through envs.dynamics.compiled_step and through
    step: the same states and costs to float64 rounding, and the same gradient of the discounted cost in Q, I_0 and
    P_0 (the backward pass is compiled too)."""
    from envs.dynamics import compiled_step
    from envs.instance import paper_instance

    rng = np.random.default_rng(5)
    ti = paper_instance(5, 1).to_torch(dtype=torch.float64)
    B, T = 3, 6
    demand = torch.tensor(rng.uniform(0, 12, (T, B, 5)) + 0.37)
    opens = torch.tensor(rng.integers(0, 2, (T, B)), dtype=torch.float64)
    start = [torch.tensor(rng.uniform(1, 9, (T, B, 5))), torch.tensor(rng.normal(5, 3, (B, 5)))]
    start.append(torch.tensor(rng.uniform(0, 4, (B, 5, LMAX - 1))))

    def rollout(simulate, q, inv, pipe):
        state, total, states = State(inv, pipe, torch.zeros(B, dtype=torch.float64)), 0.0, []
        for t in range(T):
            state, cost = simulate(ti, state, opens[t], q[t], demand[t], torch.zeros(B, dtype=torch.float64))
            total, states = total + 0.95**t * cost, [*states, state.inv, state.pipe]
        return total, states

    results = {}
    for name, simulate in (("eager", step), ("compiled", compiled_step())):
        args = [x.clone().requires_grad_(True) for x in start]
        costs, states = rollout(simulate, *args)
        results[name] = costs.detach(), [s.detach() for s in states], torch.autograd.grad(costs.sum(), args)
    (eager_costs, eager_states, eager_grads), (costs, states, grads) = results["eager"], results["compiled"]
    torch.testing.assert_close(costs, eager_costs, rtol=1e-12, atol=1e-9)
    for got, want in zip([*states, *grads], [*eager_states, *eager_grads]):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-9)
