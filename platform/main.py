"""Every classical policy on a paper instance: each variant tuned in its own Ray task, then evaluated with
zero and classical-best on the held-out paths, and a comparison table printed. Each policy's folder is what
`evaluate.py --policy NAME` writes for it (policies.classical.tuned_as_policy, classical_best), without tuning
every variant again for classical-best. Runs on an embedded local Ray, or on a cluster under `ray job submit`
(the first job of docs/cluster.md). An --out that holds these files already is refused unless --overwrite is given.

  python platform/main.py --n 16 --seed 0 --out runs/main
  ray job submit --working-dir . -- python platform/main.py --n 64 --out /mnt/shared/runs/main-n64
"""

import os

import ray
import torch

from cli.output_folders import out_argument, resolve_out
from cli.scripts import horizon, positive_int, run_cli, script_parser, seed
from envs.evaluation import EVAL_HORIZON, evaluate, paired_comparison
from envs.exogenous import HELDOUT_EPISODES, HELDOUT_SEED, check_path_size, sample_paths
from envs.instance import paper_instance
from policies.classical import CLASSICAL_BEST, POLICY_NAMES, RULES, ZERO, classical_best, tune_family, tuned_as_policy, zero_policy
from ray_access.session import init_ray, stop_ray
from run_results.records import EVALUATION, check_run_folder, clear_run, write_evaluation


@ray.remote(num_cpus=1)
def tune_task(instance, rule, horizon):
    torch.set_num_threads(1)
    return tune_family(instance, rule, horizon=horizon)


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--n", type=positive_int, default=16, help="items of the paper instance (default 16)")
    parser.add_argument("--seed", type=seed, default=0, help="instance seed (default 0)")
    parser.add_argument("--episodes", type=positive_int, default=HELDOUT_EPISODES, help="held-out episodes (default 128)")
    parser.add_argument("--horizon", type=horizon, default=EVAL_HORIZON, help="steps per episode (default 50)")
    parser.add_argument("--out", type=out_argument, default="runs/main", help="output directory (default runs/main)")
    parser.add_argument("--overwrite", action="store_true", help="replace the instance file and evaluations that --out holds")
    args = parser.parse_args()

    out = resolve_out(args.out)
    resolve_out(out / "instance.json", is_file=True, overwrite=args.overwrite)
    for name in POLICY_NAMES:
        check_run_folder(out / name, EVALUATION, overwrite=args.overwrite, resumable=False)
    instance = paper_instance(args.n, args.seed)
    check_path_size(instance.n, args.episodes, args.horizon, "--episodes")  # before anything is written or Ray starts
    instance.save(out / "instance.json")
    init_ray(os.cpu_count() or 1)  # the cluster under `ray job submit` (RAY_ADDRESS), else an embedded Ray
    print(f"tuning {len(RULES)} classical policies on n={instance.n} (seed {args.seed}) in parallel Ray tasks ...", flush=True)
    tuned = ray.get([tune_task.remote(instance, rule, args.horizon) for rule in RULES.values()])
    stop_ray()

    tinst = instance.to_torch()
    paths = sample_paths(instance, HELDOUT_SEED, args.episodes, args.horizon)
    best, best_parameters = classical_best(instance, tuned)
    entries = {
        ZERO: (zero_policy, {}),
        **{t.name: tuned_as_policy(instance, t, t.seconds) for t in tuned},
        CLASSICAL_BEST: (best, best_parameters),
    }
    results = {}
    for name, (policy, params) in entries.items():
        results[name] = evaluate(policy, tinst, paths)
        clear_run(out / name)  # what --overwrite replaces: the folder held no run otherwise
        write_evaluation(out / name, name, results[name], HELDOUT_SEED, {**vars(args), "policy": name}, params, instance=instance)

    reference = results[CLASSICAL_BEST].discounted_cost
    print(
        f"\nheld-out: {args.episodes} episodes x {args.horizon} steps, seed {HELDOUT_SEED}; classical-best = {best_parameters['family']}\n"
    )
    print(f"{'policy':<26}{'mean':>12}{'s.e.':>10}{'vs classical-best (95% CI)':>40}{'tuning s':>10}")
    for name, result in results.items():
        cmp = paired_comparison(result.discounted_cost, reference)
        ci = "reference" if name == CLASSICAL_BEST else f"{cmp.mean_difference:+.1f} [{cmp.ci_low:+.1f}, {cmp.ci_high:+.1f}]"
        print(f"{name:<26}{result.mean:>12.1f}{result.se:>10.1f}{ci:>40}{entries[name][1].get('tuning_seconds', 0.0):>10.1f}")
    print(f"\nresults in {out}/<policy>/summary.json and costs.parquet")


if __name__ == "__main__":
    run_cli(main)
