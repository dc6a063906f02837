"""The main job: tune every classical policy on a paper instance in parallel Ray tasks and print the
held-out comparison table. Runs on an embedded local Ray, or on a cluster under `ray job submit`.

  python platform/main.py --n 16 --seed 0 --out runs/main
  ray job submit --working-dir . -- python platform/main.py --n 64 --out /mnt/shared/runs/main-n64
"""

import argparse
import os

import ray
import torch

from envs.classical import POLICY_NAMES, best_of, make_policy, tune_family, zero_policy
from envs.cli import positive_int, run_cli, seed
from envs.evaluation import EVAL_HORIZON, evaluate, paired_comparison
from envs.exogenous import HELDOUT_EPISODES, HELDOUT_SEED, sample_paths
from envs.instance import paper_instance
from envs.job_output import resolve_out
from envs.results import write_evaluation
from solver_workers.ray_session import init_ray


@ray.remote(num_cpus=1)
def tune_task(instance, name, horizon):
    torch.set_num_threads(1)
    return tune_family(instance, name, horizon=horizon)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=positive_int, default=16, help="items of the paper instance (default 16)")
    parser.add_argument("--seed", type=seed, default=0, help="instance seed (default 0)")
    parser.add_argument("--episodes", type=positive_int, default=HELDOUT_EPISODES, help="held-out episodes (default 128)")
    parser.add_argument("--horizon", type=positive_int, default=EVAL_HORIZON, help="steps per episode (default 50)")
    parser.add_argument("--out", default="runs/main", help="output directory (default runs/main)")
    args = parser.parse_args()

    out = resolve_out(args.out)
    instance = paper_instance(args.n, args.seed)
    instance.save(out / "instance.json")
    init_ray(os.cpu_count() or 1)  # the cluster under `ray job submit` (RAY_ADDRESS), else an embedded Ray
    names = [n for n in POLICY_NAMES if n not in ("zero", "classical-best")]
    print(f"tuning {len(names)} classical policies on n={instance.n} (seed {args.seed}) in parallel Ray tasks ...", flush=True)
    tuned = ray.get([tune_task.remote(instance, name, args.horizon) for name in names])
    ray.shutdown()

    tinst = instance.to_torch()
    paths = sample_paths(instance, HELDOUT_SEED, args.episodes, args.horizon)
    best = best_of(tuned)
    entries = [("zero", zero_policy, {})] + [(t.name, make_policy(tinst, t.name, t.params), {**t.params, "tuning_seconds": round(t.seconds, 2)}) for t in tuned]
    entries.append(("classical-best", make_policy(tinst, best.name, best.params),
                    {"family": best.name, **best.params, "tuning_seconds": round(sum(t.seconds for t in tuned), 2)}))
    results = {}
    for name, policy, params in entries:
        results[name] = evaluate(policy, tinst, paths)
        write_evaluation(out / name, name, results[name], HELDOUT_SEED, {**vars(args), "policy": name}, params, instance=instance)

    reference = results["classical-best"].discounted_cost
    print(f"\nheld-out: {args.episodes} episodes x {args.horizon} steps, seed {HELDOUT_SEED}; "
          f"classical-best = {best.name}\n")
    seconds = {t.name: t.seconds for t in tuned}
    seconds["classical-best"] = sum(seconds.values())
    print(f"{'policy':<26}{'mean':>12}{'s.e.':>10}{'vs classical-best (95% CI)':>40}{'tuning s':>10}")
    for name, result in results.items():
        cmp = paired_comparison(result.discounted_cost, reference)
        ci = "reference" if name == "classical-best" else f"{cmp.mean_difference:+.1f} [{cmp.ci_low:+.1f}, {cmp.ci_high:+.1f}]"
        print(f"{name:<26}{result.mean:>12.1f}{result.se:>10.1f}{ci:>40}{seconds.get(name, 0.0):>10.1f}")
    print(f"\nresults in {out}/<policy>/summary.json and costs.parquet")


if __name__ == "__main__":
    run_cli(main)
