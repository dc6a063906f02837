"""The perfect-information bound against independent formulations and against policies."""

import numpy as np
import pytest
import torch

from envs.dynamics import initial_state
from envs.evaluation import evaluate
from envs.exogenous import sample_paths
from envs.instance import Instance, paper_instance
from policies.classical import RULES, make_policy, tune_family, zero_policy
from solver_workers.backends import SolverOptions, solve
from solver_workers.bound import episode_bound, prepare, solved_note, uncapacitated_bound
from solver_workers.model import build_model

EXACT = SolverOptions(gap=0.0)


def start_of(inst):
    s = initial_state(inst.to_torch(), torch.zeros(1))
    return s.inv[0].double().numpy(), s.pipe[0].double().numpy()


@pytest.mark.parametrize("n, T, seed", [(1, 8, 0), (2, 10, 1), (3, 12, 2)])
def test_facility_location_equals_the_deterministic_milp(n, T, seed):
    inst = paper_instance(n, seed)
    demand = sample_paths(inst, seed, 1, T).demand[0].double().numpy()
    rng = np.random.default_rng(seed)
    inventory, in_transit = rng.normal(4, 6, n), np.where(np.arange(3)[None] < inst.lead[:, None] - 1, rng.uniform(0, 5, (n, 3)), 0.0)
    record = episode_bound(inst, demand, inventory, in_transit, EXACT)
    reference = solve(build_model(inst, inventory, in_transit, demand[None]), EXACT)  # one scenario = the realised demand
    assert record["status"] == "optimal" and record["source"] == "facility-location"
    assert record["bound"] == pytest.approx(reference.objective, rel=1e-7)
    assert record["uncapacitated_bound"] <= record["bound"] + 1e-7


def test_uncapacitated_dp_is_exact_when_caps_do_not_bind():
    inst = paper_instance(3, 4)
    loose = Instance(
        h=inst.h, b=inst.b, lam=inst.lam, beta=inst.beta, lead=inst.lead, qbar=inst.qbar * 1000, K=inst.K, gamma=inst.gamma, rho=inst.rho
    )
    demand = sample_paths(loose, 1, 1, 12).demand[0].double().numpy()
    inventory, in_transit = start_of(loose)
    dp, opens = uncapacitated_bound(loose, prepare(loose, demand, inventory, in_transit))
    reference = solve(build_model(loose, inventory, in_transit, demand[None]), EXACT)
    assert dp == pytest.approx(reference.objective, rel=1e-7)
    assert opens == sorted(opens) and all(0 <= v < 12 for v in opens)


def test_no_orders_cost_equals_the_zero_policy():
    inst = paper_instance(2, 0)
    expensive = Instance(
        h=inst.h, b=inst.b, lam=inst.lam, beta=inst.beta, lead=inst.lead, qbar=inst.qbar, K=1e9, gamma=inst.gamma, rho=inst.rho
    )
    paths = sample_paths(expensive, 3, 2, 9)
    zero = evaluate(zero_policy, expensive.to_torch(), paths).discounted_cost
    inventory, in_transit = start_of(expensive)
    for row in range(2):
        record = episode_bound(expensive, paths.demand[row].double().numpy(), inventory, in_transit, EXACT)
        assert record["bound"] == pytest.approx(zero[row], rel=1e-5)


def test_bound_is_below_every_policy_on_every_episode():
    inst = paper_instance(3, 0)
    paths = sample_paths(inst, 11, 6, 15)
    tinst = inst.to_torch()
    costs = [evaluate(zero_policy, tinst, paths).discounted_cost]
    for name in ("base-stock-factor", "periodic"):
        tuned = tune_family(inst, RULES[name], episodes=8, horizon=15)
        costs.append(evaluate(make_policy(tinst, RULES[name], tuned.params), tinst, paths).discounted_cost)
    inventory, in_transit = start_of(inst)
    bounds = np.array([episode_bound(inst, paths.demand[r].double().numpy(), inventory, in_transit, EXACT)["bound"] for r in range(6)])
    for policy_costs in costs:
        assert np.all(bounds <= policy_costs * (1 + 1e-6))


@pytest.mark.parametrize(
    "optimal, episodes, note",
    [
        (128, 128, "all 128 solved to optimality"),
        (127, 128, "127 solved to optimality; the other 1 report a proven dual bound"),
        (4, 128, "4 solved to optimality; the other 124 report proven dual bounds"),
        (0, 2, "0 solved to optimality; the other 2 report proven dual bounds"),
    ],
)
def test_the_bound_says_how_many_episodes_report_dual_bounds(optimal, episodes, note):
    assert solved_note(optimal, episodes) == note
