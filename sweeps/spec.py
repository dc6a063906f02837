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
    """baselines.decomposition: null, or a mapping of DecompositionOptions' grid and tolerance fields."""
    if value is None:
        return None
    defaults = DecompositionOptions()
    d = _mapping(
        value,
        "baselines.decomposition",
        {"factor_points": defaults.factor_points, "coarse_points": defaults.coarse_points, "tolerance": defaults.tolerance},
    )
    where = "baselines.decomposition"
    return DecompositionOptions.check_grid(**d, where=lambda field: _where(f"{where}.{field}"), error=SweepError)


@dataclass(frozen=True)
class Baselines:
    classical_best: bool = True
    """Every classical family tuned on training paths; the best evaluated (policies.classical)."""
    dp_optimal: bool = True
    """The exact DP optimum, at n = 1 only (policies.dp_optimal)."""
    bound: dict[str, Any] | None = None
    """The perfect-information bound: {solver, time_limit (seconds per episode), threads}; null to skip."""
    milp: tuple[MilpBaseline, ...] = ()
    solver_workers: int = 2
    decomposition: dict[str, Any] | None = None
    """The decomposition lower bound: {factor_points, coarse_points, tolerance}
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
        if not isinstance(data, dict):
            raise SweepError(f"sweep file: expected a mapping of sweep fields, got {validate.describe(data)}")
        validate.keys(data, "sweep file", cls.KEYS, ("sizes", "seeds", "methods"), error=SweepError)
        d = {k: None for k in cls.KEYS} | data
        sizes = _sizes(d["sizes"], "sizes")
        seeds = _seeds(d["seeds"], "seeds")
        per_size = d["seeds_per_size"]
        if isinstance(per_size, dict):  # keys are numbers in YAML, strings once stored in sweep.json
            per_size = {int(k) if isinstance(k, str) and k.isdigit() else k: v for k, v in per_size.items()}
        per_size = _mapping(per_size, "seeds_per_size", {n: None for n in sizes})
        seeds_per_size = {n: _seeds(v, f"seeds_per_size.{n}") for n, v in per_size.items() if v is not None}
        methods = d["methods"] if d["methods"] is not None else []
        if not isinstance(methods, list):
            raise SweepError(
                f"sweep field 'methods': expected a list of methods from {list(METHOD_NAMES)}, got {validate.describe(methods)}"
            )
        methods = tuple(_choice(m, "methods", METHOD_NAMES) for m in methods)
        if len(set(methods)) != len(methods):
            raise SweepError(f"sweep field 'methods': each entry once, got {list(methods)}")
        scoped = ("all", *METHOD_NAMES)
        overrides = _mapping(d["overrides"], "overrides", {k: {} for k in scoped})
        for key, value in overrides.items():
            _mapping(value, f"overrides.{key}", {k: None for k in (value or {})})
        resources = _mapping(d["resources"], "resources", {k: None for k in scoped})
        resources = {k: Resources.parse(v, f"resources.{k}") for k, v in resources.items() if v is not None}
        evaluation = _mapping(d["evaluation"], "evaluation", {"episodes": 128, "horizon": 50})
        b = _mapping(
            d["baselines"],
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
        bound = None
        if b["bound"] is not None:
            bound = _mapping(b["bound"], "baselines.bound", {"solver": "highs", "time_limit": 300.0, "threads": 1})
            bound = {
                "solver": _choice(bound["solver"], "baselines.bound.solver", SOLVERS),
                "time_limit": validate.time_limit(bound["time_limit"], _where("baselines.bound.time_limit"), error=SweepError),
                "threads": _int(bound["threads"], "baselines.bound.threads", 1),
            }
        if not isinstance(b["milp"], list):
            raise SweepError(f"sweep field 'baselines.milp': expected a list of MILP settings, got {validate.describe(b['milp'])}")
        milp = tuple(MilpBaseline.parse(m, f"baselines.milp[{k}]") for k, m in enumerate(b["milp"]))
        names = [m.name for m in milp]
        if len(set(names)) != len(names):
            raise SweepError(f"sweep field 'baselines.milp': names must differ (set 'name'), got {names}")
        baselines = Baselines(
            b["classical_best"],
            b["dp_optimal"],
            bound,
            milp,
            _int(b["solver_workers"], "baselines.solver_workers", 1),
            _decomposition(b["decomposition"]),
            b["lookahead"],
        )
        if baselines.lookahead and baselines.decomposition is None:
            raise SweepError(
                "sweep field 'baselines.lookahead': true needs baselines.decomposition (the lookahead's tables come from that bound's run)"
            )
        spec = cls(
            sizes,
            seeds,
            methods,
            validate.seed(d["instance_seed"] or 0, _where("instance_seed"), error=SweepError),
            d["preset"] or "cpu",
            {k: dict(v or {}) for k, v in overrides.items() if v},
            resources,
            _int(evaluation["episodes"], "evaluation.episodes", 1),
            validate.horizon(evaluation["horizon"], _where("evaluation.horizon"), error=SweepError),
            baselines,
            _int(d["concurrency"] if d["concurrency"] is not None else 1, "concurrency", 1),
            _int(d["retries"] if d["retries"] is not None else 2, "retries", 0),
            _choice(d["device"] or "cpu", "device", ("cpu", "cuda")),
            seeds_per_size,
        )
        if spec.device == "cpu" and any(r.gpus_per_worker > 0 for r in resources.values()):
            raise SweepError("sweep field 'resources': gpus_per_worker > 0 needs device: cuda")
        for method in methods:  # every trial's config, once: a bad override or preset fails before anything starts
            try:
                registry.method_config(method, spec.preset, {**spec.overrides_of(method), "device": spec.device})
            except InputError as exc:
                raise SweepError(f"sweep field 'overrides' (preset '{spec.preset}', method {method}): {exc}") from None
        for k, m in enumerate(milp):  # a model too large to build fails now, in the dry run as in the run
            for n in spec.milp_sizes(m):
                check_size(n, m.scenarios, m.plan_horizon, _where(f"baselines.milp[{k}]"))
        check_path_size(max(sizes), spec.episodes, spec.horizon, _where("evaluation.episodes"), SweepError)
        for k, m in enumerate(milp):
            check_path_size(
                max(spec.milp_sizes(m), default=1),
                m.episodes or spec.episodes,
                m.horizon or spec.horizon,
                _where(f"baselines.milp[{k}].episodes"),
                SweepError,
            )
        if not spec.trials() and not spec.has_baselines():
            raise SweepError("sweep file: the grid is empty (no methods and no baselines): nothing to run")
        return spec

    def trials(self) -> list[Trial]:
        return [Trial(m, n, s) for n in self.sizes for m in self.methods for s in self.seeds_per_size.get(n, self.seeds)]

    def milp_sizes(self, m: MilpBaseline) -> tuple[int, ...]:
        """The sizes the MILP baseline `m` runs on."""
        return tuple(n for n in self.sizes if m.sizes is None or n in m.sizes)

    def has_baselines(self) -> bool:
        b = self.baselines
        return b.classical_best or (b.dp_optimal and 1 in self.sizes) or b.bound is not None or bool(b.milp) or b.decomposition is not None

    def overrides_of(self, method: str) -> dict[str, Any]:
        return {**self.overrides.get("all", {}), **self.overrides.get(method, {})}

    def uses_ray_train(self, method: str) -> bool:
        """Pathwise methods train on Ray Train workers when `workers` >= 1; RLlib methods scale the RLlib way."""
        return registry.method(method).family == "pathwise" and self.resources_of(method).workers > 0

    def resources_of(self, method: str) -> Resources:
        return self.resources.get(method, self.resources.get("all", Resources()))
