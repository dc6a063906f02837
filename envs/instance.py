"""Problem instances Theta = (K, gamma, rho, {h_i, b_i, lam_i, beta_i, L_i, qbar_i}), eq. (instance_parameters).

`Instance` is the validated, device-free description (float64 NumPy arrays) that is saved and
loaded; `TensorInstance` is the same data as tensors on a device, with the derived constants that
the dynamics (eqs. inventory_transition, in_transit_transition), the features (eq. feature_scales)
and the cost normaliser (eq. cost_normalization) need.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from envs.cli import input_file, read_text
from envs.errors import InputError

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


def is_number(value) -> bool:
    """A real number as a JSON or YAML file gives it (int or float); a boolean or a string is not one."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def describe_value(value) -> str:
    """How a value read from a file looks to its author, for error messages: `a string "2"`, `a boolean true`."""
    text = json.dumps(value, default=str)
    text = text if len(text) <= 40 else text[:37] + "..."
    if isinstance(value, (bool, np.bool_)):
        return f"a boolean {text}"
    if isinstance(value, str):
        return f"a string {text}"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}: {text}"
    if isinstance(value, dict):
        return f"an object {text}"
    return text


def _check(ok: bool, field_name: str, allowed: str, got) -> None:
    if not ok:
        raise InstanceError(f"instance field '{field_name}': expected {allowed}, got {got}")


def _item_array(items: dict, name: str, n: int | None) -> np.ndarray:
    values = np.asarray(items[name], dtype=object)
    for i, value in enumerate(values.ravel()):
        _check(is_number(value), name, "a list of numbers", describe_value(value) + (f" for item {i}" if values.ndim == 1 else ""))
    try:
        arr = np.asarray(items[name], dtype=np.float64)
    except OverflowError:
        raise InstanceError(f"instance field '{name}': expected finite numbers, got an integer too large for a float") from None
    _check(arr.ndim == 1, name, "a one-dimensional list", f"shape {arr.shape}")
    _check(arr.size >= 1, name, "at least one item (n >= 1)", "an empty list")
    _check(bool(np.all(np.isfinite(arr))), name, "finite numbers", "NaN or infinity")
    if n is not None:
        _check(arr.size == n, name, f"{n} values (one per item, like 'h')", f"{arr.size}")
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

    def __post_init__(self) -> None:
        items = {name: getattr(self, name) for name in ITEM_COLUMNS}
        n = None
        for name in ITEM_COLUMNS:
            arr = _item_array(items, name, n)
            n = arr.size
            object.__setattr__(self, name, arr)
        for name, ok, allowed in (
            ("h", self.h > 0, "values > 0"),
            ("b", self.b > 0, "values > 0"),
            ("lam", self.lam > 0, "values > 0"),
            ("beta", self.beta >= 0, "values >= 0"),
            ("lead", (self.lead == np.round(self.lead)) & (self.lead >= 1) & (self.lead <= LMAX), f"integers in 1..{LMAX}"),
            ("qbar", self.qbar > 0, "values > 0"),
        ):
            bad = getattr(self, name)[~ok]
            _check(bad.size == 0, name, allowed, f"{bad[0]:g} (item {int(np.argmin(ok))})" if bad.size else "")
        for name in ("K", "gamma", "rho"):
            value = getattr(self, name)
            _check(is_number(value), name, "a number", describe_value(value))
            try:
                value = float(value)
            except OverflowError:  # an integer beyond the float range
                value = math.inf
            _check(math.isfinite(value), name, "a finite number", value)
            object.__setattr__(self, name, value)
        _check(self.K >= 0, "K", "K >= 0", self.K)
        _check(0 < self.gamma < 1, "gamma", "0 < gamma < 1", self.gamma)
        _check(0 <= self.rho < 1, "rho", "0 <= rho < 1", self.rho)

    @property
    def n(self) -> int:
        return int(self.h.size)

    @property
    def mu(self) -> np.ndarray:
        """mu_i = lam_i (L_i + 1), eq. (feature_scales): the feature scale, and the initial inventory I_0 of
        every episode (envs.dynamics.initial_state)."""
        return self.lam * (self.lead + 1.0)

    # ---- files ---------------------------------------------------------------------------------

    def to_dict(self) -> dict:
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
    def from_dict(cls, data: dict) -> "Instance":
        """Build from the JSON layout; unknown or missing keys are an error."""
        if not isinstance(data, dict):
            raise InstanceError(f"instance: expected a JSON object, got {type(data).__name__}")
        exact_keys(data, {"K", "gamma", "rho", "items"}, "instance")
        items = data["items"]
        if not isinstance(items, dict):
            raise InstanceError("instance field 'items': expected an object of per-item lists")
        exact_keys(items, set(ITEM_COLUMNS), "instance field 'items'")
        return cls(**{name: items[name] for name in ITEM_COLUMNS}, K=data["K"], gamma=data["gamma"], rho=data["rho"])

    def save(self, path: str | os.PathLike) -> None:
        """Write the JSON file atomically."""
        atomic_write_text(Path(path), json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Instance":
        path = Path(path)
        try:
            data = json.loads(read_text(path, "instance file"))
        except json.JSONDecodeError as exc:
            raise InstanceError(f"instance file '{path}' is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def from_table(cls, path: str | os.PathLike, K: float, gamma: float, rho: float) -> "Instance":
        """Import an item table (CSV or Parquet) with exactly the columns h, b, lam, beta, lead, qbar."""
        import pyarrow as pa
        import pyarrow.csv
        import pyarrow.parquet

        path = input_file(path, "item table")
        suffix = path.suffix.lower()
        if suffix == ".csv":
            table = pyarrow.csv.read_csv(path)
        elif suffix in (".parquet", ".pq"):
            table = pyarrow.parquet.read_table(path)
        else:
            raise InstanceError(f"item table '{path}': expected a .csv or .parquet file, got '{suffix}'")
        exact_keys(set(table.column_names), set(ITEM_COLUMNS), f"item table '{path}' columns")
        items = {}
        for name in ITEM_COLUMNS:
            column = table.column(name)
            if column.null_count:
                raise InstanceError(f"instance field '{name}': {column.null_count} missing values in '{path}'")
            if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
                raise InstanceError(f"item table '{path}' column '{name}': expected numbers, got {column.type} values{_first_text(column.to_pylist())}")
            items[name] = column.to_pylist()
        return cls(**items, K=K, gamma=gamma, rho=rho)

    def item_table(self):
        """The per-item columns as a pyarrow Table (for Parquet or CSV export)."""
        import pyarrow as pa

        arrays = {name: getattr(self, name) for name in ITEM_COLUMNS}
        arrays["lead"] = self.lead.astype(np.int64)
        return pa.table(arrays)

    def to_torch(self, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> "TensorInstance":
        return TensorInstance.from_instance(self, device, dtype)


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
    keys = set(keys)
    missing, unknown = sorted(expected - keys), sorted(keys - expected)
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if unknown:
            parts.append(f"unknown {unknown}")
        raise InstanceError(f"{where}: {', '.join(parts)}; allowed keys are {sorted(expected)}")


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


def paper_instance(n: int, seed: int) -> Instance:
    """The paper's instance family (appendix table "baselines details").

    K = 10n, gamma = 0.95, rho = 0.8. A pool of max(n, 1024) items is drawn from `seed`:
    distinct (h, b, lam) triples from the 0.1 grid over h in [0.6, 2.0], b in [6.0, 11.4],
    lam in [2.0, 7.0]; beta ~ U[0.2, 0.6]; L ~ U{1,..,4}; qbar = 4 lam. The instance is the
    first n items of the pool, so for n <= 1024 smaller instances are prefixes of larger ones.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InstanceError(f"paper instance field 'n': expected an integer >= 1, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InstanceError(f"paper instance field 'seed': expected an integer >= 0, got {seed!r}")
    grids = [np.round(np.arange(lo, hi + 0.05, 0.1), 1) for lo, hi in (PAPER_H, PAPER_B, PAPER_LAM)]
    sizes = [g.size for g in grids]
    n_triples = int(np.prod(sizes))
    if n > n_triples:
        raise InstanceError(f"paper instance field 'n': expected at most {n_triples} (distinct grid triples), got {n}")
    rng = np.random.default_rng([0x4A5250, seed])
    pool = max(int(n), PAPER_POOL)
    flat = rng.choice(n_triples, size=pool, replace=False)
    ih, ib, il = np.unravel_index(flat, sizes)
    beta = rng.uniform(*PAPER_BETA, size=pool)
    lead = rng.integers(1, LMAX + 1, size=pool)
    lam = grids[2][il]
    n = int(n)
    return Instance(
        h=grids[0][ih][:n], b=grids[1][ib][:n], lam=lam[:n], beta=beta[:n], lead=lead[:n].astype(np.float64),
        qbar=4.0 * lam[:n], K=10.0 * n, gamma=0.95, rho=0.8,
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
    def from_instance(cls, inst: Instance, device, dtype) -> "TensorInstance":
        def t(a):
            return torch.tensor(np.asarray(a, dtype=np.float64), device=device, dtype=dtype)

        lead_int = inst.lead.astype(np.int64)
        slots = np.zeros((inst.n, LMAX - 1))
        has_slot = lead_int >= 2
        slots[np.nonzero(has_slot)[0], lead_int[has_slot] - 2] = 1.0
        mu = inst.mu
        sigma = np.sqrt(mu)
        return cls(
            h=t(inst.h), b=t(inst.b), lam=t(inst.lam), beta=t(inst.beta), lead=t(inst.lead), qbar=t(inst.qbar),
            K=inst.K, gamma=inst.gamma, rho=inst.rho,
            arrives_now=t(lead_int == 1), arrives_in_slot=t(slots), mu=t(mu), sigma=t(sigma),
            c_scale=float(np.mean(inst.h + inst.b)), sigma_ref=float(np.mean(sigma)),
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
