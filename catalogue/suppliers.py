"""A catalogue's suppliers: each supplier's items share its fixed ordering cost K, so a catalogue is one joint
replenishment problem per supplier, all of them sharing the demand model's common factors (one fit over every item).

The cost table's optional `supplier` column names each item's supplier; the supplier table (CSV or Parquet, columns
`supplier`, `K` and optionally `lead`) gives each supplier's K and may set one lead time for all of its items.
`supplier_instances` cuts the catalogue's fitted instance into one instance per supplier: its items' h, b, lam,
loadings, overdispersion, lead (or the supplier's) and qbar, the supplier's K, the catalogue's gamma and rho, and
under `source` the item names and the supplier's name, so every script that takes an instance takes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from envs.instance import LMAX, Instance, check_constant
from plumbing.errors import InputError
from plumbing.tables import read_table

SUPPLIER, SETUP_COST, LEAD = "supplier", "K", "lead"
HEADER = "a header line supplier,K (and optionally lead) and one row per supplier"


@dataclass(frozen=True)
class Suppliers:
    """The supplier table as read: names, K per supplier, and each one's lead time (NaN where its items keep theirs)."""

    names: list[str]
    setup_cost: np.ndarray
    lead: np.ndarray

    def row(self, name: str) -> int:
        return self.names.index(name)


def read_suppliers(path) -> Suppliers:
    """The supplier table at `path`, every row checked (a name given once, K a finite number >= 0, a lead time one of
    the instance's); one InputError naming the row and the field otherwise."""
    import pyarrow as pa

    path, table = read_table(path, "supplier table", HEADER, {SUPPLIER: pa.string()})
    columns = set(table.column_names)
    if columns - {SUPPLIER, SETUP_COST, LEAD} or {SUPPLIER, SETUP_COST} - columns:
        raise InputError(f"supplier table '{path}' columns: expected {HEADER}, got {sorted(columns)}")
    if table.num_rows == 0:
        raise InputError(f"supplier table '{path}' has no rows; expected {HEADER}")
    names = table.column(SUPPLIER).cast(pa.string()).to_pylist()
    setup = np.full(table.num_rows, np.nan)
    column = table.column(SETUP_COST)
    for row, value in enumerate(column.to_pylist()):
        where = f"supplier table '{path}' row {row + 1}" + (f" (supplier '{names[row]}')" if names[row] is not None else "")
        if value is None:
            raise InputError(f"{where}: K is missing; every supplier needs its fixed ordering cost")
        try:
            setup[row] = check_constant("K", float(value), where)
        except (TypeError, ValueError):
            raise InputError(f"{where}: K: expected a number >= 0, got {value!r}") from None
    lead = np.full(table.num_rows, np.nan)
    if LEAD in columns and table.column(LEAD).null_count < table.num_rows:
        values = table.column(LEAD).to_pylist()
        for row, value in enumerate(values):
            if value is None:
                continue
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value == math.floor(value) and 1 <= value <= LMAX):
                raise InputError(
                    f"supplier table '{path}' row {row + 1} (supplier '{names[row]}'): lead: expected a whole number of periods "
                    f"from 1 to {LMAX} (the instance's lead times), got {value!r}"
                )
            lead[row] = value
    seen = set()
    for row, name in enumerate(names):
        if name is None or not name.strip():
            raise InputError(f"supplier table '{path}' row {row + 1}: the supplier's name is missing")
        if name in seen:
            raise InputError(f"supplier table '{path}' row {row + 1} (supplier '{name}'): a second row for the same supplier")
        seen.add(name)
    return Suppliers(names, setup, lead)


def item_suppliers(
    items: list[str], suppliers_of: list[str | None], table: Suppliers, costs_path, unassigned: str | None = None
) -> list[str]:
    """Each item's supplier: its cost table row's, or `unassigned` (a supplier of the table) where the row names none
    and the user said so; an item without one, or with a supplier the table lacks, is refused by name."""
    known = set(table.names)
    if unassigned is not None and unassigned not in known:
        shown = ", ".join(table.names[:5]) + (", ..." if len(table.names) > 5 else "")
        raise InputError(f"--unassigned '{unassigned}': not a supplier of the supplier table (its suppliers: {shown})")
    chosen = []
    for item, supplier in zip(items, suppliers_of):
        if supplier is None or not supplier.strip():
            if unassigned is None:
                raise InputError(
                    f"cost table '{costs_path}' item '{item}': no supplier; name one, or give --unassigned SUPPLIER for the "
                    "items without one"
                )
            supplier = unassigned
        elif supplier not in known:
            raise InputError(
                f"cost table '{costs_path}' item '{item}': supplier '{supplier}' is not in the supplier table; add its K there"
            )
        chosen.append(supplier)
    return chosen


def supplier_instance(catalogue: Instance, items: np.ndarray, name: str, setup_cost: float, lead: float) -> Instance:
    """The JRP of one supplier: the catalogue's items `items` (indices) with their costs, caps and demand model (the
    shared factors' loadings), the supplier's K and, where `lead` is not NaN, its lead time for every item."""
    loadings = catalogue.loadings
    names = catalogue.item_names
    return Instance(
        h=catalogue.h[items], b=catalogue.b[items], lam=catalogue.lam[items],
        beta=None if loadings is not None else catalogue.beta[items],
        loadings=None if loadings is None else loadings[items],
        lead=catalogue.lead[items] if math.isnan(lead) else np.full(items.size, lead),
        qbar=catalogue.qbar[items], K=setup_cost, gamma=catalogue.gamma, rho=catalogue.rho,
        overdispersion=None if catalogue.overdispersion is None else catalogue.overdispersion[items],
        source={**(catalogue.source or {}), "item_names": [names[i] for i in items] if names else None, "supplier": name},
    )  # fmt: skip


def supplier_instances(catalogue: Instance, assigned: list[str], table: Suppliers) -> dict[str, Instance]:
    """One instance per supplier that has items (`assigned`: each catalogue item's supplier), in the supplier table's
    order; a supplier without items is left out."""
    found = {}
    for name in table.names:
        items = np.flatnonzero(np.array(assigned, dtype=object) == name)
        if items.size:
            row = table.row(name)
            found[name] = supplier_instance(catalogue, items, name, float(table.setup_cost[row]), float(table.lead[row]))
    return found
