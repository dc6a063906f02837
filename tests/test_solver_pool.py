"""The Ray solver pool: journal, resume, a killed worker, Gurobi's licence limit."""

import os
import signal
import threading

import numpy as np
import pytest
import torch
from helpers import Gate

from envs.dynamics import initial_state, step
from envs.evaluation import evaluate
from envs.exogenous import sample_paths
from envs.instance import Instance, paper_instance
from plumbing.errors import InputError
from policies.classical import RULES, make_policy, zero_policy
from policies.decomposition import DecompositionOptions
from solver_workers.backends import SolverOptions
from solver_workers.pool import (
    Journal,
    Pool,
    SolverActor,
    bound_identity,
    decision_key,
    episode_key,
    rolling_identity,
    run_bounds,
    run_rolling,
)
from solver_workers.rolling import RollingOptions, decide

FAST = RollingOptions(scenarios=2, plan_horizon=5, solver=SolverOptions(time_limit=10, gap=0.0))
IDENTITY = {"run": 1}


def decisions(path, inst, seed, options=FAST):
    return Journal(path, decision_key, rolling_identity(inst, seed, options))


def test_journal_keeps_the_first_record_and_skips_a_torn_line(tmp_path):
    path = tmp_path / "j.jsonl"
    journal = Journal(path, decision_key, IDENTITY)
    assert not path.exists()  # nothing is written before the first record
    assert journal.add({"episode": 0, "decision": 0, "open": 1})
    assert not journal.add({"episode": 0, "decision": 0, "open": 0})  # a retried duplicate
    with open(path, "a") as f:
        f.write('{"episode": 0, "decision": 1, "op')  # a crash mid-write
    again = Journal(path, decision_key, IDENTITY)
    assert list(again.records) == [(0, 0)] and again.records[(0, 0)]["open"] == 1
    assert again.add({"episode": 0, "decision": 1, "open": 0})  # the next record does not join the torn line
    assert list(Journal(path, decision_key, IDENTITY).records) == [(0, 0), (0, 1)]
    assert path.read_text().splitlines()[0] == '{"identity": {"run": 1}}'


def test_results_of_another_identity_are_not_stored(tmp_path):
    inst = paper_instance(2, 0)
    with pytest.raises(ValueError, match="another identity"):
        run_rolling(
            inst, sample_paths(inst, 6, 1, 2), FAST, None, decisions(tmp_path / "a.jsonl", inst, 5)
        )  # paths of seed 6, journal of seed 5
    with pytest.raises(ValueError, match="another identity"):
        run_bounds(
            inst,
            sample_paths(inst, 5, 1, 9),
            FAST.solver,
            None,
            Journal(tmp_path / "b.jsonl", episode_key, bound_identity(inst, 5, 8, FAST.solver)),
        )
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_resumed_run_equals_an_uninterrupted_one(tmp_path, ray_session):
    inst = paper_instance(2, 0)
    pool = Pool(2)
    # "interrupted" after two decisions per episode: the journal holds t = 0, 1
    partial = decisions(tmp_path / "a.jsonl", inst, 5)
    run_rolling(inst, sample_paths(inst, 5, 3, 2), FAST, pool, partial)
    resumed_journal = decisions(tmp_path / "a.jsonl", inst, 5)
    assert len(resumed_journal.records) == 6
    resumed = run_rolling(inst, sample_paths(inst, 5, 3, 4), FAST, pool, resumed_journal)
    fresh = run_rolling(inst, sample_paths(inst, 5, 3, 4), FAST, pool, decisions(tmp_path / "b.jsonl", inst, 5))
    np.testing.assert_array_equal(resumed[0], fresh[0])
    np.testing.assert_allclose(resumed[1], fresh[1])
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 12  # the identity, then nothing computed twice, nothing lost


@pytest.mark.slow
def test_killing_a_worker_mid_solve_loses_and_duplicates_nothing(tmp_path, ray_session):
    """The worker is held (a gate in its process, tests/helpers.py) as it starts the second decision, after the
    first is in the journal, and SIGKILLed there: the restarted actor solves that decision once, and the journal
    holds each decision exactly once. Breaks if a task in flight on a dead worker is lost or recorded twice."""
    inst = paper_instance(4, 0)
    gate = Gate(tmp_path / "gate", call=("solver_workers.rolling:decide", "before", 2))
    pool = Pool(1)
    pool.actors = [SolverActor.options(runtime_env={"env_vars": gate.env}).remote()]
    pid = ray_session.get(pool.actors[0].pid.remote())
    journal = decisions(tmp_path / "k.jsonl", inst, 0)

    seen = []

    def kill_at_the_gate():
        try:
            gate.wait()
            seen.append(sorted(journal.records))  # the first decision is in, the second in flight
        finally:
            os.kill(pid, signal.SIGKILL)  # also when the gate was not reached: the run must end either way

    killer = threading.Thread(target=kill_at_the_gate)
    killer.start()
    run_rolling(inst, sample_paths(inst, 0, 1, 2), FAST, pool, journal)
    killer.join()
    assert seen == [[(0, 0)]]
    assert sorted(journal.records) == [(0, 0), (0, 1)]
    assert len((tmp_path / "k.jsonl").read_text().splitlines()) == 1 + 2
    assert ray_session.get(pool.actors[0].pid.remote()) != pid  # the actor was restarted


@pytest.fixture(scope="module")
def pool(ray_session):
    """One pool of 2 solver actors (stateless: a task's result depends on its arguments alone) for the tests below, ended
    with the module. Its actors hold both of ray_session's CPUs: a test that starts actors of its own comes before
    the first test that asks for it, or does without it."""
    shared = Pool(2)
    yield shared
    for actor in shared.actors:
        ray_session.kill(actor)


def test_bounds_run_in_the_pool(tmp_path, pool):
    inst = paper_instance(2, 0)
    paths = sample_paths(inst, 1, 3, 8)
    journal = Journal(tmp_path / "b.jsonl", episode_key, bound_identity(inst, 1, 8, SolverOptions(gap=0.0)))
    records = run_bounds(inst, paths, SolverOptions(gap=0.0), pool, journal)
    assert [r["episode"] for r in records] == [0, 1, 2] and all(r["status"] == "optimal" for r in records)


def test_bad_input_found_by_a_worker_reaches_the_driver_as_its_one_line(pool):
    """A worker's InputError (here the DP's refusal of horizon 0) reaches the driver as an InputError whose message
    is the worker's one line, not Ray's report of the worker's traceback."""
    task = ("split_values", (paper_instance(1, 0), 0, [1.0], 0, 0, DecompositionOptions()))
    with pytest.raises(InputError) as raised:
        pool.run([task], lambda record: [], 1, 0, "values")
    assert str(raised.value).startswith("dp-optimal horizon: expected an integer") and "\n" not in str(raised.value), str(raised.value)


def test_gurobi_licence_limit_is_a_recorded_fallback():
    inst = paper_instance(4, 0)
    options = RollingOptions(scenarios=10, plan_horizon=20, solver=SolverOptions(solver="gurobi", time_limit=10))
    record = decide(inst, inst.lam * (inst.lead + 1), np.zeros((4, 3)), 0.0, 0, 0, options)
    if record["status"] != "licence-limit":
        pytest.skip("a Gurobi licence without the PyPI size limit is installed")
    assert record["columns"] > 2000
    assert record["fallback"] and record["open"] == 0 and record["quantity"] == [0.0] * 4 and record["bound"] is None


def test_rolling_milp_on_two_negative_binomial_factors_takes_the_state_s_factor_vector(tmp_path, pool):
    """The pool runs the controller on paths whose factor is [E, T+1, k]; its actions equal a loop written here that
    steps each episode and calls `decide` with the state's k-vector F_t, and its decisions do depend on that vector."""
    inst = Instance(
        h=[1.0, 1.5],
        b=[9.0, 7.0],
        lam=[3.0, 5.0],
        beta=None,
        lead=[1, 2],
        qbar=[15.0, 20.0],
        loadings=[[0.8, -0.3], [-0.2, 0.9]],
        overdispersion=[0.5, 0.3],
        K=15.0,
        gamma=0.95,
        rho=0.8,
    )
    paths = sample_paths(inst, 5, 2, 3, dtype=torch.float64)
    assert paths.factor.shape == (2, 4, 2)
    open_order, quantity = run_rolling(inst, paths, FAST, pool, decisions(tmp_path / "r.jsonl", inst, 5))
    tinst = inst.to_torch(dtype=torch.float64)
    for row, episode in enumerate(paths.episodes):
        state = initial_state(tinst, paths.factor[row, :1])
        for t in range(3):
            factor = paths.factor[row, t].tolist()
            record = decide(inst, state.inv[0].numpy(), state.pipe[0].numpy(), factor, episode, t, FAST)
            assert (open_order[row, t], quantity[row, t].tolist()) == (record["open"], record["quantity"])
            state, _ = step(
                tinst,
                state,
                torch.tensor([float(record["open"])], dtype=torch.float64),
                torch.tensor([record["quantity"]], dtype=torch.float64),
                paths.demand[row, t][None],
                paths.factor[row, t + 1][None],
            )
    low, high = [-3.0, -3.0], [3.0, 3.0]  # both items' exposures far below, then far above, their means
    orders = [decide(inst, inst.lam.copy(), np.zeros((2, 3)), f, 0, 0, RollingOptions(20, 5, FAST.solver))["quantity"] for f in (low, high)]
    assert sum(orders[0]) < sum(orders[1])


def test_the_perfect_information_bound_on_three_negative_binomial_factors_is_below_the_policies(tmp_path, pool):
    """The bound reads the paths' demand only, so it runs on k = 3 factors with overdispersion; on every episode it lies
    below the zero policy and a factor-aware rule evaluated on the same paths."""
    rng = np.random.default_rng(3)
    inst = Instance(
        h=[1.0, 1.2, 0.8],
        b=[9.0, 8.0, 10.0],
        lam=[3.0, 4.0, 5.0],
        beta=None,
        lead=[1, 2, 1],
        qbar=[20.0] * 3,
        loadings=rng.uniform(-0.7, 0.7, (3, 3)),
        overdispersion=[0.4, 0.2, 0.6],
        K=20.0,
        gamma=0.95,
        rho=0.8,
    )
    paths = sample_paths(inst, 2, 3, 8)
    options = SolverOptions(gap=0.0)
    records = run_bounds(inst, paths, options, pool, Journal(tmp_path / "b.jsonl", episode_key, bound_identity(inst, 2, 8, options)))
    bounds = np.array([r["bound"] for r in sorted(records, key=lambda r: r["episode"])])
    tinst = inst.to_torch()
    rule = make_policy(tinst, RULES["base-stock-factor"], {"reorder_z": 0.0, "cover": 2, "order_up_to_z": 1.0, "cycle_stock": 0.5})
    for policy in (zero_policy, rule):
        assert np.all(bounds <= evaluate(policy, tinst, paths).discounted_cost * (1 + 1e-6))
