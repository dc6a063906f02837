"""The method registry and the experiment API: one preset table for both trainer families, no import
circle among the trainers, and every method trained and evaluated by trainers.experiment.run_experiment
(once per session: conftest.trained), its checkpoint evaluated again by `evaluate.py --policy checkpoint:` (decide.py on every method's
checkpoint: tests/test_decide.py)."""

import json
import subprocess
import sys
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields

import pyarrow.parquet as pq
import pytest
from conftest import EPISODES, HORIZON, INSTANCE, METHODS, ROOT, TINY, run_script, tiny
from helpers import import_circle, package_imports

from envs.evaluation import evaluate
from envs.exogenous import HELDOUT_SEED, sample_paths
from envs.instance import paper_instance
from plumbing.errors import InputError
from run_results.records import read_evaluation
from trainers import pathwise, pathwise_config, registry
from trainers.checkpoint import CheckpointError, checkpoint_file, read_checkpoint
from trainers.config import ConfigError, TrainerConfig
from trainers.experiment import run_experiment
from trainers.pathwise_config import TrainConfig

# ---- the registry ---------------------------------------------------------------------------------


def test_one_preset_table_for_both_families():
    shared = [f.name for f in fields(TrainerConfig) if f.name != "method"]
    for preset, table in registry.PRESETS.items():
        assert set(table) <= {"shared", "pathwise", "rllib", *METHODS}, preset  # a misspelt part would apply to nothing
        configs = {method: registry.method_config(method, preset) for method in METHODS}
        own = {name for part, values in table.items() if part != "shared" for name in values}
        for name in set(shared) - own:  # a family or a method may set a shared field for itself
            assert len({getattr(c, name) for c in configs.values()}) == 1, (preset, name)
    cpu = {method: registry.method_config(method, "cpu") for method in METHODS}
    # the cpu preset (trainers/registry.py, docs/methods.md): B 128, 1,280 updates, 2 blocks of width 64, 4 heads,
    # feed-forward 256, hidden 256
    assert {(c.batch, c.updates, c.blocks, c.width, c.heads, c.feed_forward, c.hidden) for c in cpu.values()} == {
        (128, 1280, 2, 64, 4, 256, 256)
    }
    assert cpu["or-transformer"].checkpoint_every == cpu["hpo"].checkpoint_every == 250
    # the pathwise methods start by imitating a teacher (docs/experiments.md): OR-Transformer the lookahead, 300
    # plain and 1,000 DAgger updates, with the setup-cost feature per item; HPO classical-best, 300 plain; the paper
    # preset does not
    ot, hpo = cpu["or-transformer"], cpu["hpo"]
    assert (ot.imitation_teacher, ot.imitation_updates, ot.imitation_dagger_updates, ot.setup_feature) == (
        "decomposition-lookahead",
        300,
        1000,
        "per-item",
    )
    hpo_warm_start = (hpo.imitation_teacher, hpo.imitation_updates, hpo.imitation_dagger_updates, hpo.setup_feature)
    assert hpo_warm_start == ("classical-best", 300, 0, "paper")
    assert {(c.learning_rate, c.final_learning_rate) for c in (cpu["or-transformer"], cpu["hpo"])} == {(1e-4, 1e-5)}
    assert cpu["ppo"].learning_rate == registry.method_config("ppo", "paper").learning_rate  # PPO keeps its own
    paper_ot = registry.method_config("or-transformer", "paper")
    assert (paper_ot.imitation_updates, paper_ot.imitation_dagger_updates, paper_ot.setup_feature) == (0, 0, "paper")
    assert (cpu["ppo"].epochs, cpu["ppo"].minibatches) == (cpu["transformer-ppo"].epochs, cpu["transformer-ppo"].minibatches) == (2, 2)
    paper = registry.method_config("hpo", "paper")
    assert (paper.batch, paper.updates, paper.width, paper.checkpoint_every) == (
        1024,
        16_000,
        128,
        500,
    )  # the paper's table, the config's defaults
    from trainers import pathwise, rllib_ppo

    assert not {"PRESETS", "preset"} & set(vars(pathwise)) and not {"PPO_PRESETS", "ppo_preset"} & set(vars(rllib_ppo))


def test_every_method_has_its_config_class():
    for method in METHODS:
        config = registry.method_config(method, "paper", {"seed": 3})
        assert config.method == method and config.seed == 3
        assert registry.config_from_dict(config.to_dict()) == config
    assert isinstance(registry.method_config("hpo"), TrainConfig)
    assert type(registry.method_config("ppo")).__name__ == "PPOTrainConfig"
    from trainers import rllib_ppo

    families = {family: {m.name for m in registry.METHODS.values() if m.family == family} for family in ("pathwise", "rllib")}
    assert families == {"pathwise": set(pathwise_config.METHODS), "rllib": set(rllib_ppo.NETWORKS)}  # what each config class accepts


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: registry.method_config("dqn"),
            r"method: expected one of \['or-transformer', 'transformer-ppo', 'hpo', 'ppo'\], got 'dqn'",
        ),
        (lambda: registry.method_config("hpo", "huge"), r"preset: expected one of \['paper', 'cpu'\], got 'huge'"),
        (lambda: registry.method_config("ppo", "cpu", {"lr": 1}), r"unknown keys \['lr'\]; allowed keys are \["),
        (lambda: registry.method_config("ppo", "cpu", {"method": "hpo"}), r"overrides: 'method' is not a field to override"),
        (lambda: registry.config_from_dict({"method": ["hpo"]}), r"method: expected one of .* got \['hpo'\]"),
        (lambda: registry.train(TrainConfig(), INSTANCE, "x", workers=0), r"workers: expected None .* or an integer >= 1, got 0"),
    ],
)
def test_unknown_names_are_config_errors(call, message):
    with pytest.raises(ConfigError, match=message):
        call()


def test_experiment_arguments_are_checked_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match=r"method: expected one of \['or-transformer', 'transformer-ppo', 'hpo', 'ppo'\], got 'sac'"):
        run_experiment("sac", INSTANCE, tmp_path / "a")
    with pytest.raises(ConfigError, match=r"overrides: \['seed', 'device'\] are arguments of the experiment"):
        run_experiment("hpo", INSTANCE, tmp_path / "b", overrides={"seed": 1, "device": "cpu"})
    with pytest.raises(ConfigError, match=r"config field 'width': expected an integer in \[1, 4096\], got 0"):
        run_experiment("hpo", INSTANCE, tmp_path / "c", overrides={"width": 0})
    with pytest.raises(InputError, match="has no checkpoint.pt to resume"):
        run_experiment("hpo", INSTANCE, tmp_path / "d", overrides=tiny("hpo"), mode="resume")
    assert list(tmp_path.iterdir()) == []


def test_the_trainers_import_each_other_without_a_circle():
    graph = package_imports("trainers")
    assert (
        "trainers.rllib_ppo" in graph["trainers.registry"] and "trainers.run_folder" in graph["trainers.rllib_ppo"]
    )  # the graph sees lazy imports
    assert import_circle(graph) is None, " -> ".join(import_circle(graph))
    assert graph["trainers.checkpoint"] == set()  # the file format knows no method


def test_the_registry_imports_no_rllib():
    code = (
        "import sys, trainers.registry, trainers.experiment; "
        "assert not [m for m in sys.modules if m.startswith('ray.rllib')], 'RLlib imported'; "
        "trainers.registry.method_config('hpo'); assert not [m for m in sys.modules if m.startswith('ray.rllib')]"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


# ---- run_experiment on every method ---------------------------------------------------------------


def rebuilt_policy(method: str, weights, config, mode: str):
    """The trained policy put together by hand from the checkpoint's weights, without the registry."""
    if method in ("or-transformer", "hpo"):
        from trainers.pathwise_config import build_network
        from trainers.policy import LearnedPolicy

        model, policy_class = build_network(config, INSTANCE.n), LearnedPolicy
    else:
        from trainers.rllib_ppo import RLModulePolicy, build_module

        model, policy_class = build_module(config, INSTANCE.n), RLModulePolicy
    model.load_state_dict(weights)
    return policy_class(model, mode, config.seed)


@pytest.mark.parametrize("method", METHODS)
def test_run_experiment_trains_and_evaluates_every_method(trained, method):
    out, result, calls = trained[method].folder, trained[method].result, trained[method].calls
    assert set(result) == {"training", "greedy", "sampled"}
    assert result["training"] == json.loads((out / "training.json").read_text())
    assert (result["training"]["status"], result["training"]["updates_done"]) == ("completed", 2)
    assert result["training"].get("warm_start", {}).get("updates") == (3 if method == "or-transformer" else None)
    ckpt = registry.load_checkpoint(out / "checkpoint.pt")
    evaluated = registry.load_checkpoint(checkpoint_file(out))  # best.pt of a method that validates
    assert ckpt["config"] == registry.method_config(method, "cpu", {**tiny(method), "seed": 0, "device": "cpu"})
    curve = pq.read_table(out / "curve.parquet").to_pydict()
    assert [u for u, _ in calls] == curve["update"] == [1, 2]  # on_update after every update, with the curve's metrics
    assert [m["cost10"] for _, m in calls] == curve["cost10"]
    paths = sample_paths(INSTANCE, HELDOUT_SEED, EPISODES, HORIZON)
    for mode in ("greedy", "sampled"):
        summary = read_evaluation(out / mode)["summary"]
        assert result[mode] == summary
        assert (summary["policy"], summary["episodes"], summary["horizon"], summary["seed"]) == (
            f"{method}-{mode}",
            EPISODES,
            HORIZON,
            HELDOUT_SEED,
        )
        assert summary["instance_hash"] == INSTANCE.content_hash() and summary["training"]["updates_done"] == 2
        assert summary["parameters"]["network"] == ("best" if method in pathwise_config.METHODS else "last")
        by_hand = evaluate(rebuilt_policy(method, evaluated["trainer"]["model"], ckpt["config"], mode), INSTANCE.to_torch(), paths)
        assert summary["mean"] == pytest.approx(by_hand.mean, rel=1e-9)


@pytest.mark.parametrize("method", METHODS)
def test_a_policy_of_fixed_input_size_refuses_another_n(trained, method):
    path = trained[method].checkpoint
    other = paper_instance(3, 0)
    if method == "or-transformer":  # attention over items: any n
        policy, _ = registry.load_policy(path, instance=other)
        assert policy(*policy_input(other))[1].shape == (1, 3)
    else:
        with pytest.raises(CheckpointError, match=f"a {method} policy for n = 2 items cannot act on an instance with n = 3"):
            registry.load_policy(path, instance=other)


def policy_input(instance):
    from envs.dynamics import initial_state
    from envs.exogenous import FactorDemandStream

    tinst = instance.to_torch()
    return initial_state(tinst, FactorDemandStream(tinst, 1, 0).initial_factor()), tinst


def test_evaluate_script_on_every_methods_checkpoint(trained, tmp_path):
    (tmp_path / "inst.json").write_text(json.dumps(INSTANCE.to_dict()))
    runs = [(method, mode) for method in METHODS for mode in ("greedy", "sampled")]

    def evaluate_script(method, mode):
        return run_script(
            "evaluate.py",
            "--instance",
            tmp_path / "inst.json",
            "--policy",
            f"checkpoint:{trained[method].folder}",  # the run's best network, as its own evaluation
            "--mode",
            mode,
            "--episodes",
            EPISODES,
            "--horizon",
            HORIZON,
            "--out",
            tmp_path / f"{method}-{mode}",
        )

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda run: evaluate_script(*run), runs))
    for (method, mode), result in zip(runs, results):
        assert result.returncode == 0, result.stderr[-2000:]
        summary = read_evaluation(tmp_path / f"{method}-{mode}")["summary"]
        assert summary["policy"] == f"{method}-{mode}" and summary["parameters"]["method"] == method
        assert summary["mean"] == pytest.approx(trained[method].result[mode]["mean"], rel=1e-9)  # the same held-out episodes
        kept = read_checkpoint(checkpoint_file(trained[method].folder))["trainer"]
        network = (
            f"the best network, of update {kept['update']}, validation {kept['validation']['cost']:.2f} ± {kept['validation']['se']:.2f}"
            if method in pathwise_config.METHODS
            else f"the network of update {kept['update']}"
        )
        line = f"{method}-{mode} ({checkpoint_file(trained[method].folder)}: {network}): mean "
        assert any(printed.startswith(line) for printed in result.stdout.splitlines()), result.stdout


def test_resume_of_an_ended_experiment_trains_nothing_and_evaluates_again(trained, tmp_path):
    import shutil

    out = tmp_path / "hpo"
    shutil.copytree(trained["hpo"].folder, out)
    before = {name: (out / name).read_bytes() for name in ("checkpoint.pt", "curve.parquet", "training.json")}
    shutil.rmtree(out / "sampled")  # killed during its evaluation
    (out / "greedy" / "summary.json").unlink()
    with pytest.raises(InputError, match="already holds a run"):
        run_experiment("hpo", INSTANCE, out, overrides=tiny("hpo"), episodes=EPISODES, horizon=HORIZON, progress=False)
    calls = []
    again = run_experiment(
        "hpo",
        INSTANCE,
        out,
        overrides=tiny("hpo"),
        mode="resume",
        episodes=EPISODES,
        horizon=HORIZON,
        progress=False,
        on_update=lambda *a: calls.append(a),
    )
    assert calls == [] and {name: (out / name).read_bytes() for name in before} == before
    for mode in ("greedy", "sampled"):
        assert read_evaluation(out / mode)["summary"]["mean"] == trained["hpo"].result[mode]["mean"] == again[mode]["mean"]


def test_workers_train_a_pathwise_method_with_ray_train(monkeypatch, tmp_path):
    """workers=k goes to trainers.ray_train.train_data_parallel (replaced here by one that records its arguments
    and trains in this process), and the evaluation follows."""
    calls = []

    def train_data_parallel(config, instance, out_dir, mode="new", workers=1, use_gpu=False, resources_per_worker=None, progress=True):
        calls.append((config.method, mode, workers, use_gpu, progress))
        return pathwise.train(config, instance, out_dir, mode, progress)

    monkeypatch.setitem(sys.modules, "trainers.ray_train", types.SimpleNamespace(train_data_parallel=train_data_parallel))
    updates = []
    result = run_experiment(
        "hpo",
        INSTANCE,
        tmp_path,
        overrides=tiny("hpo"),
        episodes=EPISODES,
        horizon=HORIZON,
        progress=False,
        workers=2,
        on_update=lambda *a: updates.append(a),
    )
    assert calls == [("hpo", "new", 2, False, False)]
    assert updates == []  # Ray Train workers report to ray.train.report, not to this process's hook
    assert result["training"]["updates_done"] == 2 and read_evaluation(tmp_path / "greedy")["summary"] == result["greedy"]


def test_workers_scale_an_rllib_method_with_env_runners_and_learners(monkeypatch, tmp_path):
    """workers=k for PPO: k remote env runners and k remote learners (a GPU each with use_gpu), in the config
    that reaches the run in this process (trainers.run_folder.train_run, replaced here: no training)."""
    seen = []
    monkeypatch.setattr(registry, "train_run", lambda out_dir, mode, config, instance, run, *args: seen.append(run.config) or {})
    monkeypatch.setattr("ray_access.session.init_ray", lambda workers, address=None: None)
    config = registry.method_config("ppo", "cpu", TINY)
    registry.train(config, INSTANCE, tmp_path, workers=2)
    registry.train(config, INSTANCE, tmp_path, workers=1, use_gpu=True)
    registry.train(config, INSTANCE, tmp_path)
    assert [(c.env_runners, c.learners, c.gpus_per_learner) for c in seen] == [(2, 2, 0), (1, 1, 1), (0, 0, 0)]
    assert seen[2] == config
    with pytest.raises(ConfigError, match=r"config fields \['env_runners', 'learners', 'gpus_per_learner'\]: set by workers = 2"):
        registry.train(registry.method_config("ppo", "cpu", {**TINY, "env_runners": 1}), INSTANCE, tmp_path, workers=2)


@pytest.mark.slow
def test_run_experiment_on_one_ray_train_worker_gives_the_in_process_curve(trained, ray_session, tmp_path):
    result = run_experiment("hpo", INSTANCE, tmp_path, overrides=tiny("hpo"), episodes=EPISODES, horizon=HORIZON, progress=False, workers=1)
    in_process = trained["hpo"].folder
    assert result["training"]["updates_done"] == 2 and read_evaluation(tmp_path / "sampled")["summary"] == result["sampled"]
    curve = pq.read_table(tmp_path / "curve.parquet").to_pydict()["cost10"]
    assert curve == pytest.approx(pq.read_table(in_process / "curve.parquet").to_pydict()["cost10"], rel=1e-6)
