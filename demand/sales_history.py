"""A user's sales history and cost table, read and checked for the demand model's fit (platform/fit.py) and the
backtest (platform/backtest.py): the history as a complete [T, n] matrix of counts on one grid of periods (integers,
days, weeks, calendar months), the cost table's h, b, lead and qbar per item, and the order cap of an item whose cost
table gives none. Every refusal is one InstanceError that names the file, the item and the period or column."""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass

import numpy as np

from envs.demand_law import periods_quantile
from envs.instance import FIELD_RANGES, InstanceError, check_item_column
from plumbing import validate
from plumbing.files import file_sha256
from plumbing.tables import number_column, read_table, table_format

MIN_PERIODS = 50
"""Fewest periods a history may have: with T periods a lag-1 autocorrelation has standard error about 1/sqrt(T),
0.14 at T = 50, and the hold-out check keeps 20% (10 periods) aside."""


HISTORY_COLUMNS = ("item", "period", "demand")
ORDERED = "ordered"
"""The history's optional column: the units the user ordered of the item in the period (replayed as it ran by the
backtest: envs.history_replay.RecordedOrders)."""
DEMAND_MAX = FIELD_RANGES["lam"][2]
"""The most units one cell of a history may hold: an item's mean demand becomes its lam in the instance, whose upper
bound this is, so that a history the reader accepts never gives an instance that the instance's ranges refuse."""
INTEGER_TEXT = r"^[+-]?\d+$"
"""A CSV demand cell written as an integer (regular expression over the whole cell, trimmed)."""
NUMBER_TEXT = f"^(?:{validate.NUMBER_LITERAL.pattern})$"
"""A CSV demand cell written as a number of any form (2, 2.0, 2e3)."""
ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
COST_COLUMNS = ("item", "h", "b", "lead")
"""The cost table's required columns; `qbar` is optional (default `default_caps`), and so is `supplier` (the item's
supplier in a catalogue: catalogue/suppliers.py)."""
SUPPLIER = "supplier"
QBAR_PER_LAM = 4.0
CAP_QUANTILE = 0.999
"""The default cap covers this quantile of an item's lead-time demand (`default_caps`)."""


def default_caps(lam: np.ndarray, overdispersion: np.ndarray, lead: np.ndarray) -> np.ndarray:
    """The order cap of an item whose cost table gives none: the least whole number of units at least QBAR_PER_LAM lam_i, the
    CAP_QUANTILE quantile of its lead-time demand (L_i + 1 periods at its mean rate, the factor held still) and 1
    (docs/fitting.md; a slow mover's 4 lam is below one unit: 0.15-1.9 on a weekly panel)."""
    quantile = periods_quantile(CAP_QUANTILE, lam, overdispersion, lead + 1.0)
    return np.ceil(np.maximum.reduce([QBAR_PER_LAM * lam, quantile, np.ones_like(lam)]) - 1e-9)


@dataclass(frozen=True)
class History:
    """demand [T, n] (float64 counts), item names (the cost table's order), period labels (T strings), the step
    ('1 period', '1 day', '7 days', '1 month') and the SHA-256 of the file."""

    demand: np.ndarray
    items: list[str]
    periods: list[str]
    step: str
    sha256: str
    ordered: np.ndarray | None = None
    """[T, n] the units ordered in each period (the history's `ordered` column), or None without one."""


@dataclass(frozen=True)
class Costs:
    items: list[str]
    h: np.ndarray
    b: np.ndarray
    lead: np.ndarray
    qbar: np.ndarray | None
    supplier: list[str | None] | None = None
    """Each item's supplier (None where its cell is empty), or None without a supplier column."""


def _bad(path, item, period, what: str) -> InstanceError:
    return InstanceError(f"history '{path}' item '{item}' period {period}: {what}")


def _periods(column, path, items: np.ndarray) -> tuple[np.ndarray, str, callable]:
    """(integer period keys, unit, label of a key): integers as they are, dates as days since 1970-01-01, or as
    calendar months since 1970-01 when every date falls on the same day of its month (month starts, the 15th) or on the
    last day of its month (month ends: 2024-01-31, 2024-02-29, ...). Dates about a month apart (a median gap of 28
    days or more) that are mostly, but not all, on one such grid are refused at the earliest date off it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        column = _text_periods(column, path, items)
        kind = column.type
    if pa.types.is_integer(kind):
        return column.to_numpy().astype(np.int64), "period", str
    if pa.types.is_date(kind) or pa.types.is_timestamp(kind):
        days = pc.cast(pc.cast(column, pa.timestamp("s")), pa.int64()).to_numpy() // 86_400
        dates = days.astype("datetime64[D]")
        months = dates.astype("datetime64[M]")
        day_of_month = (dates - months).astype(np.int64)
        month_end = dates + 1 == (months + 1).astype("datetime64[D]")
        distinct = np.unique(days)
        if distinct.size > 1 and np.median(np.diff(distinct)) >= 28:
            day = int(np.bincount(day_of_month).argmax())
            same_day = day_of_month == day
            if np.all(month_end):
                return months.astype(np.int64), "month", lambda m: str(np.datetime64(int(m) + 1, "M").astype("datetime64[D]") - 1)
            if np.all(same_day):
                return months.astype(np.int64), "month", lambda m: str(np.datetime64(int(m), "M").astype("datetime64[D]") + day)
            on_grid, grid = (
                (month_end, "the last day of its month") if month_end.sum() > same_day.sum() else (same_day, f"day {day + 1} of its month")
            )
            if on_grid.mean() > 0.5:
                off = np.flatnonzero(~on_grid)
                row = int(off[np.argmin(days[off])])
                raise _bad(
                    path,
                    items[row],
                    str(dates[row]),
                    f"not {grid}, unlike most of the history's dates: monthly periods fall on one day of every month (or on "
                    "every month's last day)",
                )
        return days, "day", lambda d: str(np.datetime64(int(d), "D"))
    first = column.to_pylist()[0]
    raise InstanceError(
        f"history '{path}' column 'period': expected consecutive integers or dates (YYYY-MM-DD) at one frequency, "
        f"got {kind} values (first: {first!r} for item '{items[0]}')"
    )


def _text_periods(column, path, items: np.ndarray):
    """A text period column (a Parquet string column, or a CSV column with a value that is not a date or an integer) as
    dates (YYYY-MM-DD) or integers, whichever its first value is; an InstanceError naming the first row that is not."""
    import pyarrow as pa

    values = column.to_pylist()
    as_dates = bool(ISO_DATE.fullmatch(values[0].strip()))
    parsed = []
    for row, value in enumerate(values):
        text = value.strip()
        try:
            period = (datetime.date.fromisoformat(text) if ISO_DATE.fullmatch(text) else None) if as_dates else int(text)
        except ValueError:  # 2024-02-30, or not an integer
            period = None
        if period is None:
            expected = "a date (YYYY-MM-DD) of the calendar, like the history's first period" if as_dates else "an integer"
            raise InstanceError(
                f"history '{path}' item '{items[row]}' data row {row + 1}: column 'period': expected {expected}, got {value!r} "
                "(periods are consecutive integers or dates at one frequency)"
            )
        parsed.append(period)
    return pa.array(parsed, type=pa.date32() if as_dates else pa.int64())


def _demand(table, path, items: np.ndarray, keys: np.ndarray, label, name: str = "demand", what: str = "units sold") -> np.ndarray:
    """The count column `name` (demand, or ordered) as float64 counts [R]: integers as the file writes them (digits in a
    CSV, whose column is read as text; an integer column in Parquet: 2, never 2.0) in [0, DEMAND_MAX]. The first row
    that is not is one InstanceError naming its item and period, the column and the value as the file shows it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = table.column(name)
    csv = table_format(path, "history", InstanceError) == "csv"
    if csv:
        text = pc.utf8_trim_whitespace(column.fill_null(""))
        is_number = pc.match_substring_regex(text, NUMBER_TEXT).to_numpy(zero_copy_only=False)
        is_integer = pc.match_substring_regex(text, INTEGER_TEXT).to_numpy(zero_copy_only=False)
        demand = np.full(len(text), np.nan)
        demand[is_number] = pc.cast(text.filter(is_number), pa.float64()).to_numpy()
        missing = pc.equal(text, "").to_numpy(zero_copy_only=False)
    else:
        numeric = pa.types.is_integer(column.type) or pa.types.is_floating(column.type)
        demand = column.to_numpy(zero_copy_only=False).astype(np.float64) if numeric else np.full(len(column), np.nan)
        missing = column.is_null().to_numpy(zero_copy_only=False)
        is_number = numeric & ~missing
        is_integer = is_number & pa.types.is_integer(column.type)
    whole = is_number & (demand >= 0) & (demand == np.floor(demand))
    bad = ~whole | (demand > DEMAND_MAX) | ~is_integer
    if not bad.any():
        return demand
    row = int(np.argmax(bad))
    value = text[row].as_py() if csv else column[row].as_py()
    got, why = (repr(value) if isinstance(value, str) and not is_number[row] else str(value)), ""
    if missing[row]:
        got = "nothing (a missing value)"
    elif whole[row] and demand[row] > DEMAND_MAX:
        why = f"an item's mean demand is its lam in the instance, at most {DEMAND_MAX:g}: {FIELD_RANGES['lam'][3]}"
    elif whole[row] and csv:
        why = "a count is written as an integer, without a decimal point or an exponent"
    elif whole[row]:
        why = f"a count is an integer; the Parquet column holds {column.type} values: store it as an integer column"
    where = f"history '{path}' item '{items[row]}' period {label(keys[row])}: column '{name}'"
    raise validate.refuse(where, f"a non-negative integer ({what}) up to {DEMAND_MAX:,.0f}", got, why, InstanceError)


def read_history(path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, str, callable, str]:
    """Check a long-form history (columns item, period, demand and optionally ordered) row by row; return (item names
    [R], period keys [R], demand [R], ordered [R] or None, unit, period label, sha256). Every refusal names the item and
    the period."""
    import pyarrow as pa

    header = "a header line item,period,demand (and optionally ordered) and one row per item and period"
    path, table = read_table(path, "history", header, {"item": pa.string(), "demand": pa.string(), ORDERED: pa.string()}, InstanceError)
    columns = set(table.column_names)
    validate.keys(columns, f"history '{path}' columns", {*HISTORY_COLUMNS, ORDERED}, set(HISTORY_COLUMNS), error=InstanceError)
    if table.num_rows == 0:
        raise InstanceError(f"history '{path}' has no rows; expected {header}")
    item_column = table.column("item").cast(pa.string())
    if item_column.null_count:
        row = int(np.argmax(item_column.is_null().to_numpy(zero_copy_only=False))) + 1
        raise InstanceError(f"history '{path}' data row {row}: the item is missing")
    items = np.asarray(item_column.to_pylist(), dtype=object)
    period_column = table.column("period")
    if period_column.null_count:
        row = int(np.argmax(period_column.is_null().to_numpy(zero_copy_only=False)))
        raise InstanceError(f"history '{path}' item '{items[row]}' data row {row + 1}: the period is missing")
    keys, unit, label = _periods(period_column, path, items)
    demand = _demand(table, path, items, keys, label)
    ordered = _demand(table, path, items, keys, label, ORDERED, "units ordered") if ORDERED in columns else None
    return items, keys, demand, ordered, unit, label, file_sha256(path)


def check_fit_length(history: History, path) -> None:
    """The fit's rule on a history's length: at least MIN_PERIODS periods (a lag-1 autocorrelation from T periods has
    standard error about 1/sqrt(T)); a backtest, which fits nothing, has its own rule (envs.history_replay.window_count)."""
    periods = len(history.periods)
    if periods < MIN_PERIODS:
        raise InstanceError(
            f"history '{path}': expected at least {MIN_PERIODS} periods to fit the model, got {periods} ({history.periods[0]} to "
            f"{history.periods[-1]}) (a lag-1 autocorrelation from T periods has standard error about 1/sqrt(T))"
        )


def history_matrix(path) -> History:
    """The history as a complete [T, n] matrix: every item has one row in every period of one common grid from the
    first to the last period; items in order of first appearance."""
    items, keys, demand, ordered, unit, label, digest = read_history(path)
    names, first = np.unique(items, return_index=True)
    names = names[np.argsort(first)]
    code = {name: k for k, name in enumerate(names)}
    item_code = np.fromiter((code[x] for x in items), dtype=np.int64, count=items.size)
    order = np.lexsort((keys, item_code))
    item_code, keys, demand = item_code[order], keys[order], demand[order]
    ordered = None if ordered is None else ordered[order]
    same_item = item_code[1:] == item_code[:-1]
    gaps = np.diff(keys)
    duplicate = same_item & (gaps == 0)
    if duplicate.any():
        r = int(np.argmax(duplicate))
        raise _bad(
            path, names[item_code[r]], label(keys[r]), "a second row for the same item and period; write one row per item and period"
        )
    step_of_item = np.full(names.size, np.iinfo(np.int64).max)
    np.minimum.at(step_of_item, item_code[1:][same_item], gaps[same_item])
    step = int(np.bincount(np.minimum(step_of_item, 10**6)[step_of_item < np.iinfo(np.int64).max]).argmax()) if same_item.any() else 1
    word = {"period": "period", "day": "day", "month": "month"}[unit]
    mixed = np.flatnonzero((step_of_item != step) & (step_of_item < np.iinfo(np.int64).max))
    irregular = same_item & (gaps % step != 0)
    if mixed.size:  # an item recorded at another frequency than most: name its first period at that spacing
        k = int(mixed[0])
        irregular = same_item & (item_code[1:] == k) & (gaps == step_of_item[k])
    if irregular.any():
        r = int(np.argmax(irregular)) + 1
        raise _bad(
            path,
            names[item_code[r]],
            label(keys[r]),
            f"comes {gaps[r - 1]} {word}(s) after the item's previous period, while most items' periods are {step} {word}(s) apart: "
            "dates at mixed frequencies; give every item the same frequency",
        )
    start, end = int(keys.min()), int(keys.max())
    periods = (end - start) // step + 1
    index = (keys - start) // step
    counts = np.bincount(item_code, minlength=names.size)
    if (counts < periods).any():
        k = int(np.argmax(counts < periods))
        rows = np.flatnonzero(same_item & (item_code[1:] == k))  # gap r: from row r to row r + 1, both of item k
        spacing = gaps[rows]
        run = (spacing[:-2] != step) & (spacing[:-2] == spacing[1:-1]) & (spacing[1:-1] == spacing[2:])
        if run.any():  # three gaps in a row at another spacing than the step: a stretch at another frequency, not missing rows
            r = int(rows[np.argmax(run)]) + 1
            raise _bad(
                path,
                names[k],
                label(keys[r]),
                f"comes {gaps[r - 1]} {word}(s) after the item's previous period, and so do the next ones, while its other periods "
                f"are {step} {word}(s) apart: dates at mixed frequencies; give every period the same frequency (sum the finer "
                "periods into the coarser ones)",
            )
        present = np.zeros(periods, bool)
        present[index[item_code == k]] = True
        missing = start + step * int(np.argmin(present))
        raise _bad(
            path,
            names[k],
            label(missing),
            f"no row (the history runs from {label(start)} to {label(end)}); write 0 for a period without sales",
        )
    matrix = np.zeros((periods, names.size))
    matrix[index, item_code] = demand
    orders = None
    if ordered is not None:
        orders = np.zeros((periods, names.size))
        orders[index, item_code] = ordered
    silent = matrix.sum(axis=0) == 0
    if silent.any():
        k = int(np.argmax(silent))
        raise _bad(path, names[k], f"{label(start)} to {label(end)}", "no sales in any period; the model needs lam_i > 0 (remove the item)")
    names = list(names)
    unit_text = f"{step} {word}" + ("s" if step > 1 else "")
    return History(matrix, names, [label(start + step * t) for t in range(periods)], unit_text, digest, orders)


def read_costs(path) -> Costs:
    """The cost table: columns item, h, b, lead and optionally qbar and supplier, one row per item."""
    import pyarrow as pa

    header = "a header line item,h,b,lead (and optionally qbar, supplier) and one row per item"
    path, table = read_table(path, "cost table", header, {"item": pa.string(), SUPPLIER: pa.string()}, InstanceError)
    allowed = {*COST_COLUMNS, "qbar", SUPPLIER}
    validate.keys(set(table.column_names), f"cost table '{path}' columns", allowed, COST_COLUMNS, error=InstanceError)
    if table.num_rows == 0:
        raise InstanceError(f"cost table '{path}' has no rows; expected {header}")
    item_column = table.column("item").cast(pa.string())
    if item_column.null_count:
        raise InstanceError(f"cost table '{path}' column 'item': {item_column.null_count} missing values")
    items = item_column.to_pylist()
    seen = set()
    for item in items:
        if item in seen:
            raise InstanceError(f"cost table '{path}' item '{item}': a second row for the same item; write one row per item")
        seen.add(item)
    numbers = {
        name: np.asarray(number_column(table, name, path, InstanceError), dtype=np.float64)
        for name in ("h", "b", "lead", "qbar")
        if name in table.column_names
    }
    for name, values in numbers.items():  # the instance's ranges, said in the cost table's terms
        check_item_column(name, values, f"cost table '{path}' column '{name}'", lambda i: f"item '{items[i]}'")
    supplier = table.column(SUPPLIER).cast(pa.string()).to_pylist() if SUPPLIER in table.column_names else None
    return Costs(items, numbers["h"], numbers["b"], numbers["lead"], numbers.get("qbar"), supplier)


def match_items(history_items: list[str], costs: Costs, history_path, costs_path) -> None:
    """Refuse an item in the history but not in the cost table, or the reverse, naming it."""
    in_costs = set(costs.items)
    for item in history_items:
        if item not in in_costs:
            raise InstanceError(f"history '{history_path}' item '{item}': not in the cost table '{costs_path}'; add its h, b, lead there")
    in_history = set(history_items)
    for item in costs.items:
        if item not in in_history:
            raise InstanceError(
                f"cost table '{costs_path}' item '{item}': not in the history '{history_path}'; every item needs a demand history"
            )
