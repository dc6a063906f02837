"""The rolling-horizon MILP controller (paper algorithm "Rolling-horizon MILP controller"): at every real
step, sample scenarios conditional on the observed state, build the MILP, solve it from the all-zero
warm start, execute only the root action; with no incumbent, execute zero.

One decision is a pure function of (instance, state, episode, decision, options), so it can run on
any worker and be retried: its scenarios come from a NumPy stream keyed by (seed, episode, decision).
It plans over H = plan_horizon steps even near the end of an episode (the plan is not truncated), so
it does not depend on the evaluation horizon.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from envs.dynamics import State
from envs.instance import Instance, TensorInstance
from plumbing import validate
from solver_workers.backends import SolverOptions, solve
from solver_workers.model import build_model, sample_scenarios

_SCENARIO_STREAM = 0x4D494C50


@dataclass(frozen=True)
class RollingOptions:
    """The controller's settings; defaults are the paper's (S = 100, H = 50, 0.5% gap, 600 s)."""

    scenarios: int = 100
    plan_horizon: int = 50
    solver: SolverOptions = SolverOptions()

    def __post_init__(self):
        validate.scenarios(self.scenarios, "scenarios")
        validate.horizon(self.plan_horizon, "plan_horizon")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide(
    instance: Instance,
    inventory: np.ndarray,
    in_transit: np.ndarray,
    factor: float | list[float],
    episode: int,
    decision: int,
    options: RollingOptions,
) -> dict[str, Any]:
    """One rolling-horizon decision from the state (I_t, P_t, F_t: a number at k = 1, else k numbers); returns its
    record (action and solver statistics)."""
    rng = np.random.default_rng([_SCENARIO_STREAM, options.solver.seed, episode, decision])
    start = time.perf_counter()
    demand = sample_scenarios(instance, factor, options.scenarios, options.plan_horizon, rng)
    model = build_model(instance, inventory, in_transit, demand)
    build_seconds = time.perf_counter() - start
    result = solve(model, options.solver)
    if result.has_incumbent:
        open_order, quantity = model.root_action(result.x, instance.qbar)
    else:
        open_order, quantity = 0, np.zeros(instance.n)
    rows, cols, nnz = model.shape
    return {
        "episode": int(episode),
        "decision": int(decision),
        "open": int(open_order),
        "quantity": [float(q) for q in quantity],
        "status": result.status,
        "solve_seconds": result.seconds,
        "build_seconds": build_seconds,
        "objective": result.objective,
        "bound": result.bound,
        "gap": result.gap,
        "time_limited": result.time_limited,
        "fallback": not result.has_incumbent,
        "rows": rows,
        "columns": cols,
        "nonzeros": nnz,
    }


class ReplayPolicy:
    """Executes recorded actions open [E, T], quantity [E, T, n] step by step, so recorded controller
    decisions are costed by the shared evaluator on the same paths."""

    def __init__(self, open_order: np.ndarray, quantity: np.ndarray):
        self.open_order, self.quantity = open_order, quantity
        self.t = 0

    def reset(self) -> None:
        self.t = 0

    def __call__(self, state: State, instance: TensorInstance):
        t = self.t
        self.t += 1
        as_tensor = lambda a: torch.as_tensor(a, device=state.inv.device, dtype=state.inv.dtype)  # noqa: E731
        return as_tensor(self.open_order[:, t]), as_tensor(self.quantity[:, t])
