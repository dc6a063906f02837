"""What every training run's typed config shares: dict round trips with unknown keys refused,
field checks with one clear error, and the divergence rule."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Optional


class RunConfig:
    """Mixin for frozen dataclass configs."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"config: unknown fields {unknown}; allowed fields are {sorted(known)}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def require_positive_ints(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"config field '{name}': expected an integer >= 1, got {value!r}")

    def require_choice(self, name: str, allowed) -> None:
        if getattr(self, name) not in allowed:
            raise ValueError(f"config field '{name}': expected one of {list(allowed)}, got '{getattr(self, name)}'")


@dataclass(frozen=True)
class TrainerConfig(RunConfig):
    """The fields every trainer shares: the unified sample budget (B rollouts x T_roll steps per update,
    N updates), the network sizes, the stop rule, the seed and the device. Defaults are the paper's (table
    "OR-Transformer architecture and training settings"). The discount is the instance's gamma, not a
    training setting."""

    batch: int = 1024
    """B: parallel rollouts (environments) per update."""
    rollout: int = 10
    """T_roll: steps per rollout; one update."""
    updates: int = 16_000
    """N_update: number of updates."""
    blocks: int = 4
    """M: pre-norm Transformer blocks per encoder."""
    width: int = 128
    """d: token width."""
    heads: int = 8
    """Attention heads (must divide the width)."""
    feed_forward: int = 512
    """Feed-forward width of each block."""
    hidden: int = 512
    """Hidden width of the perceptrons (HPO, PPO)."""
    gae_lambda: float = 0.96
    """lambda_GAE."""
    learning_rate: float = 3e-4
    """(Peak) learning rate."""
    grad_clip: float = 5.0
    """Gradient-norm clip."""
    divergence_cost: float = 1e3
    """A run diverges when its mean normalised step cost exceeds this (or a loss is not finite)."""
    seed: int = 0
    device: str = "cpu"

    def check_shared_fields(self) -> None:
        self.require_positive_ints("batch", "rollout", "updates", "blocks", "width", "heads", "feed_forward", "hidden")
        if self.width % self.heads:
            raise ValueError(f"config field 'heads': must divide width {self.width}, got {self.heads}")
        if not 0 <= self.gae_lambda <= 1:
            raise ValueError(f"config field 'gae_lambda': expected a value in [0, 1], got {self.gae_lambda}")
        for name in ("learning_rate", "grad_clip", "divergence_cost"):
            if not getattr(self, name) > 0:
                raise ValueError(f"config field '{name}': expected a value > 0, got {getattr(self, name)}")


def divergence_reason(metrics: dict[str, float], c_ref: float, gamma: float, rollout: int, threshold: float) -> Optional[str]:
    """A run has diverged when a metric is not finite or the mean normalised step cost of the update's
    rollouts (cost10 / c_ref / sum_{t<T} gamma^t) exceeds `threshold`; returns the reason or None."""
    if not all(math.isfinite(v) for v in metrics.values()):
        return "non-finite loss or cost"
    mean_step = metrics["cost10"] / c_ref / sum(gamma**t for t in range(rollout))
    if mean_step > threshold:
        return f"mean normalised step cost {mean_step:.3g} exceeds {threshold:g}"
    return None
