"""The Ray solver pool: journal, resume, a killed worker, Gurobi's licence limit."""

import os
import signal
import threading

import numpy as np
import pytest

from envs.exogenous import sample_paths
from envs.instance import paper_instance
from solver_workers.backends import SolverOptions
from solver_workers.pool import Journal, Pool, run_bounds, run_rolling
from solver_workers.rolling import RollingOptions, decide

FAST = RollingOptions(scenarios=2, plan_horizon=5, solver=SolverOptions(time_limit=10, gap=0.0))


def decision_key(record):
    return record["episode"], record["decision"]


def test_journal_keeps_the_first_record_and_skips_a_torn_line(tmp_path):
    path = tmp_path / "j.jsonl"
    journal = Journal(path, key=decision_key)
    assert journal.add({"episode": 0, "decision": 0, "open": 1})
    assert not journal.add({"episode": 0, "decision": 0, "open": 0})  # a retried duplicate
    with open(path, "a") as f:
        f.write('{"episode": 0, "decision": 1, "op')  # a crash mid-write
    again = Journal(path, key=decision_key)
    assert list(again.records) == [(0, 0)] and again.records[(0, 0)]["open"] == 1


def test_resumed_run_equals_an_uninterrupted_one(tmp_path, ray_session):
    inst = paper_instance(2, 0)
    pool = Pool(2)
    # "interrupted" after two decisions per episode: the journal holds t = 0, 1
    partial = Journal(tmp_path / "a.jsonl", key=decision_key)
    run_rolling(inst, sample_paths(inst, 5, 3, 2), FAST, pool, partial)
    resumed_journal = Journal(tmp_path / "a.jsonl", key=decision_key)
    assert len(resumed_journal.records) == 6
    resumed = run_rolling(inst, sample_paths(inst, 5, 3, 4), FAST, pool, resumed_journal)
    fresh = run_rolling(inst, sample_paths(inst, 5, 3, 4), FAST, pool, Journal(tmp_path / "b.jsonl", key=decision_key))
    np.testing.assert_array_equal(resumed[0], fresh[0])
    np.testing.assert_allclose(resumed[1], fresh[1])
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    assert len(lines) == 12  # nothing computed twice, nothing lost


def test_killing_a_worker_mid_solve_loses_and_duplicates_nothing(tmp_path, ray_session):
    inst = paper_instance(4, 0)
    slow = RollingOptions(scenarios=30, plan_horizon=30, solver=SolverOptions(time_limit=3.0, gap=0.0))
    pool = Pool(1)
    pid = ray_session.get(pool.actors[0].pid.remote())
    killer = threading.Timer(1.5, os.kill, (pid, signal.SIGKILL))
    killer.start()
    journal = Journal(tmp_path / "k.jsonl", key=decision_key)
    try:
        run_rolling(inst, sample_paths(inst, 0, 1, 2), slow, pool, journal)
    finally:
        killer.cancel()
    assert sorted(journal.records) == [(0, 0), (0, 1)]
    assert len((tmp_path / "k.jsonl").read_text().splitlines()) == 2
    assert ray_session.get(pool.actors[0].pid.remote()) != pid  # the actor was restarted


def test_bounds_run_in_the_pool(tmp_path, ray_session):
    inst = paper_instance(2, 0)
    paths = sample_paths(inst, 1, 3, 8)
    journal = Journal(tmp_path / "b.jsonl", key=lambda r: r["episode"])
    records = run_bounds(inst, paths, SolverOptions(gap=0.0), Pool(2), journal)
    assert [r["episode"] for r in records] == [0, 1, 2] and all(r["status"] == "optimal" for r in records)


def test_gurobi_licence_limit_is_a_recorded_fallback():
    inst = paper_instance(4, 0)
    options = RollingOptions(scenarios=10, plan_horizon=20, solver=SolverOptions(solver="gurobi", time_limit=10))
    record = decide(inst, inst.lam * (inst.lead + 1), np.zeros((4, 3)), 0.0, 0, 0, options)
    if record["status"] != "licence-limit":
        pytest.skip("a Gurobi licence without the PyPI size limit is installed")
    assert record["columns"] > 2000
    assert record["fallback"] and record["open"] == 0 and record["quantity"] == [0.0] * 4 and record["bound"] is None
