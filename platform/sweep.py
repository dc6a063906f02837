"""Run a sweep file: one Tune trial per (method, n, seed) and the baselines of every size, into one
results directory (layout: sweeps/results_dir.py), on an embedded local Ray or a cluster.

  python platform/sweep.py --config tune_configs/quick.yaml --out results/quick [--resume] [--dry-run] [--dashboard] [--verbose]
  ray job submit --working-dir . -- python platform/sweep.py --config tune_configs/paper.yaml --out /mnt/shared/results/paper

--dry-run validates the file and prints the trials, the resources of each and an estimate of the
device-hours, without starting anything (against the cluster's resources with --address or RAY_ADDRESS,
else this machine's). --resume continues a sweep in --out: finished trials and
baselines are kept, interrupted ones continue from their checkpoints; another sweep file is refused.
Tune's experiment folders are under --out/tune (`tensorboard --logdir OUT/tune`).

The console shows the plan, progress bars, one line per finished, retried or failed trial and the trial table;
Ray's own output goes to --out/sweep.log (--verbose prints it instead, with Tune's progress reports).
--dashboard starts the embedded Ray with its dashboard, on 127.0.0.1 only, and prints its URL.

Exit status: 0 when every trial finished (completed, or diverged with its last checkpoint evaluated), 3 when some trials
failed and others finished, 4 when none finished; 2 for a refused sweep file or flag, 130 when interrupted.
"""

import argparse
import os
import shlex
from pathlib import Path

from cli.output_folders import out_argument, resolve_out
from cli.scripts import ray_address, run_cli, script_parser
from plumbing.errors import InputError, Interrupted
from ray_access.session import init_ray, stop_ray
from sweeps.console import SweepLog, dashboard_login
from sweeps.results_dir import FINISHED
from sweeps.runner import RESUME_COMMAND, cluster_nodes, dry_run, exit_status, read_spec, run_sweep


def main() -> int:
    parser = script_parser(__doc__)
    parser.add_argument("--config", required=True, help="sweep file (YAML; see tune_configs/)")
    parser.add_argument("--out", type=out_argument, required=True, help="results directory")
    parser.add_argument("--resume", action="store_true", help="continue the sweep in --out")
    parser.add_argument("--dry-run", action="store_true", help="validate and print the plan; start nothing")
    parser.add_argument("--address", type=ray_address, help="Ray cluster address (default: RAY_ADDRESS, else an embedded Ray)")
    parser.add_argument("--dashboard", action="store_true", help="start the embedded Ray with its dashboard (127.0.0.1 only)")
    parser.add_argument("--verbose", action="store_true", help="print Ray's own output and Tune's reports (default: into OUT/sweep.log)")
    args = parser.parse_args()
    if args.dashboard and (args.address or os.environ.get("RAY_ADDRESS")):
        raise InputError(
            "--dashboard starts the embedded Ray's dashboard; a cluster (--address, RAY_ADDRESS) has its own: see docs/cluster.md"
        )
    spec, data = read_spec(args.config)
    if args.dry_run:
        if args.address or os.environ.get("RAY_ADDRESS"):
            init_ray(1, args.address)  # the cluster's resources decide what fits
        print("\n".join(dry_run(spec, cluster_nodes())))
        return 0
    out = resolve_out(args.out, inputs={"--config": args.config})
    if not args.verbose:
        # Tune's legacy output engine prints nothing at verbosity 0 (sweeps.console.tune_output); its default engine still
        # prints the experiment's box, its TensorBoard line and a block per trial error.
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    with SweepLog(Path(out).resolve(), args.verbose) as sweep_log:
        return run(args, spec, data, out, sweep_log)


def run(args: argparse.Namespace, spec, data: dict, out: str, sweep_log: SweepLog) -> int:
    """Connect, run the sweep and print its end; a refused sweep leaves nothing, an interrupted one says how to resume.
    Returns the exit status (module docstring)."""

    def connect() -> None:
        url = sweep_log.connect(lambda: init_ray(1, args.address, dashboard=args.dashboard))
        if url:
            print(f"Ray dashboard: {url} ({dashboard_login(Path(out))})")
        print(f"TensorBoard: tensorboard --logdir {out}/tune", flush=True)
        if not args.verbose:
            print(f"Ray's output: {sweep_log.path} (--verbose prints it)", flush=True)

    made = not Path(out).exists()
    try:
        rows = run_sweep(
            spec, data, Path(out), args.resume, log=lambda text: print(text, flush=True), connect=connect, verbose=args.verbose
        )
    except InputError:
        stop_ray()
        if not (Path(out) / "sweep.json").exists():  # refused before the sweep began (placement, a node-local --out)
            sweep_log.discard(made)
        raise
    except KeyboardInterrupt:
        stop_ray()
        resume = os.environ.get(RESUME_COMMAND) or shlex.join(
            ["python", "platform/sweep.py", "--config", args.config, "--out", args.out]
            + [*(["--address", args.address] if args.address else []), "--resume"]
        )
        raise Interrupted(f"finished trials and baselines are kept in '{out}'; continue with: {resume}") from None
    stop_ray()
    if rows is None:
        return 0
    done = sum(r["status"] in FINISHED for r in rows)
    print(f"{done} of {len(rows)} trials finished; results in {out} (trials.parquet, curves.parquet, baselines.parquet)")
    return exit_status(rows)


if __name__ == "__main__":
    run_cli(main)
