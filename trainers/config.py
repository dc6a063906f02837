"""What every training run's typed config shares: dict round trips with unknown keys refused, a check
of every field's type and range with one clear error (`ConfigError`, by the validators of plumbing.validate:
a real field also takes YAML's string "3e-4"), and the divergence rule."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields
from enum import StrEnum
from typing import Any

from plumbing import validate
from plumbing.errors import InputError


class ConfigError(InputError):
    """A config field (or a config as a whole) is not allowed; the message names the field and the allowed values."""


class RunConfig:
    """Mixin for frozen dataclass configs."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        if not isinstance(data, dict):
            raise ConfigError(f"config: expected a mapping of config fields, got {type(data).__name__}")
        validate.keys(data, "config", {f.name for f in fields(cls)}, error=ConfigError)
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def require_int(self, name: str, low: int, high: int | None = None, why: str = "") -> None:
        """Field `name` is an int in [low, high] (no upper limit without `high`; `why` says why `high`)."""
        validate.integer(getattr(self, name), f"config field '{name}'", low, high, why=why, error=ConfigError)

    def require_real(self, name: str, low: float, high: float = math.inf, low_open: bool = False) -> None:
        """Field `name` is a finite real number in [low, high] ((low, high] with `low_open`); stores it as a float."""
        value = validate.real(getattr(self, name), f"config field '{name}'", low, high, low_open=low_open, error=ConfigError)
        object.__setattr__(self, name, value)

    def require_choice(self, name: str, allowed) -> None:
        validate.choice(getattr(self, name), f"config field '{name}'", allowed, error=ConfigError)

    def require_bool(self, name: str) -> None:
        validate.boolean(getattr(self, name), f"config field '{name}'", error=ConfigError)


BATCH_MAX = 65_536
BATCH_WHY = (
    "memory: a pathwise update keeps B x n x d activations of every block and step for its backward pass, "
    "at B = 65,536, n = 16, d = 128 already 0.5 GB each"
)
WIDTH_MAX = 4_096
WIDTH_WHY = (
    "memory: the weights grow as d^2; at d = 4,096 every block of the three networks holds 0.2 billion "
    "(3.2 GB with gradients and Adam's moments)"
)
LAYER_MAX = 16_384
LAYER_WHY = (
    "memory: a layer of this width holds width^2 (perceptrons) or d x width (feed-forward) weights; at 16,384 the "
    "three perceptrons hold 0.8 billion (13 GB with gradients and Adam's moments)"
)


class MethodName(StrEnum):
    """The learned methods (trainers.registry.METHODS holds what each is): a config's `method` is compared with these,
    never with its text."""

    OR_TRANSFORMER = "or-transformer"
    HPO = "hpo"
    PPO = "ppo"
    TRANSFORMER_PPO = "transformer-ppo"


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
    """In [0, 2^31 - 1] (plumbing.validate.SEED_MAX)."""
    device: str = "cpu"
    """cpu, cuda or cuda:K (whether it exists here is checked where the run starts, not in the config)."""

    @classmethod
    def memory_fields(cls) -> tuple[str, ...]:
        """Fields that change how much memory or time a run takes, not its result (to float rounding): a resume may
        change them."""
        return ()

    def check_shared_fields(self) -> None:
        for name in ("updates", "blocks", "heads"):
            self.require_int(name, 1)
        self.require_int("batch", 1, BATCH_MAX, BATCH_WHY)
        self.require_int("rollout", 1, validate.HORIZON_MAX, validate.HORIZON_WHY)
        self.require_int("width", 1, WIDTH_MAX, WIDTH_WHY)
        for name in ("feed_forward", "hidden"):
            self.require_int(name, 1, LAYER_MAX, LAYER_WHY)
        if self.width % self.heads:
            raise ConfigError(f"config field 'heads': must divide width {self.width}, got {self.heads}")
        self.require_real("gae_lambda", 0, 1)
        for name in ("learning_rate", "grad_clip", "divergence_cost"):
            self.require_real(name, 0, low_open=True)
        validate.seed(self.seed, "config field 'seed'", error=ConfigError)
        if not isinstance(self.device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise validate.refuse("config field 'device'", "cpu, cuda or cuda:K", validate.describe(self.device), error=ConfigError)


def divergence_reason(metrics: dict[str, float], c_ref: float, gamma: float, rollout: int, threshold: float) -> str | None:
    """A run has diverged when a metric is not finite or the mean normalised step cost of the update's
    rollouts (cost10 / c_ref / sum_{t<T} gamma^t) exceeds `threshold`; returns the reason or None."""
    if not all(math.isfinite(v) for v in metrics.values()):
        return "non-finite loss or cost"
    mean_step = metrics["cost10"] / c_ref / sum(gamma**t for t in range(rollout))
    if mean_step > threshold:
        return f"mean normalised step cost {mean_step:.3g} exceeds {threshold:g}"
    return None
