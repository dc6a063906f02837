"""The rolling-horizon MILP: HiGHS and Gurobi against a brute-force enumeration of the opening
sequence over an independent textbook formulation (explicit I, per-scenario root copies tied by
non-anticipativity rows), and first-period dynamics against envs' step."""

import itertools
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.optimize import linprog

from envs.dynamics import State, step
from envs.instance import LMAX, Instance
from plumbing.validate import SEED_MAX
from solver_workers.backends import SolverOptions, solve
from solver_workers.model import build_model, sample_scenarios


def textbook_lp_value(inst, inventory, in_transit, demand, opens):
    """The paper's eqs. (milp_objective)-(milp_domains) with Y fixed to `opens` [S, H] (root shared), as an LP."""
    S, H, n = demand.shape
    lead = inst.lead.astype(int)
    names = {}
    for w in range(S):
        for i in range(n):
            for u in range(H):
                for kind in ("I", "Rp", "Rm", "O"):
                    names[(kind, w, i, u)] = len(names)
    c = np.zeros(len(names))
    bounds = [(0, None)] * len(names)
    A_eq, b_eq, A_ub, b_ub = [], [], [], []

    def row(entries):
        r = np.zeros(len(names))
        for key, v in entries:
            r[names[key]] += v
        return r

    for w in range(S):
        for i in range(n):
            for u in range(H):
                g = inst.gamma**u / S
                c[names[("Rp", w, i, u)]] = g * inst.h[i]
                c[names[("Rm", w, i, u)]] = g * inst.b[i]
                bounds[names[("I", w, i, u)]] = (None, None)
                # Rp >= I - D, Rm >= D - I
                A_ub.append(row([(("I", w, i, u), 1), (("Rp", w, i, u), -1)]))
                b_ub.append(demand[w, u, i])
                A_ub.append(row([(("I", w, i, u), -1), (("Rm", w, i, u), -1)]))
                b_ub.append(-demand[w, u, i])
                # 0 <= O <= qbar Y, tail fixing O = 0 for u >= H - L_i
                cap = inst.qbar[i] * opens[w, u] if u < H - lead[i] else 0.0
                bounds[names[("O", w, i, u)]] = (0, cap)
                if u == 0:
                    A_eq.append(row([(("I", w, i, 0), 1)]))
                    b_eq.append(inventory[i])
                    if w > 0:  # non-anticipativity of the root quantity
                        A_eq.append(row([(("O", w, i, 0), 1), (("O", 0, i, 0), -1)]))
                        b_eq.append(0.0)
                if u < H - 1:
                    pipe = in_transit[i, u] if u + 1 <= LMAX - 1 else 0.0
                    entries = [(("I", w, i, u + 1), 1), (("I", w, i, u), -1)]
                    if u + 1 - lead[i] >= 0:
                        entries.append((("O", w, i, u + 1 - lead[i]), -1))
                    A_eq.append(row(entries))
                    b_eq.append(pipe - demand[w, u, i])
    res = linprog(c, A_ub=np.array(A_ub), b_ub=b_ub, A_eq=np.array(A_eq), b_eq=b_eq, bounds=bounds, method="highs")
    assert res.status == 0
    K = sum(inst.K * inst.gamma**u / S * opens[w, u] for w in range(S) for u in range(H))
    return res.fun + K


def brute_force(inst, inventory, in_transit, demand):
    S, H, _ = demand.shape
    last_open = H - int(inst.lead.min())  # Y_u = 0 for u >= H - L_min
    best = np.inf
    free = S * max(last_open - 1, 0)
    for root in (0, 1):
        for bits in itertools.product((0, 1), repeat=free):
            opens = np.zeros((S, H))
            opens[:, 0] = root
            if free:
                opens[:, 1:last_open] = np.array(bits).reshape(S, last_open - 1)
            best = min(best, textbook_lp_value(inst, inventory, in_transit, demand, opens))
    return best


CASES = [
    # (n, S, H, leads, seed)
    (1, 3, 5, [1], 0),
    (2, 2, 5, [1, 3], 1),
    (2, 1, 6, [2, 4], 2),
]


@pytest.mark.parametrize("n, S, H, leads, seed", CASES)
def test_highs_gurobi_and_brute_force_agree(n, S, H, leads, seed):
    rng = np.random.default_rng(seed)
    inst = Instance(
        h=rng.uniform(0.6, 2, n),
        b=rng.uniform(6, 11, n),
        lam=rng.uniform(2, 7, n),
        beta=rng.uniform(0.2, 0.6, n),
        lead=leads,
        qbar=rng.uniform(8, 28, n),
        K=10.0 * n,
        gamma=0.95,
        rho=0.8,
    )
    inventory = rng.normal(3, 4, n)
    in_transit = np.where(np.arange(LMAX - 1)[None] < (inst.lead[:, None] - 1), rng.uniform(0, 6, (n, LMAX - 1)), 0.0)
    demand = sample_scenarios(inst, 0.4, S, H, rng)
    model = build_model(inst, inventory, in_transit, demand)
    exact = brute_force(inst, inventory, in_transit, demand)
    for solver in ("highs", "gurobi"):
        result = solve(model, SolverOptions(solver=solver, gap=0.0))
        assert result.status == "optimal"
        assert result.objective == pytest.approx(exact, rel=1e-7, abs=1e-6)
        assert result.bound == pytest.approx(exact, rel=1e-6, abs=1e-6)


def test_first_period_dynamics_equal_the_environment_step():
    rng = np.random.default_rng(5)
    n = 4
    inst = Instance(
        h=[1.0, 0.8, 1.5, 2.0],
        b=[9.0, 7.0, 11.0, 6.0],
        lam=[3.0, 5.0, 2.0, 6.0],
        beta=[0.3] * 4,
        lead=[1, 2, 3, 4],
        qbar=[12.0, 20.0, 8.0, 24.0],
        K=40.0,
        gamma=0.95,
        rho=0.8,
    )
    inventory = np.array([4.0, -2.0, 6.0, 1.0])
    in_transit = np.array([[0, 0, 0], [3.0, 0, 0], [2.0, 5.0, 0], [1.0, 2.0, 4.0]])
    demand = sample_scenarios(inst, 0.0, 1, 6, rng)
    model = build_model(inst, inventory, in_transit, demand)
    result = solve(model, SolverOptions(gap=0.0))
    x = result.x
    open_order, quantity = model.root_action(x, inst.qbar)
    ti = inst.to_torch(dtype=torch.float64)
    state = State(torch.tensor(inventory[None]), torch.tensor(in_transit[None]), torch.zeros(1, dtype=torch.float64))
    nxt, cost = step(
        ti,
        state,
        torch.tensor([float(open_order)]),
        torch.tensor(quantity[None]),
        torch.tensor(demand[:, 0]),
        torch.zeros(1, dtype=torch.float64),
    )
    # the model's post-demand stock at u = 0 and u = 1 against the step: N_0 = I - D_0, I_1 = N_0 + P_1 + 1{L=1} O_0
    plus = x[model.shape[1] - 2 * n * 6 : model.shape[1] - n * 6].reshape(n, 6)
    minus = x[model.shape[1] - n * 6 :].reshape(n, 6)
    post = plus - minus
    np.testing.assert_allclose(post[:, 0], inventory - demand[0, 0], atol=1e-9)
    np.testing.assert_allclose(post[:, 1] + demand[0, 1], nxt.inv[0].numpy(), atol=1e-7)
    stage0 = inst.K * open_order + np.sum(inst.h * plus[:, 0] + inst.b * minus[:, 0])
    assert stage0 == pytest.approx(cost.item(), abs=1e-7)


def test_tail_fixing_removes_late_columns():
    inst = Instance(h=[1.0, 1.0], b=[9.0, 9.0], lam=[3.0, 3.0], beta=[0.0, 0.0], lead=[1, 4], qbar=[9.0, 9.0], K=5.0, gamma=0.9, rho=0.5)
    H, S = 6, 2
    model = build_model(inst, np.zeros(2), np.zeros((2, 3)), np.ones((S, H, 2)))
    # Y: root + S * (H - L_min - 1); O: item 0 root + S * (H - 1 - 1), item 1 root + S * (H - 4 - 1); R+/R-: 2 S n H
    expected = 1 + S * (H - 1 - 1) + (1 + S * (H - 2)) + (1 + S * (H - 5)) + 2 * S * 2 * H
    assert model.shape[1] == expected
    assert (model.root_quantity >= 0).all()


@pytest.mark.parametrize(
    "field, value", [("time_limit", float("inf")), ("time_limit", float("nan")), ("seed", -1), ("seed", 2**31), ("gap", 1.0)]
)
def test_solver_options_refuse_what_a_solver_would_reject(field, value):
    with pytest.raises(ValueError, match=field):
        SolverOptions(**{field: value})


def test_the_largest_seed_is_the_largest_highs_accepts():
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    assert h.setOptionValue("random_seed", SEED_MAX) == highspy.HighsStatus.kOk
    assert h.setOptionValue("random_seed", SEED_MAX + 1) != highspy.HighsStatus.kOk  # HiGHS would silently keep its previous seed
    assert h.getOptionValue("random_seed")[1] == SEED_MAX


def signed_negative_binomial_instance(factors: int, n: int) -> Instance:
    """n items on `factors` factors, loadings of both signs, overdispersion phi_i in 0.2..0.8."""
    rng = np.random.default_rng(factors)
    return Instance(
        h=[1.0] * n,
        b=[9.0] * n,
        lam=rng.uniform(2.0, 6.0, n),
        beta=None,
        lead=[1 + i % 2 for i in range(n)],
        qbar=[20.0] * n,
        loadings=rng.uniform(-0.7, 0.7, (n, factors)),
        overdispersion=np.linspace(0.2, 0.8, n),
        K=20.0,
        gamma=0.95,
        rho=0.8,
    )


def test_scenarios_have_the_model_s_moments_given_a_factor_vector():
    # Given F_0, item i's exposure at step u is normal with mean rho^u u_i,0 and variance 1 - rho^(2u) (u_i,0 =
    # beta_i . F_0 / |beta_i|), so with beta = |beta_i| the rate is lognormal: E rate = lam exp(beta a + beta^2 (c - 1) / 2),
    # E rate^2 = lam^2 exp(2 beta a + beta^2 (2c - 1)); the negative binomial adds phi rate^2 to the Poisson's variance.
    inst = signed_negative_binomial_instance(3, 4)
    start = np.array([0.9, -1.3, 0.5])
    scenarios = 200_000
    demand = sample_scenarios(inst, start.tolist(), scenarios, 6, np.random.default_rng(2))  # [S, H, n]
    beta, lam, phi = inst.beta, inst.lam, inst.overdispersion
    exposure0 = inst.loadings @ start / beta
    for u in (0, 2, 5):
        a, c = inst.rho**u * exposure0, 1 - inst.rho ** (2 * u)
        mean = lam * np.exp(beta * a + beta**2 * (c - 1) / 2)
        second = lam**2 * np.exp(2 * beta * a + beta**2 * (2 * c - 1))
        variance = mean + (1 + phi) * second - mean**2
        draws = demand[:, u]
        assert np.all(np.abs(draws.mean(0) - mean) <= 4.5 * draws.std(0) / np.sqrt(scenarios))
        centred = draws - draws.mean(0)
        assert np.all(np.abs(centred.var(0) - variance) <= 4.5 * (centred**2).std(0) / np.sqrt(scenarios))
        assert np.all(variance > 1.1 * (mean + second - mean**2))  # the overdispersion is visible at this size


def test_scenarios_of_the_paper_s_model_are_today_s_draws():
    # The paper's model: a standard normal block [S, H - 1] for the factor, then one Poisson draw per (scenario, step, item).
    inst = Instance(h=[1.0, 2.0], b=[9.0, 8.0], lam=[3.0, 5.0], beta=[0.3, 0.5], lead=[1, 2], qbar=[9.0, 9.0], K=5.0, gamma=0.9, rho=0.7)
    rng = np.random.default_rng(4)
    noise = rng.standard_normal((3, 4))
    factor = np.empty((3, 5))
    factor[:, 0] = 0.4
    for u in range(4):
        factor[:, u + 1] = 0.7 * factor[:, u] + np.sqrt(1 - 0.49) * noise[:, u]
    expected = rng.poisson(inst.lam * np.exp(inst.beta * factor[..., None] - inst.beta**2 / 2))
    np.testing.assert_array_equal(sample_scenarios(inst, 0.4, 3, 5, np.random.default_rng(4)), expected)


def test_scenarios_refuse_a_factor_of_the_wrong_length():
    inst = signed_negative_binomial_instance(2, 2)
    with pytest.raises(ValueError, match=r"factor: expected 2 numbers \(2 factors"):
        sample_scenarios(inst, 0.3, 2, 3, np.random.default_rng(0))


def test_a_highs_solve_prints_nothing():
    """A process's first HiGHS solve writes nothing to standard output: HiGHS prints a two-line banner on the first
    Highs a process makes, before output can be turned off, and a solver worker's output reaches the driver's console
    between a script's own lines. The control: a bare highspy.Highs() in the same kind of process prints it."""
    solve_one = (
        "import numpy as np\n"
        "from envs.instance import paper_instance\n"
        "from solver_workers.backends import SolverOptions, solve\n"
        "from solver_workers.model import build_model, sample_scenarios\n"
        "inst = paper_instance(2, 0)\n"
        "demand = sample_scenarios(inst, 0.0, 1, 3, np.random.default_rng(0))\n"
        "model = build_model(inst, np.zeros(2), np.zeros((2, int(max(inst.lead)))), demand)\n"
        "assert solve(model, SolverOptions(gap=0.0)).status == 'optimal'\n"
    )
    root = Path(__file__).resolve().parents[1]
    with ThreadPoolExecutor(max_workers=2) as pool:  # two independent processes at once
        run = list(
            pool.map(
                lambda code: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root),
                (solve_one, "import highspy; highspy.Highs()"),
            )
        )
    assert run[0].returncode == 0, run[0].stderr
    assert run[0].stdout == ""
    assert "HiGHS" in run[1].stdout  # the banner the solve keeps off the console
