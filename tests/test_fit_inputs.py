"""What platform/fit.py and platform/simulate_history.py take in and give out: every input checked before the
estimation (flags, every cell of the history), the history's integer counts and calendar months, and a history drawn
from a fitted instance that reads back with the instance's item names and step (demand/fitting.py, envs/instance.py)."""

import json
import runpy
import signal
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, run_script

import demand.fitting
from demand.fitting import fit_history
from demand.sales_history import history_matrix
from demand.simulation import simulate_history
from envs.instance import FIELD_RANGES, Instance, paper_instance
from plumbing.errors import InputError

ESTIMATION = ("choose_factors", "lagged_covariances", "estimate", "bootstrap", "smooth_factor", "holdout_check")
"""The steps of the estimation in demand.fitting, in the order fit_history runs them."""


@pytest.fixture
def no_estimation(monkeypatch):
    """Every step of the estimation raises if it is called: a refusal under this fixture came before any of them."""

    def ran(*args, **kwargs):
        raise AssertionError("the estimation ran before the input was refused")

    for name in ESTIMATION:
        monkeypatch.setattr(demand.fitting, name, ran)


def write_history(folder, cells: dict | None = None, periods: int = 60) -> tuple:
    """A valid CSV history of items A and B over integer periods 1..`periods` (Poisson(3) counts, seed 0) and their
    cost table; `cells` {(item, period): text} replaces those cells' text."""
    demand = np.random.default_rng(0).poisson(3.0, size=(periods, 2))
    rows = [(item, t + 1, str(demand[t, k])) for k, item in enumerate("AB") for t in range(periods)]
    text = "".join(f"{item},{t},{(cells or {}).get((item, t), value)}\n" for item, t, value in rows)
    (folder / "history.csv").write_text("item,period,demand\n" + text)
    (folder / "costs.csv").write_text("item,h,b,lead\nA,1.0,9.0,2\nB,1.5,8.0,3\n")
    return folder / "history.csv", folder / "costs.csv"


@pytest.mark.parametrize("cell", ["1e23", "1e12", "1000001"])
def test_a_demand_cell_beyond_the_instances_range_is_refused_before_any_estimation(cell, tmp_path, no_estimation):
    """A cell above 10^6 units (the instance's largest lam: an item's mean cannot exceed its largest cell) is one
    InputError naming the item, the period and the column, with the range, and no step of the estimation runs. Catches
    the bootstrap's traceback at 1e23 and the refusal of 'instance field lam' after the whole estimation at 1e12."""
    history, costs = write_history(tmp_path, {("B", 7): cell})
    with pytest.raises(InputError) as refused:
        fit_history(history, costs)
    message = str(refused.value)
    assert "\n" not in message and "item 'B' period 7: column 'demand': " in message, message
    assert f"expected a non-negative integer (units sold) up to 1,000,000, got {cell} (an item's mean demand" in message, message


def test_a_history_at_the_demand_bound_fits_into_an_instance_within_its_ranges(tmp_path):
    """Cells at the bound itself: an item that sells 10^6 units in 5% of the periods and none otherwise (phi at its
    cap), one that sells 999,990..10^6 every period and a Poisson(3) one, fitted with the default caps: no refusal
    later on, lam the items' sample means (computed here from the cells), and every field within the instance's
    ranges. Catches a bound on the cells that lets through a history whose instance the instance's ranges refuse."""
    rng = np.random.default_rng(1)
    spiky = np.where(rng.random(60) < 0.05, 1_000_000, 0)
    spiky[0] = 1_000_000
    steady, small = rng.integers(999_990, 1_000_001, 60), rng.poisson(3, 60)
    columns = {"A": spiky, "B": steady, "C": small}
    rows = "".join(f"{item},{t + 1},{value}\n" for item, column in columns.items() for t, value in enumerate(column))
    (tmp_path / "h.csv").write_text("item,period,demand\n" + rows)
    (tmp_path / "c.csv").write_text("item,h,b,lead\nA,1,9,4\nB,1,9,4\nC,1,9,2\n")
    fitted, _ = fit_history(tmp_path / "h.csv", tmp_path / "c.csv", replicates=10)
    np.testing.assert_allclose(fitted.lam, [column.mean() for column in columns.values()], rtol=1e-12)
    assert fitted.lam.max() <= FIELD_RANGES["lam"][2] and fitted.qbar.max() <= FIELD_RANGES["qbar"][2]


def fit_script(monkeypatch, capsys, *args) -> tuple[int, str]:
    """platform/fit.py with `args`, in this process (so that a monkeypatched demand.fitting holds): (exit status, error output)."""
    monkeypatch.setattr(sys, "argv", ["fit.py", *map(str, args)])
    monkeypatch.setattr(sys, "stderr", sys.stderr)  # run_cli wraps it; restored afterwards
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit) as stop:
            runpy.run_path(str(ROOT / "platform" / "fit.py"), run_name="__main__")
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return stop.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--K", "-1", "error: --K: expected a number in [0, 1e+12], got -1.0"),
        ("--K", "1e13", "error: --K: expected a number in [0, 1e+12], got 10000000000000.0 (larger values overflow"),
        ("--gamma", "1", "error: --gamma: expected a number in (0, 1), got 1.0"),
        ("--gamma", "nan", "error: --gamma: expected a finite number in (0, 1), got NaN"),
    ],
)
def test_a_bad_flag_is_refused_as_the_flag_before_any_estimation(flag, value, message, tmp_path, monkeypatch, capsys, no_estimation):
    """fit.py on a valid history with a bad --K or --gamma: one line naming the flag (not 'instance field K'), exit
    status 2, nothing written, and no step of the estimation run. Catches the refusal after the whole estimation."""
    history, costs = write_history(tmp_path)
    status, error = fit_script(
        monkeypatch, capsys, "--history", history, "--items", costs, flag, value, "--out", tmp_path / "out" / "i.json"
    )
    assert status == 2 and error.strip().splitlines() == [error.strip()] and error.startswith(message), error
    assert not (tmp_path / "out").exists()


def test_whole_counts_written_as_floats_are_refused_and_integers_read(tmp_path):
    """The history format's demand is an integer count (docs/formats.md, Field rules: an integer field takes 2, not
    2.0): a CSV cell 2.0 is refused naming its item and period, and so is a Parquet column of doubles even where every
    value is whole; the same counts as CSV digits (spaces around them allowed) or a Parquet integer column read as
    those counts. Catches a reader that takes 2.0 for 2."""
    history, _ = write_history(tmp_path, {("A", 4): "2.0"})
    with pytest.raises(InputError, match=r"item 'A' period 4: column 'demand': expected a non-negative integer .* got 2\.0 \(a count is"):
        history_matrix(history)
    counts = np.random.default_rng(0).poisson(3.0, size=(60, 2))
    items, periods = np.repeat(["A", "B"], 60), np.tile(np.arange(1, 61), 2)
    for kind, column in (("double", counts.T.ravel().astype(np.float64)), ("int64", counts.T.ravel())):
        pq.write_table(pa.table({"item": items, "period": periods, "demand": column}), tmp_path / f"{kind}.parquet")
    with pytest.raises(InputError, match=r"item 'A' period 1: column 'demand': .* got \d+\.0 \(a count is an integer; .* double values"):
        history_matrix(tmp_path / "double.parquet")
    np.testing.assert_array_equal(history_matrix(tmp_path / "int64.parquet").demand, counts)
    history, _ = write_history(tmp_path, {("A", 4): f" {counts[3, 0]} "})
    np.testing.assert_array_equal(history_matrix(history).demand, counts)


def month_ends(first: str, months: int) -> list[str]:
    """The last days of `months` calendar months from the month `first` (YYYY-MM), leap Februaries included."""
    start = np.datetime64(first, "M")
    return [str((start + m + 1).astype("datetime64[D]") - 1) for m in range(months)]


def month_days(first: str, months: int, day: int) -> list[str]:
    """Day `day` of `months` calendar months from the month `first` (YYYY-MM)."""
    start = np.datetime64(first, "M")
    return [str((start + m).astype("datetime64[D]") + day - 1) for m in range(months)]


def write_dated(path, dates: list[str], counts: np.ndarray) -> None:
    """A CSV history of items A and B on `dates`, counts [T, 2]."""
    rows = [f"{item},{date},{counts[t, k]}\n" for k, item in enumerate("AB") for t, date in enumerate(dates)]
    path.write_text("item,period,demand\n" + "".join(rows))


@pytest.mark.parametrize(
    "dates, step",
    [
        (month_ends("2019-11", 62), "1 month"),  # 2019-11-30 .. 2024-12-31, through 2020-02-29 and 2024-02-29
        (month_days("2019-11", 62, 1), "1 month"),
        (month_days("2019-11", 62, 28), "1 month"),
        (month_ends("2011-03", 186)[::3], "3 months"),  # quarter ends
    ],
    ids=["month-ends", "month-starts", "the-28th", "quarter-ends"],
)
def test_monthly_dates_are_calendar_months(dates, step, tmp_path):
    """Month ends (28 to 31 days apart), month starts and the 28th over five years, and quarter ends over 15: one
    period per calendar month (or quarter), the labels the dates themselves, the counts in their places. Catches
    month ends refused as '28 days apart'."""
    counts = np.random.default_rng(2).poisson(3.0, size=(len(dates), 2))
    write_dated(tmp_path / "h.csv", dates, counts)
    history = history_matrix(tmp_path / "h.csv")
    assert history.step == step and history.periods == dates
    np.testing.assert_array_equal(history.demand[:, [history.items.index(x) for x in "AB"]], counts)


@pytest.mark.parametrize(
    "dates, where, what",
    [
        (month_ends("2019-11", 62)[:20] + ["2021-07-30"] + month_ends("2021-08", 41), "2021-07-30", "not the last day of its month"),
        (month_days("2019-11", 62, 1)[:3] + ["2020-02-02"] + month_days("2020-03", 58, 1), "2020-02-02", "not day 1 of its month"),
        (
            [str(np.datetime64("2020-01-01") + 30 * t + t % 3) for t in range(60)],
            "2020-02-01",
            r"comes 31 day\(s\) after .* mixed frequencies",
        ),
    ],
    ids=["a-month-end-off", "a-month-start-off", "thirty-odd-days"],
)
def test_irregular_dates_are_still_refused(dates, where, what, tmp_path):
    """Month ends with one 30th of a 31-day month, month starts with one 2nd, and dates 30 or 31 days apart on no
    grid: refused naming the first date off the grid (or, for no grid, the first irregular period)."""
    write_dated(tmp_path / "h.csv", dates, np.ones((len(dates), 2), dtype=np.int64))
    with pytest.raises(InputError, match=rf"item 'A' period {where}: .*{what}"):
        history_matrix(tmp_path / "h.csv")


def test_a_history_drawn_from_a_fitted_instance_has_its_item_names_and_step(tmp_path):
    """fit (a history of items 'south' and 'north' on month starts) -> simulate_history.py (costs as Parquet, .pq) -> the
    history read back: the fitted instance records source.step '1 month'; the drawn history's items are the
    instance's own names in its order and its periods are calendar months from --start, month ends since --start is
    one. Catches item-000 names (which backtest.py refuses against this instance) and daily dates from a monthly
    instance."""
    dates = month_days("2019-11", 62, 1)
    counts = np.random.default_rng(3).poisson(4.0, size=(len(dates), 2))
    rows = [f"{item},{date},{counts[t, k]}\n" for k, item in enumerate(["south", "north"]) for t, date in enumerate(dates)]
    (tmp_path / "h.csv").write_text("item,period,demand\n" + "".join(rows))
    (tmp_path / "c.csv").write_text("item,h,b,lead\nnorth,1.0,9.0,2\nsouth,1.5,8.0,3\n")
    fitted, _ = fit_history(tmp_path / "h.csv", tmp_path / "c.csv", replicates=10)
    fitted.save(tmp_path / "fit.json")
    source = json.loads((tmp_path / "fit.json").read_text())["source"]
    assert source["step"] == "1 month" and source["item_names"] == ["north", "south"]
    args = ["--instance", tmp_path / "fit.json", "--periods", 55, "--start", "2030-01-31"]
    run_script("simulate_history.py", *args, "--out", tmp_path / "drawn.csv", "--costs", tmp_path / "costs.pq", check=True)
    drawn = history_matrix(tmp_path / "drawn.csv")
    assert drawn.items == ["north", "south"] and drawn.step == source["step"]
    assert drawn.periods == month_ends("2030-01", 55)
    assert pq.read_table(tmp_path / "costs.pq").column("item").to_pylist() == ["north", "south"]


@pytest.mark.parametrize(
    "step, start, periods",
    [
        ("7 days", None, [str(np.datetime64("2024-01-01") + 7 * t) for t in range(52)]),
        ("1 month", "2024-03-15", month_days("2024-03", 52, 15)),
        ("2 periods", "5", [str(5 + 2 * t) for t in range(52)]),
        (None, "2023-12-30", [str(np.datetime64("2023-12-30") + t) for t in range(52)]),
    ],
    ids=["weekly", "monthly-on-the-15th", "every-second-period", "no-step-daily"],
)
def test_a_simulated_history_reads_back_at_the_instances_step(step, start, periods, tmp_path):
    """demand.simulation.simulate_history of a paper instance whose source records `step`: the history read back has that step
    and the periods written out here from --start (weeks from 2024-01-01 by default, the 15th of each month, every
    second integer from 5); an instance without a step draws days. Catches daily dates for a weekly or monthly
    instance, which backtest.py refuses against it."""
    import pyarrow.csv

    instance = Instance.from_dict(paper_instance(2, 0).to_dict() | ({"source": {"step": step}} if step else {}))
    history, _ = simulate_history(instance, 0, 52, start)
    pyarrow.csv.write_csv(history, tmp_path / "h.csv")
    read = history_matrix(tmp_path / "h.csv")
    assert read.step == (step or "1 day") and read.periods == periods and read.items == ["item-000", "item-001"]
