"""The random streams of a run's B training rollouts, drawn for the whole batch: why W data-parallel workers
give the curve of one process (trainers.pathwise).

Rollout b's draws must depend on (seed, b) only, not on the number of workers W. The factor's draws are
positional, but torch.poisson's use of the generator depends on every rate it is given, so a worker holding
the rows `rows` of the batch still draws every step for all B rollouts from the common stream and keeps its
rows (`exogenous_step`); the factor path is exogenous, so it can. The open decisions' uniforms are drawn the
same way (trainers.pathwise.rollout). Each stream has its own seed (`stream_seed`), so the warm start's
teacher rollouts leave the paper phase's draws as they are without one.
"""

from __future__ import annotations

import torch

from envs.exogenous import FactorDemandStream

PAPER_STREAM = 0
"""The paper phase's exogenous stream (trainers.pathwise)."""
OPEN_UNIFORMS = 7919
"""The paper phase's uniforms U of the open decisions Y = 1{U < p}."""
TEACHER_STREAM = 104_729
"""The warm start's teacher rollouts (trainers.imitation)."""


def stream_seed(seed: int, stream: int) -> int:
    """The seed of a run's stream (PAPER_STREAM, OPEN_UNIFORMS, TEACHER_STREAM) for the run's config seed."""
    return seed * 1_000_003 + stream


def exogenous_step(stream: FactorDemandStream, factor: torch.Tensor, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """One exogenous step from F_t of the whole batch (`factor`, [B]), eqs. (conditional_demand) and
    (factor_process): this worker's rows of the demand D_t ([b, n]) and F_{t+1} of the whole batch ([B])."""
    demand = stream.demand(factor)[rows]
    return demand, stream.next_factor(factor)
