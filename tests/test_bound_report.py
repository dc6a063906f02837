"""How the reports name a bound and its figures: platform/report.py's pairwise table with --bound, and the sweep
report's page, table and CSV with a decomposition bound. The numbers are hand-chosen: the relaxed policies cost
95 + D per episode, classical-best 110 + E, with E - D = [1, 0, 0, -1, 1, 0, 0, -1], so the paired difference is
15 with the 95% half-width t(0.975, 7) sqrt(4 / 7) / sqrt(8) = 0.63197, and 15 / 95 = 15.8% of the relaxed
policies' mean; the DP value (the bound) is 96.0, conservatively 94.5."""

import runpy
import sys

import numpy as np
import pytest
from conftest import ROOT

from envs.evaluation import Evaluation
from envs.exogenous import HELDOUT_SEED
from envs.instance import paper_instance
from run_results.records import write_evaluation

HORIZON = 5
D = np.array([0.0, 2.0, -2.0, 1.0, -1.0, 3.0, -3.0, 0.0])
E = D + np.array([1.0, 0.0, 0.0, -1.0, 1.0, 0.0, 0.0, -1.0])
DECOMPOSITION_FIGURES = {
    "kind": "lower-bound",
    "dp_value": 96.0,
    "conservative_value": 94.5,
    "equal_shares": {"value": 93.0, "conservative": 91.0},
    "cumulative_cost": [float(10 * (t + 1)) for t in range(HORIZON)],
}


def write(folder, policy: str, costs: np.ndarray, extra: dict | None = None):
    write_evaluation(
        folder, policy, Evaluation(costs, tuple(range(len(costs))), HORIZON), HELDOUT_SEED, {}, None, extra, instance=paper_instance(1, 0)
    )
    return folder


def run_report(monkeypatch, capsys, *args, status: int = 0):
    """platform/report.py with `args`, in this process, ending with exit status `status`: its (output, error output)."""
    monkeypatch.setattr(sys, "argv", ["report.py", *map(str, args)])
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(ROOT / "platform" / "report.py"), run_name="__main__")
    captured = capsys.readouterr()
    assert stop.value.code == status, captured
    return captured.out, captured.err


def report_script(monkeypatch, capsys, *args) -> str:
    """platform/report.py with `args`, in this process; its standard output."""
    return run_report(monkeypatch, capsys, *args)[0]


def report_error(monkeypatch, capsys, *args) -> str:
    """platform/report.py with `args`, in this process, refused: its error output (exit status 2)."""
    return run_report(monkeypatch, capsys, *args, status=2)[1]


def test_a_decomposition_bound_is_named_by_its_kind_and_its_dp_value_is_the_bound(tmp_path, monkeypatch, capsys):
    """report.py EVAL --bound DECOMPOSITION_DIR: catches the row labelled "perfect-information bound" and the relaxed
    policies' simulated mean shown as "the lower bound". The bound is the DP value; the
    relaxed policies' row is their simulated cost, and the policies' column is the paired difference to them."""
    best = write(tmp_path / "best", "classical-best", 110.0 + E)
    bound = write(tmp_path / "dec", "decomposition-bound", 95.0 + D, DECOMPOSITION_FIGURES)
    out = report_script(monkeypatch, capsys, best, "--bound", bound)
    assert "perfect-information" not in out and "(lower bound)" not in out, out
    rows = {line.split(" | ")[0].strip("| "): line for line in out.splitlines() if line.startswith("| ")}
    relaxed = rows["decomposition bound's relaxed policies (simulated)"]
    assert "| 95.00 |" in relaxed and "-15.00 [-15.63, -14.37]" in relaxed  # their paired difference to the reference
    assert "+15.00 [+14.37, +15.63] (15.8%)" in rows["classical-best"]
    bound_lines = [line for line in out.splitlines() if line.startswith("decomposition bound:")]
    assert bound_lines == ["decomposition bound: DP value 96.0, conservatively 94.5 (an expected cost: the bound)"], out
    # no schedule recorded: the tightest figure is the split's; 110 / 96 - 1 = 14.58%, (110 + 1.6449 x 2 / sqrt(8)) / 96 - 1 = 15.79%
    tightest = [line for line in out.splitlines() if line.startswith("tightest lower bound:")]
    assert tightest == [
        "tightest lower bound: 96.0 (constant split); above it (mean / bound - 1): classical-best +14.58% (95% at most +15.79%)"
    ]


def test_a_perfect_information_bound_keeps_its_name_and_ratio(tmp_path, monkeypatch, capsys):
    """The perfect-information bound's row and its gap (mean / bound mean - 1) stay as they were: catches a fix of
    the decomposition case that renames every bound."""
    best = write(tmp_path / "best", "classical-best", 110.0 + E)
    bound = write(tmp_path / "pi", "perfect-information-bound", 88.0 + D, {"kind": "lower-bound"})
    out = report_script(monkeypatch, capsys, best, "--bound", bound)
    assert "| perfect-information bound | 88.00 |" in out and f"| {100 * (110 / 88 - 1):.1f}% |" in out, out


def test_a_bound_flag_given_a_policy_is_refused(tmp_path, monkeypatch, capsys):
    """--bound names a policy's evaluation (not a bound): one error line naming the flag, exit status 2; catches a
    policy reported as "the lower bound"."""
    best = write(tmp_path / "best", "classical-best", 110.0 + E)
    other = write(tmp_path / "other", "base-stock", 100.0 + D)
    err = report_error(monkeypatch, capsys, best, "--bound", other)
    assert err.startswith("error: --bound") and "base-stock" in err and "not a bound" in err, err


def test_a_bound_given_as_a_run_is_refused(tmp_path, monkeypatch, capsys):
    """A bound's folder as a run or as --reference: one error line that says it is a bound and where it goes; catches
    a row "decomposition-bound | 95.00" with a paired interval, as if the relaxed policies' cost were a policy's."""
    best = write(tmp_path / "best", "classical-best", 110.0 + E)
    bound = write(tmp_path / "dec", "decomposition-bound", 95.0 + D, DECOMPOSITION_FIGURES)
    for args in ((best, bound), (best, "--reference", bound)):
        err = report_error(monkeypatch, capsys, *args)
        assert err.count("error:") == 1 and f"'{bound}' holds a bound (decomposition-bound)" in err and "give it with --bound" in err, err


def test_an_uncertified_split_and_the_equal_shares_split_are_noted(tmp_path, monkeypatch, capsys):
    """--bound with a best split the search did not certify says so with its gap; --bound with the equal-shares folder
    says it is the equal-shares split; a certified best split gets no note."""
    best = write(tmp_path / "best", "classical-best", 110.0 + E)
    search = {"certified": False, "relative_gap": 0.0123, "rounds": 8, "tolerance": 1e-4}
    for name, extra, note in (
        ("uncertified", {"split": "best", "search": search}, "note: best split not certified (gap 1.23% at the round limit 8"),
        ("certified", {"split": "best", "search": search | {"certified": True, "relative_gap": 1e-5}}, None),
        ("equal-shares", {"split": "equal shares"}, "note: this is the bound at equal shares K/n"),
    ):
        bound = write(tmp_path / name, "decomposition-bound", 95.0 + D, DECOMPOSITION_FIGURES | extra)
        notes = [line for line in report_script(monkeypatch, capsys, best, "--bound", bound).splitlines() if line.startswith("note:")]
        if note is None:
            assert notes == [], (name, notes)
        else:
            assert len(notes) == 1 and notes[0].startswith(note), (name, notes)
