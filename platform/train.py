"""Train OR-Transformer, HPO (hybrid pathwise trainer) or the RLlib baselines PPO and Transformer-PPO on
an instance, then evaluate the policy on the held-out set.

  python platform/train.py --method or-transformer --instance inst.json --preset cpu --seed 0 --out runs/ot16
  python platform/train.py --method transformer-ppo --instance inst.json --preset cpu --seed 0 --out runs/tppo16

Writes to --out: checkpoint.pt, curve.parquet, tensorboard/, training.json, and the held-out
evaluation of the greedy (Y = 1{p > 0.5}) and sampled (Y ~ Bernoulli(p)) policies in greedy/ and
sampled/, in the format of platform/evaluate.py (for PPO: greedy = Beta mean and p > 0.5; sampled =
draws from the module's distribution). A diverged run is recorded as status 'diverged'.
"""

import argparse

import torch

from envs.cli import positive_int, read_file, run_cli
from envs.evaluation import EVAL_HORIZON, evaluate
from envs.exogenous import HELDOUT_EPISODES, HELDOUT_SEED, sample_paths
from envs.instance import Instance
from envs.results import write_evaluation
from trainers.checkpoint import PPO_METHODS
from trainers.pathwise import METHODS, PRESETS, preset
from trainers.policy import MODES, load_policy
from trainers.run import train


def read_config(path) -> dict:
    """Config fields from a YAML file (yaml.safe_load); an empty dict without a file."""
    if path is None:
        return {}
    data = read_file(path, "config file")
    if not isinstance(data, dict):
        raise ValueError(f"config file '{path}': expected a mapping of config fields, got {type(data).__name__}")
    for key in ("method", "seed", "device"):
        if key in data:
            raise ValueError(f"config file '{path}': '{key}' is set by the --{key} flag, not in the file")
    return data


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
    parser.add_argument("--resume", action="store_true", help="continue from --out/checkpoint.pt")
    parser.add_argument("--episodes", type=positive_int, default=HELDOUT_EPISODES, help="held-out episodes (default 128)")
    parser.add_argument("--horizon", type=positive_int, default=EVAL_HORIZON, help="held-out horizon (default 50)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available on this machine")
    instance = Instance.load(args.instance)
    overrides = {**read_config(args.config), **{k: getattr(args, k) for k in ("updates", "batch") if getattr(args, k) is not None}}
    if args.method in PPO_METHODS:
        from solver_workers.ray_session import init_ray
        from trainers.rllib_ppo import ppo_preset, train_ppo

        torch.set_num_threads(1)  # RLlib samples and learns in this process; one thread is 5-12x faster here (shared/notes)
        init_ray(1)
        summary = train_ppo(ppo_preset(args.preset, method=args.method, seed=args.seed, device=args.device, **overrides), instance, args.out, resume=args.resume)
    else:
        config = preset(args.preset, method=args.method, seed=args.seed, device=args.device, **overrides)
        summary = train(config, instance, args.out, resume=args.resume)
    print(f"training {summary['status']} after {summary['updates_done']} updates ({summary['wall_seconds']:.0f} s); "
          f"last cost10 {summary['final_cost10']:.4g}")
    paths = sample_paths(instance, HELDOUT_SEED, args.episodes, args.horizon, args.device)
    tinst = instance.to_torch(args.device)
    for mode in MODES:
        policy, _ = load_policy(f"{args.out}/checkpoint.pt", mode, args.device, instance)
        result = evaluate(policy, tinst, paths, progress=f"evaluate {mode}")
        extra = {"training": {k: summary[k] for k in ("status", "reason", "updates_done", "wall_seconds")}}
        write_evaluation(f"{args.out}/{mode}", f"{args.method}-{mode}", result, HELDOUT_SEED, {**vars(args), "n": instance.n, "mode": mode},
                         {"checkpoint": f"{args.out}/checkpoint.pt", "preset": args.preset}, extra)
        print(f"held-out {mode}: {result.mean:.2f} ± {result.se:.2f}")


if __name__ == "__main__":
    run_cli(main)
