"""The paper phase after a warm start: the critic's warm-up (the actor frozen) and the anchor term that keeps the
actor near the network the phase started from (trainers.pathwise)."""

import pytest
import torch
from conftest import TINY
from test_pathwise import fixed_draws
from test_train_safety import interrupt_at

from envs.instance import paper_instance
from trainers.checkpoint import read_checkpoint
from trainers.config import ConfigError
from trainers.pathwise import Anchor, PathwiseTrainer, anchor_losses, hybrid_losses, rollout, tokens, train
from trainers.pathwise_config import TrainConfig, anchor_weight, learning_rate

RUN = {**TINY, "batch": 8, "rollout": 4, "warmup": 2, "updates": 8, "imitation_updates": 0, "validate_every": 0}
INSTANCE = paper_instance(3, 0)


def actor_and_critic(trainer: PathwiseTrainer) -> tuple[torch.Tensor, torch.Tensor]:
    """The open and quantity networks' parameters, and the critic's, each flattened into one vector (copies)."""
    nets = trainer.model.networks()
    flat = lambda params: torch.cat([p.detach().flatten() for p in params]).clone()  # noqa: E731
    return flat([*nets["open"], *nets["quantity"]]), flat(nets["critic"])


def test_the_schedules_start_the_actor_after_the_critic_warm_up():
    """During the critic's warm-up the rate is the peak; the actor's first update is the warm-up's first rate and the
    last update the final rate, as without a critic warm-up shifted by its length; the anchor's weight is 0 during the
    critic's warm-up, anchor_weight at the actor's first update and 0 from anchor_updates on."""
    cfg = TrainConfig(updates=140, warmup=40, critic_warmup_updates=20, anchor_weight=2.0, anchor_updates=10)
    plain = TrainConfig(updates=120, warmup=40)
    assert [learning_rate(cfg, u) for u in (0, 19)] == [pytest.approx(3e-4)] * 2
    for u in (0, 39, 60, 119):
        assert learning_rate(cfg, 20 + u) == pytest.approx(learning_rate(plain, u))
    assert learning_rate(cfg, 140) == pytest.approx(3e-5)
    assert [anchor_weight(cfg, u) for u in (0, 19, 20, 25, 30, 100)] == pytest.approx([0, 0, 2.0, 1.0, 0, 0])


def test_config_errors_name_the_anchor_and_warm_up_fields():
    with pytest.raises(ConfigError, match="'anchor_updates': an integer >= 1 when anchor_weight"):
        TrainConfig(anchor_weight=1.0)
    with pytest.raises(ConfigError, match="'critic_warmup_updates'.*within 'updates'"):
        TrainConfig(updates=10, critic_warmup_updates=10)
    with pytest.raises(ConfigError, match="'validation_margin'"):
        TrainConfig(validation_margin=-1)


def test_the_critic_warm_up_moves_the_critic_alone_then_the_actor():
    """Over a warm-up of 3 updates the open and quantity networks keep their weights and gradient norms 0 while the
    critic moves; the fourth update moves the actor. The control, no warm-up, moves the actor at the first update."""
    trainer = PathwiseTrainer(TrainConfig(**RUN, critic_warmup_updates=3), INSTANCE.to_torch("cpu"))
    actor, critic = actor_and_critic(trainer)
    for _ in range(3):
        metrics = trainer.step()
        assert metrics["grad_norm_open"] == metrics["grad_norm_quantity"] == 0 and metrics["grad_norm_critic"] > 0
    after_warm_up = actor_and_critic(trainer)
    assert torch.equal(after_warm_up[0], actor) and not torch.equal(after_warm_up[1], critic)
    trainer.step()
    assert not torch.equal(actor_and_critic(trainer)[0], actor)
    control = PathwiseTrainer(TrainConfig(**RUN), INSTANCE.to_torch("cpu"))
    control.step()
    assert not torch.equal(actor_and_critic(control)[0], actor)


def bernoulli_kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return p * torch.log(p / q) + (1 - p) * torch.log((1 - p) / (1 - q))


def test_the_anchor_term_is_the_open_kl_and_the_quantity_error_and_adds_its_gradient_in_micro_batches():
    """On the stored states of a rollout (n = 3, float64), the anchor term of hybrid_losses (micro-batches of 3 and 5
    of 8 rollouts) is the mean Bernoulli KL(p_anchor || p) plus the mean squared fraction error, written out here, and
    the update's gradient with the anchor minus without it is the weight times that formula's gradient; the term is 0
    against the network itself."""
    inst = INSTANCE.to_torch("cpu", torch.float64)
    trainer = PathwiseTrainer(TrainConfig(**RUN), inst)
    trainer.step()
    model = trainer.model
    anchor = trainer._anchor_network(model.state_dict())
    with torch.no_grad():
        for p in anchor.parameters():
            p.add_(0.05 * torch.randn_like(p))
    draws = fixed_draws(trainer, 4)
    stored = rollout(model, inst, trainer.state, draws()).stored
    items, glob = stored.items.flatten(0, 1), stored.glob.flatten(0, 1)
    model.zero_grad()
    with torch.no_grad():
        p_anchor, f_anchor = torch.sigmoid(anchor.open_logit(items, glob)), anchor.quantity_fraction(items, glob)
    formula = (
        bernoulli_kl(p_anchor, torch.sigmoid(model.open_logit(items, glob))).mean()
        + ((model.quantity_fraction(items, glob) - f_anchor) ** 2).mean()
    )
    formula.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    chunks = ([slice(0, 3), slice(3, 6), slice(6, 8)], [slice(0, 5), slice(5, 8)])
    grads = []
    for weight in (0.0, 7.0):
        model.zero_grad()
        result = hybrid_losses(model, inst, trainer.state, draws(), trainer.config, 0.01, *chunks, anchor=Anchor(anchor, weight))
        assert result.losses.anchor.item() == pytest.approx(formula.item(), rel=1e-9)
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    assert set(expected) == {name for name, _ in model.named_parameters() if not name.startswith("critic_net")}
    for name, grad in expected.items():
        torch.testing.assert_close(grads[1][name] - grads[0][name], 7.0 * grad, rtol=1e-6, atol=1e-10, msg=name)
    own = anchor_losses(model, trainer._anchor_network(model.state_dict()), items, glob, model.open_logit(items, glob), items.shape[0])
    assert abs(own.item()) < 1e-12


def open_shift(trainer: PathwiseTrainer, start: torch.nn.Module, states) -> float:
    """Mean KL of the start network's open probabilities from the trainer's, on fixed states."""
    items, glob = states
    with torch.no_grad():
        return (
            bernoulli_kl(torch.sigmoid(start.open_logit(items, glob)), torch.sigmoid(trainer.model.open_logit(items, glob))).mean().item()
        )


def test_the_anchor_keeps_the_actor_nearer_the_network_it_started_from():
    """Eight updates at a high learning rate from the same start and streams: with a strong anchor the open network's
    probabilities on the rollouts' states end nearer the start's (KL) than without one (the control)."""
    cfg = {**RUN, "learning_rate": 1e-2, "final_learning_rate": 1e-2}
    shifts = {}
    for weight in (0.0, 1000.0):
        trainer = PathwiseTrainer(TrainConfig(**cfg, anchor_weight=weight, anchor_updates=8 if weight else 0), INSTANCE.to_torch("cpu"))
        start = trainer._anchor_network(trainer.model.state_dict())
        states = tokens(trainer.instance, trainer.state)
        for _ in range(8):
            trainer.step()
        states = tuple(torch.cat([a, b]) for a, b in zip(states, tokens(trainer.instance, trainer.state)))
        shifts[weight] = open_shift(trainer, start, states)
    assert shifts[1000.0] < 0.5 * shifts[0.0]


def test_a_resumed_run_keeps_its_anchor(tmp_path, monkeypatch):
    """A run with a critic warm-up of 2 and an anchor over 4 updates, interrupted after update 4 and resumed, ends with
    the weights of the run made in one go; its checkpoint held the anchor network. A checkpoint without it (the
    control) cannot resume the anchor term and says so."""
    cfg = TrainConfig(**RUN, critic_warmup_updates=2, anchor_weight=5.0, anchor_updates=4, checkpoint_every=0)
    train(cfg, INSTANCE, tmp_path / "whole", progress=False)
    with monkeypatch.context() as interrupted, pytest.raises(KeyboardInterrupt):
        interrupt_at(interrupted, 3, signals=1)
        train(cfg, INSTANCE, tmp_path / "resumed", progress=False)
    saved = read_checkpoint(tmp_path / "resumed" / "checkpoint.pt")["trainer"]
    assert saved["update"] == 4 and "anchor" in saved
    train(cfg, INSTANCE, tmp_path / "resumed", mode="resume", progress=False)
    whole, resumed = (read_checkpoint(tmp_path / name / "checkpoint.pt")["trainer"] for name in ("whole", "resumed"))
    assert "anchor" not in whole  # the term ended at update 6: its network was let go
    for name, value in whole["model"].items():
        torch.testing.assert_close(resumed["model"][name], value, rtol=0, atol=0, msg=name)
    trainer = PathwiseTrainer(cfg, INSTANCE.to_torch("cpu"), fresh=False)
    trainer.load_state_dict({k: v for k, v in saved.items() if k != "anchor"})
    with pytest.raises(RuntimeError, match="anchor network is missing at update 4"):
        trainer.step()
