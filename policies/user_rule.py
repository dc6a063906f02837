"""The user's own reorder rule as a policy: the practitioner's baseline, evaluated, backtested and served like any named
policy (user-rule:PATH, policies/names.py).

A rule table (CSV or Parquet, docs/formats.md) gives each item one row: `item`, its order-up-to level S_i
(`order_up_to`) and either a reorder point s_i (`reorder_point`: reviewed every period, an order of S_i - x_i when the
inventory position x_i = I_i + sum_l P_i,l is at or below s_i) or a review period R_i (`review_period`: every R_i
periods, counted from the episode's start at 0, an order of S_i - x_i when x_i is below S_i). A period's order opens,
and pays the setup cost K once, when any item orders; each item's quantity is capped at the instance's qbar_i, as every
policy's is (the action set of eq. hybrid_action), and the parameters say how many items have an S_i - s_i above their cap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from envs.dynamics import State
from envs.instance import Instance, TensorInstance, item_rows
from plumbing.errors import InputError
from plumbing.files import file_sha256
from plumbing.tables import number_column, read_table

NAME = "user-rule"
ITEM, REORDER_POINT, ORDER_UP_TO, REVIEW_PERIOD = "item", "reorder_point", "order_up_to", "review_period"
HEADER = "a header line item,order_up_to and reorder_point and/or review_period, one row per item"
LEVEL_MAX = 1e9
"""The largest level a rule may state (units): the simulation's costs stay finite (envs.instance's lam range)."""


@dataclass(frozen=True)
class RuleTable:
    """A rule table as read: per row, the item, S, and s (NaN where the row reviews periodically) or R (0 where it
    reviews every period)."""

    items: list[str]
    order_up_to: np.ndarray
    reorder_point: np.ndarray
    review_period: np.ndarray
    sha256: str


def _optional_column(table, name: str, path) -> np.ndarray:
    """A numeric column of the rule table with NaN where a row leaves it empty; NaN everywhere when the table lacks it."""
    import pyarrow as pa

    if name not in table.column_names:
        return np.full(table.num_rows, np.nan)
    column = table.column(name)
    if column.null_count == table.num_rows:
        return np.full(table.num_rows, np.nan)
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        raise InputError(f"rule table '{path}' column '{name}': expected numbers (or empty cells), got {column.type} values")
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)


def read_rule_table(path) -> RuleTable:
    """The rule table at `path`, every row checked; one InputError naming the row and the field otherwise."""
    import pyarrow as pa

    path, table = read_table(path, "rule table", HEADER, {ITEM: pa.string()})
    columns = set(table.column_names)
    allowed = {ITEM, ORDER_UP_TO, REORDER_POINT, REVIEW_PERIOD}
    if columns - allowed or {ITEM, ORDER_UP_TO} - columns or not columns & {REORDER_POINT, REVIEW_PERIOD}:
        raise InputError(f"rule table '{path}' columns: expected {HEADER}, got {sorted(columns)}")
    if table.num_rows == 0:
        raise InputError(f"rule table '{path}' has no rows; expected {HEADER}")
    items = table.column(ITEM).cast(pa.string()).to_pylist()
    up_to = np.asarray(number_column(table, ORDER_UP_TO, path), dtype=np.float64)
    reorder, review = _optional_column(table, REORDER_POINT, path), _optional_column(table, REVIEW_PERIOD, path)
    seen = set()
    for row, item in enumerate(items):
        where = f"rule table '{path}' row {row + 1}" + (f" (item '{item}')" if item is not None else "")
        if item is None:
            raise InputError(f"{where}: the item is missing")
        if item in seen:
            raise InputError(f"{where}: a second row for the same item; write one rule per item")
        seen.add(item)
        s, big_s, r = reorder[row], up_to[row], review[row]
        if not (math.isfinite(big_s) and 0 <= big_s <= LEVEL_MAX):
            raise InputError(f"{where}: order_up_to: expected a number from 0 to {LEVEL_MAX:g} (units), got {big_s:g}")
        if math.isnan(s) == math.isnan(r):
            given = "neither" if math.isnan(s) else "both"
            raise InputError(f"{where}: expected exactly one of reorder_point (s, S) and review_period (R, S), got {given}")
        if not math.isnan(s) and not (math.isfinite(s) and -LEVEL_MAX <= s <= big_s):
            raise InputError(f"{where}: reorder_point: expected a number from {-LEVEL_MAX:g} up to order_up_to ({big_s:g}), got {s:g}")
        if not math.isnan(r) and not (math.isfinite(r) and r >= 1 and r == math.floor(r)):
            raise InputError(f"{where}: review_period: expected a whole number of periods >= 1, got {r:g}")
    return RuleTable(items, up_to, reorder, np.nan_to_num(review, nan=0.0).astype(np.int64), file_sha256(path))


def write_rule_table(table: RuleTable, items: list[str], path) -> None:
    """The rows of `items` (each of the table's) as a rule table CSV at `path`, written whole."""
    import csv
    import io

    from plumbing.files import atomic_write_text

    row = {item: k for k, item in enumerate(table.items)}
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow([ITEM, REORDER_POINT, ORDER_UP_TO, REVIEW_PERIOD])
    for item in items:
        k = row[item]
        periodic = bool(table.review_period[k])
        reorder = "" if periodic else repr(float(table.reorder_point[k]))
        writer.writerow([item, reorder, repr(float(table.order_up_to[k])), int(table.review_period[k]) if periodic else ""])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text.getvalue())


def instance_rows(table: RuleTable, instance: Instance, path) -> np.ndarray:
    """For each of the instance's items, its row of the rule table (envs.instance.item_rows): by name where the instance
    names its items (source.item_names, written by fit.py and the catalogue), else by count in the table's order."""
    by_count = "rules are matched to items by count, in the table's order"
    return item_rows(instance, table.items, f"rule table '{path}'", "", by_count, "rule")


class UserRulePolicy:
    """The rule table's rules on one instance (module docstring): tensors [n] of S_i, s_i (-inf where periodic) and R_i
    (0 where reviewed every period); `reset` restarts the review clock (the evaluator calls it per rollout)."""

    def __init__(self, order_up_to: torch.Tensor, reorder_point: torch.Tensor, review_period: torch.Tensor):
        self.order_up_to, self.reorder_point, self.review_period = order_up_to, reorder_point, review_period
        self.clock = 0

    def reset(self) -> None:
        self.clock = 0

    def __call__(self, state: State, instance: TensorInstance) -> tuple[torch.Tensor, torch.Tensor]:
        position = state.inventory_position()  # [B, n]
        periodic = self.review_period > 0
        reviewed = self.clock % self.review_period.clamp_min(1) == 0  # [n]; rows reviewed every period never read it
        due = torch.where(periodic, reviewed & (position < self.order_up_to), position <= self.reorder_point)
        quantity = torch.where(due, torch.minimum((self.order_up_to - position).clamp_min(0.0), instance.qbar), torch.zeros_like(position))
        self.clock += 1
        return (quantity > 0).any(-1).to(position.dtype), quantity


def user_rule_policy(instance: Instance, path, device="cpu") -> tuple[UserRulePolicy, dict]:
    """(policy, parameters for a summary) of the rule table at `path` on `instance`."""
    table = read_rule_table(path)
    rows = instance_rows(table, instance, path)
    tensors = instance.to_torch(device)
    up_to, reorder, review = table.order_up_to[rows], table.reorder_point[rows], table.review_period[rows]
    levels = torch.as_tensor(np.stack([up_to, np.where(review > 0, -np.inf, reorder)]), device=tensors.device, dtype=tensors.dtype)
    policy = UserRulePolicy(levels[0], levels[1], torch.as_tensor(review, device=tensors.device))
    above_cap = int(np.sum(np.where(review > 0, up_to, up_to - reorder) > instance.qbar))
    parameters = {
        "rule_table": str(path),
        "rule_table_sha256": table.sha256,
        "reorder_point_items": int(np.sum(review == 0)),
        "review_period_items": int(np.sum(review > 0)),
        "items_whose_order_can_exceed_qbar": above_cap,
    }
    return policy, parameters
