"""Validation while training, and the best network: what a run keeps so that more training never leaves it with a
worse policy than one it passed through.

At update 0 (the network a run starts from: the warm start's, a fine-tune's initial weights, or a fresh one),
every `validate_every` updates and at the last update, the greedy policy is scored on the validation set: its
mean discounted cost on `validation_episodes` paths of `validation_horizon` steps drawn with
envs.exogenous.VALIDATION_SEED, a seed of their own (never the held-out set, the classical rules' tuning paths or
a training stream), the same for every run on the instance, so that seeds and settings are compared on the same
paths. The network with the lowest score (the earlier one on a tie) is kept beside the last: in the trainer's
checkpoint state and as the run folder's best.pt (trainers.run), which `checkpoint:RUN` evaluates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from envs.evaluation import evaluate
from envs.exogenous import VALIDATION_SEED, sample_paths
from envs.instance import Instance
from trainers.networks import ThreeNetworks
from trainers.policy import LearnedPolicy


def due(update: int, every: int, updates: int) -> bool:
    """Whether the network of `update` is scored: never when `every` is 0, else at update 0, every `every` updates and
    at the run's last update `updates`."""
    return every > 0 and (update == 0 or update % every == 0 or update == updates)


class Score(NamedTuple):
    """The validation of one update's network: its mean discounted cost and that mean's standard error."""

    update: int
    cost: float
    se: float


@dataclass
class Best:
    """The network with the lowest validation cost so far: its update, score and weights (CPU copies)."""

    score: Score
    model: dict[str, torch.Tensor]

    def state(self) -> dict[str, Any]:
        return {"update": self.score.update, "cost": self.score.cost, "se": self.score.se, "model": self.model}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Best:
        return cls(Score(int(state["update"]), float(state["cost"]), float(state["se"])), state["model"])


class Validation:
    """The validation set of one run (paths of VALIDATION_SEED on `instance`, on `device`), the scores so far and
    the best network."""

    def __init__(self, instance: Instance, episodes: int, horizon: int, device: torch.device | str):
        self.instance = instance.to_torch(device)
        self.paths = sample_paths(instance, VALIDATION_SEED, episodes, horizon, device)
        self.scores: list[Score] = []
        self.best: Best | None = None

    def scored(self, update: int) -> bool:
        return any(s.update == update for s in self.scores)

    def score(self, model: ThreeNetworks, update: int) -> Score:
        """Score `model` (the network of `update`) and keep it when it is the best so far; the model is left in
        training mode."""
        try:
            costs = evaluate(LearnedPolicy(model, "greedy"), self.instance, self.paths)
        finally:
            model.train()
        score = Score(update, costs.mean, costs.se)
        self.scores.append(score)
        if self.best is None or score.cost < self.best.score.cost:
            self.best = Best(score, {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
        return score

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: every score and the best network."""
        return {"scores": [list(s) for s in self.scores], "best": self.best.state() if self.best else None}

    def load_state(self, state: dict[str, Any]) -> None:
        self.scores = [Score(int(u), float(c), float(s)) for u, c, s in state["scores"]]
        self.best = Best.from_state(state["best"]) if state["best"] else None


SETTINGS = ("validate_every", "validation_episodes", "validation_horizon")
"""The config fields of validation (trainers.pathwise.TrainConfig)."""


def validation_record(config, state: dict[str, Any]) -> dict[str, Any]:
    """training.json's `validation` from a checkpoint's validation state (`Validation.state`): the config's settings,
    the seed, every score and the best network's update and score."""
    best = state["best"]
    return {
        **{name: getattr(config, name) for name in SETTINGS},
        "seed": VALIDATION_SEED,
        "scores": [dict(zip(Score._fields, score)) for score in state["scores"]],
        "best": {name: best[name] for name in Score._fields} if best else None,
    }


def best_network_state(best: dict[str, Any]) -> dict[str, Any]:
    """best.pt's trainer state (trainers.checkpoint) from `Best.state`: the weights, their update and their score."""
    return {"model": best["model"], "update": best["update"], "network": "best", "validation": {"cost": best["cost"], "se": best["se"]}}
