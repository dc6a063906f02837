"""A sweep file (YAML, tune_configs/*.yaml) as a typed, validated spec, and the plan it expands to:
one training trial per (method, n, seed) and the baselines of every size.

Every key is checked here, before anything starts: unknown keys name the allowed ones, numbers are
range-checked, methods and presets must exist, and the config of every trial is built once so that a
bad override fails now rather than in the middle of a sweep."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from envs.errors import InputError
from trainers import registry

METHOD_NAMES = tuple(registry.METHODS)
SOLVERS = ("highs", "gurobi")


class SweepError(InputError):
    """A sweep file's key is unknown, missing or outside its allowed values."""


def _mapping(value, where: str, allowed: dict[str, Any], required: tuple[str, ...] = ()) -> dict:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise SweepError(f"sweep field '{where}': expected a mapping, got {type(value).__name__}")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise SweepError(f"sweep field '{where}': unknown keys {unknown}; allowed keys are {sorted(allowed)}")
    missing = [k for k in required if k not in value]
    if missing:
        raise SweepError(f"sweep field '{where}': missing keys {missing}")
    return {**allowed, **value}


def _int(value, where: str, low: int, high: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise SweepError(f"sweep field '{where}': expected an integer {bounds}, got {value!r}")
    return value


def _real(value, where: str, low: float, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < low or (low_open and value == low):
        raise SweepError(f"sweep field '{where}': expected a finite number {'>' if low_open else '>='} {low:g}, got {value!r}")
    return float(value)


def _choice(value, where: str, allowed) -> str:
    if value not in allowed:
        raise SweepError(f"sweep field '{where}': expected one of {list(allowed)}, got {value!r}")
    return value


def _seeds(value, where: str) -> tuple[int, ...]:
    """A count k (the seeds 0..k-1) or a list of distinct seeds."""
    if isinstance(value, int) and not isinstance(value, bool):
        return tuple(range(_int(value, where, 1)))
    if not isinstance(value, list) or not value:
        raise SweepError(f"sweep field '{where}': expected a count >= 1 or a non-empty list of seeds, got {value!r}")
    seeds = tuple(_int(s, where, 0, 2**31 - 1) for s in value)
    if len(set(seeds)) != len(seeds):
        raise SweepError(f"sweep field '{where}': each seed once, got {list(seeds)}")
    return seeds


@dataclass(frozen=True)
class Resources:
    """Per trial: Ray Train workers of a pathwise method (0: train in the trial's own process), and what
    each worker (or the trial itself, for PPO and workers = 0) holds. Fractional GPUs let small-n trials
    share a GPU."""

    workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0

    @classmethod
    def parse(cls, value, where: str) -> "Resources":
        d = _mapping(value, where, asdict(cls()))
        return cls(_int(d["workers"], f"{where}.workers", 0), _real(d["cpus_per_worker"], f"{where}.cpus_per_worker", 0, low_open=True),
                   _real(d["gpus_per_worker"], f"{where}.gpus_per_worker", 0))


@dataclass(frozen=True)
class MilpBaseline:
    """One rolling-horizon MILP baseline (paper appendix "MILP solver setup"), run on the solver pool."""

    name: str
    solver: str = "highs"
    scenarios: int = 100
    plan_horizon: int = 50
    time_limit: float = 600.0
    gap: float = 0.005
    threads: int = 1
    sizes: Optional[tuple[int, ...]] = None
    """Only these sizes (default: every size of the sweep)."""
    episodes: Optional[int] = None
    """Held-out episodes and horizon of this baseline (default: the sweep's evaluation)."""
    horizon: Optional[int] = None

    @classmethod
    def parse(cls, value, where: str) -> "MilpBaseline":
        d = _mapping(value, where, {f: v for f, v in asdict(cls("")).items()} | {"name": None})
        name = d["name"] or f"milp-{d['solver']}"
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
            raise SweepError(f"sweep field '{where}.name': expected letters, digits, '-' and '_', got {name!r}")
        sizes = d["sizes"]
        if sizes is not None:
            if not isinstance(sizes, list) or not sizes:
                raise SweepError(f"sweep field '{where}.sizes': expected a non-empty list of sizes, got {sizes!r}")
            sizes = tuple(_int(s, f"{where}.sizes", 1) for s in sizes)
        return cls(
            name, _choice(d["solver"], f"{where}.solver", SOLVERS), _int(d["scenarios"], f"{where}.scenarios", 1),
            _int(d["plan_horizon"], f"{where}.plan_horizon", 1), _real(d["time_limit"], f"{where}.time_limit", 0, low_open=True),
            _real(d["gap"], f"{where}.gap", 0), _int(d["threads"], f"{where}.threads", 1), sizes,
            None if d["episodes"] is None else _int(d["episodes"], f"{where}.episodes", 1),
            None if d["horizon"] is None else _int(d["horizon"], f"{where}.horizon", 1),
        )


@dataclass(frozen=True)
class Baselines:
    classical_best: bool = True
    """Every classical family tuned on training paths; the best evaluated (envs.classical)."""
    dp_optimal: bool = True
    """The exact DP optimum, at n = 1 only (envs.dp_optimal)."""
    bound: Optional[dict[str, Any]] = None
    """The perfect-information bound: {solver, time_limit (seconds per episode), threads}; null to skip."""
    milp: tuple[MilpBaseline, ...] = ()
    solver_workers: int = 2
    """Actors of the Ray solver pool."""


@dataclass(frozen=True)
class Trial:
    method: str
    n: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.method}-n{self.n}-s{self.seed}"


@dataclass(frozen=True)
class SweepSpec:
    sizes: tuple[int, ...]
    seeds: tuple[int, ...]
    methods: tuple[str, ...]
    instance_seed: int = 0
    preset: str = "cpu"
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Config fields over the preset: under 'all' for every method, or under a method's name."""
    resources: dict[str, Resources] = field(default_factory=dict)
    """Under 'all' or a method's name (see Resources)."""
    episodes: int = 128
    horizon: int = 50
    baselines: Baselines = Baselines()
    concurrency: int = 1
    """Trials that run at once."""
    retries: int = 2
    """Retries of a failed trial (each resumes from the trial's last checkpoint)."""
    device: str = "cpu"
    """Device of the learners: cpu, or cuda (with gpus_per_worker > 0)."""
    seeds_per_size: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Training seeds of particular sizes (a count or a list), instead of `seeds`."""

    KEYS = ("sizes", "seeds", "seeds_per_size", "methods", "instance_seed", "preset", "overrides", "resources", "evaluation", "baselines", "concurrency", "retries",
            "device", "description")

    @classmethod
    def from_dict(cls, data) -> "SweepSpec":
        if not isinstance(data, dict):
            raise SweepError(f"sweep file: expected a mapping of sweep fields, got {type(data).__name__}")
        d = _mapping(data, "sweep file", {k: None for k in cls.KEYS}, required=("sizes", "seeds", "methods"))
        if not isinstance(d["sizes"], list) or not d["sizes"]:
            raise SweepError(f"sweep field 'sizes': expected a non-empty list of item counts >= 1, got {d['sizes']!r}")
        sizes = tuple(_int(n, "sizes", 1) for n in d["sizes"])
        seeds = _seeds(d["seeds"], "seeds")
        per_size = d["seeds_per_size"]
        if isinstance(per_size, dict):  # keys are numbers in YAML, strings once stored in sweep.json
            per_size = {int(k) if isinstance(k, str) and k.isdigit() else k: v for k, v in per_size.items()}
        per_size = _mapping(per_size, "seeds_per_size", {n: None for n in sizes})
        seeds_per_size = {n: _seeds(v, f"seeds_per_size.{n}") for n, v in per_size.items() if v is not None}
        methods = d["methods"] if d["methods"] is not None else []
        if not isinstance(methods, list):
            raise SweepError(f"sweep field 'methods': expected a list of methods from {list(METHOD_NAMES)}, got {methods!r}")
        methods = tuple(_choice(m, "methods", METHOD_NAMES) for m in methods)
        for name, values in (("sizes", sizes), ("methods", methods)):
            if len(set(values)) != len(values):
                raise SweepError(f"sweep field '{name}': each entry once, got {list(values)}")
        scoped = ("all", *METHOD_NAMES)
        overrides = _mapping(d["overrides"], "overrides", {k: {} for k in scoped})
        for key, value in overrides.items():
            _mapping(value, f"overrides.{key}", {k: None for k in (value or {})})
        resources = _mapping(d["resources"], "resources", {k: None for k in scoped})
        resources = {k: Resources.parse(v, f"resources.{k}") for k, v in resources.items() if v is not None}
        evaluation = _mapping(d["evaluation"], "evaluation", {"episodes": 128, "horizon": 50})
        b = _mapping(d["baselines"], "baselines", {"classical_best": True, "dp_optimal": True, "bound": None, "milp": [], "solver_workers": 2})
        for key in ("classical_best", "dp_optimal"):
            if not isinstance(b[key], bool):
                raise SweepError(f"sweep field 'baselines.{key}': expected true or false, got {b[key]!r}")
        bound = None
        if b["bound"] is not None:
            bound = _mapping(b["bound"], "baselines.bound", {"solver": "highs", "time_limit": 300.0, "threads": 1})
            bound = {"solver": _choice(bound["solver"], "baselines.bound.solver", SOLVERS),
                     "time_limit": _real(bound["time_limit"], "baselines.bound.time_limit", 0, low_open=True),
                     "threads": _int(bound["threads"], "baselines.bound.threads", 1)}
        if not isinstance(b["milp"], list):
            raise SweepError(f"sweep field 'baselines.milp': expected a list of MILP settings, got {b['milp']!r}")
        milp = tuple(MilpBaseline.parse(m, f"baselines.milp[{k}]") for k, m in enumerate(b["milp"]))
        names = [m.name for m in milp]
        if len(set(names)) != len(names):
            raise SweepError(f"sweep field 'baselines.milp': names must differ (set 'name'), got {names}")
        baselines = Baselines(b["classical_best"], b["dp_optimal"], bound, milp, _int(b["solver_workers"], "baselines.solver_workers", 1))
        spec = cls(
            sizes, seeds, methods, _int(d["instance_seed"] or 0, "instance_seed", 0), d["preset"] or "cpu",
            {k: dict(v or {}) for k, v in overrides.items() if v}, resources,
            _int(evaluation["episodes"], "evaluation.episodes", 1), _int(evaluation["horizon"], "evaluation.horizon", 1), baselines,
            _int(d["concurrency"] if d["concurrency"] is not None else 1, "concurrency", 1),
            _int(d["retries"] if d["retries"] is not None else 2, "retries", 0),
            _choice(d["device"] or "cpu", "device", ("cpu", "cuda")), seeds_per_size,
        )
        if spec.device == "cpu" and any(r.gpus_per_worker > 0 for r in resources.values()):
            raise SweepError("sweep field 'resources': gpus_per_worker > 0 needs device: cuda")
        for method in methods:  # every trial's config, once: a bad override or preset fails before anything starts
            registry.method_config(method, spec.preset, {**spec.overrides_of(method), "device": spec.device})
        if not spec.trials() and not spec.has_baselines():
            raise SweepError("sweep file: the grid is empty (no methods and no baselines): nothing to run")
        return spec

    def trials(self) -> list[Trial]:
        return [Trial(m, n, s) for n in self.sizes for m in self.methods for s in self.seeds_per_size.get(n, self.seeds)]

    def has_baselines(self) -> bool:
        b = self.baselines
        return b.classical_best or (b.dp_optimal and 1 in self.sizes) or b.bound is not None or bool(b.milp)

    def overrides_of(self, method: str) -> dict[str, Any]:
        return {**self.overrides.get("all", {}), **self.overrides.get(method, {})}

    def uses_ray_train(self, method: str) -> bool:
        """Pathwise methods train on Ray Train workers when `workers` >= 1; RLlib methods scale the RLlib way."""
        return registry.method(method).family == "pathwise" and self.resources_of(method).workers > 0

    def resources_of(self, method: str) -> Resources:
        return self.resources.get(method, self.resources.get("all", Resources()))
