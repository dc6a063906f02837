"""Validation while training and the best network (trainers.model_selection, trainers.run_folder), and rollouts that run away
(trainers.pathwise.restart_runaways)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from conftest import INSTANCE, TINY, run_script
from test_train_safety import interrupt_at

from envs.dynamics import State, initial_state
from envs.exogenous import HELDOUT_SEED, TUNING_SEED, FactorDemandStream, sample_paths
from envs.instance import paper_instance
from trainers import model_selection as validation_module
from trainers.checkpoint import checkpoint_file, read_checkpoint
from trainers.model_selection import Validation, due
from trainers.pathwise import PathwiseTrainer, restart_runaways, train
from trainers.pathwise_config import TrainConfig
from trainers.resolver import resolve
from trainers.streams import PAPER_STREAM, stream_seed

# ---- the validation set -----------------------------------------------------------------------------


def shared_paths(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many factor paths of `a` [paths, T + 1] start as one of `b` does (their first two draws: continuous values,
    equal for two paths only when one is the other)."""
    starts = {tuple(row) for row in b[:, :2].double().tolist()}
    return sum(tuple(row) in starts for row in a[:, :2].double().tolist())


def test_validation_paths_are_not_the_held_out_tuning_or_training_paths(monkeypatch):
    """No validation path is one of the held-out set, of the classical rules' tuning paths or of the training streams
    of 8 seeds; the control, a validation set drawn with the held-out seed, is the held-out set's first paths."""
    horizon = 50
    validation = Validation(INSTANCE, 64, horizon, "cpu").paths.factor
    tensor = INSTANCE.to_torch("cpu")
    others = [sample_paths(INSTANCE, seed, 128, horizon).factor for seed in (HELDOUT_SEED, TUNING_SEED)]
    for seed in range(8):
        stream = FactorDemandStream(tensor, 256, seed=stream_seed(seed, PAPER_STREAM))
        factor = stream.initial_factor()
        draws = [factor]
        for _ in range(horizon):
            stream.demand(factor)
            factor = stream.next_factor(factor)
            draws.append(factor)
        others.append(torch.stack(draws, dim=1))
    assert [shared_paths(validation, other) for other in others] == [0] * len(others)
    monkeypatch.setattr(validation_module, "VALIDATION_SEED", HELDOUT_SEED)
    control = Validation(INSTANCE, 64, horizon, "cpu").paths.factor
    assert shared_paths(control, others[0]) == control.shape[0]


def test_validation_is_due_at_the_start_every_validate_every_updates_and_at_the_end():
    assert [u for u in range(0, 11) if due(u, 4, 10)] == [0, 4, 8, 10]
    assert not any(due(u, 0, 10) for u in range(11))


# ---- the best network -------------------------------------------------------------------------------

SMALL = dict(TINY, updates=6, validate_every=2, checkpoint_every=2, imitation_updates=0, validation_episodes=4, validation_horizon=5)


class ScriptedScores:
    """Stands in for trainers.model_selection.evaluate: the validation costs come from `costs` in call order (a number: that
    cost on each of 4 paths, reported with s.e. 0.5; or the per-path costs), and the weights of each scored network are
    kept (copies)."""

    def __init__(self, costs):
        self.costs = iter(costs)
        self.weights = []

    def __call__(self, policy, instance, paths):
        self.weights.append({k: v.clone() for k, v in policy.model.state_dict().items()})
        cost = next(self.costs)
        if np.ndim(cost):
            cost = np.asarray(cost, np.float64)
            return SimpleNamespace(mean=float(cost.mean()), se=float(cost.std(ddof=1) / np.sqrt(cost.size)), discounted_cost=cost)
        return SimpleNamespace(mean=cost, se=0.5, discounted_cost=np.full(4, cost))


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_whose_validation_cost_rises_keeps_the_earlier_network(tmp_path, monkeypatch):
    """Scores 5, 3, 4, 6 at updates 0, 2, 4, 6: best.pt holds the weights scored at update 2 (not the last ones, which
    differ), training.json and the curve say so, and checkpoint:RUN evaluates it."""
    scores = ScriptedScores([5.0, 3.0, 4.0, 6.0])
    monkeypatch.setattr(validation_module, "evaluate", scores)
    summary = train(TrainConfig(**SMALL), INSTANCE, tmp_path / "run", progress=False)
    best = read_checkpoint(tmp_path / "run" / "best.pt")["trainer"]
    last = read_checkpoint(tmp_path / "run" / "checkpoint.pt")["trainer"]
    assert best["update"] == 2 and best["validation"] == {"cost": 3.0, "se": 0.5}
    assert same_weights(best["model"], scores.weights[1])
    assert not same_weights(best["model"], last["model"])
    assert same_weights(last["model"], scores.weights[3])
    assert summary["validation"]["best"] == {"update": 2, "cost": 3.0, "se": 0.5}
    assert [s["update"] for s in summary["validation"]["scores"]] == [0, 2, 4, 6]
    curve = pq.read_table(tmp_path / "run" / "curve.parquet").to_pydict()
    assert curve["validation_cost"] == [None, 3.0, None, 4.0, None, 6.0]
    assert checkpoint_file(tmp_path / "run") == tmp_path / "run" / "best.pt"
    resolved = resolve(f"checkpoint:{tmp_path / 'run'}", horizon=5)
    assert resolved.parameters["network"] == "best" and resolved.parameters["update"] == 2
    last_parameters = resolve(f"checkpoint:{tmp_path / 'run' / 'checkpoint.pt'}", horizon=5).parameters
    assert last_parameters["network"] == "last" and last_parameters["update"] == 6 and "validation_cost" not in last_parameters


def test_a_resumed_run_keeps_its_best_network(tmp_path, monkeypatch):
    """A run interrupted after update 3 (scored at 0 and 2) and resumed (scored at 4 and 6) keeps update 2's network,
    the same weights as the run made in one go; the resumed attempt scores no update twice (the scripted scores would
    run out). Control: a resume that forgot the checkpoint's validation would keep update 4's, the best it scored."""
    monkeypatch.setattr(validation_module, "evaluate", ScriptedScores([5.0, 3.0, 4.0, 6.0]))
    train(TrainConfig(**SMALL), INSTANCE, tmp_path / "whole", progress=False)
    monkeypatch.setattr(validation_module, "evaluate", ScriptedScores([5.0, 3.0, 4.0, 6.0]))
    with monkeypatch.context() as interrupted, pytest.raises(KeyboardInterrupt):
        interrupt_at(interrupted, 2, signals=1)
        train(TrainConfig(**SMALL), INSTANCE, tmp_path / "resumed", progress=False)
    summary = train(TrainConfig(**SMALL), INSTANCE, tmp_path / "resumed", mode="resume", progress=False)
    assert summary["attempts"] == [0, 3]
    assert [s["update"] for s in summary["validation"]["scores"]] == [0, 2, 4, 6]
    whole, resumed = (read_checkpoint(tmp_path / name / "best.pt")["trainer"] for name in ("whole", "resumed"))
    assert resumed["update"] == whole["update"] == 2
    assert same_weights(resumed["model"], whole["model"])


def test_a_later_network_replaces_the_kept_one_only_when_its_paired_lead_exceeds_the_margin(tmp_path, monkeypatch):
    """Per-path costs scored at updates 0, 2, 4, 6 (4 paths): update 2 is lower than update 0 by 1 on average with a
    paired s.e. of 0.577 (1.7 s.e.), update 4 by 3 with the same s.e. (5.2 s.e.), update 6 higher. With the margin of
    2 s.e. update 2 does not replace update 0 and update 4 does; with margin 0 (the control: the lowest score) update
    2 replaces update 0 (checked on a Validation alone) until update 4 beats it in turn; with margin 7 nothing beats
    update 0."""
    base = np.array([10.0, 20.0, 30.0, 40.0])
    scored = [base, base - [0.0, 2.0, 0.0, 2.0], base - [2.0, 4.0, 2.0, 4.0], base + 1]
    kept = {}
    for margin in (2.0, 0.0, 7.0):
        monkeypatch.setattr(validation_module, "evaluate", ScriptedScores(scored))
        run = tmp_path / f"margin{margin:g}"
        summary = train(TrainConfig(**SMALL, validation_margin=margin), INSTANCE, run, progress=False)
        kept[margin] = read_checkpoint(run / "best.pt")["trainer"]["update"]
        assert summary["validation"]["best"]["update"] == kept[margin]
        assert summary["validation"]["validation_margin"] == margin
    assert kept == {2.0: 4, 0.0: 4, 7.0: 0}
    validation = Validation(INSTANCE, 4, 5, "cpu", margin=0.0)
    monkeypatch.setattr(validation_module, "evaluate", ScriptedScores(scored[:2]))
    model = PathwiseTrainer(TrainConfig(**SMALL), INSTANCE.to_torch("cpu")).model
    validation.score(model, 0)
    validation.score(model, 2)
    assert validation.best.score.update == 2
    with_margin = Validation(INSTANCE, 4, 5, "cpu", margin=2.0)
    monkeypatch.setattr(validation_module, "evaluate", ScriptedScores(scored[:2]))
    with_margin.score(model, 0)
    with_margin.score(model, 2)
    assert with_margin.best.score.update == 0
    restored = Validation(INSTANCE, 4, 5, "cpu", margin=2.0)  # a resume: the kept network's per-path costs come back
    restored.load_state(with_margin.state())
    assert np.array_equal(restored.best.costs, scored[0]) and isinstance(with_margin.state()["best"]["costs"], torch.Tensor)


def test_the_recorded_best_score_is_the_best_networks_cost_on_the_validation_paths(trained):
    """The shared OR-Transformer run (warm start, 2 updates): best.pt's score is one of training.json's, update 0's
    unless a later one is lower (the margin may keep update 0 over a lower one), and evaluating best.pt's greedy
    policy on the validation seed's paths gives that score again."""
    from envs.evaluation import evaluate
    from envs.exogenous import VALIDATION_SEED
    from trainers.policy import LearnedPolicy
    from trainers.registry import load_policy

    run = trained["or-transformer"]
    record = json.loads((run.folder / "training.json").read_text())["validation"]
    assert [s["update"] for s in record["scores"]] == [0, 2]
    kept = next(s for s in record["scores"] if s["update"] == record["best"]["update"])
    assert kept["cost"] == record["best"]["cost"]
    assert kept["update"] == 0 or kept["cost"] < record["scores"][0]["cost"]
    policy, ckpt = load_policy(run.folder / "best.pt")
    assert ckpt["trainer"]["update"] == record["best"]["update"]
    paths = sample_paths(INSTANCE, VALIDATION_SEED, record["validation_episodes"], record["validation_horizon"])
    again = evaluate(LearnedPolicy(policy.model, "greedy"), INSTANCE.to_torch("cpu"), paths)
    assert again.mean == pytest.approx(record["best"]["cost"], rel=1e-6)
    assert run.result["greedy"]["parameters"]["network"] == "best"


def test_the_report_names_the_network_each_evaluation_is_of(trained):
    """report.py's pairwise table: OR-Transformer's held-out evaluation is of its best network, PPO's (no validation)
    of its last."""
    ot, ppo = trained["or-transformer"], trained["ppo"]
    best = json.loads((ot.folder / "training.json").read_text())["validation"]["best"]["update"]
    result = run_script("report.py", ot.folder / "greedy", ppo.folder / "greedy")
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"| or-transformer-greedy (best network, update {best}) |" in result.stdout
    assert "| ppo-greedy (last network, update 2) |" in result.stdout


# ---- rollouts that run away ---------------------------------------------------------------------------


def test_restart_runaways_resets_exactly_the_rollouts_outside_the_region():
    """|I_i| > periods lam_i + qbar_i in some item restarts the rollout (I = mu, nothing in transit, the factor kept);
    at the limit itself it runs on."""
    instance = paper_instance(2, 0).to_torch("cpu", torch.float64)
    limit = 5 * instance.lam + instance.qbar
    inv = torch.stack([limit, -limit, torch.stack([limit[0] + 0.01, limit[1]]), torch.stack([limit[0], -limit[1] - 0.01])])
    pipe = torch.ones(4, 2, 3, dtype=torch.float64)
    factor = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    state, count = restart_runaways(State(inv, pipe, factor), instance, 5.0)
    fresh = initial_state(instance, factor)
    assert int(count) == 2
    assert torch.equal(state.inv[:2], inv[:2]) and torch.equal(state.pipe[:2], pipe[:2])
    assert torch.equal(state.inv[2:], fresh.inv[2:]) and torch.equal(state.pipe[2:], fresh.pipe[2:])
    assert torch.equal(state.factor, factor)


def never_ordering_costs(restart_periods: float, updates: int = 40) -> tuple[list[float], list[int]]:
    """cost10 and restarts of each update of a tiny run whose policy never opens an order (the open head's bias at -30,
    a learning rate too small to move it)."""
    config = TrainConfig(
        **{**TINY, "updates": updates, "imitation_updates": 0, "validate_every": 0},
        learning_rate=1e-9,
        final_learning_rate=1e-10,
        warmup=0,
        restart_periods=restart_periods,
        divergence_cost=1e9,
    )
    trainer = PathwiseTrainer(config, INSTANCE.to_torch("cpu"))
    with torch.no_grad():
        trainer.model.open_net.head.weight.zero_()
        trainer.model.open_net.head.bias.fill_(-30.0)
    metrics = [trainer.step() for _ in range(updates)]
    assert all(m["open_rate"] == 0 for m in metrics)
    return [m["cost10"] for m in metrics], [m["restarted"] for m in metrics]


def test_a_policy_that_never_orders_keeps_bounded_costs_because_its_rollouts_restart():
    """With restarts (5 periods) every update's cost stays below that of backorders of 5 lam + qbar + one rollout's
    demand in every item, and the count of restarts says why; without them (the control) the backorders and the cost
    grow with every update."""
    costs, restarted = never_ordering_costs(5.0)
    instance = INSTANCE
    rollout = TINY["rollout"]
    worst_step = float(np.sum((instance.h + instance.b) * (5 * instance.lam + instance.qbar + 10 * rollout * instance.lam)))
    assert max(costs) < worst_step * rollout
    assert sum(restarted) > 0
    runaway, never = never_ordering_costs(0.0)
    assert sum(never) == 0
    assert runaway[-1] > 3 * max(costs) and runaway[-1] > runaway[len(runaway) // 2] > runaway[0]


def test_a_run_folder_serves_its_best_network(trained):
    """decide.py and serve.py's Decider on checkpoint:RUN: best.pt's decisions and its SHA-256 in /info."""
    from plumbing.files import file_sha256
    from serving.decisions import load_decider

    run = trained["or-transformer"]
    decider = load_decider(f"checkpoint:{run.folder}")
    assert decider.info["checkpoint_sha256"] == file_sha256(run.folder / "best.pt")
    assert str(run.folder / "best.pt") in decider.label
