"""One experiment: a training run of any method and its held-out evaluation, the greedy policy
(Y = 1{p > 0.5}; PPO: Beta mean) and the sampled one (Y ~ Bernoulli(p); PPO: draws from the module's
distribution). platform/train.py, the sweep's Tune trials and the tests all run it.

The run folder holds the run's files (trainers.run_folder) and greedy/ and sampled/ in the evaluation format
(run_results.records.write_evaluation, whole or not read), of the run's best network where it validates (best.pt,
trainers.model_selection), else of its last. The evaluation runs after every call that ends with a
finished training, so `mode="resume"` of a run that has ended trains nothing and evaluates it again
(the same numbers): a call killed during its evaluation is finished by a resume.
"""

from __future__ import annotations

import os
from typing import Any

from envs.evaluation import EVAL_HORIZON, evaluate
from envs.exogenous import HELDOUT_EPISODES, HELDOUT_SEED, check_cost_range, check_path_size, sample_paths
from envs.instance import Instance
from run_results.records import write_evaluation
from trainers import registry
from trainers.checkpoint import checkpoint_file, network_of
from trainers.config import ConfigError
from trainers.policy import MODES
from trainers.run_folder import check_run_dir

ARGUMENT_FIELDS = ("method", "seed", "device")
"""Config fields that are arguments of run_experiment, never overrides."""


def run_experiment(
    method: str,
    instance: Instance,
    out_dir: str | os.PathLike,
    *,
    preset: str = "cpu",
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    mode: str = "new",
    episodes: int = HELDOUT_EPISODES,
    horizon: int = EVAL_HORIZON,
    device: str = "cpu",
    progress: bool = True,
    workers: int | None = None,
    use_gpu: bool = False,
    on_update: registry.OnUpdate = None,
    resources_per_worker: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Trains `method` on `instance` in the run folder `out_dir` (config `preset` + `overrides` (config fields) + `seed`, on `device`), then
    evaluates it on `episodes` held-out episodes of `horizon` steps. `mode`: new, resume or overwrite (trainers.run_folder); `workers`,
    `use_gpu`, `on_update`, `resources_per_worker`: as registry.train. Checks the config, the instance's cost range over `horizon` and the
    run folder before writing anything. Returns {training: training.json's content, greedy: summary, sampled: summary} (the summaries
    as in OUT/greedy/summary.json, OUT/sampled/...)."""
    overrides = dict(overrides or {})
    if given := [k for k in ARGUMENT_FIELDS if k in overrides]:
        raise ConfigError(f"overrides: {given} are arguments of the experiment, not overrides")
    config = registry.method_config(method, preset, {**overrides, "seed": seed, "device": device})
    check_cost_range(instance, horizon)
    check_path_size(instance.n, episodes, horizon)
    out = check_run_dir(out_dir, mode)
    training = registry.train(
        config,
        instance,
        out,
        mode=mode,
        progress=progress,
        workers=workers,
        use_gpu=use_gpu,
        on_update=on_update,
        resources_per_worker=resources_per_worker,
    )
    settings = {
        "method": method,
        "preset": preset,
        "seed": seed,
        "overrides": overrides,
        "run_mode": mode,
        "episodes": episodes,
        "horizon": horizon,
        "device": device,
        "workers": workers,
        "use_gpu": use_gpu,
        "out": str(out),
        "n": instance.n,
        "training_config": training["manifest"]["config"],
    }
    paths = sample_paths(instance, HELDOUT_SEED, episodes, horizon, device)
    tinst = instance.to_torch(device)
    summaries = {}
    chosen = checkpoint_file(out)  # the best network where the run validates, else its last
    for policy_mode in MODES:
        policy, ckpt = registry.load_policy(chosen, policy_mode, device, instance)
        result = evaluate(policy, tinst, paths, progress=f"evaluate {policy_mode}" if progress else None)
        extra = {"training": {k: training[k] for k in ("status", "reason", "updates_done", "wall_seconds")}}
        summaries[policy_mode] = write_evaluation(
            out / policy_mode,
            f"{method}-{policy_mode}",
            result,
            HELDOUT_SEED,
            {**settings, "mode": policy_mode},
            {"checkpoint": str(chosen), "preset": preset, **network_of(ckpt["trainer"])},
            extra,
            instance=instance,
        )
    return {"training": training, **summaries}
