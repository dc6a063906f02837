"""Classical replenishment policies and their tuning by batched simulation.

Families (each sees only s_t = (I, P, F; Theta) and, for periodic review, its own clock):

* zero              never order;
* base-stock        joint trigger: if any item's inventory position IP_i = I_i + sum_l P_{i,l} is below
                    its reorder level s_i, open an order and raise every item towards S_i;
* can-order         (s, c, S): if any item is below s_i, open an order and raise every item below its
                    can-order level c_i = s_i + f (S_i - s_i) towards S_i;
* fraction-trigger  open when at least a fraction f of the items (and at least one) are below s_i;
* cost-trigger      open when the expected backlog cost of not ordering now,
                    sum_i b_i E[(D_i - IP_i)^+] with D_i the demand over L_i + 1 periods (normal loss
                    function), reaches theta * K;
* periodic          (R, S): every R periods raise every item towards S_i.
Raising is Q_i = clip(S_i - IP_i, 0, qbar_i).

Levels come from the demand over the next p periods, D_t + ... + D_{t+p-1}, whose mean and standard
deviation are known in closed form under eqs. (factor_process)-(conditional_demand_rate), with k factors and
overdispersion too (envs.demand_law.DemandMoments). An order
placed at t serves demand from t + L_i on, so the reorder level covers p = L_i + 1 periods:
s_i = m_i + z_s sd_i. The order-up-to level adds cover and cycle stock,
S_i = m_i + z_S sd_i + k EOQ_i over p = L_i + cover periods (periodic: L_i + R), with the economic order
quantity EOQ_i = sqrt(2 (K / n) lam_i / h_i) (the fixed cost shared over the n items). The static variant
uses the stationary moments; the factor-aware variant ("-factor") conditions them on the observed F_t (each item
on its own exposure u_i,t, envs.instance.exposure).

Tuning (`tune_family`): a coarse grid of every parameter, all candidates simulated at once on the same
training paths, then pattern searches from the best points (`refine`), so the tuned parameters are
not limited by the grid's spacing.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from envs.demand_law import DemandMoments
from envs.dynamics import State
from envs.evaluation import rollout_costs, standard_error
from envs.exogenous import HELDOUT_SEED, TUNING_SEED, sample_paths
from envs.instance import LMAX, Instance, TensorInstance


@dataclass(frozen=True)
class Parameter:
    """A tuned parameter: its coarse grid, the first step of the refinement and its scale (linear: x +- step;
    log: x * exp(+-step); integer: x +- 1), kept within [low, high]."""

    grid: tuple[float, ...]
    step: float
    scale: str = "linear"
    low: float = -math.inf
    high: float = math.inf


# The reorder trigger sits low: with many items some item is almost always below a high s_i, which would
# open an order every period.
REORDER_Z = Parameter((-2.0, -1.0, 0.0, 1.0), 0.5)
UP_TO = {
    "cover": Parameter((1,), 1, "integer", 1, 8),  # the refinement moves it; the cycle-stock term does its work
    "order_up_to_z": Parameter((0.0, 1.0, 2.0), 0.5),
    "cycle_stock": Parameter((0.0, 0.5, 1.0), 0.25, low=0.0),
}
FAMILIES: dict[str, dict[str, Parameter]] = {
    "base-stock": {"reorder_z": REORDER_Z, **UP_TO},
    "can-order": {"reorder_z": REORDER_Z, "can_order_fraction": Parameter((1 / 3, 2 / 3), 1 / 6, low=0.0, high=1.0), **UP_TO},
    "fraction-trigger": {"reorder_z": REORDER_Z, "trigger_fraction": Parameter((0.1, 0.25, 0.5), 0.05, low=0.0, high=1.0), **UP_TO},
    "cost-trigger": {"theta": Parameter((0.1, 0.3, 1.0, 3.0), 0.5, "log", 1e-3), **UP_TO},
    "periodic": {
        "period": Parameter((1, 2, 3, 4, 6), 1, "integer", 1, 12),
        "order_up_to_z": UP_TO["order_up_to_z"],
        "cycle_stock": UP_TO["cycle_stock"],
    },
}
MAX_COVER = int(max(UP_TO["cover"].high, FAMILIES["periodic"]["period"].high))
REFINE_STARTS = 2
"""Pattern searches per variant, from the best grid points."""
REFINE_ROUNDS = 12
"""Batches of moves one pattern search simulates at most."""
TUNING_EPISODES = 64
"""Training paths a variant is tuned on."""
LONG_TUNING = 60.0
"""Seconds of estimated tuning above which `tuned_policy` with progress prints its estimate."""


@dataclass(frozen=True)
class Rule:
    """A tuned rule: its family (FAMILIES) and whether it reads the factor (factor-aware; its name ends in -factor)."""

    family: str
    aware: bool

    @property
    def name(self) -> str:
        return f"{self.family}-factor" if self.aware else self.family


RULES = {rule.name: rule for rule in (Rule(family, aware) for family in FAMILIES for aware in (False, True))}
"""Every family, static and factor-aware, by name."""
VARIANTS = tuple(RULES)
"""What classical-best chooses from."""
ZERO = "zero"
CLASSICAL_BEST = "classical-best"
POLICY_NAMES = (ZERO, *VARIANTS, CLASSICAL_BEST)
RULES_OF = {ZERO: (), **{name: (rule,) for name, rule in RULES.items()}, CLASSICAL_BEST: tuple(RULES.values())}
"""The rules each name tunes: none for zero (it never orders), one for a variant, every variant for classical-best (which
keeps the best on the training paths). policies.names.parse_policy reads a name's rules from here."""


def expected_shortfall(mean, sd, position):
    """E[(D - x)^+] for D ~ Normal(mean, sd^2) at x = position (the normal loss function), elementwise."""
    sd = sd.clamp_min(1e-9)
    u = (position - mean) / sd
    return sd * (torch.exp(-0.5 * u * u) / math.sqrt(2 * math.pi) - u * torch.special.ndtr(-u))


def economic_order_quantity(instance: TensorInstance) -> torch.Tensor:
    """EOQ_i = sqrt(2 (K / n) lam_i / h_i): [n]."""
    return torch.sqrt(2 * (instance.K / instance.n) * instance.lam / instance.h)


def _raise_to(level, position, qbar):
    return torch.minimum(torch.clamp_min(level - position, 0.0), qbar)


@dataclass
class ClassicalPolicy:
    """A classical family with parameters per batch row (tensors [B], or [1] to broadcast)."""

    family: str
    factor_aware: bool
    params: dict[str, torch.Tensor]
    moments: DemandMoments
    clock: int = field(default=0, init=False)

    def reset(self) -> None:
        """Restart the review clock of the periodic family (called by the evaluator per rollout)."""
        self.clock = 0

    def __call__(self, state: State, instance: TensorInstance):
        position = state.inventory_position()  # [B, n]
        lead = instance.lead.long()[None, :]  # [1, n]
        p = self.params
        cover = p["period"] if self.family == "periodic" else p["cover"]
        # the order-up-to level's periods, and the protection interval L_i + 1 of the reorder level and the cost trigger
        (cover_mean, cover_sd), (mean, sd) = self.moments.over(
            state.factor if self.factor_aware else None, state.batch, lead + cover.long()[:, None], lead + 1
        )
        up_to = cover_mean + p["order_up_to_z"][:, None] * cover_sd + p["cycle_stock"][:, None] * economic_order_quantity(instance)
        quantity = _raise_to(up_to, position, instance.qbar)
        if self.family == "periodic":
            due = (self.clock % p["period"].long()) == 0
            self.clock += 1
            return (due & (position < up_to).any(-1)).to(position.dtype), quantity
        if self.family == "cost-trigger":
            backlog_cost = (instance.b * expected_shortfall(mean, sd, position)).sum(-1)
            return (backlog_cost >= p["theta"] * instance.K).to(position.dtype), quantity
        below = position < mean + p["reorder_z"][:, None] * sd
        if self.family == "fraction-trigger":
            open_order = below.any(-1) & (below.to(position.dtype).mean(-1) >= p["trigger_fraction"])
        else:
            open_order = below.any(-1)
        if self.family == "can-order":
            reorder = mean + p["reorder_z"][:, None] * sd
            quantity = quantity * (position < reorder + p["can_order_fraction"][:, None] * (up_to - reorder))
        return open_order.to(position.dtype), quantity


def zero_policy(state: State, instance: TensorInstance):
    """Never order: Y = 0, Q = 0."""
    return (
        torch.zeros(state.batch, device=state.inv.device, dtype=state.inv.dtype),
        torch.zeros_like(state.inv),
    )


def make_policy(instance: TensorInstance, rule: Rule, params: dict[str, float]) -> ClassicalPolicy:
    """A single-parameter-set policy, e.g. from tuned parameters."""
    expected = set(FAMILIES[rule.family])
    if set(params) != expected:
        raise ValueError(f"{rule.name} parameters: expected {sorted(expected)}, got {sorted(params)}")
    tensors = {k: torch.tensor([float(v)], device=instance.device, dtype=instance.dtype) for k, v in params.items()}
    return ClassicalPolicy(rule.family, rule.aware, tensors, DemandMoments(instance, LMAX + MAX_COVER))


def policy_from_parameters(instance: TensorInstance, parameters: dict) -> ClassicalPolicy:
    """The policy of a summary's `parameters` ({"family": the variant's name, each tuned parameter, tuning figures...}),
    as written by `tuned_policy`."""
    name = parameters["family"]
    if name not in RULES:
        raise ValueError(f"parameters' family: expected one of {list(VARIANTS)}, got {name!r}")
    rule = RULES[name]
    return make_policy(instance, rule, {k: parameters[k] for k in FAMILIES[rule.family]})


@dataclass(frozen=True)
class TunedPolicy:
    name: str
    params: dict[str, float]
    tuning_mean: float
    tuning_se: float
    candidates: int
    """Parameter sets simulated: the coarse grid and the refinement's."""
    seconds: float


class _Simulator:
    """Mean discounted costs of candidate parameter sets of one variant on fixed training paths (common
    random numbers), simulated in batched chunks of at most `max_elements` item-rollouts."""

    def __init__(
        self,
        instance: Instance,
        rule: Rule,
        episodes: int,
        horizon: int,
        seed: int,
        device,
        max_elements: int,
        clock: TuningClock | None = None,
    ):
        self.family, self.aware = rule.family, rule.aware
        self.clock = clock
        self.names = list(FAMILIES[self.family])
        self.tinst = instance.to_torch(device)
        self.paths = sample_paths(instance, seed, episodes, horizon, device)
        self.moments = DemandMoments(self.tinst, LMAX + MAX_COVER)
        self.episodes = episodes
        self.chunk = max(1, max_elements // (episodes * instance.n))
        self.evaluated = 0

    @torch.no_grad()
    def costs(self, candidates: list[tuple[float, ...]], bar: tqdm | None = None) -> np.ndarray:
        """Per-episode discounted costs [C, episodes] of each candidate; `bar` counts the candidates simulated."""
        out = []
        for start in range(0, len(candidates), self.chunk):
            started = time.perf_counter()
            block = candidates[start : start + self.chunk]
            values = torch.tensor(block, device=self.tinst.device, dtype=self.tinst.dtype)  # [C, P]
            params = {k: values[:, i].repeat_interleave(self.episodes) for i, k in enumerate(self.names)}
            policy = ClassicalPolicy(self.family, self.aware, params, self.moments)
            total = rollout_costs(policy, self.tinst, self.paths.factor, self.paths.demand, repeats=len(block))
            out.append(total.view(len(block), self.episodes).cpu().numpy())
            if bar is not None:
                bar.update(len(block))
            if self.clock is not None:
                self.clock.timed(len(block), time.perf_counter() - started)
        self.evaluated += len(candidates)
        return np.concatenate(out)


def _neighbours(point: tuple[float, ...], steps: list[float], spec: list[Parameter]) -> list[tuple[float, ...]]:
    """The pattern search's moves: each parameter one step up and down (integers by 1), within bounds."""
    moves = []
    for i, (x, step, p) in enumerate(zip(point, steps, spec)):
        if step == 0:
            continue
        for sign in (-1, 1):
            y = x * math.exp(sign * step) if p.scale == "log" else x + sign * step
            y = min(max(y, p.low), p.high)
            if y != x:
                moves.append(point[:i] + (y,) + point[i + 1 :])
    return moves


def refine(
    simulate, start: tuple[float, ...], start_costs: np.ndarray, spec: list[Parameter], rounds: int = REFINE_ROUNDS, halvings: int = 3
):
    """Pattern search from the grid's best point: simulate every one-step move at once; move to the best if it
    is cheaper, else halve the steps (integer steps stay 1 and stop after their first failure) until each has
    been halved `halvings` times or `rounds` batches ran. Returns (point, its per-episode costs)."""
    steps = [p.step for p in spec]
    halved = 0
    point, costs = start, start_costs
    for _ in range(rounds):
        moves = _neighbours(point, steps, spec)
        if not moves:
            break
        trial = simulate(moves)
        best = int(np.argmin(trial.mean(1)))
        if trial[best].mean() < costs.mean():
            point, costs = moves[best], trial[best]
            continue
        halved += 1
        if halved > halvings:
            break
        steps = [0 if p.scale == "integer" else s / 2 for s, p in zip(steps, spec)]
    return point, costs


def tuning_candidates(rule: Rule, refinement: bool = True) -> tuple[int, int]:
    """(fewest, most) parameter sets `tune_family` simulates for `rule`: its coarse grid, and the grid
    plus what REFINE_STARTS pattern searches can add (REFINE_ROUNDS batches of at most two moves per parameter)."""
    spec = FAMILIES[rule.family].values()
    grid = math.prod(len(p.grid) for p in spec)
    return grid, grid + (REFINE_STARTS * REFINE_ROUNDS * 2 * len(spec) if refinement else 0)


class TuningClock:
    """Times the first simulated chunk of a tuning and, when the tuning's most candidates at that pace would take more
    than LONG_TUNING seconds, prints the estimate once (the progress bars then show each variant's progress)."""

    def __init__(self, what: str, rules: tuple[Rule, ...], instance: Instance, episodes: int, horizon: int, refinement: bool = True):
        counts = [tuning_candidates(rule, refinement) for rule in rules]
        self.fewest, self.most = sum(c[0] for c in counts), sum(c[1] for c in counts)
        self.what = (
            f"tuning {what}: {self.fewest} to {self.most} candidate simulations of {episodes} episodes x {horizon} steps "
            f"x {instance.n} items"
        )
        self.message: str | None = None

    def timed(self, candidates: int, seconds: float) -> None:
        if self.message is not None:
            return
        per = seconds / candidates
        self.message = (
            f"{self.what}; the first took {per:.3g} s each, so about {_duration(self.fewest * per)} to "
            f"{_duration(self.most * per)} on this machine"
        )
        if self.most * per > LONG_TUNING:
            tqdm.write(self.message, file=sys.stderr)


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} hours" if seconds >= 3600 else f"{seconds / 60:.1f} minutes" if seconds >= 60 else f"{seconds:.0f} s"


def tune_family(
    instance: Instance,
    rule: Rule,
    episodes: int = TUNING_EPISODES,
    horizon: int = 50,
    seed: int = TUNING_SEED,
    device: str | torch.device = "cpu",
    max_elements: int = 1 << 23,
    progress: bool = False,
    refinement: bool = True,
    clock: TuningClock | None = None,
) -> TunedPolicy:
    """Tune one variant on `episodes` training paths: every parameter set of the family's coarse grid is
    simulated on the same paths (common random numbers) in batched chunks, then `refine` searches from
    each of the REFINE_STARTS best; the lowest mean discounted cost wins. `clock` times the simulations; the
    progress bar counts them, grid and search alike, against the most the search may add (tuning_candidates)."""
    if seed == HELDOUT_SEED:
        raise ValueError(f"tuning seed: must differ from the held-out seed {HELDOUT_SEED}")
    started = time.perf_counter()
    sim = _Simulator(instance, rule, episodes, horizon, seed, device, max_elements, clock)
    spec = list(FAMILIES[sim.family].values())
    grid = [tuple(float(v) for v in c) for c in itertools.product(*(p.grid for p in spec))]
    most = tuning_candidates(rule, refinement)[1]
    with tqdm(total=most, desc=f"tune {rule.name}", unit="sim", disable=not progress, leave=False) as bar:
        grid_costs = sim.costs(grid, bar)  # [C, episodes]
        ranked = np.argsort(grid_costs.mean(1), kind="stable")[: REFINE_STARTS if refinement else 1]
        found = [(grid[i], grid_costs[i]) for i in ranked]
        if refinement:  # from the best few grid points: the grid's best may sit in a worse basin
            found = [refine(lambda moves: sim.costs(moves, bar), point, costs, spec) for point, costs in found]
        bar.total = sim.evaluated  # the search stopped before its most
        bar.refresh()
    point, costs = min(found, key=lambda f: f[1].mean())
    return TunedPolicy(
        name=rule.name,
        params=dict(zip(sim.names, point)),
        tuning_mean=float(costs.mean()),
        tuning_se=standard_error(costs),
        candidates=sim.evaluated,
        seconds=time.perf_counter() - started,
    )


def tune_all(instance: Instance, rules: tuple[Rule, ...], progress: bool = False, **kwargs) -> list[TunedPolicy]:
    """Tune each of `rules`, in that order."""
    return [tune_family(instance, rule, progress=progress, **kwargs) for rule in tqdm(rules, desc="tune classical", disable=not progress)]


def best_of(tuned: list[TunedPolicy]) -> TunedPolicy:
    """The practitioner's reference: the tuned family with the lowest cost on the training paths."""
    return min(tuned, key=lambda t: t.tuning_mean)


def tuned_as_policy(instance: Instance, tuned: TunedPolicy, seconds: float, device="cpu"):
    """(policy, parameters for the summary): the family, its tuned parameters, the tuning cost and `seconds`
    spent tuning (policy_from_parameters reads them back)."""
    parameters = {
        "family": tuned.name,
        **tuned.params,
        "tuning_mean": tuned.tuning_mean,
        "tuning_se": tuned.tuning_se,
        "tuning_seconds": round(seconds, 2),
    }
    return make_policy(instance.to_torch(device), RULES[tuned.name], tuned.params), parameters


def classical_best(instance: Instance, every: list[TunedPolicy], device="cpu"):
    """classical-best as (policy, parameters) from every tuned variant: the best on the training paths
    (best_of), with the seconds spent tuning all of them."""
    return tuned_as_policy(instance, best_of(every), sum(t.seconds for t in every), device)


def tuned_policy(instance: Instance, name: str, rules: tuple[Rule, ...], horizon: int, device="cpu", progress: bool = False, **tune_kwargs):
    """(policy, parameters for the summary) of the policy `name` that tunes `rules` (RULES_OF[name]): never ordering for
    none (zero), the tuned rule for one, the best on the training paths for several (classical_best). Rules are tuned on
    training paths (TUNING_SEED) at the evaluation horizon. With `progress`, a tuning that may take longer than
    LONG_TUNING prints its time estimate (TuningClock), then progress bars."""
    if not rules:
        return zero_policy, {}
    if progress:
        episodes, refinement = tune_kwargs.get("episodes", TUNING_EPISODES), tune_kwargs.get("refinement", True)
        tune_kwargs["clock"] = TuningClock(name, rules, instance, episodes, horizon, refinement)
    if len(rules) > 1:
        return classical_best(instance, tune_all(instance, rules, horizon=horizon, device=device, progress=progress, **tune_kwargs), device)
    tuned = tune_family(instance, rules[0], horizon=horizon, device=device, progress=progress, **tune_kwargs)
    return tuned_as_policy(instance, tuned, tuned.seconds, device)
