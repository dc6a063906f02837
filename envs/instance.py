"""Problem instances Theta = (K, gamma, rho, {h_i, b_i, lam_i, beta_i, L_i, qbar_i}), eq. (instance_parameters).

`Instance` is the validated, device-free description (float64 NumPy arrays) that is saved and
loaded; `TensorInstance` is the same data as tensors on a device, with the derived constants that
the dynamics (eqs. inventory_transition, in_transit_transition), the features (eq. feature_scales)
and the cost normaliser (eq. cost_normalization) need.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from plumbing import validate
from plumbing.errors import InputError
from plumbing.files import atomic_write_text, read_text
from plumbing.tables import number_column, read_table

LMAX = 4
"""Maximum admissible lead time L_max; the item token has L_max - 1 = 3 in-transit slots."""

ITEM_COLUMNS = ("h", "b", "lam", "beta", "lead", "qbar")
LOADING_COLUMN = re.compile(r"loading[1-9][0-9]*")
"""An item table's loading columns (several factors): loading1..loadingk."""
MODEL_KEYS = ("beta", "loadings", "overdispersion")
"""The per-item demand-model keys of an instance file: 'beta' or 'loadings', and optionally 'overdispersion'."""
FACTORS_MAX = 16
"""Most common factors k an instance may have (docs/model.md, "Several factors and overdispersion")."""
OVERDISPERSION_MAX = 100.0
LOADING_NORM_MAX = 2.0

# Paper family grid (appendix table "baselines details"): h, b, lam are drawn as distinct triples
# from a 0.1 grid over these ranges (our reading of "no two items share (h, b, lam)").
PAPER_H = (0.6, 2.0)
PAPER_B = (6.0, 11.4)
PAPER_LAM = (2.0, 7.0)
PAPER_BETA = (0.2, 0.6)
PAPER_POOL = 1024


class InstanceError(InputError):
    """An instance field is missing, unknown or outside its allowed range."""


VALUE_WHY = "larger values overflow the simulation's float32 costs within 10,000 steps; docs/formats.md"
FIELD_RANGES = {
    # name: (low, low_open, high, why): the upper bounds keep every simulated quantity finite (docs/formats.md)
    "h": (0.0, True, 1e6, VALUE_WHY),
    "b": (0.0, True, 1e6, VALUE_WHY),
    "lam": (0.0, True, 1e6, VALUE_WHY),
    "beta": (
        0.0,
        False,
        LOADING_NORM_MAX,
        "the demand rate's factor exp(beta F - beta^2 / 2) reaches e^18 at beta = 2 and F = 10; docs/formats.md",
    ),
    "overdispersion": (
        0.0,
        False,
        OVERDISPERSION_MAX,
        "Var(D | rate) = rate + phi rate^2: phi = 100 means no demand in 95% of periods at rate 1",
    ),
    "qbar": (0.0, True, 1e8, VALUE_WHY),
    "K": (0.0, False, 1e12, VALUE_WHY),
}
"""The range of every real instance field but gamma and rho (checked with their own rules, `check_constant`)."""


def check_constant(name: str, value, where: str | None = None) -> float:
    """The instance constant `name` (K, gamma or rho) as a float in its range: K as FIELD_RANGES, gamma in (0, 1), rho
    in [0, 1). `where` names the value as the user gave it (a flag: '--K'); by default it is the instance field."""
    where = where or f"instance field '{name}'"
    if name == "K":
        low, low_open, high, why = FIELD_RANGES["K"]
        return validate.real(value, where, low, high, low_open=low_open, why=why, error=InstanceError)
    low_open = {"gamma": True, "rho": False}[name]
    return validate.real(value, where, 0, 1, low_open=low_open, high_open=True, error=InstanceError)


def check_factors_for_items(factors: int, n: int, where: str, items: str) -> int:
    """The number of common factors k for n items, refused above n (`where` names it, `items` says what n is): the
    loadings B [n, k] have rank at most n, and B F_t depends on F_t only through its projection on B's row space, itself
    at most n independent AR(1) factors; so k > n factors are a model of n factors, which no history tells apart."""
    if factors > n:
        raise validate.refuse(where, f"at most {n}, {items}", str(factors), "n items' loadings span at most n factors", InstanceError)
    return factors


def _refuse(field_name: str, allowed: str, got, why: str = ""):
    return validate.refuse(f"instance field '{field_name}'", allowed, got, why, InstanceError)


def check_item_column(name: str, values: np.ndarray, where: str, item_name) -> None:
    """Refuse the first value of the per-item column `name` (ITEM_COLUMNS) outside its range: `where` names the
    field as the user wrote it, `item_name(i)` the item."""
    if name == "lead":
        ok, allowed, why, high = (values == np.round(values)) & (values >= 1) & (values <= LMAX), f"integers in 1..{LMAX}", "", LMAX
    else:
        low, low_open, high, why = FIELD_RANGES[name]
        ok = ((values > low) if low_open else (values >= low)) & (values <= high)
        allowed = validate.real_range(low, high, low_open).replace("a number", "numbers", 1)
    if not ok.all():
        i = int(np.argmin(ok))
        raise validate.refuse(where, allowed, f"{values[i]:g} ({item_name(i)})", why if values[i] > high else "", InstanceError)


def _item_array(items: dict, name: str, n: int | None) -> np.ndarray:
    values = np.asarray(items[name], dtype=object)
    for i, value in enumerate(values.ravel()):
        if not validate.is_number(value):
            raise _refuse(name, "a list of numbers", validate.describe(value) + (f" for item {i}" if values.ndim == 1 else ""))
    try:
        arr = np.asarray(items[name], dtype=np.float64)
    except OverflowError:
        raise _refuse(name, "finite numbers", "an integer too large for a float") from None
    if arr.ndim != 1:
        raise _refuse(name, "a one-dimensional list", f"shape {arr.shape}")
    if arr.size < 1:
        raise _refuse(name, "at least one item (n >= 1)", "an empty list")
    if not np.all(np.isfinite(arr)):
        raise _refuse(name, "finite numbers", "NaN or infinity")
    if n is not None and arr.size != n:
        raise _refuse(name, f"{n} values (one per item, like 'h')", f"{arr.size}")
    return arr


@dataclass(frozen=True, eq=False)
class Instance:
    """One JRP instance. Per-item arrays have length n; validation happens on construction."""

    h: np.ndarray
    b: np.ndarray
    lam: np.ndarray
    beta: np.ndarray
    lead: np.ndarray
    qbar: np.ndarray
    K: float
    gamma: float
    rho: float
    source: dict | None = None
    """Where a fitted instance came from (platform/fit.py: the history file's SHA-256, the periods used, the item
    names); not a parameter, so not in `to_dict` or `content_hash`, but kept by `save` and `load`."""
    loadings: np.ndarray | None = None
    """[n, k] signed loadings beta_i of k common factors (docs/model.md, "Several factors and overdispersion"); None is
    the paper's model, one factor with the non-negative loadings `beta`. Given, `beta` must be None and becomes the
    norms |beta_i|; one non-negative column is stored as the paper's model (loadings None), so it is the same problem."""
    overdispersion: np.ndarray | None = None
    """[n] phi_i >= 0: D_i | rate ~ negative binomial with mean rate and variance rate + phi_i rate^2 (Poisson at
    phi_i = 0); None (or all zero) is the paper's Poisson demand, eq. (conditional_demand)."""

    def __post_init__(self) -> None:
        if self.loadings is not None:
            self._set_loadings()
        items = {name: getattr(self, name) for name in ITEM_COLUMNS}
        n = None
        for name in ITEM_COLUMNS:
            arr = _item_array(items, name, n)
            n = arr.size
            object.__setattr__(self, name, arr)
        for name in ITEM_COLUMNS:
            check_item_column(name, getattr(self, name), f"instance field '{name}'", self.item_name)
        if self.overdispersion is not None:
            phi = _item_array({"overdispersion": self.overdispersion}, "overdispersion", n)
            check_item_column("overdispersion", phi, "instance field 'overdispersion'", self.item_name)
            object.__setattr__(self, "overdispersion", phi if phi.any() else None)
        for name in ("K", "gamma", "rho"):
            object.__setattr__(self, name, check_constant(name, getattr(self, name)))
        if self.source is not None and not isinstance(self.source, dict):
            raise _refuse("source", "an object (where a fitted instance came from)", validate.describe(self.source))

    def _set_loadings(self) -> None:
        """Validate `loadings` ([n, k]); set `beta` to the rows' norms, or store one non-negative column as `beta`."""
        if self.beta is not None:
            raise _refuse("beta", "absent when 'loadings' is given (beta_i is then the norm of item i's loadings)", "both")
        rows = self.loadings
        items = len(self.h) if isinstance(self.h, (list, tuple, np.ndarray)) else None
        if not isinstance(rows, np.ndarray):
            if not isinstance(rows, (list, tuple)) or not all(isinstance(row, (list, tuple)) for row in rows):
                raise _refuse("loadings", "a list of n lists of k numbers (item i's loadings on the k factors)", validate.describe(rows))
            widths = {len(row) for row in rows}
            if len(widths) > 1:
                raise _refuse("loadings", "the same number k of loadings for every item", f"lengths {sorted(widths)}")
            for i, row in enumerate(rows):
                for value in row:
                    if not validate.is_number(value):
                        raise _refuse("loadings", "numbers", f"{validate.describe(value)} ({self.item_name_unchecked(i, len(rows))})")
        arr = np.asarray(rows, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[0] < 1:
            raise _refuse("loadings", "an [n, k] table of numbers (n >= 1 items)", f"shape {arr.shape}")
        if items is not None and arr.shape[0] != items:
            raise _refuse("loadings", f"{items} rows (one per item, like 'h')", f"{arr.shape[0]}")
        if not 1 <= arr.shape[1] <= FACTORS_MAX:
            raise _refuse("loadings", f"k = 1..{FACTORS_MAX} loadings per item", f"k = {arr.shape[1]}")
        if not np.isfinite(arr).all():
            raise _refuse("loadings", "finite numbers", "NaN or infinity")
        norms = loading_norms(arr)
        check_item_column(
            "beta", norms, "instance field 'loadings' (the norm of an item's loadings)", lambda i: self.item_name_unchecked(i, arr.shape[0])
        )
        if arr.shape[1] == 1 and (arr >= 0).all():
            object.__setattr__(self, "beta", arr[:, 0].copy())
            object.__setattr__(self, "loadings", None)
        else:
            object.__setattr__(self, "beta", norms)
            object.__setattr__(self, "loadings", arr)

    def item_name_unchecked(self, item: int, n: int) -> str:
        """`item_name` for an instance of `n` items whose fields are not yet checked (while it is being validated)."""
        names = self._source_names(n)
        return f"item '{names[item]}'" if names else f"item {item}"

    def _source_names(self, n: int) -> list | None:
        """The item names of `source` (a fitted instance's) when it holds one per item of `n`, else None."""
        names = self.source.get("item_names") if isinstance(self.source, dict) else None
        return names if isinstance(names, list) and len(names) == n else None

    @property
    def item_names(self) -> list[str] | None:
        """The items' names, in the order of the per-item lists, where the instance has them (a fitted one:
        source.item_names), else None."""
        names = self._source_names(self.n)
        return [str(name) for name in names] if names else None

    @property
    def n(self) -> int:
        return int(self.h.size)

    @property
    def factors(self) -> int:
        """k, the number of common factors: F_t has k coordinates (the state's factor is [B] at k = 1, else [B, k])."""
        return 1 if self.loadings is None else int(self.loadings.shape[1])

    @property
    def paper_model(self) -> bool:
        """Whether demand follows the paper's model exactly: one factor, non-negative loadings, Poisson demand."""
        return self.loadings is None and self.overdispersion is None

    @property
    def directions(self) -> np.ndarray | None:
        """[n, k] beta_i / |beta_i| (a zero row where beta_i = 0), or None for one non-negative factor, where every
        item's exposure u_i,t is F_t itself (`exposure`)."""
        return None if self.loadings is None else unit_directions(self.loadings)

    def demand_model(self) -> str:
        """The demand model in words, for messages: "one factor, Poisson" or e.g. "3 factors, signed loadings, negative binomial"."""
        if self.paper_model:
            return "the paper's model (one factor, non-negative loadings, Poisson demand)"
        parts = [f"{self.factors} factor{'s' if self.factors > 1 else ''}"]
        if self.loadings is not None and (self.loadings < 0).any():
            parts.append("signed loadings")
        parts.append("negative-binomial demand" if self.overdispersion is not None else "Poisson demand")
        return ", ".join(parts)

    def item_name(self, item: int) -> str:
        """How a message names item `item`: "item 'NAME'" where the instance has item names (a fitted one), else "item K"."""
        return self.item_name_unchecked(item, self.n)

    def caps_below_demand(self) -> np.ndarray:
        """The items whose order cap qbar_i is below their mean demand lam_i per period (E D_i = lam_i, eq.
        conditional_demand): no policy keeps up with their demand, so their backlog grows without bound."""
        return np.flatnonzero(self.qbar < self.lam)

    @property
    def mu(self) -> np.ndarray:
        """mu_i = lam_i (L_i + 1), eq. (feature_scales): the feature scale, and the initial inventory I_0 of
        every episode (envs.dynamics.initial_state)."""
        return self.lam * (self.lead + 1.0)

    # ---- files ---------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """The parameters (the problem itself), without `source`. The paper's model has exactly today's keys (and so
        today's content hash); several factors store 'loadings' in place of 'beta', overdispersion 'overdispersion'."""
        items = {name: getattr(self, name).tolist() for name in ITEM_COLUMNS}
        items["lead"] = [int(v) for v in self.lead]
        if self.loadings is not None:
            del items["beta"]
            items["loadings"] = self.loadings.tolist()
        if self.overdispersion is not None:
            items["overdispersion"] = self.overdispersion.tolist()
        return {"K": self.K, "gamma": self.gamma, "rho": self.rho, "items": items}

    def content_hash(self) -> str:
        """SHA-256 of the canonical JSON of every parameter: two instances have the same hash exactly
        when they are the same problem. Results and journals record it, so that runs on different
        instances are never mixed or compared."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @classmethod
    def from_dict(cls, data: dict) -> Instance:
        """Build from the JSON layout; unknown or missing keys are an error ('source' is optional)."""
        if not isinstance(data, dict):
            raise InstanceError(f"instance: expected a JSON object, got {type(data).__name__}")
        validate.keys(data, "instance", {"K", "gamma", "rho", "items", "source"}, {"K", "gamma", "rho", "items"}, error=InstanceError)
        items = data["items"]
        if not isinstance(items, dict):
            raise InstanceError("instance field 'items': expected an object of per-item lists")
        required = set(ITEM_COLUMNS) - ({"beta"} if "loadings" in items else set())
        validate.keys(items, "instance field 'items'", set(ITEM_COLUMNS) | set(MODEL_KEYS), required, error=InstanceError)
        if "beta" in items and "loadings" in items:
            raise InstanceError("instance field 'items': expected one of 'beta' (one factor) and 'loadings' (k factors), got both")
        for name in MODEL_KEYS:
            if name in items and items[name] is None:
                raise _refuse(name, "a list with one entry per item", "null")
        return cls(
            **{name: items.get(name) for name in (*ITEM_COLUMNS, *MODEL_KEYS[1:])},
            K=data["K"],
            gamma=data["gamma"],
            rho=data["rho"],
            source=data.get("source"),
        )

    def save(self, path: str | os.PathLike) -> None:
        """Write the JSON file atomically (with `source` when there is one)."""
        data = self.to_dict() | ({"source": self.source} if self.source is not None else {})
        atomic_write_text(Path(path), json.dumps(data, indent=1) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> Instance:
        path = Path(path)
        data = validate.load_json(read_text(path, "instance file"), "instance file", path, InstanceError)
        try:
            return cls.from_dict(data)
        except InstanceError as exc:
            raise InstanceError(f"instance file '{path}': {exc}") from None

    @classmethod
    def from_table(cls, path: str | os.PathLike, K: float, gamma: float, rho: float) -> Instance:
        """Import an item table (a UTF-8 CSV or a Parquet file) with exactly the columns h, b, lam, beta, lead, qbar
        and one row per item."""
        header = f"a header line {','.join(ITEM_COLUMNS)} and one row per item"
        path, table = read_table(path, "item table", header, error=InstanceError)
        columns = set(table.column_names)
        k = sum(1 for c in columns if LOADING_COLUMN.fullmatch(c))
        loading_columns = [f"loading{j}" for j in range(1, k + 1)]
        model = ({"beta"} if not k else set(loading_columns)) | ({"overdispersion"} & columns)
        expected = (set(ITEM_COLUMNS) - {"beta"}) | model
        demand_model_at_fault = bool((model - columns) | (columns - expected - {"overdispersion"}))  # else: say nothing of loadings
        hint = " (several factors: loading1..loadingk in place of beta; optionally overdispersion)" if demand_model_at_fault else ""
        validate.keys(columns, f"item table '{path}' columns{hint}", expected | {"overdispersion"}, expected, error=InstanceError)
        if table.num_rows == 0:
            raise InstanceError(f"item table '{path}' has no rows; expected {header} (n >= 1)")
        values = {name: number_column(table, name, path, InstanceError) for name in expected - set(loading_columns)}
        if k:
            values["loadings"] = np.column_stack([number_column(table, c, path, InstanceError) for c in loading_columns])
        return cls(**{"beta": None} | values, K=K, gamma=gamma, rho=rho)

    def item_table(self):
        """The per-item columns as a pyarrow Table (for Parquet or CSV export): `from_table`'s layout."""
        import pyarrow as pa

        arrays = {name: getattr(self, name) for name in ITEM_COLUMNS}
        arrays["lead"] = self.lead.astype(np.int64)
        if self.loadings is not None:
            del arrays["beta"]
            arrays |= {f"loading{j + 1}": self.loadings[:, j] for j in range(self.factors)}
        if self.overdispersion is not None:
            arrays["overdispersion"] = self.overdispersion
        return pa.table(arrays)

    def to_torch(self, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> TensorInstance:
        return TensorInstance.from_instance(self, device, dtype)


def item_rows(instance: Instance, items: list[str], table: str, instance_name: str, by_count: str, what: str) -> np.ndarray:
    """For each of the instance's items, its index in `items` (the item column of `table`, a history or a rule table):
    matched by name where the instance names its items (source.item_names), else by count (`by_count` says in which
    order). An item of the table the instance lacks, or one of the instance without its `what` in the table, is one
    InputError naming it (`instance_name`: how the message names the instance, e.g. " 'inst.json'")."""
    names = instance.item_names
    if names is None:
        if len(items) != instance.n:
            raise InputError(
                f"{table} has {len(items)} items, the instance{instance_name} has n = {instance.n} (it names no items, so {by_count})"
            )
        return np.arange(instance.n)
    known = set(names)
    for item in items:
        if item not in known:
            shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
            raise InputError(f"{table} item '{item}': not an item of the instance{instance_name} (its items: {shown})")
    row = {item: k for k, item in enumerate(items)}
    for item in names:
        if item not in row:
            raise InputError(f"{table}: no {what} for item '{item}' of the instance{instance_name}; every item needs its {what}")
    return np.array([row[item] for item in names])


def factor_shape(factors: int) -> tuple[int, ...]:
    """The shape of one F_t: () with one factor (a number, as in the paper), (k,) with k >= 2 factors."""
    return () if factors == 1 else (factors,)


def as_loadings(beta: np.ndarray) -> np.ndarray:
    """Loadings as [n, k]: one factor's [n] as a column."""
    return beta[:, None] if beta.ndim == 1 else beta


def loading_norms(loadings: np.ndarray) -> np.ndarray:
    """|beta_i| [n] of the loadings [n, k]: the loading's size that item i's demand rate uses at its exposure (`exposure`)."""
    return np.sqrt((loadings**2).sum(axis=1))


def unit_directions(loadings: np.ndarray) -> np.ndarray:
    """[n, k] beta_i / |beta_i| of the loadings [n, k], a zero row where beta_i = 0 (`exposure`'s directions)."""
    norms = loading_norms(loadings)[:, None]
    return np.divide(loadings, norms, out=np.zeros_like(loadings), where=norms > 0)


def exposure(directions, factor):
    """u_i,t = beta_i . F_t / |beta_i|, item i's exposure to the factors, a stationary AR(1) with the factor's rho and unit variance: eq.
    (conditional_demand_rate) with beta_i -> |beta_i| and F_t -> u_i,t (docs/model.md, "Several factors and overdispersion").
    `directions` [n, k] (Instance.directions, NumPy or torch like `factor`), or None for one non-negative factor; `factor` [...] at k = 1,
    else [..., k]. Returns [..., n], or [..., 1] (F_t itself) when `directions` is None."""
    if directions is None:
        return factor[..., None]
    if directions.shape[1] == 1:
        return factor[..., None] * directions[:, 0]
    return factor @ directions.T


def exact_keys(keys, expected: set, where: str) -> None:
    """Refuse, naming `where`, a mapping (instance, item table, decide.py's state) whose keys are not exactly `expected`."""
    validate.keys(keys, where, expected, expected, error=InstanceError)


def _paper_grids() -> list[np.ndarray]:
    """The 0.1 grids of h, b and lam of the paper family."""
    return [np.round(np.arange(lo, hi + 0.05, 0.1), 1) for lo, hi in (PAPER_H, PAPER_B, PAPER_LAM)]


PAPER_MAX_N = int(np.prod([g.size for g in _paper_grids()]))
"""The largest paper-family instance: 42,075 distinct (h, b, lam) grid triples."""
PAPER_MAX_N_WHY = f"the paper family has {PAPER_MAX_N:,} distinct (h, b, lam) grid triples"


def paper_instance(n: int, seed: int) -> Instance:
    """The paper's instance family (appendix table "baselines details"; docs/model.md, "Choices where the paper is silent"): the first n
    items of a pool of max(n, 1024) drawn from `seed`, so for n <= 1024 smaller instances are prefixes of larger ones. Raises
    InstanceError for n outside [1, PAPER_MAX_N] or a bad seed."""
    n = validate.integer(n, "paper instance field 'n'", 1, PAPER_MAX_N, why=PAPER_MAX_N_WHY, error=InstanceError)
    seed = validate.seed(seed, "paper instance field 'seed'", error=InstanceError)
    grids = _paper_grids()
    sizes = [g.size for g in grids]
    rng = np.random.default_rng([0x4A5250, seed])
    pool = max(n, PAPER_POOL)
    flat = rng.choice(PAPER_MAX_N, size=pool, replace=False)
    ih, ib, il = np.unravel_index(flat, sizes)
    beta = rng.uniform(*PAPER_BETA, size=pool)
    lead = rng.integers(1, LMAX + 1, size=pool)
    lam = grids[2][il]
    return Instance(
        h=grids[0][ih][:n],
        b=grids[1][ib][:n],
        lam=lam[:n],
        beta=beta[:n],
        lead=lead[:n].astype(np.float64),
        qbar=4.0 * lam[:n],
        K=10.0 * n,
        gamma=0.95,
        rho=0.8,
    )


def with_factors(instance: Instance, factors: int, overdispersion: float, seed: int) -> Instance:
    """`instance` with k = `factors` common factors and the overdispersion phi_i = `overdispersion` for every item
    (docs/model.md, "Several factors and overdispersion"): item i keeps its loading's size |beta_i| = beta_i and gets a
    direction drawn uniformly on the unit sphere of R^k from `seed` (k >= 2), so loadings of both signs. factors = 1
    keeps the one non-negative factor. Every other field, and each item's marginal demand law, stays the same."""
    factors = validate.integer(factors, "factors", 1, FACTORS_MAX, error=InstanceError)
    phi = validate.real(overdispersion, "overdispersion", 0.0, OVERDISPERSION_MAX, error=InstanceError)
    fields = {name: getattr(instance, name) for name in (*ITEM_COLUMNS, "K", "gamma", "rho", "source")}
    if factors >= 2:
        draws = np.random.default_rng([0x4A5250, validate.seed(seed, "seed", error=InstanceError), factors]).standard_normal(
            (instance.n, factors)
        )
        fields |= {"beta": None, "loadings": instance.beta[:, None] * unit_directions(draws)}
    return Instance(**fields, overdispersion=np.full(instance.n, phi))


@dataclass(frozen=True, eq=False)
class TensorInstance:
    """An instance as tensors on one device, with the derived constants used in hot paths.

    Shapes: per-item tensors are [n]; `arrives_in_slot` is [n, LMAX-1].
    """

    h: torch.Tensor
    b: torch.Tensor
    lam: torch.Tensor
    beta: torch.Tensor
    lead: torch.Tensor  # integer-valued, same dtype as the others
    qbar: torch.Tensor
    K: float
    gamma: float
    rho: float
    arrives_now: torch.Tensor = field(repr=False)  # [n] 1{L_i = 1}, eq. (inventory_transition)
    arrives_in_slot: torch.Tensor = field(repr=False)  # [n, LMAX-1] 1{l = L_i - 1}, eq. (in_transit_transition)
    mu: torch.Tensor = field(repr=False)  # [n] mu_i = lam_i (L_i + 1), eq. (feature_scales)
    sigma: torch.Tensor = field(repr=False)  # [n] sigma_i = sqrt(mu_i)
    c_scale: float = 0.0  # (1/n) sum_j (h_j + b_j)
    sigma_ref: float = 0.0  # (1/n) sum_j sigma_j
    c_ref: float = 0.0  # K + sum_i (h_i + b_i) sigma_i, eq. (cost_normalization)
    directions: torch.Tensor | None = field(default=None, repr=False)  # [n, k] beta_i / |beta_i| (Instance.directions)
    overdispersion: torch.Tensor | None = field(default=None, repr=False)  # [n] phi_i (Instance.overdispersion)

    @classmethod
    def from_instance(cls, inst: Instance, device, dtype) -> TensorInstance:
        def t(a):
            return torch.tensor(np.asarray(a, dtype=np.float64), device=device, dtype=dtype)

        lead_int = inst.lead.astype(np.int64)
        slots = np.zeros((inst.n, LMAX - 1))
        has_slot = lead_int >= 2
        slots[np.nonzero(has_slot)[0], lead_int[has_slot] - 2] = 1.0
        mu = inst.mu
        sigma = np.sqrt(mu)
        return cls(
            h=t(inst.h),
            b=t(inst.b),
            lam=t(inst.lam),
            beta=t(inst.beta),
            lead=t(inst.lead),
            qbar=t(inst.qbar),
            K=inst.K,
            gamma=inst.gamma,
            rho=inst.rho,
            arrives_now=t(lead_int == 1),
            arrives_in_slot=t(slots),
            mu=t(mu),
            sigma=t(sigma),
            c_scale=float(np.mean(inst.h + inst.b)),
            sigma_ref=float(np.mean(sigma)),
            c_ref=float(inst.K + np.sum((inst.h + inst.b) * sigma)),
            directions=None if inst.directions is None else t(inst.directions),
            overdispersion=None if inst.overdispersion is None else t(inst.overdispersion),
        )

    def exposure(self, factor: torch.Tensor) -> torch.Tensor:
        """Each item's exposure u_i,t (`exposure`, this module) from F_t ([B] at k = 1, else [B, k]): [B, n], or
        [B, 1] (the factor itself, for every item) under one non-negative factor."""
        return exposure(self.directions, factor)

    @property
    def factors(self) -> int:
        """k (Instance.factors)."""
        return 1 if self.directions is None else int(self.directions.shape[1])

    @property
    def n(self) -> int:
        return int(self.h.shape[0])

    @property
    def device(self) -> torch.device:
        return self.h.device

    @property
    def dtype(self) -> torch.dtype:
        return self.h.dtype
