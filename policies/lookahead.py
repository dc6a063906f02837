"""The decomposition lookahead policy: a joint rule from the decomposition bound's per-item values
(docs/methods.md, "Decomposition lookahead").

Item i's post-decision value W_i,t(y, f) comes from its n = 1 DP at its share k_i of the bound's split
(policies/decomposition.py, policies/dp_optimal.py). At a state (x, f, t), x_i the inventory position, item i's gain
is g_i = max(0, W_i,t(x_i, f) - min_{x_i < y <= x_i + qbar_i} W_i,t(y, f)); the rule opens iff sum_i g_i > c K and
then orders every item with g_i > 0 up to its minimiser (c = 1: the one-step lookahead on the decomposed values; at
n = 1 the DP's own rule).

Tables keep, per (stage, item, factor point), the excess W - min_y W in float16 in the item's own unit (scale_i: its
largest excess / EXCESS_CAP), in two forms: `finite` (every decision stage of the evaluation horizon, or within its
share of FINITE_BUDGET the stages that a straight line between kept ones does not hold to STAGE_TOLERANCE) and
`stationary` (W_i,0 of a long horizon, for a state without a period: decide.py, serve.py). A position goes to the
nearest point of the item's DP lattice; the item's exposure (TensorInstance.exposure) is interpolated linearly between
factor grid points, clamped at the ends. A table set is one .npz per item plus tables.json in a folder (a
decomposition bound run writes it under `lookahead/`).
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from envs.dynamics import State
from envs.instance import Instance, TensorInstance
from plumbing.errors import InputError, first_line
from plumbing.files import atomic_write, atomic_write_text

NAME = "decomposition-lookahead"
FORMS = ("finite", "stationary")
STATIONARY_TAIL = 1e-4
"""The stationary form solves a horizon H with gamma^H <= this: W_0 then differs from the infinite-horizon
value by at most gamma^H times the largest per-period cost difference over H periods."""
TABLES_DIR = "lookahead"
TABLES_FILE = "tables.json"
EXCESS_CAP = 60000.0
"""The largest excess stored, in its item's unit (float16 holds up to 65504); also the value that pads a row."""
DTYPES = {"float16": np.float16, "float32": np.float32}
FINITE_BUDGET = 2e9
"""Bytes the finite form of n items may take: an item whose rows of every stage take more than FINITE_BUDGET / n keeps
only the stages that the line between kept ones cannot stand for (STAGE_TOLERANCE); the others keep every stage."""
STAGE_TOLERANCE = 256.0
"""A finite-form stage is left out when the line between the kept stages around it is within this many of its item's
units (1/EXCESS_CAP of the item's largest excess), plus 2^-11 of the entry (float16's rounding), at every entry."""
FLOAT16_ROUNDING = 2.0**-11
REBUILD = "run the decomposition bound again (platform/bound.py --kind decomposition --out DIR) and use its folder"


def stationary_horizon(gamma: float) -> int:
    """H with gamma^H <= STATIONARY_TAIL (at least 1)."""
    return max(1, math.ceil(math.log(STATIONARY_TAIL) / math.log(gamma))) if gamma < 1 else 1


def excess(action_value: np.ndarray) -> np.ndarray:
    """W - min_y W along the last axis (positions)."""
    return action_value - action_value.min(-1, keepdims=True)


def _on_line(rows: np.ndarray, first: int, last: int, tolerance: float) -> bool:
    """Whether every stage strictly between `first` and `last` of rows [S, M, N] is within `tolerance` plus float16's
    rounding of the straight line between those two stages' rows."""
    between = rows[first + 1 : last]
    weight = ((np.arange(first + 1, last) - first) / (last - first))[:, None, None]
    line = (1.0 - weight) * rows[first] + weight * rows[last]
    return bool((np.abs(line - between) <= tolerance + FLOAT16_ROUNDING * np.abs(between)).all())


def stage_tolerance(row_bytes: int, n: int) -> float | None:
    """The tolerance an item's finite form is kept at when its rows of every stage take `row_bytes` and the instance has
    n items: STAGE_TOLERANCE above its share of FINITE_BUDGET, else None (every stage kept)."""
    return STAGE_TOLERANCE if row_bytes > FINITE_BUDGET / n else None


def stage_knots(rows: np.ndarray, tolerance: float | None) -> np.ndarray:
    """The stages of rows [S, M, N] (stored units) that the finite form keeps (module docstring), increasing: with a
    `tolerance`, the last stage, then from each kept stage back the earliest stage whose line to it holds every stage
    between (`_on_line`), down to stage 0; every stage when `tolerance` is None. Empty for S = 0."""
    if tolerance is None:
        return np.arange(rows.shape[0])
    kept = [rows.shape[0] - 1] if rows.shape[0] else []
    while kept and kept[-1] > 0:
        last, first = kept[-1], kept[-1] - 1
        while first > 0 and _on_line(rows, first - 1, last, tolerance):
            first -= 1
        kept.append(first)
    return np.array(kept[::-1], dtype=np.int64)


@dataclass(frozen=True)
class ItemTable:
    """One item's tables: positions [N] (its lattice), factor_points [M], finite [K_i, M, N] the excess of W_t at the stages
    `finite_stages` [K_i] (increasing, the last T_i - 1, T_i = max(T - L_i, 0); a stage between two kept ones reads the line
    between them), stationary [M, N] the excess of W_0 of a long horizon (each None when not kept), stored times
    1 / scales[form]; the share k_i it was solved with and the window (largest order in lattice steps)."""

    positions: np.ndarray
    factor_points: np.ndarray
    finite: np.ndarray | None
    stationary: np.ndarray | None
    share: float
    window: int
    scales: dict[str, float]
    finite_stages: np.ndarray | None = None

    @classmethod
    def from_values(
        cls,
        positions: np.ndarray,
        factor_points: np.ndarray,
        finite,
        stationary,
        share: float,
        window: int,
        dtype: str,
        stage_tolerance: float | None = None,
    ):
        """From the DP's action values W (finite [T_dec, M, N], stationary [M, N'] on the same lattice from the same bottom):
        the finite form in `dtype` at its `stage_knots` for `stage_tolerance` (None: every stage), the stationary form in
        float32. Each form's scale is its largest excess over EXCESS_CAP (1 when every excess is 0), so a form's stored rows
        do not depend on whether the other form was built beside it."""
        N = positions.size
        rows = {form: excess(values) for form, values in zip(FORMS, (finite, stationary)) if values is not None}
        scales = {form: float(row.max(initial=0.0)) / EXCESS_CAP or 1.0 for form, row in rows.items()}
        scaled = {form: row / scales[form] for form, row in rows.items()}
        knots = stage_knots(scaled[FORMS[0]], stage_tolerance) if FORMS[0] in scaled else None

        def stored(form, kind):
            if form not in scaled:
                return None
            kept = (scaled[form] if knots is None or form != FORMS[0] else scaled[form][knots]).astype(DTYPES[kind])
            # the shorter form is padded with EXCESS_CAP, the top of the stored range: never the first minimiser
            extra = N - kept.shape[-1]
            return np.concatenate([kept, np.full((*kept.shape[:-1], extra), EXCESS_CAP, kept.dtype)], -1) if extra else kept

        # the stationary form is one stage, and decide.py's answers should not depend on `dtype`
        finite_rows, stationary_rows = stored(FORMS[0], dtype), stored(FORMS[1], "float32")
        return cls(positions, factor_points, finite_rows, stationary_rows, float(share), int(window), scales, knots)

    def kept_at(self, tolerance: float) -> ItemTable:
        """This table, which keeps every stage, with its finite form kept at the stages `stage_knots` chooses for
        `tolerance` from its stored rows (what a bound run would keep, to the stored rows' rounding)."""
        if self.finite_stages.size != self.finite.shape[0]:
            raise ValueError("the table's finite form leaves stages out already")
        knots = stage_knots(self.finite.astype(np.float64), tolerance)
        return replace(self, finite=self.finite[knots], finite_stages=knots)

    def save(self, path: str | os.PathLike) -> None:
        """One .npz member per array: each form (with its scale, `{form}_scale`; the finite form with its kept
        stages, `finite_stages`) can be read without the other."""
        arrays = {"positions": self.positions, "factor_points": self.factor_points, "share": np.float64(self.share), "window": self.window}
        for form in FORMS:
            if getattr(self, form) is not None:
                arrays[form] = getattr(self, form)
                arrays[f"{form}_scale"] = np.float64(self.scales[form])
        if self.finite is not None:
            arrays["finite_stages"] = self.finite_stages

        def write(tmp):
            with open(tmp, "wb") as handle:
                np.savez(handle, **arrays)

        atomic_write(path, write)

    @classmethod
    def load(cls, path: str | os.PathLike, forms: tuple[str, ...] = FORMS) -> ItemTable:
        """The tables in `path`, of `forms` only (a form not asked for, or not in the file, is None). A form's scale is its
        `{form}_scale`, else the file's one `scale`, else 1 (the instance's cost units); a finite form without `finite_stages`
        keeps every stage. A missing, truncated or foreign file raises one InputError naming it."""
        try:
            with np.load(path, allow_pickle=False) as members:
                kept = [form for form in FORMS if form in forms and form in members]
                shared = float(members["scale"]) if "scale" in members else 1.0
                finite = members[FORMS[0]] if FORMS[0] in kept else None
                knots = None
                if finite is not None:
                    knots = members["finite_stages"] if "finite_stages" in members else np.arange(finite.shape[0])
                    if knots.shape != finite.shape[:1] or (knots.size and (knots[0] != 0 or (np.diff(knots) <= 0).any())):
                        raise ValueError(f"finite_stages {knots.tolist()} are not {finite.shape[0]} increasing stages from 0")
                return cls(
                    members["positions"],
                    members["factor_points"],
                    finite,
                    members[FORMS[1]] if FORMS[1] in kept else None,
                    float(members["share"]),
                    int(members["window"]),
                    {form: float(members[f"{form}_scale"]) if f"{form}_scale" in members else shared for form in kept},
                    knots,
                )
        except FileNotFoundError:
            raise InputError(f"{NAME} tables: item file '{path}' does not exist; {REBUILD}") from None
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            raise InputError(
                f"{NAME} tables: item file '{path}' is truncated or not a tables file ({first_line(exc)}); {REBUILD}"
            ) from None


class DeviceTables(NamedTuple):
    """A LookaheadTables' arrays as tensors on one device (the same names)."""

    excess: torch.Tensor
    positions: torch.Tensor
    count: torch.Tensor
    offset: torch.Tensor
    stages: torch.Tensor
    knot_lower: torch.Tensor
    knot_upper: torch.Tensor
    knot_weight: torch.Tensor
    window: torch.Tensor
    factor_points: torch.Tensor
    scales: torch.Tensor


def item_file(item: int) -> str:
    return f"item-{item:05d}.npz"


@dataclass(frozen=True)
class LookaheadTables:
    """Every item's tables of one form. positions [n, N], padded to a common length (increasing past an item's own `count`, so a
    batched searchsorted works); excess one flat array, item i's block [K_i, M, count_i] from `offset[i]`, in units of scales[i];
    stages [n] the finite form's T - L_i (no order from then on; at least one row kept), 1 for the stationary form; at stage t
    item i reads (1 - knot_weight) row knot_lower + knot_weight row knot_upper of its block (each [n, max stages]); window [n],
    factor_points [M], shares [n]; `horizon` T (None: the stationary form). `on(device)` gives the tensors, shared per device."""

    positions: np.ndarray
    count: np.ndarray
    excess: np.ndarray  # not padded: item sizes differ by a factor of 3 on the paper family
    offset: np.ndarray
    stages: np.ndarray
    knot_lower: np.ndarray
    knot_upper: np.ndarray
    knot_weight: np.ndarray
    window: np.ndarray
    factor_points: np.ndarray
    shares: np.ndarray
    scales: np.ndarray
    horizon: int | None
    instance_hash: str
    _on_device: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _buckets: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def on(self, device: torch.device | str) -> DeviceTables:
        """The arrays as tensors on `device`, made at the first call for that device and kept."""
        device = torch.device(device)
        if device not in self._on_device:
            self._on_device[device] = DeviceTables(*(torch.as_tensor(getattr(self, name), device=device) for name in DeviceTables._fields))
        return self._on_device[device]

    def buckets(self, device: torch.device | str) -> list[tuple[torch.Tensor, int]]:
        """The items grouped by their window's size class (windows in (2^(k-1), 2^k]), as (item indices on `device`,
        the group's largest window): a decision gathers each group's windows at its own width, so a few items with
        wide windows (a large cap on a fine lattice) do not widen every item's, and the work is at most twice the sum
        of the windows. Made at the first call for a device and kept."""
        key = torch.device(device)
        if key not in self._buckets:
            size_class = np.ceil(np.log2(np.maximum(self.window, 1))).astype(np.int64)
            self._buckets[key] = [
                (torch.as_tensor(np.flatnonzero(size_class == k), device=device), int(self.window[size_class == k].max()))
                for k in np.unique(size_class)
            ]
        return self._buckets[key]

    def __getstate__(self) -> dict:
        """Pickled (sent to another process) without the device copies: each process makes its own."""
        return {**self.__dict__, "_on_device": {}, "_buckets": {}}

    @property
    def form(self) -> str:
        return FORMS[1] if self.horizon is None else FORMS[0]

    @property
    def nbytes(self) -> int:
        return int(self.excess.nbytes + self.positions.nbytes)

    @cached_property
    def interpolated(self) -> bool:
        """Whether some stage is read between two kept stages (found at the first decision and kept)."""
        return bool((self.knot_weight > 0).any())

    @classmethod
    def from_items(cls, items: list[ItemTable], form: str, horizon: int | None, instance_hash: str) -> LookaheadTables:
        if form not in FORMS:
            raise InputError(f"{NAME} form: expected one of {list(FORMS)}, got {form!r}")
        rows = [getattr(t, form) for t in items]
        if any(r is None for r in rows):
            raise InputError(f"{NAME}: the tables hold no {form} form")
        M = items[0].factor_points.size
        rows = [r[None] if form == FORMS[1] else r for r in rows]  # [K_i, M, N_i]
        knots = [t.finite_stages if form == FORMS[0] else np.zeros(1, np.int64) for t in items]
        stages = np.array([int(k[-1]) + 1 if k.size else 0 for k in knots])
        lower, upper, weight = _knot_reading(knots, max(int(stages.max(initial=0)), 1))
        rows = [r if r.shape[0] else np.zeros((1, M, t.positions.size), r.dtype) for r, t in zip(rows, items)]
        count = np.array([t.positions.size for t in items])
        N = int(count.max())
        positions = np.empty((len(items), N))
        for i, t in enumerate(items):
            positions[i, : count[i]] = t.positions
            positions[i, count[i] :] = t.positions[-1] + 1.0 + np.arange(N - count[i])
        sizes = np.array([r.size for r in rows])
        return cls(
            positions,
            count,
            np.concatenate([r.ravel() for r in rows]),
            np.concatenate([[0], np.cumsum(sizes)[:-1]]),
            stages if form == FORMS[0] else np.ones(len(items), np.int64),
            lower,
            upper,
            weight,
            np.array([t.window for t in items]),
            items[0].factor_points,
            np.array([t.share for t in items]),
            np.array([t.scales[form] for t in items]),
            horizon if form == FORMS[0] else None,
            instance_hash,
        )


def _knot_reading(knots: list[np.ndarray], width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per item and stage t < width, the kept rows around t and the weight of the upper one (lower, upper [n, width],
    weight [n, width]): t itself when kept (weight 0), else the kept stages a < t < c with weight (t - a) / (c - a).
    Stages past an item's last kept one read it."""
    lower = np.zeros((len(knots), width), np.int64)
    upper = np.zeros((len(knots), width), np.int64)
    weight = np.zeros((len(knots), width))
    for i, kept in enumerate(knots):
        if not kept.size:
            continue
        stage = np.minimum(np.arange(width), kept[-1])
        below = np.searchsorted(kept, stage, side="right") - 1
        above = np.minimum(below + 1, kept.size - 1)
        span = kept[above] - kept[below]
        lower[i], upper[i] = below, above
        weight[i] = np.where(span > 0, (stage - kept[below]) / np.maximum(span, 1), 0.0)
    return lower, upper, weight


# ---- the table folder --------------------------------------------------------------------------------


def write_manifest(folder: str | os.PathLike, instance: Instance, horizon: int, settings: dict) -> None:
    """tables.json: what the item files in `folder` were built for (written last: a folder without it is not whole): the
    instance's content hash (which tells its factors, loadings and overdispersion apart) and its demand model in words."""
    record = {
        "policy": NAME,
        "instance_hash": instance.content_hash(),
        "n": instance.n,
        "demand_model": instance.demand_model(),
        "horizon": int(horizon),
        **settings,
    }
    atomic_write_text(Path(folder) / TABLES_FILE, json.dumps(record, indent=1) + "\n")


def load_tables(folder: str | os.PathLike, instance: Instance, form: str, horizon: int | None = None) -> LookaheadTables:
    """The `form` tables in `folder` (a decomposition bound's results folder or its lookahead/ subfolder) for
    `instance`, reading that form's rows only; the finite form needs the evaluation `horizon` the tables were built for. Refuses tables of
    another instance or horizon, and a folder without tables."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(
            f"{NAME} tables: folder '{folder}' {'is a file' if folder.exists() else 'does not exist'}; expected the folder of a "
            "decomposition bound run (platform/bound.py --kind decomposition --out DIR)"
        )
    if (folder / TABLES_DIR / TABLES_FILE).exists():
        folder = folder / TABLES_DIR
    manifest = folder / TABLES_FILE
    if not manifest.exists():
        raise InputError(
            f"{NAME} tables: '{folder}' holds no {TABLES_FILE}; expected the folder of a decomposition bound run "
            "(platform/bound.py --kind decomposition --out DIR) that finished"
        )
    try:
        record = json.loads(manifest.read_text())
    except ValueError:
        record = None
    if not (isinstance(record, dict) and isinstance(record.get("horizon"), int)):
        raise InputError(
            f"{NAME} tables: '{manifest}' is not a tables file of a decomposition bound run (expected JSON with an integer 'horizon')"
        )
    if record.get("instance_hash") != instance.content_hash():
        model = record.get("demand_model")
        models = f"; built for {model}, this one has {instance.demand_model()}" if model and model != instance.demand_model() else ""
        raise InputError(
            f"{NAME} tables: '{folder}' was built for another instance (content hash {record.get('instance_hash')}, "
            f"this one's is {instance.content_hash()}{models}); run the decomposition bound on this instance"
        )
    if form == FORMS[0] and horizon != record["horizon"]:
        raise InputError(
            f"{NAME} tables: '{folder}' holds finite-horizon tables for horizon {record['horizon']}, asked for {horizon}; "
            f"evaluate with --horizon {record['horizon']} (backtest.py: --window {record['horizon']}), use the stationary "
            f"form, or run the bound with --horizon {horizon}"
        )
    items = [ItemTable.load(folder / item_file(i), forms=(form,)) for i in range(instance.n)]
    return LookaheadTables.from_items(items, form, record["horizon"], record["instance_hash"])


# ---- the policy --------------------------------------------------------------------------------------


class LookaheadPolicy:
    """The rule of the module docstring as a policy (state, instance) -> (Y [B], Q [B, n]), opening iff sum_i g_i > c K,
    c = `threshold` (InputError if not >= 0). Q holds every item's proposal y_i* - x_i where g_i > 0 (clipped to [0, qbar_i]),
    also where the rule does not open (what an imitating student learns from); the order placed is Y Q. Each call answers at
    `period` (the stationary form ignores it) and advances it; `reset()`, which the evaluator calls before every rollout, sets it to 0."""

    def __init__(self, tables: LookaheadTables, threshold: float = 1.0):
        if not threshold >= 0:
            raise InputError(f"{NAME} threshold c: expected a number >= 0, got {threshold!r}")
        self.tables = tables
        self.threshold = float(threshold)
        self.period = 0

    def reset(self) -> None:
        """Start a rollout: the next call is period 0."""
        self.period = 0

    @torch.no_grad()
    def gains(self, state: State, instance: TensorInstance, period: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(g [B, n], proposed quantity [B, n]) at `period` (the stationary form ignores it), item group by item group
        (`LookaheadTables.buckets`)."""
        n = self.tables.positions.shape[0]
        if instance.n != n:
            raise InputError(f"{NAME}: the tables are for n = {n} items, the instance has n = {instance.n}")
        device = state.inv.device
        tables = self.tables.on(device)
        N = tables.positions.shape[1]
        position = state.inventory_position().double().T.contiguous()  # [n, B] x_i
        above = torch.searchsorted(tables.positions, position).clamp(1, N - 1)
        lower_nearer = (position - tables.positions.gather(1, above - 1)) <= (tables.positions.gather(1, above) - position)
        nearest = torch.minimum(torch.where(lower_nearer, above - 1, above), (tables.count - 1)[:, None])  # [n, B] nearest lattice point
        # each item's exposure u_i,t: [n, B], or [1, B] (F_t for every item) under the paper's model
        factor = instance.exposure(state.factor).double().T.clamp(tables.factor_points[0], tables.factor_points[-1])
        qbar = instance.qbar.double()
        period = period if self.tables.horizon is not None else 0  # the stationary form: one stage, every period
        interpolated = self.tables.interpolated
        gain, quantity = torch.zeros_like(position), torch.zeros_like(position)
        for items, width in self.tables.buckets(device):
            shared = factor if factor.shape[0] == 1 else factor[items]
            group = self._group_gains(tables, items, width, position[items], nearest[items], shared, qbar[items], period, interpolated)
            gain[items], quantity[items] = group
        return gain.T, quantity.T

    @staticmethod
    def _group_gains(tables: DeviceTables, items, width: int, position, nearest, factor, qbar, period: int, interpolated: bool):
        """(g [b, B], quantity [b, B]) of the items `items` ([b]) whose windows are at most `width` lattice steps."""
        count, window, points = tables.count[items], tables.window[items], tables.factor_points
        M = points.numel()
        steps = torch.arange(width + 1, device=position.device)
        columns = torch.minimum(nearest[..., None] + steps, (count - 1)[:, None, None])  # [b, B, w+1]: column 0 is no order
        targets = tables.positions[items[:, None, None], columns]  # y
        qbar = qbar[:, None]  # [b, 1]
        valid = (steps > 0) & (steps <= window[:, None, None]) & (nearest[..., None] + steps < count[:, None, None])
        # the lattice's cap is ceil(qbar): keep the true cap, measured from the table's first position for a position below
        # it (a backlog deeper than the DP's domain orders its whole cap towards the table's best target, not nothing)
        anchor = torch.maximum(position, tables.positions[items, :1])
        valid &= targets - anchor[..., None] <= qbar[..., None] * (1 + 1e-9)
        # a coarse lattice (steps over one unit) whose window stops short of the cap: the cap's end x + qbar is a target too,
        # its value interpolated between its two lattice neighbours (policies/dp_optimal.py's `Lattice.rest`)
        spacing = (tables.positions[items, 1] - tables.positions[items, 0])[:, None]  # [b, 1]
        beyond = (spacing > 1 + 1e-9) & (qbar > window[:, None] * spacing * (1 + 1e-9))  # [b, 1]
        end = None
        if bool(beyond.any()):
            rows = tables.positions[items]  # [b, N]
            end = torch.minimum(anchor + qbar, rows.gather(1, (count - 1)[:, None]))  # [b, B]
            above = torch.minimum(torch.searchsorted(rows, end.contiguous()).clamp_min(1), (count - 1)[:, None])
            lower_target = rows.gather(1, above - 1)
            share = (end - lower_target) / (rows.gather(1, above) - lower_target)
            columns = torch.cat([columns, (above - 1)[..., None], above[..., None]], dim=-1)
        stages = tables.stages[items]
        stage = torch.clamp(torch.minimum(stages - 1, torch.full_like(stages, period)), min=0)
        if M > 1:
            upper_point = torch.searchsorted(points, factor.contiguous()).clamp(1, M - 1)  # [b or 1, B]
            point_weight = ((factor - points[upper_point - 1]) / (points[upper_point] - points[upper_point - 1]))[..., None]

        def read(knot):
            """The excess at `columns` of each item's kept row `knot` [b], interpolated in the factor: [b, B, w+1]."""
            base = (tables.offset[items] + knot * M * count)[:, None, None]  # [b, 1, 1] start of each item's kept row
            if M == 1:
                return tables.excess[base + columns].double()
            upper_row = base + count[:, None, None] * upper_point[..., None]
            lower = tables.excess[upper_row - count[:, None, None] + columns].double()
            return (1 - point_weight) * lower + point_weight * tables.excess[upper_row + columns].double()

        values = read(tables.knot_lower[items, stage])
        if interpolated:  # a stage between two kept ones: the line between them
            stage_weight = tables.knot_weight[items, stage][:, None, None]
            values = (1 - stage_weight) * values + stage_weight * read(tables.knot_upper[items, stage])
        values = values * tables.scales[items][:, None, None]  # [b, B, w+1 (+2)] in cost units
        best, best_column = values[..., : width + 1].masked_fill(~valid, math.inf).min(-1)  # [b, B]
        target = targets.gather(2, best_column[..., None])[..., 0]
        if end is not None:  # the cap's own end, between two lattice points of a coarse lattice
            at_end = torch.where(beyond, (1 - share) * values[..., -2] + share * values[..., -1], math.inf)
            target = torch.where(at_end < best, end, target)
            best = torch.minimum(best, at_end)
        gain = (values[..., 0] - best).clamp_min(0.0)
        gain = torch.where(torch.isfinite(best) & (period < stages)[:, None], gain, torch.zeros_like(gain))
        quantity = torch.where(gain > 0, torch.minimum(target - position, qbar).clamp_min(0.0), torch.zeros_like(position))
        return gain, quantity

    def __call__(self, state: State, instance: TensorInstance):
        period = self.period
        if self.tables.horizon is not None and period >= self.tables.horizon:
            raise InputError(
                f"{NAME}: the finite-horizon tables are for {self.tables.horizon} periods, called at period {period}; "
                "use the stationary form"
            )
        self.period += 1
        gain, quantity = self.gains(state, instance, period)
        opens = gain.sum(1) > self.threshold * instance.K
        dtype = state.inv.dtype
        return opens.to(dtype), quantity.to(dtype)
