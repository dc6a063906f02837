"""Classical replenishment policies and their tuning by batched simulation.

Families (each sees only s_t = (I, P, F; Theta) and, for periodic review, its own clock):

* zero        never order;
* base-stock  joint trigger: if any item's inventory position IP_i = I_i + sum_l P_{i,l} is below s_i,
              open an order and raise every item towards S_i;
* can-order   (s, c, S): if any item is below s_i, open an order and raise every item below its
              can-order level c_i towards S_i;
* periodic    (R, S): every R periods raise every item towards S_i.
Raising is Q_i = clip(S_i - IP_i, 0, qbar_i).

Levels come from the demand over the next p periods, D_t + ... + D_{t+p-1}, whose mean and standard
deviation are known in closed form under eqs. (factor_process)-(conditional_demand_rate):
level = mean + z * sd with global multipliers (z, cover periods, ...). The static variant uses the
stationary moments; the factor-aware variant ("-factor") conditions them on the observed F_t.
An order placed at t serves demand from t + L_i on, so the reorder level s covers p = L_i + 1
periods and the order-up-to level covers p = L_i + cover periods.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from envs.dynamics import State
from envs.evaluation import rollout_costs, standard_error
from envs.exogenous import HELDOUT_SEED, TUNING_SEED, sample_paths
from envs.instance import LMAX, Instance, TensorInstance

# Candidate grids of the global multipliers (the reorder trigger sits low: with many items some item
# is almost always below a high s_i, which would open an order every period).
REORDER_Z = (-2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0)
UP_TO_Z = (-0.5, 0.0, 0.5, 1.0, 1.5, 2.0)
COVER_GRID = (1, 2, 3, 4, 6)
FAMILIES: dict[str, dict[str, tuple]] = {
    "base-stock": {"reorder_z": REORDER_Z, "cover": COVER_GRID, "order_up_to_z": UP_TO_Z},
    "can-order": {"reorder_z": REORDER_Z, "can_order_fraction": (1 / 3, 2 / 3), "cover": COVER_GRID, "order_up_to_z": UP_TO_Z},
    "periodic": {"period": (1, 2, 3, 4, 6), "order_up_to_z": UP_TO_Z},
}
MAX_COVER = max(max(COVER_GRID), max(FAMILIES["periodic"]["period"]))
POLICY_NAMES = ("zero", *(f"{f}{s}" for f in FAMILIES for s in ("", "-factor")), "classical-best")


class DemandMoments:
    """Mean and variance of D_t + ... + D_{t+p-1} for p = 1..J, per item, given F_t or stationary.

    With A_j = E[F_{t+j}] and C_jk = Cov(F_{t+j}, F_{t+k}) (given F_t: A_j = rho^j F_t,
    C_jk = rho^|j-k| - rho^(j+k); stationary: A_j = 0, C_jk = rho^|j-k|), the rate multiplier
    m_j = E[exp(beta F_{t+j} - beta^2/2)] = exp(beta A_j + beta^2 (C_jj - 1) / 2) and
    Cov(rate_j, rate_k) = lam^2 m_j m_k (exp(beta^2 C_jk) - 1). A Poisson sum adds lam sum_j m_j.
    """

    def __init__(self, instance: TensorInstance, periods: int):
        self.instance = instance
        j = torch.arange(periods, device=instance.device, dtype=instance.dtype)
        self.rho_j = instance.rho**j  # [J]
        lag = (j[:, None] - j[None, :]).abs()
        stationary_cov = instance.rho**lag  # [J, J]
        conditional_cov = stationary_cov - instance.rho ** (j[:, None] + j[None, :])
        beta2 = (instance.beta**2)[:, None, None]  # [n, 1, 1]
        self._gain = {  # exp(beta^2 C) - 1: [n, J, J]
            aware: torch.expm1(beta2 * cov) for aware, cov in ((False, stationary_cov), (True, conditional_cov))
        }
        self._var_drift = {aware: torch.diagonal(cov) - 1 for aware, cov in ((False, stationary_cov), (True, conditional_cov))}
        self._stationary = self._cumulative(None)  # constant: computed once

    def cumulative(self, factor: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Cumulative mean and variance over p = 1..J periods: [B, n, J] each (B = 1 when factor is None)."""
        if factor is None:
            return self._stationary
        # Rows that share an episode share F_t (tuning runs many candidates per episode).
        distinct, row_of = torch.unique(factor, return_inverse=True)
        cum_mean, cum_var = self._cumulative(distinct)
        return cum_mean[row_of], cum_var[row_of]

    def _cumulative(self, factor: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        inst = self.instance
        aware = factor is not None
        mean_f = (factor[:, None] * self.rho_j) if aware else torch.zeros_like(self.rho_j)[None]  # [B, J]
        beta = inst.beta[None, :, None]  # [1, n, 1]
        m = torch.exp(beta * mean_f[:, None, :] + 0.5 * beta**2 * self._var_drift[aware])  # [B, n, J]
        gain = self._gain[aware]
        cross = torch.einsum("njk,bnk->bnj", torch.tril(gain, -1), m)  # sum_{k<j} G_jk m_k
        increment = inst.lam[None, :, None] * m + inst.lam[None, :, None] ** 2 * (
            2 * m * cross + m * m * torch.diagonal(gain, dim1=-2, dim2=-1)
        )
        return inst.lam[None, :, None] * m.cumsum(-1), increment.cumsum(-1)


def _level(cum_mean, cum_var, periods, z):
    """mean + z * sd of the demand over `periods` [B, n] (long, >= 1) periods."""
    rows = max(cum_mean.shape[0], periods.shape[0])
    idx = (periods - 1).expand(rows, -1)[..., None]
    mean = cum_mean.expand(rows, -1, -1).gather(-1, idx)[..., 0]
    sd = cum_var.expand(rows, -1, -1).gather(-1, idx)[..., 0].clamp_min(0).sqrt()
    return mean + z[:, None] * sd


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
        cum_mean, cum_var = self.moments.cumulative(state.factor if self.factor_aware else None)
        position = state.inventory_position()  # [B, n]
        lead = instance.lead.long()[None, :]  # [1, n]
        p = self.params
        if self.family == "periodic":
            period = p["period"].long()
            up_to = _level(cum_mean, cum_var, lead + period[:, None], p["order_up_to_z"])
            due = (self.clock % period) == 0
            self.clock += 1
            quantity = _raise_to(up_to, position, instance.qbar)
            open_order = (due & (position < up_to).any(-1)).to(position.dtype)
            return open_order, quantity
        reorder = _level(cum_mean, cum_var, lead + 1, p["reorder_z"])
        up_to = _level(cum_mean, cum_var, lead + p["cover"].long()[:, None], p["order_up_to_z"])
        open_order = (position < reorder).any(-1).to(position.dtype)
        quantity = _raise_to(up_to, position, instance.qbar)
        if self.family == "can-order":
            can_order = reorder + p["can_order_fraction"][:, None] * (up_to - reorder)
            quantity = quantity * (position < can_order)
        return open_order, quantity


def zero_policy(state: State, instance: TensorInstance):
    """Never order: Y = 0, Q = 0."""
    return (
        torch.zeros(state.batch, device=state.inv.device, dtype=state.inv.dtype),
        torch.zeros_like(state.inv),
    )


def parse_policy_name(name: str) -> tuple[str, bool]:
    if name not in POLICY_NAMES:
        raise ValueError(f"policy: expected one of {list(POLICY_NAMES)}, got '{name}'")
    return name.removesuffix("-factor"), name.endswith("-factor")


def make_policy(instance: TensorInstance, name: str, params: dict[str, float]) -> ClassicalPolicy:
    """A single-parameter-set policy, e.g. from tuned parameters."""
    family, aware = parse_policy_name(name)
    expected = set(FAMILIES[family])
    if set(params) != expected:
        raise ValueError(f"{name} parameters: expected {sorted(expected)}, got {sorted(params)}")
    tensors = {k: torch.tensor([float(v)], device=instance.device, dtype=instance.dtype) for k, v in params.items()}
    return ClassicalPolicy(family, aware, tensors, DemandMoments(instance, LMAX + MAX_COVER))


@dataclass(frozen=True)
class TunedPolicy:
    name: str
    params: dict[str, float]
    tuning_mean: float
    tuning_se: float
    candidates: int


def tune_family(
    instance: Instance,
    name: str,
    episodes: int = 64,
    horizon: int = 50,
    seed: int = TUNING_SEED,
    device: str | torch.device = "cpu",
    max_elements: int = 1 << 23,
    progress: bool = False,
) -> TunedPolicy:
    """Grid-search one family on `episodes` training paths: every candidate parameter set is
    simulated on the same paths (common random numbers) in batched chunks; the lowest mean
    discounted cost wins."""
    if seed == HELDOUT_SEED:
        raise ValueError(f"tuning seed: must differ from the held-out seed {HELDOUT_SEED}")
    family, aware = parse_policy_name(name)
    tinst = instance.to_torch(device)
    paths = sample_paths(instance, seed, episodes, horizon, device)
    grid = FAMILIES[family]
    candidates = list(itertools.product(*grid.values()))
    moments = DemandMoments(tinst, LMAX + MAX_COVER)
    chunk = max(1, max_elements // (episodes * instance.n))
    costs = []
    with torch.no_grad():
        for start in tqdm(range(0, len(candidates), chunk), desc=f"tune {name}", disable=not progress, leave=False):
            block = candidates[start : start + chunk]
            values = torch.tensor(block, device=device, dtype=tinst.dtype)  # [C, P]
            params = {k: values[:, i].repeat_interleave(episodes) for i, k in enumerate(grid)}
            policy = ClassicalPolicy(family, aware, params, moments)
            c = len(block)
            total = rollout_costs(policy, tinst, paths.factor, paths.demand, repeats=c)
            costs.append(total.view(c, episodes).cpu().numpy())
    costs = np.concatenate(costs)
    best = int(np.argmin(costs.mean(1)))
    return TunedPolicy(
        name=name,
        params={k: float(v) for k, v in zip(grid, candidates[best])},
        tuning_mean=float(costs[best].mean()),
        tuning_se=standard_error(costs[best]),
        candidates=len(candidates),
    )


def tune_all(instance: Instance, progress: bool = False, **kwargs) -> list[TunedPolicy]:
    """Tune every family, static and factor-aware, in the order of POLICY_NAMES."""
    names = [n for n in POLICY_NAMES if n not in ("zero", "classical-best")]
    return [tune_family(instance, n, progress=progress, **kwargs) for n in tqdm(names, desc="tune classical", disable=not progress)]


def best_of(tuned: list[TunedPolicy]) -> TunedPolicy:
    """The practitioner's reference: the tuned family with the lowest cost on the training paths."""
    return min(tuned, key=lambda t: t.tuning_mean)


def tuned_policy(instance: Instance, name: str, horizon: int, device="cpu", progress: bool = False, **tune_kwargs):
    """Resolve a policy name (see POLICY_NAMES) to (policy, parameters for the summary).

    Classical families are tuned first on training paths (TUNING_SEED) with the evaluation horizon;
    `classical-best` tunes every family and keeps the best on those paths.
    """
    tinst = instance.to_torch(device)
    if name == "zero":
        return zero_policy, {}
    if name == "classical-best":
        tuned = best_of(tune_all(instance, horizon=horizon, device=device, progress=progress, **tune_kwargs))
    else:
        tuned = tune_family(instance, name, horizon=horizon, device=device, progress=progress, **tune_kwargs)
    parameters = {"family": tuned.name, **tuned.params, "tuning_mean": tuned.tuning_mean, "tuning_se": tuned.tuning_se}
    return make_policy(tinst, tuned.name, tuned.params), parameters
