"""Fine-tuning: a pathwise run that starts from another run's network (config field initial_weights)."""

import json

import pytest
import torch
import yaml
from conftest import TINY, run_script

from envs.instance import paper_instance
from trainers.config import ConfigError
from trainers.pathwise import PathwiseTrainer
from trainers.pathwise_config import NO_WARM_START
from trainers.registry import load_checkpoint, method_config, train

NETWORK = {**TINY, "updates": 2}
"""The network of the session's trained runs (conftest.trained, n = 2), for 2 updates."""
FINE_TUNE = {**NETWORK, **NO_WARM_START}
"""... trained at once (no warm start)."""


@pytest.fixture(scope="module")
def trained_paths(trained):
    """The session's OR-Transformer and HPO checkpoints (n = 2, seed 0)."""
    return {method: str(trained[method].checkpoint) for method in ("or-transformer", "hpo")}


def weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_an_or_transformer_starts_from_a_run_at_another_size(trained_paths):
    fresh = PathwiseTrainer(method_config("or-transformer", "cpu", {**FINE_TUNE, "seed": 5}), paper_instance(6, 0).to_torch())
    tuned = PathwiseTrainer(
        method_config("or-transformer", "cpu", {**FINE_TUNE, "seed": 5, "initial_weights": trained_paths["or-transformer"]}),
        paper_instance(6, 0).to_torch(),
    )
    saved = load_checkpoint(trained_paths["or-transformer"])["trainer"]["model"]
    got = weights(tuned.model)
    assert got.keys() == saved.keys() and all(torch.equal(got[k], saved[k]) for k in saved)
    assert not all(torch.equal(got[k], v) for k, v in weights(fresh.model).items())  # not the seed's fresh network
    tuned.step()  # and it trains at the new size


def test_another_network_is_refused_naming_the_field(trained_paths):
    path = trained_paths["or-transformer"]
    with pytest.raises(ConfigError, match=r"config field 'initial_weights'.*width 16 \(this run: 32\)"):
        PathwiseTrainer(
            method_config("or-transformer", "cpu", {**FINE_TUNE, "width": 32, "initial_weights": path}), paper_instance(2, 0).to_torch()
        )
    with pytest.raises(ConfigError, match=r"config field 'initial_weights'.*setup_feature 'per-item' \(this run: 'paper'\)"):
        PathwiseTrainer(
            method_config("or-transformer", "cpu", {**FINE_TUNE, "setup_feature": "paper", "initial_weights": path}),
            paper_instance(2, 0).to_torch(),
        )
    with pytest.raises(ConfigError, match=r"config field 'setup_feature': an hpo network has a fixed n"):
        method_config("hpo", "cpu", {**FINE_TUNE, "setup_feature": "per-item"})
    with pytest.raises(ConfigError, match=r"config field 'initial_weights'.*method 'or-transformer' \(this run: 'hpo'\)"):
        PathwiseTrainer(method_config("hpo", "cpu", {**FINE_TUNE, "initial_weights": path}), paper_instance(2, 0).to_torch())
    with pytest.raises(ConfigError, match=r"config field 'initial_weights'.*does not fit this network"):  # HPO's input is 11 n + 4
        PathwiseTrainer(
            method_config("hpo", "cpu", {**FINE_TUNE, "initial_weights": trained_paths["hpo"]}), paper_instance(6, 0).to_torch()
        )


def test_a_fine_tune_resumes_without_its_initial_weights_file(trained_paths, tmp_path):
    """The resumed run's weights come from its own checkpoint: the file it started from may be gone (or changed)."""
    source = tmp_path / "source.pt"
    source.write_bytes(open(trained_paths["or-transformer"], "rb").read())
    config = method_config("or-transformer", "cpu", {**FINE_TUNE, "updates": 1, "initial_weights": str(source)})
    train(config, paper_instance(4, 0), tmp_path / "ft", progress=False)
    source.unlink()
    resumed = train(
        method_config("or-transformer", "cpu", {**FINE_TUNE, "updates": 2, "initial_weights": str(source)}),
        paper_instance(4, 0),
        tmp_path / "ft",
        mode="resume",
        progress=False,
    )
    assert resumed["status"] == "completed" and resumed["updates_done"] == 2 and resumed["attempts"] == [0, 1]


@pytest.mark.slow
def test_the_command_line_fine_tune_skips_the_presets_warm_start(trained_paths, tmp_path):
    """train.py --initial-weights: the cpu preset imitates the lookahead first, which would overwrite the network."""
    inst, config = tmp_path / "i6.json", tmp_path / "network.yaml"
    paper_instance(6, 0).save(inst)
    config.write_text(yaml.safe_dump(NETWORK))
    run_script(
        "train.py",
        "--method",
        "or-transformer",
        "--instance",
        inst,
        "--config",
        config,
        "--initial-weights",
        trained_paths["or-transformer"],
        "--episodes",
        2,
        "--horizon",
        3,
        "--out",
        tmp_path / "ft",
        check=True,
    )
    fine_tune = load_checkpoint(tmp_path / "ft" / "checkpoint.pt")["config"]
    assert (fine_tune.imitation_updates, fine_tune.imitation_dagger_updates) == (0, 0)
    assert "warm_start" not in json.loads((tmp_path / "ft" / "training.json").read_text())
    config.write_text(yaml.safe_dump({**NETWORK, "imitation_updates": 2}))  # unless the config asks for one
    run_script(
        "train.py",
        "--method",
        "or-transformer",
        "--instance",
        inst,
        "--config",
        config,
        "--initial-weights",
        trained_paths["or-transformer"],
        "--episodes",
        2,
        "--horizon",
        3,
        "--out",
        tmp_path / "ft2",
        check=True,
    )
    assert json.loads((tmp_path / "ft2" / "training.json").read_text())["warm_start"]["updates"] == 2


def test_a_refused_initial_weights_leaves_no_run_folder(trained_paths, tmp_path):
    """The checkpoint is checked before the run folder is made (the script and the library alike)."""
    inst = tmp_path / "i4.json"
    paper_instance(4, 0).save(inst)
    result = run_script(
        "train.py", "--method", "hpo", "--instance", inst, "--initial-weights", trained_paths["or-transformer"], "--out", tmp_path / "ft"
    )
    assert result.returncode == 2 and "holds another network: method 'or-transformer' (this run: 'hpo')" in result.stderr, result.stderr[
        -2000:
    ]
    assert not (tmp_path / "ft").exists()
    with pytest.raises(ConfigError, match="does not fit this network"):
        train(
            method_config("hpo", "cpu", {**FINE_TUNE, "initial_weights": trained_paths["hpo"]}),
            paper_instance(6, 0),
            tmp_path / "lib",
            progress=False,
        )
    assert not (tmp_path / "lib").exists()
