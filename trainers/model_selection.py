"""Validation while training, and the best network: what a run keeps so that more training never leaves it with a
worse policy than one it passed through.

At update 0 (the network a run starts from: the warm start's, a fine-tune's initial weights, or a fresh one),
every `validate_every` updates and at the last update, the greedy policy is scored on the validation set: its
mean discounted cost on `validation_episodes` paths of `validation_horizon` steps drawn with
envs.exogenous.VALIDATION_SEED, a seed of their own (never the held-out set, the classical rules' tuning paths or
a training stream), the same for every run on the instance, so that seeds and settings are compared on the same
paths. The network kept beside the last (in the trainer's checkpoint state and as the run folder's best.pt,
trainers.run_folder, which `checkpoint:RUN` evaluates) is the first scored one until a later network beats it on the same
paths: its per-episode costs minus the kept network's have a mean below -`validation_margin` standard errors of that
mean (`beats`). With margin 0 that is the lowest score (the earlier one on a tie); with a margin a network whose lead is
within the validation's noise does not replace the warm start it came from: at n = 16 the paper phase's networks
differ from their warm start by less than the noise of 64 paths, and the lowest of a dozen such scores is the one
whose paths happened to favour it (docs/experiments.md, "The selected student")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from envs.evaluation import evaluate, paired_comparison
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


def beats(costs: np.ndarray, kept: np.ndarray | None, kept_mean: float, margin: float) -> bool:
    """Whether a network whose per-episode validation costs are `costs` replaces the kept one (`kept`, its costs on
    the same paths; None in a checkpoint made before they were kept: then its mean `kept_mean` alone): the mean of
    costs - kept is below -margin times its standard error (strictly below 0 at margin 0)."""
    if kept is None:
        return float(np.mean(costs)) < kept_mean
    difference = paired_comparison(costs, kept)
    return difference.mean_difference < -margin * difference.se


@dataclass
class Best:
    """The kept network: its update, score, per-episode validation costs and weights (CPU copies)."""

    score: Score
    model: dict[str, torch.Tensor]
    costs: np.ndarray | None

    def state(self) -> dict[str, Any]:
        costs = None if self.costs is None else torch.from_numpy(self.costs)  # a checkpoint holds tensors, not arrays
        return {"update": self.score.update, "cost": self.score.cost, "se": self.score.se, "model": self.model, "costs": costs}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Best:
        costs = state.get("costs")  # absent from checkpoints made before the costs were kept
        score = Score(int(state["update"]), float(state["cost"]), float(state["se"]))
        return cls(score, state["model"], None if costs is None else costs.cpu().numpy())


class Validation:
    """The validation set of one run (paths of VALIDATION_SEED on `instance`, on `device`), the scores so far and
    the best network."""

    def __init__(self, instance: Instance, episodes: int, horizon: int, device: torch.device | str, margin: float = 0.0):
        self.instance = instance.to_torch(device)
        self.margin = margin
        self.paths = sample_paths(instance, VALIDATION_SEED, episodes, horizon, device)
        self.scores: list[Score] = []
        self.best: Best | None = None

    def scored(self, update: int) -> bool:
        return any(s.update == update for s in self.scores)

    def score(self, model: ThreeNetworks, update: int) -> Score:
        """Score `model` (the network of `update`) and keep it when it is the first or `beats` the kept one; the model
        is left in training mode."""
        try:
            costs = evaluate(LearnedPolicy(model, "greedy"), self.instance, self.paths)
        finally:
            model.train()
        score = Score(update, costs.mean, costs.se)
        self.scores.append(score)
        if self.best is None or beats(costs.discounted_cost, self.best.costs, self.best.score.cost, self.margin):
            weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            self.best = Best(score, weights, np.asarray(costs.discounted_cost, np.float64))
        return score

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: every score and the best network."""
        return {"scores": [list(s) for s in self.scores], "best": self.best.state() if self.best else None}

    def load_state(self, state: dict[str, Any]) -> None:
        self.scores = [Score(int(u), float(c), float(s)) for u, c, s in state["scores"]]
        self.best = Best.from_state(state["best"]) if state["best"] else None


SETTINGS = ("validate_every", "validation_episodes", "validation_horizon", "validation_margin")
"""The config fields of validation (trainers.pathwise_config.TrainConfig)."""


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
