"""platform/milp.py, bound.py and report.py end to end on a tiny instance."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import run_script

from envs.instance import paper_instance

script = run_script


COMMON = ["--episodes", 3, "--horizon", 4, "--workers", 2]


@pytest.fixture(scope="module")
def milp_run(tmp_path_factory):
    """milp.py on the paper instance n = 2 with 2 workers: the folder and the script's result."""
    tmp = tmp_path_factory.mktemp("solvers")
    inst = tmp / "inst.json"
    paper_instance(2, 0).save(inst)
    args = ["--instance", inst, *COMMON, "--scenarios", 2, "--plan-horizon", 5, "--time-limit", 10, "--out", tmp / "milp", "--trace"]
    milp = script("milp.py", *args)
    assert milp.returncode == 0, milp.stderr[-2000:]
    return tmp, milp


@pytest.fixture(scope="module")
def solved(milp_run):
    """milp_run's folder also holding bound.py's perfect-information bound and evaluate.py's classical-best on the
    same held-out episodes."""
    tmp, milp = milp_run
    inst = tmp / "inst.json"
    bound = script("bound.py", "--instance", inst, *COMMON, "--out", tmp / "bound", "--trace")
    best = script("evaluate.py", "--instance", inst, "--policy", "classical-best", "--episodes", 3, "--horizon", 4, "--out", tmp / "best")
    for result in (bound, best):
        assert result.returncode == 0, result.stderr[-2000:]
    return tmp, milp, bound


def test_milp_cli_writes_the_evaluation_format_and_decisions(milp_run):
    tmp, milp = milp_run
    summary = json.loads((tmp / "milp" / "summary.json").read_text())
    assert summary["policy"] == "milp-highs" and summary["episodes"] == 3 and summary["decisions"]["count"] == 12
    assert summary["decisions"]["fallback"] == 0 and summary["parameters"]["scenarios"] == 2
    decisions = pq.read_table(tmp / "milp" / "decisions.parquet").to_pydict()
    assert sorted(zip(decisions["episode"], decisions["decision"])) == [(e, t) for e in range(3) for t in range(4)]
    steps = pq.read_table(tmp / "milp" / "steps.parquet").to_pydict()
    by_key = {(e, t): o for e, t, o in zip(decisions["episode"], decisions["decision"], decisions["open"])}
    assert [by_key[(e, t)] for e, t in zip(steps["episode"], steps["t"])] == steps["open"]
    assert "12 decisions" in milp.stdout


@pytest.mark.slow
def test_rerun_resumes_from_the_journal(milp_run):
    tmp, _ = milp_run
    before = (tmp / "milp" / "decisions.jsonl").read_text()
    again = script(
        "milp.py",
        "--instance",
        tmp / "inst.json",
        "--episodes",
        3,
        "--horizon",
        4,
        "--workers",
        1,
        "--scenarios",
        2,
        "--plan-horizon",
        5,
        "--time-limit",
        10,
        "--out",
        tmp / "milp",
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert (tmp / "milp" / "decisions.jsonl").read_text() == before  # nothing solved again


@pytest.mark.slow
def test_bound_cli_and_report_gap(solved):
    tmp, _, bound = solved
    summary = json.loads((tmp / "bound" / "summary.json").read_text())
    assert summary["policy"] == "perfect-information-bound" and summary["kind"] == "lower-bound"
    bounds = pq.read_table(tmp / "bound" / "costs.parquet").to_pydict()["discounted_cost"]
    milp = pq.read_table(tmp / "milp" / "costs.parquet").to_pydict()["discounted_cost"]
    best = pq.read_table(tmp / "best" / "costs.parquet").to_pydict()["discounted_cost"]
    assert np.all(np.array(bounds) <= np.array(milp) + 1e-6) and np.all(np.array(bounds) <= np.array(best) + 1e-6)
    report = script("report.py", tmp / "best", tmp / "milp", "--bound", tmp / "bound", "--out", tmp / "table.md")
    assert report.returncode == 0, report.stderr
    assert "| milp-highs |" in report.stdout and "gap to bound" in report.stdout and (tmp / "table.md").exists()
    other = script(
        "evaluate.py", "--instance", tmp / "inst.json", "--policy", "zero", "--episodes", 2, "--horizon", 4, "--out", tmp / "zero2"
    )
    assert other.returncode == 0
    refused = script("report.py", tmp / "best", tmp / "zero2")
    assert refused.returncode == 2 and "differ from the reference" in refused.stderr
