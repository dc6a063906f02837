"""Train OR-Transformer, HPO (hybrid pathwise trainer) or the RLlib baselines PPO and Transformer-PPO on
an instance, then evaluate the policy on the held-out set.

  python platform/train.py --method or-transformer --instance inst.json --preset cpu --seed 0 --out runs/ot16
  python platform/train.py --method transformer-ppo --instance inst.json --preset cpu --seed 0 --out runs/tppo16

Writes to --out: checkpoint.pt, curve.parquet, tensorboard/, training.json, and the held-out
evaluation of the greedy (Y = 1{p > 0.5}) and sampled (Y ~ Bernoulli(p)) policies in greedy/ and
sampled/, in the format of platform/evaluate.py (for PPO: greedy = Beta mean and p > 0.5; sampled =
draws from the module's distribution). A diverged run is recorded as status 'diverged'.

An --out that already holds a run is refused: add --resume to continue it from its checkpoint (same
settings; --updates may grow) or --overwrite to remove it and start anew. --resume of a run that has
ended (diverged, or completed its --updates) trains nothing and evaluates it again (the same numbers;
this also finishes an evaluation that was interrupted). Ctrl-C or SIGTERM stops after the current update
and saves it (press again to stop at once, keeping the last checkpoint); the message gives the command
that resumes. Config files: YAML fields of trainers/pathwise.py TrainConfig or trainers/rllib_ppo.py
PPOTrainConfig over the preset, each checked for its type and range (a real number may be written as
3e-4, which YAML reads as a string).
"""

import argparse
import shlex
import sys
from pathlib import Path

import torch

from envs.cli import Interrupted, device, output_dir, positive_int, read_file, run_cli
from envs.evaluation import EVAL_HORIZON, evaluate
from envs.exogenous import HELDOUT_EPISODES, HELDOUT_SEED, sample_paths
from envs.instance import Instance
from envs.results import write_evaluation
from trainers.checkpoint import PPO_METHODS, CheckpointError, load_checkpoint
from trainers.config import ConfigError
from trainers.pathwise import METHODS, PRESETS, preset
from trainers.policy import MODES, load_policy
from trainers.run import check_run_dir, train


def read_config(path) -> dict:
    """Config fields from a YAML file (yaml.safe_load); an empty dict without a file or for an empty one."""
    if path is None:
        return {}
    data = read_file(path, "config file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}': expected a mapping of config fields (name: value), got a {type(data).__name__}")
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(f"config file '{path}': field names are text, got {key!r}")
    for key in ("method", "seed", "device"):
        if key in data:
            raise ConfigError(f"config file '{path}': '{key}' is set by the --{key} flag, not in the file")
    return data


def command(args, flag: str) -> str:
    """The command line of this run with `flag` (--resume or --overwrite), to copy and paste."""
    argv = [sys.executable, sys.argv[0]]
    for name in ("method", "instance", "preset", "seed", "config", "updates", "batch", "episodes", "horizon", "device", "out"):
        if getattr(args, name) is not None:
            argv += [f"--{name}", str(getattr(args, name))]
    return shlex.join([*argv, flag])


def stopped(args, updates: int) -> str:
    """What an interruption kept, read from the checkpoint on disk, and how to go on."""
    path = Path(args.out) / "checkpoint.pt"
    try:
        ckpt = load_checkpoint(path)
    except CheckpointError:
        return f"training stopped before its first checkpoint; nothing was saved; start again with: {command(args, '--overwrite')}"
    done, status = ckpt["trainer"]["update"], ckpt["status"]
    if status in ("completed", "diverged"):
        return f"training {status} after {done} updates ('{path}'), the held-out evaluation did not finish; evaluate with: {command(args, '--resume')}"
    if status == "interrupted":
        return f"training stopped after update {done} of {updates}, saved in '{path}'; resume with: {command(args, '--resume')}"
    return f"training stopped at once; the last checkpoint '{path}' holds update {done} of {updates}; resume with: {command(args, '--resume')}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", required=True, choices=METHODS + PPO_METHODS)
    parser.add_argument("--instance", required=True, help="instance JSON file")
    parser.add_argument("--preset", default="cpu", choices=list(PRESETS), help="training budget and network size (default cpu)")
    parser.add_argument("--seed", type=int, default=0, help="training seed (default 0)")
    parser.add_argument("--out", required=True, help="run directory")
    parser.add_argument("--config", help="YAML file of config fields over the preset (see tune_configs/); unknown keys are an error")
    parser.add_argument("--updates", type=positive_int, help="override the preset's number of updates")
    parser.add_argument("--batch", type=positive_int, help="override the preset's parallel rollouts per update")
    existing = parser.add_mutually_exclusive_group()
    existing.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint.pt")
    existing.add_argument("--overwrite", action="store_true", help="remove the run in --out (checkpoint, curve, TensorBoard, evaluations) and start anew")
    parser.add_argument("--episodes", type=positive_int, default=HELDOUT_EPISODES, help="held-out episodes (default 128)")
    parser.add_argument("--horizon", type=positive_int, default=EVAL_HORIZON, help="held-out horizon (default 50)")
    parser.add_argument("--device", type=device, default="cpu", help="torch device: cpu, cuda or cuda:K (default cpu)")
    args = parser.parse_args()
    run_mode = "resume" if args.resume else "overwrite" if args.overwrite else "new"
    out = check_run_dir(output_dir(args.out), run_mode)
    instance = Instance.load(args.instance)
    overrides = {**read_config(args.config), **{k: getattr(args, k) for k in ("updates", "batch") if getattr(args, k) is not None}}
    settings = dict(method=args.method, seed=args.seed, device=args.device, **overrides)
    if args.method in PPO_METHODS:
        from trainers.rllib_ppo import ppo_preset, train_ppo

        config = ppo_preset(args.preset, **settings)
    else:
        config = preset(args.preset, **settings)
    try:
        if args.method in PPO_METHODS:
            from solver_workers.ray_session import init_ray

            torch.set_num_threads(1)  # RLlib samples and learns in this process; one thread is 5-12x faster here (shared/notes)
            init_ray(1)
            summary = train_ppo(config, instance, out, run_mode)
        else:
            summary = train(config, instance, out, run_mode)
        print(f"training {summary['status']} after {summary['updates_done']} updates ({summary['wall_seconds']:.0f} s); "
              f"last cost10 {summary['final_cost10']:.4g}")
        paths = sample_paths(instance, HELDOUT_SEED, args.episodes, args.horizon, args.device)
        tinst = instance.to_torch(args.device)
        for mode in MODES:
            policy, _ = load_policy(out / "checkpoint.pt", mode, args.device, instance)
            result = evaluate(policy, tinst, paths, progress=f"evaluate {mode}")
            extra = {"training": {k: summary[k] for k in ("status", "reason", "updates_done", "wall_seconds")}}
            write_evaluation(out / mode, f"{args.method}-{mode}", result, HELDOUT_SEED, {**vars(args), "n": instance.n, "mode": mode},
                             {"checkpoint": str(out / "checkpoint.pt"), "preset": args.preset}, extra, instance=instance)
            print(f"held-out {mode}: {result.mean:.2f} ± {result.se:.2f}")
    except KeyboardInterrupt:
        raise Interrupted(stopped(args, config.updates)) from None

if __name__ == "__main__":
    run_cli(main)
