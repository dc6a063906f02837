"""RLlib PPO baselines (new API stack) on the same simulator, budget and evaluation as the pathwise trainer.

* `JRPModule`: one thin `TorchRLModule` + `ValueFunctionAPI` adapter around the networks of
  `trainers.networks`: `network="mlp"` (PPO: perceptrons with two hidden layers, tanh, on the flat
  11n + 4 input) or `network="transformer"` (Transformer-PPO: the OR-Transformer encoders).
* `JRPActionDistribution`: Y ~ Bernoulli(p) and, per item, a fraction u_i ~ Beta(alpha_i, beta_i) with
  alpha, beta = 1 + softplus(.) >= 1; the env executes Q_i = u_i qbar_i. A Beta lives on [0, 1] exactly,
  so every sampled action is feasible without clipping (a clipped Gaussian would make the executed
  action differ from the one whose log-probability PPO uses), and alpha, beta >= 1 keeps the density
  bounded. RLlib must not rescale it: `normalize_actions=False`, `clip_actions=False`.
* Sampling: RLlib steps `envs.gym_env.JRPVectorEnv`, one object stepping all B rollouts
  (`gym_env_vectorize_mode="vector_entry_point"`), as a continuing process like the pathwise
  trainer's rollouts (the horizon is the whole run, so no resets).
* One update = one `Algorithm.train()` on B x T_roll fresh samples (rollout_fragment_length = T_roll
  per env): PPO then makes `epochs` passes over `minibatches` minibatches of that batch.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import ray
import torch
import torch.nn.functional as F
from ray.rllib.algorithms.ppo import PPO, PPOConfig
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.distribution import Distribution
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.core.rl_module.torch import TorchRLModule
from ray.tune.registry import register_env

from envs.features import GLOBAL_FEATURES, ITEM_FEATURES, flat_features
from envs.gym_env import JRPVectorEnv, jrp_spaces
from envs.instance import Instance
from plumbing.errors import InputError
from ray_access.private import logging_to
from ray_access.session import init_ray
from trainers.checkpoint import CheckpointError
from trainers.config import ConfigError, MethodName, TrainerConfig, divergence_reason
from trainers.networks import FlatPerceptron, GlobalReadout, ItemReadout, TransformerShape
from trainers.policy import Decision
from trainers.run_folder import MethodRun, OnUpdate, train_run

NETWORKS = {MethodName.PPO.value: "mlp", MethodName.TRANSFORMER_PPO.value: "transformer"}
ENV_ID = "jrp-vector"
_BETA_EPS = 1e-6


def split_tokens(obs: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The flat observation (item tokens item-major, then the global token) as ([B, n, 11], [B, 4])."""
    return obs[:, : ITEM_FEATURES * n].reshape(obs.shape[0], n, ITEM_FEATURES), obs[:, ITEM_FEATURES * n :]


class JRPActionDistribution(Distribution):
    """Bernoulli(open) x prod_i Beta(fraction_i) from inputs [B, 1 + 2n]: open logit, then (alpha, beta) pre-activations per item."""

    def __init__(self, inputs: torch.Tensor):
        super().__init__()
        n = (inputs.shape[-1] - 1) // 2
        self.open = torch.distributions.Bernoulli(logits=inputs[..., 0])
        shape = inputs[..., 1:].reshape(*inputs.shape[:-1], n, 2)
        self.fraction = torch.distributions.Beta(1 + F.softplus(shape[..., 0]), 1 + F.softplus(shape[..., 1]))

    @classmethod
    def from_logits(cls, logits: torch.Tensor, **kwargs) -> JRPActionDistribution:
        return cls(logits)

    @staticmethod
    def required_input_dim(space: gym.Space, **kwargs) -> int:
        return 1 + 2 * space[1].shape[0]

    def sample(self, *, sample_shape=None, **kwargs):
        return self.open.sample().long(), self.fraction.sample().clamp(_BETA_EPS, 1 - _BETA_EPS)

    def rsample(self, *, sample_shape=None, **kwargs):
        raise NotImplementedError("the Bernoulli part has no reparameterised sample")

    def logp(self, value, **kwargs) -> torch.Tensor:
        open_order, fraction = value
        return self.open.log_prob(open_order.float()) + self.fraction.log_prob(fraction.clamp(_BETA_EPS, 1 - _BETA_EPS)).sum(-1)

    def entropy(self, **kwargs) -> torch.Tensor:
        return self.open.entropy() + self.fraction.entropy().sum(-1)

    def kl(self, other: JRPActionDistribution, **kwargs) -> torch.Tensor:
        kl = torch.distributions.kl.kl_divergence
        return kl(self.open, other.open) + kl(self.fraction, other.fraction).sum(-1)

    def to_deterministic(self) -> JRPGreedyAction:
        return JRPGreedyAction(self.open.probs, self.fraction.mean)


class JRPGreedyAction(Distribution):
    """The evaluation action: Y = 1{p > 0.5}, u = the Beta mean."""

    def __init__(self, probability: torch.Tensor, fraction: torch.Tensor):
        super().__init__()
        self.probability, self.fraction = probability, fraction

    def sample(self, **kwargs):
        return (self.probability > 0.5).long(), self.fraction

    rsample = sample

    def logp(self, value, **kwargs):
        raise NotImplementedError("a deterministic action has no log-probability")

    def entropy(self, **kwargs):
        return torch.zeros_like(self.probability)

    def kl(self, other, **kwargs):
        raise NotImplementedError

    @staticmethod
    def required_input_dim(space: gym.Space, **kwargs) -> int:
        return JRPActionDistribution.required_input_dim(space)

    @classmethod
    def from_logits(cls, logits, **kwargs):
        return JRPActionDistribution(logits).to_deterministic()


class JRPModule(TorchRLModule, ValueFunctionAPI):
    """model_config: n, network (mlp | transformer), hidden, blocks, width, heads, feed_forward."""

    def setup(self):
        cfg = self.model_config
        n = self.n = int(cfg["n"])
        if self.observation_space.shape != (ITEM_FEATURES * n + GLOBAL_FEATURES,):
            raise ValueError(f"observation space {self.observation_space.shape} does not fit n = {n} items")
        if cfg["network"] == "mlp":
            self.open_net = FlatPerceptron(n, cfg["hidden"])
            self.quantity_net = FlatPerceptron(n, cfg["hidden"], per_item=2)
            self.critic_net = FlatPerceptron(n, cfg["hidden"])
        elif cfg["network"] == "transformer":
            shape = TransformerShape(cfg["blocks"], cfg["width"], cfg["heads"], cfg["feed_forward"])
            self.open_net, self.quantity_net, self.critic_net = GlobalReadout(shape), ItemReadout(shape, outputs=2), GlobalReadout(shape)
        else:
            raise ValueError(f"model_config 'network': expected 'mlp' or 'transformer', got {cfg['network']!r}")

    def _forward(self, batch, **kwargs):
        items, glob = split_tokens(batch[Columns.OBS], self.n)
        inputs = torch.cat([self.open_net(items, glob)[:, None], self.quantity_net(items, glob).flatten(1)], dim=-1)
        return {Columns.ACTION_DIST_INPUTS: inputs}

    def compute_values(self, batch, embeddings=None):
        return self.critic_net(*split_tokens(batch[Columns.OBS], self.n))

    def get_inference_action_dist_cls(self):
        return JRPActionDistribution

    def get_exploration_action_dist_cls(self):
        return JRPActionDistribution

    def get_train_action_dist_cls(self):
        return JRPActionDistribution


class RolloutCost(RLlibCallback):
    """Logs cost10 = the mean over rollouts of sum_{t<T_roll} gamma^t C_t of each sampled fragment
    (rewards are -C_t / c_ref, so they are scaled back by c_ref)."""

    def on_sample_end(self, *, env_runner, metrics_logger, samples, **kwargs):
        gamma, c_ref = env_runner.config.gamma, env_runner.config.env_config["c_ref"]
        costs = []
        for episode in samples:
            rewards = np.asarray(episode.get_rewards(), dtype=np.float64)
            if rewards.size:
                costs.append(-c_ref * np.sum(rewards * gamma ** np.arange(rewards.size)))
        if costs:
            metrics_logger.log_value("cost10", float(np.mean(costs)), reduce="mean", window=1)


@dataclass(frozen=True)
class PPOTrainConfig(TrainerConfig):
    """One PPO run: the shared fields (the same budget as the pathwise trainer) and PPO's own settings."""

    method: str = MethodName.PPO.value
    """ppo (MLP) or transformer-ppo (OR-Transformer encoders)."""
    epochs: int = 4
    """PPO passes over each update's batch (>= 1)."""
    minibatches: int = 4
    """Minibatches per pass (>= 1; minibatch size = batch x rollout / minibatches)."""
    clip: float = 0.2
    """PPO clip parameter, > 0."""
    value_weight: float = 0.13
    """Value-loss weight (alpha_V of the pathwise trainer), >= 0."""
    entropy: float = 0.001
    """Entropy bonus weight, >= 0."""
    env_runners: int = 0
    """RLlib's num_env_runners (>= 0): remote env runners sharing the B rollouts, B / env_runners each (it must
    divide batch); 0 samples in the driver."""
    learners: int = 0
    """RLlib's num_learners (>= 0): remote learners sharing each update's B x T_roll samples and minibatches (it
    must divide batch x rollout / minibatches); 0 learns in the driver, on `device`."""
    gpus_per_learner: float = 0.0
    """RLlib's num_gpus_per_learner for remote learners (>= 0; a fraction shares a GPU); needs learners >= 1."""

    def __post_init__(self):
        self.require_choice("method", NETWORKS)
        self.check_shared_fields()
        self.require_int("epochs", 1)
        self.require_int("minibatches", 1)
        if (self.batch * self.rollout) % self.minibatches:
            raise ConfigError(
                f"config field 'minibatches': must divide batch x rollout = {self.batch * self.rollout}, got {self.minibatches}"
            )
        self.require_real("clip", 0, low_open=True)
        self.require_real("value_weight", 0)
        self.require_real("entropy", 0)
        self.require_int("env_runners", 0)
        self.require_int("learners", 0)
        self.require_real("gpus_per_learner", 0)
        if self.env_runners and self.batch % self.env_runners:
            raise ConfigError(f"config field 'env_runners': must divide batch = {self.batch}, got {self.env_runners}")
        if self.learners and (self.batch * self.rollout) % (self.minibatches * self.learners):
            raise ConfigError(
                f"config field 'learners': must divide batch x rollout / minibatches = {self.batch * self.rollout / self.minibatches:g}, "
                f"got {self.learners}"
            )
        if self.gpus_per_learner and not self.learners:
            raise ConfigError(
                f"config field 'gpus_per_learner': needs learners >= 1 (the driver's learner runs on 'device'), got "
                f"{self.gpus_per_learner:g}"
            )

    def model_config(self, n: int) -> dict[str, Any]:
        return {
            "n": n,
            "network": NETWORKS[self.method],
            "hidden": self.hidden,
            "blocks": self.blocks,
            "width": self.width,
            "heads": self.heads,
            "feed_forward": self.feed_forward,
        }


def make_env(env_config: dict) -> JRPVectorEnv:
    """RLlib's env creator: the batched simulator as one vector env (called with num_envs)."""
    instance = Instance.from_dict(env_config["instance"])
    env = JRPVectorEnv(
        instance, num_envs=int(env_config["num_envs"]), horizon=int(env_config["horizon"]), reward_scale=1.0 / env_config["c_ref"]
    )
    env.reset(seed=int(env_config["seed"]))
    return env


def algorithm_config(config: PPOTrainConfig, instance: Instance) -> PPOConfig:
    """RLlib's config of a run: B x T_roll samples per update from the driver or `env_runners` remote runners,
    learned in the driver or split over `learners` remote learners."""
    per_learner = config.batch * config.rollout // max(config.learners, 1)
    learner_gpus = config.gpus_per_learner if config.learners else (1 if config.device.startswith("cuda") else 0)
    return (
        PPOConfig()
        .environment(
            env=ENV_ID,
            env_config={
                "instance": instance.to_dict(),
                "horizon": (config.updates + 1) * config.rollout,
                "seed": config.seed,
                "c_ref": instance.to_torch().c_ref,
            },
            normalize_actions=False,
            clip_actions=False,
        )
        .env_runners(
            num_env_runners=config.env_runners,
            num_envs_per_env_runner=config.batch // max(config.env_runners, 1),
            rollout_fragment_length=config.rollout,
            gym_env_vectorize_mode="vector_entry_point",
        )
        .learners(num_learners=config.learners, num_gpus_per_learner=learner_gpus)
        .training(
            train_batch_size_per_learner=per_learner,
            minibatch_size=per_learner // config.minibatches,
            num_epochs=config.epochs,
            lr=config.learning_rate,
            gamma=instance.gamma,
            lambda_=config.gae_lambda,
            clip_param=config.clip,
            vf_loss_coeff=config.value_weight,
            vf_clip_param=float("inf"),
            entropy_coeff=config.entropy,
            grad_clip=config.grad_clip,
            grad_clip_by="global_norm",
            use_kl_loss=False,
        )
        .rl_module(rl_module_spec=RLModuleSpec(module_class=JRPModule, model_config=config.model_config(instance.n)))
        .callbacks(RolloutCost)
        .debugging(seed=config.seed, log_level="ERROR")
        .reporting(metrics_num_episodes_for_smoothing=1)
    )


def check_resources(config: PPOTrainConfig, resources: dict[str, float], where: str) -> None:
    """Raises InputError when the remote env runners and learners need more CPUs (one each) or GPUs (gpus_per_learner each)
    than `resources` (a Ray cluster's totals, or this machine's for the embedded Ray) hold: Ray would wait for them for ever."""
    cpus = config.env_runners + config.learners
    gpus = config.learners * config.gpus_per_learner
    if cpus > resources.get("CPU", 0):
        raise InputError(
            f"config fields 'env_runners' {config.env_runners} and 'learners' {config.learners} need {cpus} CPUs (one each), "
            f"{where} has {resources.get('CPU', 0):g}: lower them (0 samples and learns in the driver), or use a larger cluster"
        )
    if gpus > resources.get("GPU", 0):
        raise InputError(
            f"config field 'gpus_per_learner' {config.gpus_per_learner:g} x 'learners' {config.learners} needs {gpus:g} GPUs, "
            f"{where} has {resources.get('GPU', 0):g}"
        )


def build_algorithm(config: PPOTrainConfig, instance: Instance, logdir: str) -> PPO:
    """A PPO algorithm for `instance` whose logs (result.json, progress.csv, TensorBoard) go to `logdir`."""
    register_env(ENV_ID, make_env)

    return logging_to(PPO, logdir)(config=algorithm_config(config, instance))


class RLModulePolicy:
    """A trained JRPModule as a policy for the shared evaluator. greedy: Y = 1{p > 0.5}, Q = qbar x the Beta
    mean; sampled: Y and the fractions drawn from the module's distribution, from a seeded stream."""

    def __init__(self, module: JRPModule, mode: str = "greedy", seed: int = 0):
        if mode not in ("greedy", "sampled"):
            raise ValueError(f"mode: expected one of ['greedy', 'sampled'], got '{mode}'")
        self.module, self.mode, self.seed = module.eval(), mode, seed
        self.rng_state = None

    def reset(self) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.rng_state = torch.get_rng_state()

    @torch.no_grad()
    def decide(self, state, instance) -> Decision:
        obs = flat_features(instance, state).float()
        distribution = JRPActionDistribution(self.module.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS])
        if self.mode == "greedy":
            open_order, fraction = distribution.to_deterministic().sample()
        else:
            if self.rng_state is None:
                self.reset()
            with torch.random.fork_rng(devices=[]):
                torch.set_rng_state(self.rng_state)
                open_order, fraction = distribution.sample()
                self.rng_state = torch.get_rng_state()
        dtype = state.inv.dtype
        return Decision(open_order.to(dtype), distribution.open.probs.to(dtype), instance.qbar * fraction.to(dtype))

    def __call__(self, state, instance):
        open_order, _, quantity = self.decide(state, instance)
        return open_order, quantity


def build_module(config: PPOTrainConfig, n: int) -> JRPModule:
    """The RLModule of a run, outside any algorithm (for evaluation and decisions)."""
    observation, action = jrp_spaces(n)
    return JRPModule(observation_space=observation, action_space=action, model_config=config.model_config(n))


class PPORun(MethodRun):
    """A PPO run (trainers.run_folder.MethodRun): the RLlib algorithm, with a checkpoint every updates / 5 updates. rllib/algorithm-<k> is
    RLlib's checkpoint of update k, used to resume; checkpoint.pt holds the module weights for evaluation and names k. checkpoint.pt is
    written after rllib/algorithm-<k> and the older ones are removed after it, so a run stopped at any point resumes from a matching
    pair."""

    def __init__(self, config: PPOTrainConfig, instance: Instance):
        self.config, self.instance = config, instance
        self.checkpoint_every = max(config.updates // 5, 1)
        self.c_ref = instance.to_torch().c_ref
        self.algo: PPO | None = None
        self.update = 0
        self.written: set[int] = set()
        """Updates whose algorithm-<k> this attempt wrote or restored (any other one there is a leftover)."""
        self.threads: int | None = None
        """The process's torch threads before `build`, restored by `close`."""

    def build(self, out: Path, checkpoint: dict[str, Any] | None) -> PPORun:
        self.algorithms = out / "rllib"
        self.update = 0 if checkpoint is None else int(checkpoint["trainer"]["update"])
        restored = self.algorithms / f"algorithm-{self.update}"
        if checkpoint is not None and not restored.is_dir():
            raise CheckpointError(
                f"RLlib checkpoint '{restored}' of the checkpoint's update {self.update} is missing: start anew with --overwrite"
            )
        if not ray.is_initialized() and not os.environ.get("RAY_ADDRESS"):  # the embedded Ray this starts: refuse before it starts
            check_resources(self.config, {"CPU": os.cpu_count() or 1, "GPU": torch.cuda.device_count()}, "this machine")
        init_ray(1)
        check_resources(self.config, ray.cluster_resources(), "the Ray cluster")
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the driver's one thread, as `python bench/rllib.py` measures the registry's throughputs
        torch.manual_seed(self.config.seed)
        self.algo = build_algorithm(self.config, self.instance, str(self.algorithms / "logs"))
        if checkpoint is not None:
            self.algo.restore_from_path(str(restored))
            self.written.add(self.update)
        return self

    def step(self) -> dict[str, float]:
        result = self.algo.train()
        self.update += 1
        learner = result.get("learners", {}).get("default_policy", {})
        metrics = {"cost10": float(result["env_runners"]["cost10"])}
        for key in ("total_loss", "policy_loss", "vf_loss", "entropy", "mean_kl_loss", "gradients_default_optimizer_global_norm"):
            if key in learner:
                metrics[key] = float(learner[key])
        return metrics

    def diverged(self, metrics: dict[str, float]) -> str | None:
        return divergence_reason(metrics, self.c_ref, self.instance.gamma, self.config.rollout, self.config.divergence_cost)

    def checkpoint_state(self) -> dict[str, Any]:
        """rllib/algorithm-<update> first; then the module's weights for checkpoint.pt."""
        path = self.algorithms / f"algorithm-{self.update}"
        if self.update not in self.written:
            shutil.rmtree(path, ignore_errors=True)
            self.algo.save_to_path(str(path))
            self.written.add(self.update)
        return {"model": {k: v.detach().cpu() for k, v in self.algo.get_module().state_dict().items()}, "update": self.update}

    def after_checkpoint(self) -> None:
        """The older rllib/algorithm-<k>, now that checkpoint.pt names the newest."""
        for old in self.algorithms.glob("algorithm-*"):
            if old.name != f"algorithm-{self.update}":
                shutil.rmtree(old)

    def close(self) -> None:
        if self.algo is not None:
            self.algo.stop()
        if self.threads is not None:
            torch.set_num_threads(self.threads)


def train_ppo(
    config: PPOTrainConfig,
    instance: Instance,
    out_dir,
    mode: str = "new",
    progress: bool = True,
    on_update: OnUpdate = None,
) -> dict[str, Any]:
    """Train a PPO run in this process in `out_dir` (`mode`, `on_update` and the run's files: trainers.run_folder,
    with rllib/: `PPORun`); returns training.json's content."""
    return train_run(out_dir, mode, config, instance, PPORun(config, instance), progress, on_update)
