"""A sweep file (YAML, tune_configs/*.yaml) as a typed, validated spec, and the plan it expands to:
one training trial per (method, n, seed) and the baselines of every size.

Every key is checked here, before anything starts: unknown keys name the allowed ones, numbers are
range-checked, methods and presets must exist, and the config of every trial is built once so that a
bad override fails now rather than in the middle of a sweep."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from envs.exogenous import check_path_size
from envs.instance import PAPER_MAX_N, PAPER_MAX_N_WHY
from plumbing import validate
from plumbing.errors import InputError
from policies.decomposition import DecompositionOptions
from policies.joint_dp import SWEEP_ITEMS
from solver_workers.backends import SOLVERS
from solver_workers.model import check_size
from trainers import registry

METHOD_NAMES = tuple(registry.METHODS)
SEED_COUNT_MAX = 1_000


class SweepError(InputError):
    """A sweep file's key is unknown, missing or outside its allowed values."""


def _where(name: str) -> str:
    return f"sweep field '{name}'"


def _mapping(value, where: str, allowed: dict[str, Any], required: tuple[str, ...] = ()) -> dict:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise SweepError(f"{_where(where)}: expected a mapping, got {validate.describe(value)}")
    validate.keys(value, _where(where), allowed, required, error=SweepError)
    return {**allowed, **value}


def _int(value, where: str, low: int, high: int | None = None, why: str = "") -> int:
    return validate.integer(value, _where(where), low, high, why=why, error=SweepError)


def _real(value, where: str, low: float, low_open: bool = False) -> float:
    return validate.real(value, _where(where), low, low_open=low_open, error=SweepError)


def _choice(value, where: str, allowed) -> str:
    return validate.choice(value, _where(where), allowed, error=SweepError)


def _seeds(value, where: str) -> tuple[int, ...]:
    """A count k (the seeds 0..k-1) or a list of distinct seeds."""
    if isinstance(value, int) and not isinstance(value, bool):
        return tuple(range(_int(value, where, 1, SEED_COUNT_MAX, "each seed is a training trial of every method and size")))
    if not isinstance(value, list) or not value:
        raise SweepError(f"{_where(where)}: expected a count >= 1 or a non-empty list of seeds, got {validate.describe(value)}")
    seeds = tuple(validate.seed(s, _where(where), error=SweepError) for s in value)
    if len(set(seeds)) != len(seeds):
        raise SweepError(f"{_where(where)}: each seed once, got {list(seeds)}")
    return seeds


def _sizes(value, where: str) -> tuple[int, ...]:
    """A non-empty list of distinct paper-family sizes n."""
    if not isinstance(value, list) or not value:
        raise SweepError(f"{_where(where)}: expected a non-empty list of item counts >= 1, got {validate.describe(value)}")
    sizes = tuple(_int(n, where, 1, PAPER_MAX_N, PAPER_MAX_N_WHY) for n in value)
    if len(set(sizes)) != len(sizes):
        raise SweepError(f"{_where(where)}: each entry once, got {list(sizes)}")
    return sizes


@dataclass(frozen=True)
class Resources:
    """Per trial: Ray Train workers of a pathwise method (0: train in the trial's own process), and what
    each worker (or the trial itself, for PPO and workers = 0) holds. Fractional GPUs let small-n trials
    share a GPU."""

    workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0

    @classmethod
    def parse(cls, value, where: str) -> Resources:
        d = _mapping(value, where, asdict(cls()))
        return cls(
            _int(d["workers"], f"{where}.workers", 0),
            _real(d["cpus_per_worker"], f"{where}.cpus_per_worker", 0, low_open=True),
            _real(d["gpus_per_worker"], f"{where}.gpus_per_worker", 0),
        )


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
    sizes: tuple[int, ...] | None = None
    """Only these sizes (default: every size of the sweep)."""
    episodes: int | None = None
    """Held-out episodes and horizon of this baseline (default: the sweep's evaluation)."""
    horizon: int | None = None

    @classmethod
    def parse(cls, value, where: str) -> MilpBaseline:
        d = _mapping(value, where, {f: v for f, v in asdict(cls("")).items()} | {"name": None})
        name = d["name"] or f"milp-{d['solver']}"
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
            raise SweepError(f"{_where(where + '.name')}: expected letters, digits, '-' and '_', got {validate.describe(name)}")
        return cls(
            name,
            _choice(d["solver"], f"{where}.solver", SOLVERS),
            validate.scenarios(d["scenarios"], _where(f"{where}.scenarios"), error=SweepError),
            validate.horizon(d["plan_horizon"], _where(f"{where}.plan_horizon"), error=SweepError),
            validate.time_limit(d["time_limit"], _where(f"{where}.time_limit"), error=SweepError),
            validate.mip_gap(d["gap"], _where(f"{where}.gap"), error=SweepError),
            _int(d["threads"], f"{where}.threads", 1),
            None if d["sizes"] is None else _sizes(d["sizes"], f"{where}.sizes"),
            None if d["episodes"] is None else _int(d["episodes"], f"{where}.episodes", 1),
            None if d["horizon"] is None else validate.horizon(d["horizon"], _where(f"{where}.horizon"), error=SweepError),
        )


def _decomposition(value) -> dict[str, Any] | None:
    """baselines.decomposition: null, or a mapping of DecompositionOptions' grid, tolerance and schedule_rounds fields."""
    if value is None:
        return None
    defaults = DecompositionOptions()
    where = "baselines.decomposition"
    d = _mapping(
        value,
        where,
        {
            "factor_points": defaults.factor_points,
            "coarse_points": defaults.coarse_points,
            "tolerance": defaults.tolerance,
            "schedule_rounds": defaults.schedule_rounds,
        },
    )
    rounds = _int(d.pop("schedule_rounds"), f"{where}.schedule_rounds", 0)
    grid = DecompositionOptions.check_grid(**d, where=lambda field: _where(f"{where}.{field}"), error=SweepError)
    return grid | {"schedule_rounds": rounds}


@dataclass(frozen=True)
class Baselines:
    classical_best: bool = True
    """Every classical family tuned on training paths; the best evaluated (policies.classical)."""
    dp_optimal: bool = True
    """The exact DP optimum, at the sizes n <= SWEEP_ITEMS only (policies.dp_optimal, policies.joint_dp)."""
    bound: dict[str, Any] | None = None
    """The perfect-information bound: {solver, time_limit (seconds per episode), threads}; null to skip."""
    milp: tuple[MilpBaseline, ...] = ()
    solver_workers: int = 2
    decomposition: dict[str, Any] | None = None
    """The decomposition lower bound: {factor_points, coarse_points, tolerance, schedule_rounds}
    (policies.decomposition.DecompositionOptions); null to skip."""
    lookahead: bool = False
    """The decomposition lookahead policy (policies.lookahead), from the tables of the decomposition bound's run
    (needs `decomposition`)."""
    """Actors of the Ray solver pool."""


@dataclass(frozen=True)
class Trial:
    method: str
    n: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.method}-n{self.n}-s{self.seed}"


def _sweep_fields(data, keys: tuple[str, ...]) -> dict:
    """The sweep file's mapping with every key of `keys` (None where absent); SweepError for an unknown or a missing key."""
    if not isinstance(data, dict):
        raise SweepError(f"sweep file: expected a mapping of sweep fields, got {validate.describe(data)}")
    validate.keys(data, "sweep file", keys, ("sizes", "seeds", "methods"), error=SweepError)
    return {k: None for k in keys} | data


def _seeds_per_size(value, sizes: tuple[int, ...]) -> dict[int, tuple[int, ...]]:
    """seeds_per_size: the training seeds of each size of `sizes` that it names."""
    if isinstance(value, dict):  # keys are numbers in YAML, strings once stored in sweep.json
        value = {int(k) if isinstance(k, str) and k.isdigit() else k: v for k, v in value.items()}
    per_size = _mapping(value, "seeds_per_size", {n: None for n in sizes})
    return {n: _seeds(v, f"seeds_per_size.{n}") for n, v in per_size.items() if v is not None}


def _methods(value) -> tuple[str, ...]:
    """methods: distinct names from METHOD_NAMES (none for null)."""
    methods = value if value is not None else []
    if not isinstance(methods, list):
        raise SweepError(f"sweep field 'methods': expected a list of methods from {list(METHOD_NAMES)}, got {validate.describe(methods)}")
    methods = tuple(_choice(m, "methods", METHOD_NAMES) for m in methods)
    if len(set(methods)) != len(methods):
        raise SweepError(f"sweep field 'methods': each entry once, got {list(methods)}")
    return methods


def _scopes() -> tuple[str, ...]:
    """The keys of `overrides` and `resources`: 'all' (every method) or a method's name."""
    return ("all", *METHOD_NAMES)


def _overrides(value) -> dict[str, dict[str, Any]]:
    """overrides: the config fields under each key of _scopes() that sets any (checked against the configs later)."""
    overrides = _mapping(value, "overrides", {k: {} for k in _scopes()})
    for key, fields in overrides.items():
        _mapping(fields, f"overrides.{key}", dict.fromkeys(fields) if isinstance(fields, dict) else {})
    return {k: dict(v or {}) for k, v in overrides.items() if v}


def _resources(value) -> dict[str, Resources]:
    """resources: the Resources under each key of _scopes() that it names."""
    resources = _mapping(value, "resources", {k: None for k in _scopes()})
    return {k: Resources.parse(v, f"resources.{k}") for k, v in resources.items() if v is not None}


def _bound(value) -> dict[str, Any] | None:
    """baselines.bound: null, or {solver, time_limit, threads} with their defaults."""
    if value is None:
        return None
    bound = _mapping(value, "baselines.bound", {"solver": "highs", "time_limit": 300.0, "threads": 1})
    return {
        "solver": _choice(bound["solver"], "baselines.bound.solver", SOLVERS),
        "time_limit": validate.time_limit(bound["time_limit"], _where("baselines.bound.time_limit"), error=SweepError),
        "threads": _int(bound["threads"], "baselines.bound.threads", 1),
    }


def _milp(value) -> tuple[MilpBaseline, ...]:
    """baselines.milp: a list of MILP baselines of distinct names."""
    if not isinstance(value, list):
        raise SweepError(f"sweep field 'baselines.milp': expected a list of MILP settings, got {validate.describe(value)}")
    milp = tuple(MilpBaseline.parse(m, f"baselines.milp[{k}]") for k, m in enumerate(value))
    names = [m.name for m in milp]
    if len(set(names)) != len(names):
        raise SweepError(f"sweep field 'baselines.milp': names must differ (set 'name'), got {names}")
    return milp


def _baselines(value) -> Baselines:
    """baselines: every field checked, the lookahead only with the decomposition bound."""
    b = _mapping(
        value,
        "baselines",
        {
            "classical_best": True,
            "dp_optimal": True,
            "bound": None,
            "milp": [],
            "solver_workers": 2,
            "decomposition": None,
            "lookahead": False,
        },
    )
    for key in ("classical_best", "dp_optimal", "lookahead"):
        validate.boolean(b[key], _where(f"baselines.{key}"), error=SweepError)
    baselines = Baselines(
        b["classical_best"],
        b["dp_optimal"],
        _bound(b["bound"]),
        _milp(b["milp"]),
        _int(b["solver_workers"], "baselines.solver_workers", 1),
        _decomposition(b["decomposition"]),
        b["lookahead"],
    )
    if baselines.lookahead and baselines.decomposition is None:
        raise SweepError(
            "sweep field 'baselines.lookahead': true needs baselines.decomposition (the lookahead's tables come from that bound's run)"
        )
    return baselines


def _settings(d: dict, evaluation: dict) -> dict[str, Any]:
    """SweepSpec's remaining fields, by name: the instance seed, preset, `evaluation`'s episodes and horizon, and how trials run."""
    return {
        "instance_seed": validate.seed(d["instance_seed"] or 0, _where("instance_seed"), error=SweepError),
        "preset": _choice(d["preset"] or "cpu", "preset", list(registry.PRESETS)),
        "episodes": _int(evaluation["episodes"], "evaluation.episodes", 1),
        "horizon": validate.horizon(evaluation["horizon"], _where("evaluation.horizon"), error=SweepError),
        "concurrency": _int(d["concurrency"] if d["concurrency"] is not None else 1, "concurrency", 1),
        "retries": _int(d["retries"] if d["retries"] is not None else 2, "retries", 0),
        "device": _choice(d["device"] or "cpu", "device", ("cpu", "cuda")),
    }


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

    KEYS = (
        "sizes",
        "seeds",
        "seeds_per_size",
        "methods",
        "instance_seed",
        "preset",
        "overrides",
        "resources",
        "evaluation",
        "baselines",
        "concurrency",
        "retries",
        "device",
        "description",
    )

    @classmethod
    def from_dict(cls, data) -> SweepSpec:
        """The spec of a sweep file's mapping `data`, every field checked and every trial's config built; SweepError otherwise."""
        d = _sweep_fields(data, cls.KEYS)
        sizes = _sizes(d["sizes"], "sizes")
        seeds = _seeds(d["seeds"], "seeds")
        seeds_per_size = _seeds_per_size(d["seeds_per_size"], sizes)
        methods = _methods(d["methods"])
        overrides = _overrides(d["overrides"])
        resources = _resources(d["resources"])
        evaluation = _mapping(d["evaluation"], "evaluation", {"episodes": 128, "horizon": 50})
        baselines = _baselines(d["baselines"])
        spec = cls(
            sizes,
            seeds,
            methods,
            overrides=overrides,
            resources=resources,
            baselines=baselines,
            seeds_per_size=seeds_per_size,
            **_settings(d, evaluation),
        )
        spec._check_scopes()
        spec._check_configs()
        spec._check_sizes()
        if not spec.trials() and not spec.has_baselines():
            raise SweepError("sweep file: the grid is empty (no methods and no baselines): nothing to run")
        return spec

    def _check_scopes(self) -> None:
        """Raises SweepError for an override or a resource of a method the sweep does not train, and for a MILP baseline's
        size that is not one of the sweep's: each would be dropped without a word."""
        for field_name, scoped in (("overrides", self.overrides), ("resources", self.resources)):
            if absent := [key for key in scoped if key != "all" and key not in self.methods]:
                raise SweepError(
                    f"sweep field '{field_name}.{absent[0]}': {absent[0]} is not among the sweep's methods {list(self.methods)}; "
                    f"add it to 'methods' or drop its {field_name}"
                )
        for k, m in enumerate(self.baselines.milp):
            if m.sizes is not None and (outside := [n for n in m.sizes if n not in self.sizes]):
                raise SweepError(
                    f"sweep field 'baselines.milp[{k}].sizes': {outside} not among the sweep's sizes {list(self.sizes)}; "
                    "a baseline runs only at the sweep's sizes: add them to 'sizes' or drop them here"
                )

    def _check_configs(self) -> None:
        """Raises SweepError for GPUs on a cpu sweep, a cuda sweep whose trials ask for no GPU, or a preset or override that a
        method's config refuses."""
        if self.device == "cpu" and any(r.gpus_per_worker > 0 for r in self.resources.values()):
            raise SweepError("sweep field 'resources': gpus_per_worker > 0 needs device: cuda")
        if self.device == "cuda":  # Ray hides every GPU from a trial that asks for none: its learner would find no CUDA
            for method in self.methods:
                if (gpus := self.resources_of(method).gpus_per_worker) <= 0:
                    raise SweepError(
                        f"sweep field 'resources': device: cuda needs gpus_per_worker > 0 for every method (Ray shows a trial no GPU "
                        f"it did not ask for), {method} has {gpus:g}; set it, or device: cpu"
                    )
        for method in self.methods:  # every trial's config, once: a bad override or preset fails before anything starts
            try:
                registry.method_config(method, self.preset, {**self.overrides_of(method), "device": self.device})
            except InputError as exc:
                raise SweepError(f"sweep field 'overrides' (preset '{self.preset}', method {method}): {exc}") from None

    def _check_sizes(self) -> None:
        """Raises InputError for a MILP model or held-out paths too large to build, in the dry run as in the run."""
        milp = self.baselines.milp
        for k, m in enumerate(milp):
            for n in self.milp_sizes(m):
                check_size(n, m.scenarios, m.plan_horizon, _where(f"baselines.milp[{k}]"))
        check_path_size(max(self.sizes), self.episodes, self.horizon, _where("evaluation.episodes"), SweepError)
        for k, m in enumerate(milp):
            check_path_size(
                max(self.milp_sizes(m), default=1),
                m.episodes or self.episodes,
                m.horizon or self.horizon,
                _where(f"baselines.milp[{k}].episodes"),
                SweepError,
            )

    def trials(self) -> list[Trial]:
        return [Trial(m, n, s) for n in self.sizes for m in self.methods for s in self.seeds_per_size.get(n, self.seeds)]

    def milp_sizes(self, m: MilpBaseline) -> tuple[int, ...]:
        """The sizes the MILP baseline `m` runs on."""
        return tuple(n for n in self.sizes if m.sizes is None or n in m.sizes)

    @property
    def has_dp_optimal(self) -> bool:
        """Whether a size of the sweep is small enough for its dp-optimal baseline (policies.joint_dp.SWEEP_ITEMS)."""
        return any(n <= SWEEP_ITEMS for n in self.sizes)

    def has_baselines(self) -> bool:
        b = self.baselines
        dp_optimal = b.dp_optimal and self.has_dp_optimal
        return b.classical_best or dp_optimal or b.bound is not None or bool(b.milp) or b.decomposition is not None

    def overrides_of(self, method: str) -> dict[str, Any]:
        return {**self.overrides.get("all", {}), **self.overrides.get(method, {})}

    def uses_ray_train(self, method: str) -> bool:
        """Pathwise methods train on Ray Train workers when `workers` >= 1; RLlib methods scale the RLlib way."""
        return registry.method(method).family == "pathwise" and self.resources_of(method).workers > 0

    def resources_of(self, method: str) -> Resources:
        return self.resources.get(method, self.resources.get("all", Resources()))
