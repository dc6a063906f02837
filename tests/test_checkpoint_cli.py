"""Checkpoints (round trip, resume, rejection of bad files) and the train / evaluate / decide CLI."""

import json
import os

import pyarrow.parquet as pq
import pytest
import torch
import yaml
from conftest import ROOT, TINY, run_script

from envs.instance import paper_instance
from trainers.checkpoint import CheckpointError, save_checkpoint
from trainers.pathwise import PathwiseTrainer, train
from trainers.pathwise_config import NO_WARM_START, TrainConfig
from trainers.registry import load_checkpoint, load_policy

RUN = {**TINY, "warmup": 2, "checkpoint_every": 2}


def test_round_trip_gives_identical_decisions(tmp_path):
    instance = paper_instance(3, 0)
    cfg = TrainConfig(**RUN, updates=2)
    trainer = PathwiseTrainer(cfg, instance.to_torch())
    trainer.step()
    save_checkpoint(tmp_path / "c.pt", cfg, instance, trainer.state_dict(), "completed")
    policy, ckpt = load_policy(tmp_path / "c.pt")
    assert ckpt["config"] == cfg and ckpt["instance"].to_dict() == instance.to_dict()
    for a, b in zip(policy.model.state_dict().values(), trainer.model.state_dict().values()):
        assert torch.equal(a, b)


def test_resume_continues_the_same_curve(tmp_path):
    instance = paper_instance(2, 0)
    straight = train(TrainConfig(**RUN, updates=4), instance, tmp_path / "a", progress=False)
    train(TrainConfig(**RUN, updates=2), instance, tmp_path / "b", progress=False)
    resumed = train(TrainConfig(**RUN, updates=4), instance, tmp_path / "b", mode="resume", progress=False)
    curve_a = pq.read_table(tmp_path / "a" / "curve.parquet").to_pydict()
    curve_b = pq.read_table(tmp_path / "b" / "curve.parquet").to_pydict()
    assert curve_a["update"] == curve_b["update"] == [1, 2, 3, 4]
    assert curve_a["cost10"] == curve_b["cost10"]
    assert straight["status"] == resumed["status"] == "completed"
    assert set(curve_a) == {"method", "n", "seed", "update", "cost10", "wall_seconds", "validation_cost", "restarted"}
    assert any((tmp_path / "a" / "tensorboard").iterdir())


def test_resume_refuses_a_different_config(tmp_path):
    instance = paper_instance(2, 0)
    train(TrainConfig(**RUN, updates=2), instance, tmp_path, progress=False)
    with pytest.raises(CheckpointError, match=r"other settings \(width 16 there, 32 here\): only .updates. may change on resume"):
        train(TrainConfig(**{**RUN, "width": 32}, updates=4), instance, tmp_path, mode="resume", progress=False)


def test_resume_may_change_the_memory_settings_but_not_the_precision(tmp_path):
    """memory_budget, micro_batch and checkpoint_activations change memory, not results: a run resumes with other
    values and its curve is the uninterrupted one (to float rounding); precision changes results and is refused."""
    instance = paper_instance(2, 0)
    straight = train(TrainConfig(**RUN, updates=4), instance, tmp_path / "a", progress=False)
    train(TrainConfig(**RUN, updates=2), instance, tmp_path / "b", progress=False)
    other_memory = {"memory_budget": 0.01, "micro_batch": 3, "checkpoint_activations": True}
    resumed = train(TrainConfig(**RUN, updates=4, **other_memory), instance, tmp_path / "b", mode="resume", progress=False)
    curves = [pq.read_table(tmp_path / run / "curve.parquet").to_pydict()["cost10"] for run in ("a", "b")]
    assert curves[1] == pytest.approx(curves[0], rel=1e-5) and resumed["status"] == straight["status"] == "completed"
    with pytest.raises(CheckpointError, match=r'other settings \(precision "float32" there, "bfloat16" here\)'):
        train(TrainConfig(**RUN, updates=6, precision="bfloat16"), instance, tmp_path / "b", mode="resume", progress=False)


def test_diverged_run_is_a_result(tmp_path):
    summary = train(TrainConfig(**RUN, updates=5, divergence_cost=1e-6), paper_instance(2, 0), tmp_path, progress=False)
    assert summary["status"] == "diverged" and summary["updates_done"] == 1
    assert json.loads((tmp_path / "training.json").read_text())["status"] == "diverged"
    assert load_checkpoint(tmp_path / "checkpoint.pt")["status"] == "diverged"


def test_bad_checkpoint_files_are_rejected(tmp_path):
    instance = paper_instance(2, 0)
    cfg = TrainConfig(**RUN, updates=1)
    trainer = PathwiseTrainer(cfg, instance.to_torch())
    good = tmp_path / "good.pt"
    save_checkpoint(good, cfg, instance, trainer.state_dict(), "completed")
    (tmp_path / "truncated.pt").write_bytes(good.read_bytes()[:200])
    (tmp_path / "noise.pt").write_bytes(b"not a checkpoint at all")
    torch.save({"weights": torch.zeros(3)}, tmp_path / "foreign.pt")
    for name, message in (
        ("truncated.pt", "truncated or not a checkpoint"),
        ("noise.pt", "truncated or not a checkpoint"),
        ("foreign.pt", "field 'format'"),
        ("missing.pt", "does not exist"),
    ):
        with pytest.raises(CheckpointError, match=message):
            load_checkpoint(tmp_path / name)
    payload = torch.load(good, weights_only=True)
    payload["trainer"]["model"] = {k: v[..., :1] for k, v in payload["trainer"]["model"].items()}
    torch.save(payload, tmp_path / "mismatch.pt")
    with pytest.raises(CheckpointError, match="weights do not match"):
        load_policy(tmp_path / "mismatch.pt")
    hpo = TrainConfig(**RUN, updates=1, method="hpo")
    save_checkpoint(tmp_path / "hpo.pt", hpo, instance, PathwiseTrainer(hpo, instance.to_torch()).state_dict(), "completed")
    with pytest.raises(CheckpointError, match="n = 2 items cannot act on an instance with n = 3"):
        load_policy(tmp_path / "hpo.pt", instance=paper_instance(3, 0))


def test_train_evaluate_decide_end_to_end(tmp_path):
    inst = tmp_path / "inst.json"
    paper_instance(3, 0).save(inst)
    short = tmp_path / "short-warm-start.yaml"
    short.write_text(
        "imitation_updates: 20\nimitation_dagger_updates: 2\nimitation_teacher: base-stock\n"
    )  # the cpu preset's warm start, shortened from 300 + 1,000 (a teacher of one family to tune)
    run = run_script(
        "train.py",
        "--method",
        "or-transformer",
        "--instance",
        inst,
        "--config",
        short,
        "--updates",
        3,
        "--batch",
        8,
        "--episodes",
        4,
        "--horizon",
        5,
        "--out",
        tmp_path / "run",
    )
    assert run.returncode == 0, run.stderr
    for mode in ("greedy", "sampled"):
        summary = json.loads((tmp_path / "run" / mode / "summary.json").read_text())
        assert summary["policy"] == f"or-transformer-{mode}" and summary["episodes"] == 4 and summary["training"]["status"] == "completed"
    assert pq.read_table(tmp_path / "run" / "curve.parquet").num_rows == 3
    assert json.loads((tmp_path / "run" / "training.json").read_text())["warm_start"]["updates"] == 20
    ev = run_script(
        "evaluate.py",
        "--instance",
        inst,
        "--policy",
        f"checkpoint:{tmp_path / 'run'}",  # its best.pt, the network of the run's own held-out evaluation
        "--episodes",
        4,
        "--horizon",
        5,
        "--out",
        tmp_path / "ev",
    )
    assert ev.returncode == 0, ev.stderr
    evaluated = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert evaluated["policy"] == "or-transformer-greedy" and evaluated["parameters"]["mode"] == "greedy"
    assert evaluated["mean"] == pytest.approx(json.loads((tmp_path / "run" / "greedy" / "summary.json").read_text())["mean"])
    state = tmp_path / "state.json"
    state.write_text(json.dumps([{"inventory": [1, 2, 3], "in_transit": [[0, 0, 0]] * 3, "factor": 0.5}] * 2))
    decision = run_script("decide.py", "--checkpoint", tmp_path / "run" / "checkpoint.pt", "--state", state)
    assert decision.returncode == 0, decision.stderr
    answers = json.loads(decision.stdout)
    assert len(answers) == 2 and len(answers[0]["quantity"]) == 3 and answers[0]["open"] in (0, 1)
    qbar = paper_instance(3, 0).qbar
    assert all(0 <= q <= cap for q, cap in zip(answers[0]["quantity"], qbar))
    state.write_text(json.dumps({"inventory": [1, 2], "in_transit": [[0, 0, 0]] * 3, "factor": 0.5}))
    bad = run_script("decide.py", "--checkpoint", tmp_path / "run" / "checkpoint.pt", "--state", state)
    assert bad.returncode == 2 and "field 'inventory': expected 3 numbers" in bad.stderr
    state.write_text('{"inventory": [1, 2,')
    bad = run_script("decide.py", "--checkpoint", tmp_path / "run" / "checkpoint.pt", "--state", state)
    assert bad.returncode == 2 and f"state file '{state}' is not valid JSON" in bad.stderr
    bad = run_script("evaluate.py", "--instance", inst, "--policy", f"checkpoint:{tmp_path / 'nothing.pt'}", "--out", tmp_path / "x")
    assert bad.returncode == 2 and "does not exist" in bad.stderr


def test_yaml_config_files(tmp_path):
    inst = tmp_path / "inst.json"
    paper_instance(2, 0).save(inst)
    quick = tmp_path / "quick.yaml"  # tune_configs/train/quick.yaml without the cpu preset's warm start
    quick.write_text(yaml.safe_dump({**yaml.safe_load((ROOT / "tune_configs" / "train" / "quick.yaml").read_text()), **NO_WARM_START}))
    run = run_script(
        "train.py",
        "--method",
        "hpo",
        "--instance",
        inst,
        "--config",
        quick,
        "--updates",
        2,
        "--episodes",
        2,
        "--horizon",
        3,
        "--out",
        tmp_path / "run",
    )
    assert run.returncode == 0, run.stderr
    config = load_checkpoint(tmp_path / "run" / "checkpoint.pt")["config"]
    warm_start = (config.imitation_updates, config.imitation_dagger_updates)
    assert (config.hidden, config.batch, config.updates, warm_start) == (64, 16, 2, (0, 0))  # file over preset, flag over file
    bad = tmp_path / "bad.yaml"
    bad.write_text("batch: 16\nlearning_rte: 0.1\n")
    result = run_script("train.py", "--method", "hpo", "--instance", inst, "--config", bad, "--out", tmp_path / "x")
    assert result.returncode == 2 and "unknown keys ['learning_rte']" in result.stderr
    bad.write_text("batch: [16\n")
    result = run_script("train.py", "--method", "hpo", "--instance", inst, "--config", bad, "--out", tmp_path / "x")
    assert result.returncode == 2 and "is not valid YAML" in result.stderr
    result = run_script("train.py", "--method", "hpo", "--instance", inst, "--config", tmp_path / "none.yaml", "--out", tmp_path / "x")
    assert result.returncode == 2 and "config file" in result.stderr and "does not exist" in result.stderr


def test_a_checkpoint_naming_python_code_is_refused_without_running_it_or_echoing_torch(tmp_path, recwarn):
    """torch's refusal advises re-running with weights_only=False (which would run the payload) after a warning about the
    pickle protocol; the error says instead that the file is not a checkpoint of this platform and will not be unpickled."""
    ran = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {ran}",))

    torch.save({"format": Payload()}, tmp_path / "evil.pt")  # protocol 4 inside a zip: torch warns about it on load
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(tmp_path / "evil.pt")
    message = str(refused.value)
    assert (
        "not a checkpoint of this platform" in message
        and "the Python object posix.system" in message
        and "will not be unpickled" in message
    )
    assert "weights_only" not in message and "will likely succeed" not in message
    assert not ran.exists() and len(recwarn) == 0
