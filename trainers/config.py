"""What every training run's typed config shares: dict round trips with unknown keys refused, a check
of every field's type and range with one clear error (`ConfigError`), and the divergence rule.

Numbers: an integer field takes an int (not a bool, not a float); a real field takes an int or a float
(not a bool), finite and in its range. A string is never a number, with one exception for YAML: YAML 1.1
(yaml.safe_load) reads `3e-4`, without a dot, as the string "3e-4", so a real field also takes a string
that is a plain decimal or scientific literal ("3e-4", "0.5", "1E3") and converts it."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields
from typing import Any, Optional

from envs.errors import InputError

NUMBER_LITERAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
"""The strings a real field accepts (YAML 1.1 reads `3e-4` as a string); not 'nan', 'inf' or '1_000'."""


class ConfigError(InputError):
    """A config field (or a config as a whole) is not allowed; the message names the field and the allowed values."""


class RunConfig:
    """Mixin for frozen dataclass configs."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        if not isinstance(data, dict):
            raise ConfigError(f"config: expected a mapping of config fields, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(map(str, data)) - known)
        if unknown:
            raise ConfigError(f"config: unknown fields {unknown}; allowed fields are {sorted(known)}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def require_int(self, name: str, low: int, high: Optional[int] = None) -> None:
        """Field `name` is an int in [low, high] (no upper limit without `high`)."""
        value = getattr(self, name)
        allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
            raise ConfigError(f"config field '{name}': expected {allowed}, got {value!r}")

    def require_real(self, name: str, low: float, high: float = math.inf, low_open: bool = False) -> None:
        """Field `name` is a finite real number in [low, high] ((low, high] with `low_open`); stores it as a float."""
        value = getattr(self, name)
        allowed = f"a number {'>' if low_open else '>='} {low:g}" + ("" if high == math.inf else f" and <= {high:g}")
        if isinstance(value, str) and NUMBER_LITERAL.fullmatch(value.strip()):
            value = float(value)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(f"config field '{name}': expected {allowed}, got {value!r}")
        value = float(value)
        if not math.isfinite(value) or value < low or (low_open and value == low) or value > high:
            raise ConfigError(f"config field '{name}': expected {allowed}, got {value!r}")
        object.__setattr__(self, name, value)

    def require_choice(self, name: str, allowed) -> None:
        value = getattr(self, name)
        if not isinstance(value, str) or value not in allowed:
            raise ConfigError(f"config field '{name}': expected one of {list(allowed)}, got {value!r}")


SEED_LIMIT = 2**32 - 1
"""Seeds are in [0, 2^32 - 1] (numpy's and gymnasium's range)."""


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
    """lambda_GAE, in [0, 1]."""
    learning_rate: float = 3e-4
    """(Peak) learning rate, > 0."""
    grad_clip: float = 5.0
    """Gradient-norm clip, > 0."""
    divergence_cost: float = 1e3
    """A run diverges when its mean normalised step cost exceeds this (> 0) or a loss is not finite."""
    seed: int = 0
    """In [0, 2^32 - 1]."""
    device: str = "cpu"
    """cpu, cuda or cuda:K (whether it exists here is checked where the run starts, not in the config)."""

    def check_shared_fields(self) -> None:
        for name in ("batch", "rollout", "updates", "blocks", "width", "heads", "feed_forward", "hidden"):
            self.require_int(name, 1)
        if self.width % self.heads:
            raise ConfigError(f"config field 'heads': must divide width {self.width}, got {self.heads}")
        self.require_real("gae_lambda", 0, 1)
        for name in ("learning_rate", "grad_clip", "divergence_cost"):
            self.require_real(name, 0, low_open=True)
        self.require_int("seed", 0, SEED_LIMIT)
        if not isinstance(self.device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"config field 'device': expected cpu, cuda or cuda:K, got {self.device!r}")


def divergence_reason(metrics: dict[str, float], c_ref: float, gamma: float, rollout: int, threshold: float) -> Optional[str]:
    """A run has diverged when a metric is not finite or the mean normalised step cost of the update's
    rollouts (cost10 / c_ref / sum_{t<T} gamma^t) exceeds `threshold`; returns the reason or None."""
    if not all(math.isfinite(v) for v in metrics.values()):
        return "non-finite loss or cost"
    mean_step = metrics["cost10"] / c_ref / sum(gamma**t for t in range(rollout))
    if mean_step > threshold:
        return f"mean normalised step cost {mean_step:.3g} exceeds {threshold:g}"
    return None
