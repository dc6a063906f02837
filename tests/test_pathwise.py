"""The hybrid pathwise trainer: schedules, GAE, gradients, one update, tiny training, determinism."""

import math

import numpy as np
import pytest
import torch
from conftest import TINY

from envs.evaluation import evaluate
from envs.exogenous import sample_paths
from envs.instance import paper_instance
from trainers.pathwise import PathwiseTrainer, TrainConfig, entropy_weight, gae, learning_rate, losses, rollout
from trainers.policy import LearnedPolicy
from trainers.registry import method_config

RUN = {**TINY, "batch": 16, "rollout": 5, "hidden": 32, "warmup": 2, "updates": 10}


def test_learning_rate_and_entropy_schedules():
    cfg = TrainConfig(updates=140, warmup=40)
    assert learning_rate(cfg, 0) == pytest.approx(3e-4 / 40)
    assert learning_rate(cfg, 39) == pytest.approx(3e-4)
    assert learning_rate(cfg, 90) == pytest.approx(3e-5 + 0.5 * (3e-4 - 3e-5) * (1 + math.cos(math.pi * 0.5)))
    assert learning_rate(cfg, 140) == pytest.approx(3e-5)
    assert entropy_weight(cfg, 0) == pytest.approx(0.01) and entropy_weight(cfg, 139) == pytest.approx(0.001)


def test_gae_matches_a_slow_loop():
    rng = np.random.default_rng(0)
    cost, value, boot = rng.normal(size=(3, 6)), rng.normal(size=(3, 6)), rng.normal(size=3)
    adv, target = gae(torch.tensor(cost), torch.tensor(value), torch.tensor(boot), 0.95, 0.96)
    for e in range(3):
        v = list(value[e]) + [boot[e]]
        delta = [cost[e, t] + 0.95 * v[t + 1] - v[t] for t in range(6)]
        for t in range(6):
            expected = sum((0.95 * 0.96) ** m * delta[t + m] for m in range(6 - t))
            assert adv[e, t].item() == pytest.approx(expected)
            assert target[e, t].item() == pytest.approx(expected + value[e, t])


@pytest.mark.parametrize("method", ["or-transformer", "hpo"])
def test_pathwise_gradient_matches_finite_differences(method):
    """d L_PW / d c_Q (the quantity head's bias) through every step, feature and the frozen terminal value."""
    torch.manual_seed(0)
    cfg = TrainConfig(method=method, **RUN)
    inst = paper_instance(3, 0).to_torch(dtype=torch.float64)
    trainer = PathwiseTrainer(cfg, inst)
    trainer.model.double()
    for _ in range(3):  # move away from the initial state
        trainer.state = rollout(trainer.model, inst, trainer.state, trainer.stream, 5, trainer.generator).final_state.detach()
    head = trainer.model.quantity_net.head if method == "or-transformer" else trainer.model.quantity_net.net[-1]
    streams = (trainer.stream.generator.get_state(), trainer.generator.get_state())

    def pathwise_loss():
        trainer.stream.generator.set_state(streams[0]), trainer.generator.set_state(streams[1])
        ro = rollout(trainer.model, inst, trainer.state, trainer.stream, 5, trainer.generator)
        return losses(ro, inst.gamma, cfg, 0.0).pathwise, ro

    loss, ro = pathwise_loss()
    assert 0 < ro.open_order.mean() < 1
    grad = torch.autograd.grad(loss, head.bias)[0].sum().item()
    eps = 1e-6
    with torch.no_grad():
        head.bias += eps
        plus = pathwise_loss()[0].item()
        head.bias -= 2 * eps
        minus = pathwise_loss()[0].item()
        head.bias += eps
    assert grad == pytest.approx((plus - minus) / (2 * eps), rel=1e-4, abs=1e-8)
    assert abs(grad) > 1e-6


def test_one_update_lowers_the_loss_on_a_fixed_batch():
    torch.manual_seed(0)
    cfg = TrainConfig(**{**RUN, "warmup": 1, "learning_rate": 1e-3})
    inst = paper_instance(2, 0).to_torch()
    trainer = PathwiseTrainer(cfg, inst)
    streams = (trainer.stream.generator.get_state(), trainer.generator.get_state())
    state = trainer.state

    def loss_now():
        trainer.stream.generator.set_state(streams[0]), trainer.generator.set_state(streams[1])
        return losses(rollout(trainer.model, inst, state, trainer.stream, 5, trainer.generator), inst.gamma, cfg, 0.01).total

    before = loss_now().item()
    trainer.step()
    assert loss_now().item() < before


def test_same_seed_gives_the_same_curve_and_other_seeds_differ():
    inst = paper_instance(2, 0).to_torch()
    trainers = [PathwiseTrainer(TrainConfig(**RUN, seed=s), inst) for s in (3, 3, 4)]
    costs = [[t.step()["cost10"] for _ in range(3)] for t in trainers]
    assert costs[0] == costs[1] and costs[0] != costs[2]


BROKEN = {"or-transformer": "quantity_fraction", "hpo": "open_logit"}
"""Per method, the network output whose gradient the broken control of the tiny training drops (see the test)."""


def tiny_training_cost(method: str, instance, paths, broken: str | None = None) -> float:
    """The greedy policy's mean cost on `paths` after 120 updates at n = 1 (seed 0); with `broken`, that network
    output detached during training (its gradient lost)."""
    torch.manual_seed(0)
    inst = instance.to_torch()
    cfg = TrainConfig(
        method=method,
        batch=64,
        rollout=10,
        updates=120,
        blocks=1,
        width=32,
        heads=2,
        feed_forward=64,
        hidden=64,
        warmup=10,
        learning_rate=1e-3,
        final_learning_rate=1e-4,
    )
    trainer = PathwiseTrainer(cfg, inst)
    if broken is not None:
        output = getattr(trainer.model, broken)
        setattr(trainer.model, broken, lambda *args, **kwargs: output(*args, **kwargs).detach())
    for _ in range(cfg.updates):
        trainer.step()
    if broken is not None:
        delattr(trainer.model, broken)
    return evaluate(LearnedPolicy(trainer.model, "greedy"), inst, paths).mean


@pytest.mark.slow
@pytest.mark.parametrize("method", ["or-transformer", "hpo"])
def test_tiny_training_comes_close_to_classical_best(method, tuned):
    """120 updates at n = 1 bring the greedy policy close to tuned classical-best on the same 32 held-out paths,
    much closer than the same training with the gradient of one network output dropped (its broken control, in
    the same test, so the margin belongs to the method, not to one float32 trajectory): measured on this
    project's machine 1.004 x classical-best's cost for OR-Transformer against 1.061 x with the quantity head's
    output detached, and 1.102 x for HPO against 23 x with the opening head's output detached. The honest run
    must close at least half of the broken control's distance to classical-best. (HPO learns mostly the opening
    in 120 updates; the pathwise gradient itself is checked by finite differences above.)"""
    instance = paper_instance(1, 0)
    paths = sample_paths(instance, 99, 32, 50)
    classical_best = evaluate(tuned(instance, "classical-best", 50)[0], instance.to_torch(), paths).mean
    honest = tiny_training_cost(method, instance, paths) / classical_best
    broken = tiny_training_cost(method, instance, paths, BROKEN[method]) / classical_best
    assert broken > 1.02 and honest - 1 < 0.5 * (broken - 1), (honest, broken)


def test_divergence_is_detected():
    inst = paper_instance(2, 0).to_torch()
    trainer = PathwiseTrainer(TrainConfig(**RUN, divergence_cost=1e-6), inst)
    assert "exceeds" in trainer.diverged(trainer.step())
    metrics = trainer.step() | {"loss": float("nan")}
    assert trainer.diverged(metrics) == "non-finite loss or cost"


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="'method': expected one of"):
        TrainConfig(method="dqn")
    with pytest.raises(ValueError, match=r"'batch': expected an integer in \[1, 65536\]"):
        TrainConfig(batch=0)
    with pytest.raises(ValueError, match=r"unknown keys \['lr'\]"):
        TrainConfig.from_dict({"lr": 1})
    with pytest.raises(ValueError, match="preset: expected one of"):
        method_config("or-transformer", "huge")
