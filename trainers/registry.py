"""The learned methods by name, in one table: each method's family (the hybrid pathwise trainer or RLlib
PPO), typed config, presets, trainer and policy loader. Everything that depends on the method goes through
here; nothing else branches on a method's name.

This module imports no RLlib: the RLlib family (trainers.rllib_ppo) is imported when one of its methods
is used. Layers, each importing only those below it (tests/test_registry.py checks there is no circle):
trainers.checkpoint (the file format) <- trainers.run_folder (run folders and a run's life, for every method) <-
trainers.pathwise (the pathwise update, over trainers.streams, and its training in this process), trainers.rllib_ppo,
trainers.ray_train <- this registry <- trainers.experiment, the scripts and the sweep.

  method_config("ppo", "cpu", {"updates": 40})              typed config: the preset, then the overrides
  train(config, instance, out_dir, mode="new")               a run folder, by the config's method
  load_checkpoint(path) / load_policy(path, "greedy")        a checkpoint of any method, and its policy
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch

from envs.features import check_one_factor
from envs.instance import Instance
from plumbing.errors import InputError, first_line
from trainers.checkpoint import CheckpointError, read_checkpoint
from trainers.config import ConfigError, MethodName
from trainers.pathwise import PathwiseRun
from trainers.pathwise_config import TrainConfig, build_network
from trainers.policy import LearnedPolicy
from trainers.run_folder import MethodRun, OnUpdate, train_run


@dataclass(frozen=True)
class Method:
    name: str
    family: str
    """pathwise (trainers.pathwise: OR-Transformer, HPO) or rllib (trainers.rllib_ppo: PPO, Transformer-PPO)."""
    fixed_size: bool
    """The policy's input has a fixed size 11n + 4 (perceptrons, RLlib modules): it acts only on its training n."""
    label: str
    """The name in the report's tables and figures."""
    throughput: float
    """Transitions per second of one CPU learner at n = 16, B = 128 (`python bench/rllib.py`, docs/benchmarks.md),
    for the sweep's dry-run estimate of training hours only."""


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(MethodName.OR_TRANSFORMER.value, "pathwise", fixed_size=False, label="OR-Transformer", throughput=1662.0),
        Method(MethodName.TRANSFORMER_PPO.value, "rllib", fixed_size=True, label="Transformer-PPO", throughput=536.0),
        Method(MethodName.HPO.value, "pathwise", fixed_size=True, label="HPO", throughput=25375.0),
        Method(MethodName.PPO.value, "rllib", fixed_size=True, label="PPO", throughput=4381.0),
    )
}
"""In the paper's column order (table "Mean discounted cost"), which the report keeps."""

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # The paper's configuration: the configs' defaults (table "OR-Transformer architecture and training settings").
    "paper": {"shared": {}, "pathwise": {}, "rllib": {}},
    # Trains n = 16 in under an hour on one CPU core: 8x fewer rollouts per update, 12.5x fewer updates, two
    # blocks of width 64 (4 heads, feed-forward 256) instead of four of 128, the paper's updates at a 3x lower
    # learning rate (1e-4 to 1e-5). The pathwise methods first imitate a teacher (the warm start): OR-Transformer
    # the decomposition lookahead, 300 plain and 1,000 DAgger updates, with the setup-cost feature per item (the
    # best selected student over 3 seeds, and one network for every n: docs/experiments.md); HPO classical-best,
    # 300 plain updates. PPO makes 2 passes of 2 minibatches (4 Adam steps) per update instead of 4 x 4, so
    # Transformer-PPO at n = 16 fits in about half an hour here.
    "cpu": {
        "shared": {"batch": 128, "updates": 1280, "blocks": 2, "width": 64, "heads": 4, "feed_forward": 256, "hidden": 256},
        "pathwise": {"checkpoint_every": 250, "imitation_updates": 300, "learning_rate": 1e-4, "final_learning_rate": 1e-5},
        "rllib": {"epochs": 2, "minibatches": 2},
        MethodName.OR_TRANSFORMER.value: {
            "imitation_teacher": "decomposition-lookahead",
            "imitation_dagger_updates": 1000,
            "setup_feature": "per-item",
        },
    },
}
"""Per preset: the fields every family shares, then each family's own, then a method's own (over the config's
defaults)."""


def method(name) -> Method:
    """The registry entry of `name`; a ConfigError names the methods there are."""
    if not isinstance(name, str) or name not in METHODS:
        raise ConfigError(f"method: expected one of {list(METHODS)}, got {name!r}")
    return METHODS[name]


# ---- the two families ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Where and how one training run goes: `train`'s arguments after the config and the instance, but the hook
    `on_update`, which only a run in this process calls."""

    out_dir: str | os.PathLike
    mode: str = "new"
    progress: bool = True
    workers: int | None = None
    """None: train in this process; k: on k Ray processes (pathwise: Ray Train workers; RLlib: env runners and learners)."""
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None


class Family(NamedTuple):
    config_class: type
    method_run: Callable[[Any, Instance, Placement], MethodRun]
    """(config, instance, placement) -> the run's parts in this process (trainers.run_folder.MethodRun)."""
    data_parallel: Callable[[Any, Instance, Placement], dict[str, Any]] | None
    """(config, instance, placement) -> training.json's content, for a placement on Ray Train workers; None: the
    family places its workers itself, from `method_run`."""
    build_model: Callable[[Any, int], torch.nn.Module]
    """(config, n) -> the network whose state_dict the checkpoint holds."""
    policy_class: type
    """(model, mode, seed) -> a policy for the shared evaluator and decide.py."""


def _pathwise_run(config: TrainConfig, instance: Instance, placement: Placement) -> PathwiseRun:
    return PathwiseRun(config, instance)


def _train_pathwise_on_workers(config: TrainConfig, instance: Instance, placement: Placement) -> dict[str, Any]:
    """On `workers` Ray Train workers, each simulating its shard of the B rollouts; their metrics go to
    ray.train.report (and on to Tune inside a trial), not to `on_update`."""
    from trainers.ray_train import train_data_parallel  # imports Ray Train

    return train_data_parallel(
        config,
        instance,
        placement.out_dir,
        mode=placement.mode,
        workers=placement.workers,
        use_gpu=placement.use_gpu,
        resources_per_worker=placement.resources_per_worker,
        progress=placement.progress,
    )


def _rllib_run(config, instance: Instance, placement: Placement):
    """RLlib's driver runs in this process, and its env runners and learners too unless the config asks for
    remote ones or `workers` is given: then, as a Ray Train worker holds a simulator shard and a learner
    replica, `workers` remote env runners and `workers` remote learners (with a GPU each when `use_gpu`)."""
    from trainers.rllib_ppo import PPORun

    if placement.workers is not None:
        scaling = {"env_runners": placement.workers, "learners": placement.workers, "gpus_per_learner": 1 if placement.use_gpu else 0}
        defaults = type(config)(method=config.method)
        if any(getattr(config, k) != getattr(defaults, k) for k in scaling):
            raise ConfigError(
                f"config fields {list(scaling)}: set by workers = {placement.workers}; leave them at their defaults or give no workers"
            )
        config = replace(config, **scaling)
    return PPORun(config, instance)


def family(name: str) -> Family:
    """The implementation of a family; the rllib one imports RLlib."""
    if name == "pathwise":
        return Family(TrainConfig, _pathwise_run, _train_pathwise_on_workers, build_network, LearnedPolicy)
    from trainers.rllib_ppo import PPOTrainConfig, RLModulePolicy, build_module

    return Family(PPOTrainConfig, _rllib_run, None, build_module, RLModulePolicy)


# ---- configs, training, checkpoints, policies ---------------------------------------------------------


def method_config(name: str, preset: str = "cpu", overrides: dict[str, Any] | None = None):
    """The typed config of method `name`: the config's defaults (the paper's), then the preset's shared, family
    and method fields, then `overrides` (config fields; unknown ones are refused, naming the allowed ones)."""
    entry = method(name)
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ConfigError(f"preset: expected one of {list(PRESETS)}, got {preset!r}")
    overrides = dict(overrides or {})
    if "method" in overrides:
        raise ConfigError(f"overrides: 'method' is not a field to override (the method is {name!r})")
    values = PRESETS[preset]
    return family(entry.family).config_class.from_dict(
        {**values["shared"], **values[entry.family], **values.get(name, {}), **overrides, "method": entry.name}
    )


def config_from_dict(data: dict[str, Any]):
    """A stored config (config.to_dict()) as its method's typed config."""
    if not isinstance(data, dict):
        raise ConfigError(f"config: expected a mapping of config fields, got {type(data).__name__}")
    return family(method(data.get("method")).family).config_class.from_dict(data)


def train(
    config,
    instance: Instance,
    out_dir: str | os.PathLike,
    *,
    mode: str = "new",
    progress: bool = True,
    workers: int | None = None,
    use_gpu: bool = False,
    on_update: OnUpdate = None,
    resources_per_worker: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Trains `config`'s method in the run folder `out_dir` (modes and files: trainers.run_folder); returns training.json's content.
    `workers` None trains in this process (on config.device), k on k Ray processes, a GPU each with `use_gpu` (pathwise: Ray Train
    workers; RLlib: env runners and learners); other values raise ConfigError. `on_update(update, metrics)` is called after each update
    made in this process (Ray Train workers report to ray.train.report, and on to Tune in a trial). `resources_per_worker` (Ray Train
    workers): as ray.train.ScalingConfig's, e.g. {"CPU": 2, "GPU": 0.25}."""
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
        raise ConfigError(f"workers: expected None (train in this process) or an integer >= 1, got {workers!r}")
    check_one_factor(instance, f"method {config.method!r}")
    placement = Placement(out_dir, mode, progress, workers, use_gpu, resources_per_worker)
    implementation = family(method(config.method).family)
    if workers is not None and implementation.data_parallel is not None:
        return implementation.data_parallel(config, instance, placement)
    return train_run(out_dir, mode, config, instance, implementation.method_run(config, instance, placement), progress, on_update)


def load_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu") -> dict[str, Any]:
    """A checkpoint of any method: {config (its method's typed config), instance, status, reason, trainer}."""
    ckpt = read_checkpoint(path, device)
    try:
        config = config_from_dict(ckpt["config"])
    except ConfigError as exc:
        raise CheckpointError(f"checkpoint '{path}': malformed content ({exc})") from None
    return {**ckpt, "config": config}


def load_policy(
    path: str | os.PathLike,
    mode: str = "greedy",
    device: str | torch.device = "cpu",
    instance: Instance | None = None,
    precision: str = "float32",
) -> tuple[Any, dict[str, Any]]:
    """A checkpoint as a policy (greedy or sampled), and the checkpoint. With `instance`, a policy of fixed
    input size is checked against its item count (OR-Transformer acts on any n). `precision` bfloat16 (a pathwise
    method's network, trainers.policy.LearnedPolicy) runs its networks under bfloat16 autocast."""
    ckpt = load_checkpoint(path, device)
    config, n = ckpt["config"], ckpt["instance"].n
    entry = method(config.method)
    if instance is not None and entry.fixed_size and instance.n != n:
        raise CheckpointError(
            f"checkpoint '{path}': a {config.method} policy for n = {n} items cannot act on an instance with n = {instance.n}"
        )
    if instance is not None:
        check_one_factor(instance, f"checkpoint '{path}'")
    implementation = family(entry.family)
    model = implementation.build_model(config, n).to(device)
    try:
        model.load_state_dict(ckpt["trainer"]["model"])
    except RuntimeError as exc:
        raise CheckpointError(f"checkpoint '{path}': weights do not match its config ({first_line(exc)})") from None
    if precision == "float32":
        return implementation.policy_class(model, mode, config.seed), ckpt
    if entry.family != "pathwise":
        raise InputError(f"precision {precision}: applies to or-transformer and hpo checkpoints; '{path}' holds a {config.method} policy")
    return implementation.policy_class(model, mode, config.seed, precision=precision), ckpt
