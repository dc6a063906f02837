"""train.py never loses work: a run folder is never overwritten or mixed by accident, resumption needs a
checkpoint and its whole curve, Ctrl-C / SIGTERM saves the last finished update (and a resume from it
gives the uninterrupted curve), and every config field is checked for its type and range."""

import json
import math
import os
import re
import runpy
import shlex
import signal
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from conftest import ROOT, TINY, run_script
from helpers import Gate

from cli.scripts import _terminate
from envs.instance import paper_instance
from plumbing.errors import InputError
from plumbing.validate import load_yaml
from trainers import pathwise
from trainers.config import ConfigError
from trainers.pathwise import PathwiseTrainer, train
from trainers.pathwise_config import TrainConfig
from trainers.registry import load_checkpoint, method_config

RUN = {**TINY, "method": "hpo", "warmup": 2, "checkpoint_every": 2}


def curve(folder) -> dict:
    return pq.read_table(folder / "curve.parquet").to_pydict()


def event_files(folder) -> list:
    return sorted((folder / "tensorboard").iterdir())


def test_a_new_run_refuses_a_folder_that_holds_a_run(tmp_path):
    instance = paper_instance(2, 0)
    train(TrainConfig(**RUN, updates=2), instance, tmp_path / "run", progress=False)
    before = (tmp_path / "run" / "checkpoint.pt").read_bytes(), event_files(tmp_path / "run")
    with pytest.raises(
        InputError,
        match=r"run folder '.*run' already holds a run \(best.pt, checkpoint.pt, curve.parquet, tensorboard, training.json\): "
        r"continue it with --resume or replace it with --overwrite",
    ):
        train(TrainConfig(**RUN, updates=3, seed=1), instance, tmp_path / "run", progress=False)
    assert ((tmp_path / "run" / "checkpoint.pt").read_bytes(), event_files(tmp_path / "run")) == before
    for name in ("greedy", "tensorboard"):  # any one of a run's files is enough
        (tmp_path / name / name).mkdir(parents=True)
        with pytest.raises(InputError, match=f"already holds a run \\({name}\\)"):
            train(TrainConfig(**RUN, updates=2), instance, tmp_path / name, progress=False)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's file")
    assert train(TrainConfig(**RUN, updates=1), instance, tmp_path / "mine", progress=False)["status"] == "completed"


def test_overwrite_replaces_the_previous_run_and_nothing_else(tmp_path):
    instance = paper_instance(2, 0)
    run = tmp_path / "run"
    train(TrainConfig(**RUN, updates=4), instance, run, progress=False)
    for name in ("greedy", "sampled", "rllib/algorithm-4"):
        (run / name).mkdir(parents=True)
        (run / name / "summary.json").write_text("{}")
    (run / ".checkpoint.pt.tmp123").write_bytes(b"left by a killed writer")
    (run / "notes.txt").write_text("a user's file")
    summary = train(TrainConfig(**RUN, updates=2, seed=5), instance, run, mode="overwrite", progress=False)
    assert summary["updates_done"] == 2 and summary["seed"] == 5
    assert sorted(p.name for p in run.iterdir()) == [
        "best.pt",
        "checkpoint.pt",
        "curve.parquet",
        "notes.txt",
        "tensorboard",
        "training.json",
    ]
    assert len(event_files(run)) == 1  # TensorBoard holds the new run only
    assert curve(run)["update"] == [1, 2] and set(curve(run)["seed"]) == {5}
    assert load_checkpoint(run / "checkpoint.pt")["config"].seed == 5


def test_resume_needs_a_checkpoint(tmp_path):
    cfg = TrainConfig(**RUN, updates=2)
    with pytest.raises(InputError, match=r"run folder '.*empty' has no checkpoint.pt to resume: run without --resume to start it"):
        train(cfg, paper_instance(2, 0), tmp_path / "empty", mode="resume", progress=False)
    assert not (tmp_path / "empty").exists()
    (tmp_path / "partial" / "tensorboard").mkdir(parents=True)
    with pytest.raises(InputError, match="has no checkpoint.pt to resume: start anew with --overwrite"):
        train(cfg, paper_instance(2, 0), tmp_path / "partial", mode="resume", progress=False)


def test_resume_refuses_a_curve_that_lacks_updates_of_the_checkpoint(tmp_path):
    instance = paper_instance(2, 0)
    cfg = TrainConfig(**RUN, updates=4)
    train(TrainConfig(**RUN, updates=2), instance, tmp_path, progress=False)
    rows = pq.read_table(tmp_path / "curve.parquet")
    checkpoint = (tmp_path / "checkpoint.pt").read_bytes()
    (tmp_path / "curve.parquet").unlink()
    with pytest.raises(
        InputError, match=r"curve '.*curve.parquet' is missing: the checkpoint holds update 2 and the curve cannot be rebuilt.*--overwrite"
    ):
        train(cfg, instance, tmp_path, mode="resume", progress=False)
    pq.write_table(rows.slice(1), tmp_path / "curve.parquet")  # update 1 lost
    with pytest.raises(InputError, match=r"holds 1 of the updates 1..2"):
        train(cfg, instance, tmp_path, mode="resume", progress=False)
    (tmp_path / "curve.parquet").write_bytes(b"PAR1 not parquet")
    with pytest.raises(InputError, match="is not readable"):
        train(cfg, instance, tmp_path, mode="resume", progress=False)
    assert (tmp_path / "checkpoint.pt").read_bytes() == checkpoint
    pq.write_table(rows, tmp_path / "curve.parquet")
    train(cfg, instance, tmp_path, mode="resume", progress=False)
    assert curve(tmp_path)["update"] == [1, 2, 3, 4]


def test_resume_of_a_run_that_ended_trains_nothing(tmp_path):
    instance = paper_instance(2, 0)
    done = tmp_path / "done"
    summary = train(TrainConfig(**RUN, updates=2), instance, done, progress=False)
    files = {p: p.read_bytes() for p in done.rglob("*") if p.is_file()}
    assert train(TrainConfig(**RUN, updates=2), instance, done, mode="resume", progress=False) == summary
    assert {p: p.read_bytes() for p in done.rglob("*") if p.is_file()} == files  # nothing written, TensorBoard included
    with pytest.raises(InputError, match="holds update 2, more than this run's 1 updates: resume with at least 2"):
        train(TrainConfig(**RUN, updates=1), instance, done, mode="resume", progress=False)
    (done / "training.json").unlink()  # a run killed between its last checkpoint and training.json
    rebuilt = train(TrainConfig(**RUN, updates=2), instance, done, mode="resume", progress=False)
    assert {k: rebuilt[k] for k in ("status", "updates_done", "final_cost10")} == {
        k: summary[k] for k in ("status", "updates_done", "final_cost10")
    }
    diverged = tmp_path / "diverged"
    first = train(TrainConfig(**RUN, updates=5, divergence_cost=1e-6), instance, diverged, progress=False)
    again = train(TrainConfig(**RUN, updates=9, divergence_cost=1e-6), instance, diverged, mode="resume", progress=False)
    assert again == first and again["status"] == "diverged" and curve(diverged)["update"] == [1]
    assert load_checkpoint(diverged / "checkpoint.pt")["reason"] == first["reason"] and "exceeds" in first["reason"]


@pytest.fixture
def sigterm_is_ctrl_c():
    """SIGTERM raises KeyboardInterrupt, as in the scripts (cli.scripts.run_cli)."""
    previous = signal.signal(signal.SIGTERM, _terminate)
    yield
    signal.signal(signal.SIGTERM, previous)


def interrupt_at(monkeypatch, update: int, signals: int, signum=signal.SIGINT):
    """Make the trainer receive `signals` signals at the start of update `update` + 1, before any of its work."""
    step = PathwiseTrainer.step

    def interrupted_step(self):
        if self.update == update:
            for _ in range(signals):
                os.kill(os.getpid(), signum)
        return step(self)

    monkeypatch.setattr(PathwiseTrainer, "step", interrupted_step)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_finishes_the_update_saves_it_and_the_resume_matches(tmp_path, monkeypatch, sigterm_is_ctrl_c, signum):
    instance = paper_instance(2, 0)
    cfg = TrainConfig(**{**RUN, "checkpoint_every": 0}, updates=6)
    straight = train(cfg, instance, tmp_path / "straight", progress=False)
    interrupt_at(monkeypatch, 2, signals=1, signum=signum)
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    assert before[1] is _terminate
    with pytest.raises(KeyboardInterrupt):
        train(cfg, instance, tmp_path / "run", progress=False)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # restored
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert (ckpt["status"], ckpt["trainer"]["update"]) == ("interrupted", 3)  # update 3 was under way: it finished and was saved
    assert curve(tmp_path / "run")["update"] == [1, 2, 3]
    assert json.loads((tmp_path / "run" / "training.json").read_text())["status"] == "interrupted"
    monkeypatch.undo()
    resumed = train(cfg, instance, tmp_path / "run", mode="resume", progress=False)
    assert resumed["status"] == "completed" and resumed["updates_done"] == 6
    assert curve(tmp_path / "run")["cost10"] == curve(tmp_path / "straight")["cost10"] and straight["updates_done"] == 6


def test_a_failed_update_saves_the_last_finished_one_and_the_resume_matches(tmp_path, monkeypatch):
    """An update that raises in the middle (here the third, after its exogenous draws, as an out-of-memory error
    would) saves the run at update 2 with status failed and the error as the reason, raises the error again, and
    a resume continues the uninterrupted curve: the failed update's draws were given back. Without the save the
    run would keep no checkpoint (checkpoint_every 0), without giving the draws back the resumed curve would differ."""
    instance = paper_instance(2, 0)
    cfg = TrainConfig(**{**RUN, "checkpoint_every": 0}, updates=5)
    straight = train(cfg, instance, tmp_path / "straight", progress=False)
    losses = pathwise.hybrid_losses

    def out_of_memory_at_update_3(*args, **kwargs):
        if len(calls) == 2:
            raise RuntimeError("out of memory (simulated)\ndetails")
        calls.append(1)
        return losses(*args, **kwargs)

    calls: list[int] = []
    monkeypatch.setattr(pathwise, "hybrid_losses", out_of_memory_at_update_3)
    with pytest.raises(RuntimeError, match="out of memory"):
        train(cfg, instance, tmp_path / "run", progress=False)
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert (ckpt["status"], ckpt["trainer"]["update"]) == ("failed", 2)
    assert ckpt["reason"] == "update 3 failed: RuntimeError: out of memory (simulated)"
    assert json.loads((tmp_path / "run" / "training.json").read_text())["status"] == "failed"
    monkeypatch.undo()
    resumed = train(cfg, instance, tmp_path / "run", mode="resume", progress=False)
    assert resumed["status"] == "completed" and curve(tmp_path / "run")["cost10"] == curve(tmp_path / "straight")["cost10"]
    assert straight["updates_done"] == 5


def test_a_second_interrupt_stops_at_once_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    instance = paper_instance(2, 0)
    cfg = TrainConfig(**RUN, updates=6)  # checkpoints at updates 2, 4 and 6
    train(cfg, instance, tmp_path / "straight", progress=False)
    interrupt_at(monkeypatch, 2, signals=1)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, instance, tmp_path / "run", progress=False)
    assert load_checkpoint(tmp_path / "run" / "checkpoint.pt")["trainer"]["update"] == 3
    interrupt_at(monkeypatch, 4, signals=2)  # twice in the resumed run, before update 5 does anything
    with pytest.raises(KeyboardInterrupt):
        train(cfg, instance, tmp_path / "run", mode="resume", progress=False)
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert (ckpt["status"], ckpt["trainer"]["update"]) == ("running", 4) and curve(tmp_path / "run")["update"] == [1, 2, 3, 4]
    monkeypatch.undo()
    train(cfg, instance, tmp_path / "run", mode="resume", progress=False)
    assert curve(tmp_path / "run")["cost10"] == curve(tmp_path / "straight")["cost10"]


def test_train_script_saves_on_ctrl_c_and_the_printed_command_resumes_to_the_uninterrupted_curve(tmp_path):
    """An interrupted fine-tune given every flag that reaches the config (and the evaluation's): the command that
    train.py prints resumes it (a command that left one out would be refused: its config would differ)."""
    inst = tmp_path / "inst.json"
    instance = paper_instance(2, 0)
    instance.save(inst)
    source = tmp_path / "source"
    train(TrainConfig(**RUN, updates=2, seed=9), instance, source, progress=False)
    config = tmp_path / "tiny.yaml"
    fields = {**RUN, "checkpoint_every": 10, "learning_rate": "3e-4"}
    config.write_text("".join(f"{k}: {v}\n" for k, v in fields.items() if k != "method"))
    assert yaml.safe_load(config.read_text())["learning_rate"] == "3e-4"  # YAML 1.1 reads it as a string; train.py takes the number
    run, log = tmp_path / "run", tmp_path / "stderr.txt"
    flags = {
        "--method": "hpo",
        "--instance": str(inst),
        "--preset": "paper",
        "--seed": "3",
        "--config": str(config),
        "--updates": "30",
        "--batch": "4",
        "--initial-weights": str(source / "checkpoint.pt"),
        "--episodes": "2",
        "--horizon": "3",
        "--device": "cpu",
        "--out": str(run),
    }
    argv = [sys.executable, str(ROOT / "platform" / "train.py"), *[part for flag in flags.items() for part in flag]]
    one_thread = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny tensors: the same numbers, and no thread contention on a busy machine
    gate = Gate(tmp_path / "gate", call=("trainers.checkpoint:save_checkpoint", "after", 1))  # the child waits after its first checkpoint
    with open(log, "w") as stderr:
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr, env={**one_thread, **gate.env})
        try:
            gate.wait(process)
            process.send_signal(signal.SIGINT)  # at update 10, however fast the machine trains
            gate.release()
            process.wait(timeout=120)
        finally:
            process.kill()
    output = log.read_text()
    assert process.returncode == 130, output[-3000:]
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if line.startswith("interrupted:")]
    ckpt = load_checkpoint(run / "checkpoint.pt")
    done = ckpt["trainer"]["update"]
    assert ckpt["status"] == "interrupted" and 10 <= done < 30
    assert (ckpt["config"].learning_rate, ckpt["config"].seed, ckpt["config"].batch) == (3e-4, 3, 4)
    assert ckpt["config"].initial_weights == str(source / "checkpoint.pt") and ckpt["config"].imitation_updates == 0
    assert len(lines) == 1 and f"training stopped after update {done} of 30, saved in '{run / 'checkpoint.pt'}'; resume with: " in lines[0]
    assert curve(run)["update"] == list(range(1, done + 1)) and not (run / "greedy").exists()
    resume = shlex.split(lines[0].split("resume with: ")[1])
    assert resume[-1] == "--resume" and all(part in resume for flag in flags.items() for part in flag)
    finished = subprocess.run(resume, capture_output=True, text=True, timeout=300, env=one_thread)
    assert finished.returncode == 0, finished.stderr[-3000:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        straight = train(ckpt["config"], instance, tmp_path / "straight", progress=False)
    finally:
        torch.set_num_threads(threads)
    assert curve(run)["update"] == list(range(1, 31)) and curve(run)["cost10"] == curve(tmp_path / "straight")["cost10"]
    assert json.loads((run / "greedy" / "summary.json").read_text())["training"]["updates_done"] == straight["updates_done"] == 30
    assert json.loads((run / "training.json").read_text())["attempts"] == [0, done]


def test_a_refused_resume_names_the_fields_that_differ_and_both_values(tmp_path):
    inst = tmp_path / "inst.json"
    paper_instance(2, 0).save(inst)
    train(TrainConfig(**RUN, updates=2), paper_instance(2, 0), tmp_path / "run", progress=False)
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    common = [
        "--instance",
        inst,
        "--preset",
        "paper",
        "--updates",
        3,
        "--episodes",
        2,
        "--horizon",
        3,
        "--out",
        tmp_path / "run",
        "--resume",
    ]
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({k: v for k, v in RUN.items() if k != "method"}))
    for flags, differs in (
        (["--method", "hpo", "--config", config, "--batch", 4, "--seed", 1], "batch 8 there, 4 here; seed 0 there, 1 here"),
        (["--method", "ppo", "--batch", 8], 'method "hpo" there, "ppo" here)'),
    ):
        result = run_script("train.py", *flags, *common)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert f"belongs to a run with other settings ({differs}" in errors[0] and "only 'updates' may change on resume" in errors[0]
    assert {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == before


def test_sigterm_while_train_py_starts_says_so_and_leaves_nothing(tmp_path):
    """SIGTERM while the script imports its libraries: the child is held before it imports trainers.experiment
    (after interrupt_start_up, before run_cli), so the signal lands there on any machine. Breaks if an interruption
    during the imports prints a traceback, writes the run folder or exits otherwise than 130."""
    inst = tmp_path / "inst.json"
    paper_instance(2, 0).save(inst)
    gate = Gate(tmp_path / "gate", before_import="trainers.experiment")
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "platform" / "train.py"), "--method", "hpo", "--instance", str(inst), "--out", str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **gate.env},
    )
    try:
        gate.wait(process)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130 and stderr.splitlines() == [
        "interrupted: stopped while starting, before any work; nothing was written"
    ], stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("checkpoint_every", -1, "an integer >= 0, got -1"),
        ("warmup", -3, "an integer >= 0, got -3"),
        ("batch", True, "an integer in [1, 65536], got a boolean true"),
        ("batch", 100_000_000, "an integer in [1, 65536], got 100000000 (memory: a pathwise update keeps B x n x d activations"),
        ("width", 2.5, "an integer in [1, 4096], got 2.5"),
        ("width", 1_000_000, "an integer in [1, 4096], got 1000000 (memory: the weights grow as d^2"),
        ("feed_forward", 16_385, "an integer in [1, 16384], got 16385 (memory: "),
        ("hidden", 10**6, "an integer in [1, 16384], got 1000000 (memory: "),
        ("updates", 20.0, "an integer >= 1, got 20.0"),
        ("rollout", "10", 'an integer in [1, 10000], got a string "10"'),
        (
            "rollout",
            10_001,
            "an integer in [1, 10000], got 10001 (the instance bounds keep costs finite in float32 over at most 10,000 steps)",
        ),
        ("seed", -1, "an integer in [0, 2147483647], got -1"),
        ("seed", 2**31, "an integer in [0, 2147483647], got 2147483648 (the largest seed HiGHS and Gurobi accept)"),
        ("learning_rate", "abc", 'a number > 0, got a string "abc"'),
        ("learning_rate", True, "a number > 0, got a boolean true"),
        ("learning_rate", 0, "a number > 0, got 0"),
        ("learning_rate", "3e-4", 'a number > 0, got a string "3e-4"'),
        ("learning_rate", math.inf, "a finite number > 0, got Infinity"),
        ("learning_rate", 10**400, "a number > 0 below 1.8e+308 (a float64), got 1000"),
        ("gae_lambda", 1.5, "a number in [0, 1], got 1.5"),
        ("gae_lambda", "0.9x", 'a number in [0, 1], got a string "0.9x"'),
        ("grad_clip", -5, "a number > 0, got -5"),
        ("divergence_cost", 0.0, "a number > 0, got 0.0"),
        ("entropy_start", -0.01, "a number >= 0, got -0.01"),
        ("entropy_end", math.nan, "a finite number >= 0, got NaN"),
        ("pathwise_weight", -1, "a number >= 0, got -1"),
        ("critic_weight", [0.1], "a number >= 0, got a list of 1: [0.1]"),
        ("final_learning_rate", 0, "a number > 0, got 0"),
        ("adam_eps", None, "a number > 0, got null"),
        ("device", "gpu", 'cpu, cuda or cuda:K, got a string "gpu"'),
        ("method", ["hpo"], "one of ['or-transformer', 'hpo'], got a list of 1: [\"hpo\"]"),
    ],
)
def test_every_config_field_is_checked(field, value, message):
    with pytest.raises(ConfigError, match=re.escape(f"config field '{field}': expected {message}")):
        TrainConfig.from_dict({field: value})


def test_numbers_in_yaml_form_are_read_as_numbers():
    text = "learning_rate: 3e-4\nfinal_learning_rate: 1E-5\ngae_lambda: 1\nadam_eps: .5e-8\nentropy_end: +0\n"
    cfg = TrainConfig.from_dict(load_yaml(text, "config file", "c.yaml"))  # YAML 1.1 (yaml.safe_load) reads 3e-4 as a string
    assert (cfg.learning_rate, cfg.final_learning_rate, cfg.gae_lambda, cfg.adam_eps, cfg.entropy_end) == (3e-4, 1e-5, 1.0, 0.5e-8, 0.0)
    assert isinstance(cfg.gae_lambda, float) and TrainConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match=r"config: expected a mapping of config fields, got list"):
        TrainConfig.from_dict([{"batch": 8}])
    with pytest.raises(ConfigError, match=r"preset: expected one of \['paper', 'cpu'\], got 'bogus'"):
        method_config("or-transformer", "bogus")
    assert issubclass(ConfigError, InputError)


def test_curve_columns_are_checked(tmp_path):
    instance = paper_instance(2, 0)
    train(TrainConfig(**RUN, updates=2), instance, tmp_path, progress=False)
    pq.write_table(pa.table({"update": [1, 2]}), tmp_path / "curve.parquet")
    with pytest.raises(
        InputError,
        match=r"expected the columns \['method', 'n', 'seed', 'update', 'cost10', 'wall_seconds', 'validation_cost', 'restarted'\]",
    ):
        train(TrainConfig(**RUN, updates=3), instance, tmp_path, mode="resume", progress=False)


def test_ctrl_c_during_the_last_update_reports_a_completed_run_not_a_resume(tmp_path, monkeypatch, capsys):
    """Ctrl-C while the last update runs: that update finishes and the run is saved as completed, so train.py
    says training completed and how to evaluate it, never "stopped ... resume with" (catches a loop that calls a
    completed run interrupted, or a message that offers to resume a run with nothing left to train)."""
    inst = tmp_path / "inst.json"
    paper_instance(2, 0).save(inst)
    run, updates = tmp_path / "run", 3
    config = tmp_path / "tiny.yaml"
    config.write_text("".join(f"{k}: {v}\n" for k, v in {**RUN, "imitation_updates": 0}.items() if k != "method"))
    interrupt_at(monkeypatch, updates - 1, signals=1)  # at the start of the last update
    flags = ["--method", "hpo", "--instance", inst, "--config", config, "--updates", updates, "--episodes", 2, "--horizon", 3]
    monkeypatch.setattr(sys, "argv", ["train.py", *map(str, flags), "--out", str(run)])
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(ROOT / "platform" / "train.py"), run_name="__main__")
    err = capsys.readouterr().err
    ckpt = load_checkpoint(run / "checkpoint.pt")
    assert (ckpt["status"], ckpt["trainer"]["update"]) == ("completed", updates)
    lines = [line for line in err.splitlines() if line.startswith("interrupted")]
    assert stop.value.code == 130 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith(f"interrupted: training completed after {updates} updates") and "resume with" not in lines[0], lines[0]
    assert "--resume" in lines[0]  # evaluating it is a resume of the completed run
