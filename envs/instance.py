"""Problem instances Theta = (K, gamma, rho, {h_i, b_i, lam_i, beta_i, L_i, qbar_i}), eq. (instance_parameters).

`Instance` is the validated, device-free description (float64 NumPy arrays) that is saved and
loaded; `TensorInstance` is the same data as tensors on a device, with the derived constants that
the dynamics (eqs. inventory_transition, in_transit_transition), the features (eq. feature_scales)
and the cost normaliser (eq. cost_normalization) need.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from envs import validate
from envs.errors import InputError
from envs.files import input_file, read_text

LMAX = 4
"""Maximum admissible lead time L_max; the item token has L_max - 1 = 3 in-transit slots."""

ITEM_COLUMNS = ("h", "b", "lam", "beta", "lead", "qbar")

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
    "beta": (0.0, False, 2.0, "the demand rate's factor exp(beta F - beta^2 / 2) reaches e^18 at beta = 2 and F = 10; docs/formats.md"),
    "qbar": (0.0, True, 1e8, VALUE_WHY),
    "K": (0.0, False, 1e12, VALUE_WHY),
}
"""The range of every real instance field but gamma and rho (checked with their own rules)."""


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

    def __post_init__(self) -> None:
        items = {name: getattr(self, name) for name in ITEM_COLUMNS}
        n = None
        for name in ITEM_COLUMNS:
            arr = _item_array(items, name, n)
            n = arr.size
            object.__setattr__(self, name, arr)
        for name in ITEM_COLUMNS:
            check_item_column(name, getattr(self, name), f"instance field '{name}'", self.item_name)
        low, low_open, high, why = FIELD_RANGES["K"]
        where = "instance field '{}'"
        object.__setattr__(self, "K", validate.real(self.K, where.format("K"), low, high, low_open=low_open, why=why, error=InstanceError))
        object.__setattr__(
            self, "gamma", validate.real(self.gamma, where.format("gamma"), 0, 1, low_open=True, high_open=True, error=InstanceError)
        )
        object.__setattr__(self, "rho", validate.real(self.rho, where.format("rho"), 0, 1, high_open=True, error=InstanceError))
        if self.source is not None and not isinstance(self.source, dict):
            raise _refuse("source", "an object (where a fitted instance came from)", validate.describe(self.source))

    @property
    def n(self) -> int:
        return int(self.h.size)

    def item_name(self, item: int) -> str:
        """How a message names item `item`: "item 'NAME'" where the instance has item names (a fitted one), else "item K"."""
        names = (self.source or {}).get("item_names")
        return f"item '{names[item]}'" if isinstance(names, list) and len(names) == self.n else f"item {item}"

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
        """The parameters (the problem itself), without `source`."""
        items = {name: getattr(self, name).tolist() for name in ITEM_COLUMNS}
        items["lead"] = [int(v) for v in self.lead]
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
        exact_keys(items, set(ITEM_COLUMNS), "instance field 'items'")
        return cls(
            **{name: items[name] for name in ITEM_COLUMNS}, K=data["K"], gamma=data["gamma"], rho=data["rho"], source=data.get("source")
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
        path, table = read_table(path, "item table", header)
        exact_keys(set(table.column_names), set(ITEM_COLUMNS), f"item table '{path}' columns")
        if table.num_rows == 0:
            raise InstanceError(f"item table '{path}' has no rows; expected {header} (n >= 1)")
        return cls(**{name: number_column(table, name, path) for name in ITEM_COLUMNS}, K=K, gamma=gamma, rho=rho)

    def item_table(self):
        """The per-item columns as a pyarrow Table (for Parquet or CSV export)."""
        import pyarrow as pa

        arrays = {name: getattr(self, name) for name in ITEM_COLUMNS}
        arrays["lead"] = self.lead.astype(np.int64)
        return pa.table(arrays)

    def to_torch(self, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> TensorInstance:
        return TensorInstance.from_instance(self, device, dtype)


def read_table(path: str | os.PathLike, what: str, header: str, column_types: dict | None = None):
    """(path, pyarrow Table) of a UTF-8 CSV (with a header line) or Parquet input file; one InputError naming `what`
    and the path for a missing, unreadable, empty or malformed file. `column_types` fixes CSV column types by name
    (e.g. item names as text, so that '007' stays '007')."""
    import pyarrow as pa
    import pyarrow.csv
    import pyarrow.parquet

    path = input_file(path, what)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".parquet", ".pq"):
        raise InstanceError(f"{what} '{path}': expected a .csv or .parquet file, got '{suffix}'")
    csv = suffix == ".csv"
    try:
        if csv:
            text = read_text(path, what)
            if not text.strip():
                raise InstanceError(f"{what} '{path}' is empty; expected {header}")
            options = pyarrow.csv.ConvertOptions(column_types=column_types or {})
            # one thread (here and for Parquet): Arrow's CPU thread pool, once started, can abort the interpreter's exit
            # ("terminate called without an active exception", SIGABRT: 2 of 6 runs of instance.py --items here)
            reading = pyarrow.csv.ReadOptions(use_threads=False)
            table = pyarrow.csv.read_csv(io.BytesIO(text.encode()), read_options=reading, convert_options=options)
        else:
            table = pyarrow.parquet.read_table(path, use_threads=False)
    except pa.ArrowException as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InstanceError(f"{what} '{path}' is not a readable {'CSV' if csv else 'Parquet'} file ({first_line})") from None
    return path, table


def number_column(table, name: str, path) -> list:
    """The values of the numeric column `name` of an item table read from `path`; missing values or text are one
    InstanceError naming the column."""
    import pyarrow as pa

    column = table.column(name)
    if column.null_count:
        raise InstanceError(f"instance field '{name}': {column.null_count} missing values in '{path}'")
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        raise InstanceError(
            f"item table '{path}' column '{name}': expected numbers, got {column.type} values{_first_text(column.to_pylist())}"
        )
    return column.to_pylist()


def _first_text(values: list) -> str:
    """' (first: "abc" in row 3)' for the first value of a text column that is not a number; '' if none."""
    for row, value in enumerate(values, start=1):
        try:
            float(value)
        except (TypeError, ValueError):
            return f" (first: {json.dumps(value)} in data row {row})"
    return ""


def exact_keys(keys, expected: set, where: str) -> None:
    """Refuse, naming `where`, a mapping (instance, item table, decide.py's state) whose keys are not exactly `expected`."""
    validate.keys(keys, where, expected, expected, error=InstanceError)


TEMPORARY = re.compile(r"\.(.+)\.tmp\d*")
"""The name `atomic_write` gives the temporary file of NAME: .NAME.tmpPID."""


def written_by_atomic_write(name: str) -> str | None:
    """The file whose atomic write (killed before its rename) left the temporary file `name`, else None."""
    match = TEMPORARY.fullmatch(name)
    return match.group(1) if match else None


def atomic_write(path: str | os.PathLike, write) -> None:
    """Call `write(tmp)` on a temporary file beside `path`, then rename it over `path`, so no reader
    ever sees half a file (every results, instance and checkpoint file is written this way)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def _paper_grids() -> list[np.ndarray]:
    """The 0.1 grids of h, b and lam of the paper family."""
    return [np.round(np.arange(lo, hi + 0.05, 0.1), 1) for lo, hi in (PAPER_H, PAPER_B, PAPER_LAM)]


PAPER_MAX_N = int(np.prod([g.size for g in _paper_grids()]))
"""The largest paper-family instance: 42,075 distinct (h, b, lam) grid triples."""
PAPER_MAX_N_WHY = f"the paper family has {PAPER_MAX_N:,} distinct (h, b, lam) grid triples"


def paper_instance(n: int, seed: int) -> Instance:
    """The paper's instance family (appendix table "baselines details").

    K = 10n, gamma = 0.95, rho = 0.8. A pool of max(n, 1024) items is drawn from `seed`:
    distinct (h, b, lam) triples from the 0.1 grid over h in [0.6, 2.0], b in [6.0, 11.4],
    lam in [2.0, 7.0]; beta ~ U[0.2, 0.6]; L ~ U{1,..,4}; qbar = 4 lam. The instance is the
    first n items of the pool, so for n <= 1024 smaller instances are prefixes of larger ones.
    """
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
        )

    @property
    def n(self) -> int:
        return int(self.h.shape[0])

    @property
    def device(self) -> torch.device:
        return self.h.device

    @property
    def dtype(self) -> torch.dtype:
        return self.h.dtype
