"""What every training run's typed config shares: dict round trips with unknown keys refused,
field checks with one clear error, and the divergence rule."""

from __future__ import annotations

import math
from dataclasses import asdict, fields
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


def divergence_reason(metrics: dict[str, float], c_ref: float, gamma: float, rollout: int, threshold: float) -> Optional[str]:
    """A run has diverged when a metric is not finite or the mean normalised step cost of the update's
    rollouts (cost10 / c_ref / sum_{t<T} gamma^t) exceeds `threshold`; returns the reason or None."""
    if not all(math.isfinite(v) for v in metrics.values()):
        return "non-finite loss or cost"
    mean_step = metrics["cost10"] / c_ref / sum(gamma**t for t in range(rollout))
    if mean_step > threshold:
        return f"mean normalised step cost {mean_step:.3g} exceeds {threshold:g}"
    return None
