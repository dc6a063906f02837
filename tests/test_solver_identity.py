"""Run identity of the solver scripts: a re-run into an existing --out resumes only with the same
instance and settings, extends the journal with more episodes (or, for decisions, a longer horizon),
and is refused otherwise; Ctrl-C and SIGTERM keep the journal and say how to resume."""

import json
import os
import runpy
import signal
import subprocess
import sys

import pytest
from conftest import ROOT, run_script
from helpers import HANG_SECONDS, Gate

from envs.exogenous import sample_paths
from envs.instance import paper_instance
from plumbing.errors import InputError
from solver_workers.backends import SolverOptions
from solver_workers.pool import Journal, Pool, bound_identity, decision_key, episode_key, rolling_identity, run_bounds, run_rolling
from solver_workers.rolling import RollingOptions

SEED = 5
MILP = {"--scenarios": 2, "--plan-horizon": 4, "--time-limit": 10, "--gap": 0.0, "--seed": SEED, "--workers": 1}
MILP_OPTIONS = RollingOptions(2, 4, SolverOptions("highs", 10.0, 0.0))
BOUND = {"--horizon": 6, "--time-limit": 10, "--seed": SEED, "--workers": 1}
BOUND_OPTIONS = SolverOptions("highs", 10.0, 0.0)


def flags(settings: dict) -> list:
    """Command-line arguments of {flag: value}; a value None is a switch."""
    return [x for flag, value in settings.items() for x in ([flag] if value is None else [flag, value])]


def main_of(script: str, *args) -> None:
    """Run platform/<script>'s main in this process: a refusal comes before Ray starts, and a run uses
    the test session's Ray instead of starting its own."""
    main = runpy.run_path(str(ROOT / "platform" / script))["main"]
    argv = sys.argv
    sys.argv = [script, *map(str, args)]
    try:
        main()
    finally:
        sys.argv = argv


def lines(path) -> list[str]:
    return path.read_text().splitlines()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ray_session):
    """Journals of a milp run (1 episode x 2 decisions) and a bound run (1 episode x 6 steps) on an n = 2 instance."""
    tmp = tmp_path_factory.mktemp("identity")
    inst = paper_instance(2, 0)
    inst.save(tmp / "inst.json")
    paper_instance(2, 1).save(tmp / "same-n.json")
    paper_instance(1, 0).save(tmp / "other-n.json")
    pool = Pool(1)
    run_rolling(
        inst,
        sample_paths(inst, SEED, 1, 2),
        MILP_OPTIONS,
        pool,
        Journal(tmp / "milp" / "decisions.jsonl", decision_key, rolling_identity(inst, SEED, MILP_OPTIONS)),
    )
    run_bounds(
        inst,
        sample_paths(inst, SEED, 1, 6),
        BOUND_OPTIONS,
        pool,
        Journal(tmp / "bound" / "bounds.jsonl", episode_key, bound_identity(inst, SEED, 6, BOUND_OPTIONS)),
    )
    return tmp


@pytest.mark.parametrize(
    "change, field",
    [
        ({"--scenarios": 3}, "scenarios 2 there, 3 here"),
        ({"--plan-horizon": 5}, "plan_horizon 4 there, 5 here"),
        ({"--solver-seed": 1}, "solver_seed 0 there, 1 here"),
        ({"--seed": SEED + 1}, f"seed {SEED} there, {SEED + 1} here"),
        ({"--solver": "gurobi"}, 'solver "highs" there, "gurobi" here'),
        ({"--gap": 0.01}, "gap 0.0 there, 0.01 here"),
        ({"--time-limit": 11}, "time_limit 10.0 there, 11.0 here"),
        ({"--threads": 2}, "threads 1 there, 2 here"),
        ({"--no-warm-start": None}, "warm_start true there, false here"),
    ],
)
def test_milp_rerun_with_another_setting_is_refused(runs, change, field):
    before = lines(runs / "milp" / "decisions.jsonl")
    with pytest.raises(InputError, match="belongs to a run with other settings") as refused:
        main_of("milp.py", "--instance", runs / "inst.json", "--episodes", 1, "--horizon", 2, *flags(MILP | change), "--out", runs / "milp")
    assert field in str(refused.value) and "another --out" in str(refused.value)
    assert str(refused.value).count(" there, ") == 1  # only the changed field is listed
    assert lines(runs / "milp" / "decisions.jsonl") == before


@pytest.mark.parametrize(
    "change, field",
    [
        ({"--horizon": 7}, "horizon 6 there, 7 here"),
        ({"--seed": SEED + 1}, f"seed {SEED} there, {SEED + 1} here"),
        ({"--time-limit": 11}, "time_limit 10.0 there, 11.0 here"),
        ({"--threads": 2}, "threads 1 there, 2 here"),
        ({"--solver": "gurobi"}, 'solver "highs" there, "gurobi" here'),
    ],
)
def test_bound_rerun_with_another_setting_is_refused(runs, change, field):
    before = lines(runs / "bound" / "bounds.jsonl")
    with pytest.raises(InputError, match="belongs to a run with other settings") as refused:
        main_of("bound.py", "--instance", runs / "inst.json", "--episodes", 1, *flags(BOUND | change), "--out", runs / "bound")
    assert field in str(refused.value) and str(refused.value).count(" there, ") == 1
    assert lines(runs / "bound" / "bounds.jsonl") == before


def test_another_instance_of_the_same_n_is_refused(runs):
    with pytest.raises(InputError) as refused:
        main_of("milp.py", "--instance", runs / "same-n.json", "--episodes", 1, "--horizon", 2, *flags(MILP), "--out", runs / "milp")
    old, new = paper_instance(2, 0).content_hash(), paper_instance(2, 1).content_hash()
    assert f"instance_hash {old[:16]}… there, {new[:16]}… here" in str(refused.value) and str(refused.value).count(" there, ") == 1


def test_another_n_is_refused_without_a_traceback(runs):
    before = lines(runs / "bound" / "bounds.jsonl")
    result = run_script("bound.py", "--instance", runs / "other-n.json", "--episodes", 1, *flags(BOUND), "--out", runs / "bound")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]  # one line
    assert result.stderr.startswith("error: journal ") and "n 2 there, 1 here" in result.stderr and "instance_hash" in result.stderr
    assert lines(runs / "bound" / "bounds.jsonl") == before


def test_a_journal_without_identity_is_refused(tmp_path):
    inst = tmp_path / "inst.json"
    paper_instance(2, 0).save(inst)
    old = '{"episode": 0, "decision": 0, "open": 1, "quantity": [3.0, 4.0]}\n'  # written before identities
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "decisions.jsonl").write_text(old)
    result = run_script("milp.py", "--instance", inst, "--episodes", 1, "--horizon", 2, *flags(MILP), "--out", tmp_path / "out")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "decisions.jsonl' has no run identity" in result.stderr and "another --out" in result.stderr
    assert (tmp_path / "out" / "decisions.jsonl").read_text() == old and os.listdir(tmp_path / "out") == ["decisions.jsonl"]


def test_more_episodes_and_a_longer_horizon_extend_the_milp_journal(runs):
    """Decisions depend on neither (module docstring of solver_workers/pool.py): the re-run keeps the
    two decisions of episode 0, solves its third and the three of episode 1."""
    before = lines(runs / "milp" / "decisions.jsonl")
    main_of("milp.py", "--instance", runs / "inst.json", "--episodes", 2, "--horizon", 3, *flags(MILP), "--out", runs / "milp")
    after = lines(runs / "milp" / "decisions.jsonl")
    assert len(before) == 1 + 2 and after[:3] == before and len(after) == 1 + 2 * 3
    assert sorted(decision_key(json.loads(line)) for line in after[1:]) == [(e, t) for e in range(2) for t in range(3)]
    summary = json.loads((runs / "milp" / "summary.json").read_text())
    assert summary["episodes"] == 2 and summary["decisions"]["count"] == 6


@pytest.mark.slow
def test_more_episodes_extend_the_bound_journal(runs):
    before = lines(runs / "bound" / "bounds.jsonl")
    main_of("bound.py", "--instance", runs / "inst.json", "--episodes", 3, *flags(BOUND), "--out", runs / "bound")
    after = lines(runs / "bound" / "bounds.jsonl")
    assert len(before) == 1 + 1 and after[:2] == before and len(after) == 1 + 3
    assert sorted(json.loads(line)["episode"] for line in after[1:]) == [0, 1, 2]


def run_until_first_decision(command: list, gate: Gate) -> subprocess.Popen:
    """Start the script and wait until it holds at `gate`."""
    # Ctrl-C as a terminal delivers it: the child starts with SIGINT's default action even if an earlier test
    # left this process ignoring SIGINT (an ignored signal is inherited across exec)
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **gate.env},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        gate.wait(process)
    except AssertionError:
        process.kill()
        raise AssertionError(process.communicate()[1][-2000:]) from None
    return process


@pytest.mark.parametrize("signum", [pytest.param(signal.SIGINT, marks=pytest.mark.slow), signal.SIGTERM])  # one handler serves both
def test_interrupted_milp_keeps_the_journal_and_resumes(tmp_path, signum, ray_session):
    """Two decisions of an n = 4 model: the driver is held (a gate in its process, tests/helpers.py) just after
    the first decision is in the journal, and the signal comes there, whatever the machine's speed. Breaks if an
    interruption loses the journal's records, prints a traceback or writes results."""
    paper_instance(4, 0).save(tmp_path / "inst.json")
    args = [
        "--instance",
        tmp_path / "inst.json",
        "--episodes",
        1,
        "--horizon",
        2,
        "--scenarios",
        2,
        "--plan-horizon",
        5,
        "--gap",
        0,
        "--time-limit",
        10,
        "--workers",
        1,
        "--out",
        tmp_path / "out",
    ]
    journal = tmp_path / "out" / "decisions.jsonl"
    gate = Gate(tmp_path / "gate", call=("solver_workers.pool:Journal.add", "after", 1))
    process = run_until_first_decision([sys.executable, str(ROOT / "platform" / "milp.py"), *map(str, args)], gate)
    kept = lines(journal)
    assert len(kept) == 1 + 1  # the identity and the first decision
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=HANG_SECONDS)
    assert process.returncode == 130 and "Traceback" not in stderr, stderr[-2000:]
    last = stderr.strip().splitlines()[-1]
    assert (
        last
        == f"interrupted: no results written; journal '{journal}' keeps {len(kept) - 1} of 2 decisions; re-run the same command to resume"
    )
    assert lines(journal)[: len(kept)] == kept and not (tmp_path / "out" / "summary.json").exists()
    if signum == signal.SIGINT:
        main_of("milp.py", *args)
        assert lines(journal)[: len(kept)] == kept and len(lines(journal)) == 1 + 2
        assert json.loads((tmp_path / "out" / "summary.json").read_text())["decisions"]["count"] == 2


def test_an_interruption_before_the_first_record_says_nothing_was_kept(tmp_path):
    """A run stopped before its journal's first record (its folder not even made) says that nothing was recorded, not
    that a journal in a missing folder keeps 0 records; with a record it names the journal and what it keeps."""
    from solver_workers.solver_run import interrupted

    journal = Journal(tmp_path / "never-made" / "bounds.jsonl", lambda record: record["episode"], {"seed": 0})
    assert str(interrupted(journal, 0, "0 of 4 episodes")) == (
        "no results written and nothing recorded yet; re-run the same command to start it again"
    )
    journal.path.parent.mkdir()
    journal.path.write_text("{}\n")
    assert str(interrupted(journal, 1, "1 of 4 episodes")) == (
        f"no results written; journal '{journal.path}' keeps 1 of 4 episodes; re-run the same command to resume"
    )
