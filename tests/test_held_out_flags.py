"""The flags that evaluate.py, milp.py and bound.py share are one flag group (cli.scripts.held_out_flags)."""

import re

import pytest
from conftest import run_script

SHARED = ("--episodes", "--horizon", "--seed", "--out")
SOLVER_POOL = ("--workers", "--address")


def flag_help(text: str, flag: str) -> str:
    """The help text of `flag` in a script's --help output, its whitespace collapsed (argparse wraps it to the width of
    each parser's longest flag)."""
    found = re.search(rf"\n  {flag}(?: [A-Z_]+)?\s+(.*?)(?=\n  -|\n\n|\Z)", text, re.DOTALL)
    assert found, f"{flag} not in:\n{text}"
    return " ".join(found.group(1).split())


@pytest.fixture(scope="module")
def helps():
    result = {}
    for script in ("evaluate.py", "milp.py", "bound.py"):
        done = run_script(script, "--help")
        assert done.returncode == 0, done.stderr
        result[script] = done.stdout
    return result


def test_the_shared_flags_have_one_help_text_in_every_script(helps):
    """Catches a script that declares one of the shared flags itself again (another default or wording, as "steps per
    episode" in one script against "decisions per episode" in another)."""
    for flag in SHARED:
        assert len({flag_help(text, flag) for text in helps.values()}) == 1, flag
    for flag in SOLVER_POOL:
        assert flag_help(helps["milp.py"], flag) == flag_help(helps["bound.py"], flag)
        assert f"\n  {flag}" not in helps["evaluate.py"]  # evaluate.py runs no solver pool
    assert flag_help(helps["bound.py"], "--horizon") == "decisions per episode (default 50)"
    assert flag_help(helps["evaluate.py"], "--seed") == "exogenous-path seed (default: held-out 20260128)"


def test_the_learned_policy_flags_are_one_group_in_every_script_that_runs_one():
    """--mode and --precision of evaluate.py, backtest.py, decide.py and serve.py come from cli.scripts.learned_policy_flags:
    the same choices and wording but for the name of the learned policy; decide.py and backtest.py had no --precision."""
    texts = {}
    for script in ("evaluate.py", "backtest.py", "decide.py", "serve.py"):
        done = run_script(script, "--help")
        assert done.returncode == 0, done.stderr
        texts[script] = done.stdout
    for flag, pattern in (
        ("--mode", r"for .+: greedy or sampled opening \(default greedy\)"),
        ("--precision", r"for .+ of or-transformer or hpo: the networks' arithmetic, bfloat16 autocast or float32 \(default float32\)"),
    ):
        for script, text in texts.items():
            found = re.search(rf"\n  {flag} \{{[a-z0-9,]+\}}\s+(.*?)(?=\n  -|\n\n|\Z)", text, re.DOTALL)
            assert found and re.fullmatch(pattern, " ".join(found.group(1).split())), (script, flag)
