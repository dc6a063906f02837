"""Train OR-Transformer, HPO (hybrid pathwise trainer) or the RLlib baselines PPO and Transformer-PPO on
an instance, then evaluate the policy on the held-out set (trainers.experiment.run_experiment, the call
that the sweep's trials make too).

  python platform/train.py --method or-transformer --instance inst.json --preset cpu --seed 0 --out runs/ot16
  python platform/train.py --method transformer-ppo --instance inst.json --preset cpu --seed 0 --out runs/tppo16

Writes to --out: checkpoint.pt, best.pt (OR-Transformer and HPO: the network the validation kept,
trainers.model_selection), curve.parquet, tensorboard/, training.json, and the held-out evaluation of the best network
(else the last) as the greedy (Y = 1{p > 0.5}) and sampled (Y ~ Bernoulli(p)) policies in greedy/ and
sampled/, in the format of platform/evaluate.py (for PPO: greedy = Beta mean and p > 0.5; sampled =
draws from the module's distribution). A diverged run is recorded as status 'diverged'.

An --out that already holds a run is refused: add --resume to continue it from its checkpoint (same
settings; --updates may grow) or --overwrite to remove it and start anew. --resume of a run that has
ended (diverged, or completed its --updates) trains nothing and evaluates it again (the same numbers;
this also finishes an evaluation that was interrupted). Ctrl-C or SIGTERM stops after the current update
and saves it (press again to stop at once, keeping the last checkpoint); the message gives the command
that resumes. Config files: YAML fields of trainers/pathwise.py TrainConfig or trainers/rllib_ppo.py
PPOTrainConfig over the preset (trainers/registry.py PRESETS), each checked for its type and range (the rules,
3e-4 and 0x10 included: docs/formats.md, "Field rules").
"""

from cli.scripts import interrupt_start_up

interrupt_start_up()  # the imports below take seconds: an interruption there ends the script at once, with its message

import argparse
import shlex
import sys
from pathlib import Path

from cli.output_folders import out_argument, resolve_out
from cli.scripts import device, horizon, positive_int, run_cli, script_parser, seed
from envs.evaluation import EVAL_HORIZON
from envs.exogenous import HELDOUT_EPISODES
from envs.instance import Instance
from plumbing.errors import Interrupted
from plumbing.files import read_file
from trainers.checkpoint import CheckpointError, read_checkpoint
from trainers.config import ConfigError
from trainers.experiment import run_experiment
from trainers.pathwise_config import NO_WARM_START
from trainers.policy import MODES
from trainers.registry import METHODS, PRESETS
from trainers.run_folder import check_run_dir


def read_config(path) -> dict:
    """Config fields from a YAML file (plumbing.validate.load_yaml); an empty dict without a file or for an empty one."""
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


MODE_FLAGS = ("resume", "overwrite")


def command(args: argparse.Namespace, flag: str) -> str:
    """The command line of this run with `flag` (--resume or --overwrite) instead of its own mode flag, to copy
    and paste: every parsed flag (each flag of the parser is --NAME for its attribute NAME, `-` for `_`), so
    each setting that reaches the config or the evaluation is the same."""
    argv = [sys.executable, sys.argv[0]]
    for name, value in vars(args).items():
        if name in MODE_FLAGS or value is None or value is False:
            continue
        argv.append(f"--{name.replace('_', '-')}")
        if value is not True:
            argv.append(str(value))
    return shlex.join([*argv, flag])


def stopped(args, out: Path) -> str:
    """What an interruption kept, read from the checkpoint on disk, and how to go on."""
    path = out / "checkpoint.pt"
    try:
        ckpt = read_checkpoint(path)
    except CheckpointError:
        return f"training stopped before its first checkpoint; nothing was saved; start again with: {command(args, '--overwrite')}"
    done, status, updates = ckpt["trainer"]["update"], ckpt["status"], ckpt["config"]["updates"]
    if status in ("completed", "diverged"):
        return (
            f"training {status} after {done} updates ('{path}'), the held-out evaluation did not finish; evaluate with: "
            f"{command(args, '--resume')}"
        )
    if status == "interrupted":
        return f"training stopped after update {done} of {updates}, saved in '{path}'; resume with: {command(args, '--resume')}"
    return (
        f"training stopped at once; the last checkpoint '{path}' holds update {done} of {updates}; resume with: {command(args, '--resume')}"
    )


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--method", required=True, choices=list(METHODS))
    parser.add_argument("--instance", required=True, help="instance JSON file")
    parser.add_argument("--preset", default="cpu", choices=list(PRESETS), help="training budget and network size (default cpu)")
    parser.add_argument("--seed", type=seed, default=0, help="training seed (default 0)")
    parser.add_argument("--out", type=out_argument, required=True, help="run directory")
    parser.add_argument("--config", help="YAML file of config fields over the preset (see tune_configs/train/); unknown keys are an error")
    parser.add_argument("--updates", type=positive_int, help="override the preset's number of updates")
    parser.add_argument("--batch", type=positive_int, help="override the preset's parallel rollouts per update")
    parser.add_argument(
        "--initial-weights",
        metavar="CHECKPOINT",
        help="fine-tune: start from this pathwise checkpoint's network (a run folder: its best.pt; same method and "
        "network shape; an OR-Transformer's from any n) instead of a fresh one, without the preset's warm start "
        "(unless --config sets imitation_updates or imitation_dagger_updates)",
    )
    existing = parser.add_mutually_exclusive_group()
    existing.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint.pt")
    existing.add_argument(
        "--overwrite", action="store_true", help="remove the run in --out (checkpoint, curve, TensorBoard, evaluations) and start anew"
    )
    parser.add_argument("--episodes", type=positive_int, default=HELDOUT_EPISODES, help="held-out episodes (default 128)")
    parser.add_argument("--horizon", type=horizon, default=EVAL_HORIZON, help="held-out horizon (default 50)")
    parser.add_argument("--device", type=device, default="cpu", help="torch device: cpu, cuda or cuda:K (default cpu)")
    args = parser.parse_args()
    run_mode = "resume" if args.resume else "overwrite" if args.overwrite else "new"
    inputs = {"--instance": args.instance, "--config": args.config, "--initial-weights": args.initial_weights}
    out = check_run_dir(resolve_out(args.out, inputs=inputs), run_mode)
    instance = Instance.load(args.instance)
    overrides = {
        **read_config(args.config),
        **{k: getattr(args, k) for k in ("updates", "batch", "initial_weights") if getattr(args, k) is not None},
    }
    if args.initial_weights is not None and METHODS[args.method].family == "pathwise":
        for name, value in NO_WARM_START.items():  # a warm start would overwrite the network being fine-tuned
            overrides.setdefault(name, value)
    try:
        result = run_experiment(
            args.method,
            instance,
            out,
            preset=args.preset,
            seed=args.seed,
            overrides=overrides,
            mode=run_mode,
            episodes=args.episodes,
            horizon=args.horizon,
            device=args.device,
        )
    except KeyboardInterrupt:
        raise Interrupted(stopped(args, out)) from None
    training = result["training"]
    print(
        f"training {training['status']} after {training['updates_done']} updates ({training['wall_seconds']:.0f} s); "
        f"last cost10 {training['final_cost10']:.4g}"
    )
    validation = training.get("validation")
    if validation and validation["best"]:
        best = validation["best"]
        margin = validation.get("validation_margin", 0)
        rule = f"each replaced only by one {margin:g} s.e. better on the same paths" if margin else "the lowest score"
        print(
            f"kept network by validation ({rule}): update {best['update']}, {best['cost']:.2f} ± {best['se']:.2f} on "
            f"{validation['validation_episodes']} validation paths (best.pt, evaluated below)"
        )
    for mode in MODES:
        print(f"held-out {mode}: {result[mode]['mean']:.2f} ± {result[mode]['se']:.2f}")


if __name__ == "__main__":
    run_cli(main)
