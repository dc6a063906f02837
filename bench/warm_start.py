"""Warm start: how close plain imitation and DAgger bring a greedy student to its teacher (paper instance,
seed 0). For each schedule (plain imitation updates, DAgger updates): the student's paired excess over the
teacher's discounted cost on 64 episodes x 50 steps of a seed that neither tuning nor training uses, as a
share of the teacher's mean with its standard error, and the phase's seconds. One JSON line per schedule, with
the machine's load (os.getloadavg). The network and batch are the warm-start tests' (16 rollouts of 5 steps,
one block of width 16); the teacher is built once.

  python bench/warm_start.py [--n 4] [--teacher classical-best] [--schedules 60+0 60+60 200+0 100+100]
"""

import argparse
import copy
import json
import os
import time

import torch

import trainers.warm_start as warm_start_module
from envs.evaluation import EVAL_HORIZON, evaluate
from envs.exogenous import sample_paths
from envs.instance import paper_instance
from trainers.imitation import TEACHERS, teacher_policy
from trainers.pathwise import PathwiseTrainer
from trainers.pathwise_config import TrainConfig
from trainers.policy import LearnedPolicy

NETWORK = dict(batch=16, rollout=5, blocks=1, width=16, heads=2, feed_forward=32, hidden=32, warmup=2, updates=1)
PATHS_SEED = 4242


def schedule(text: str) -> tuple[int, int]:
    plain, dagger = text.split("+")
    return int(plain), int(dagger)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--teacher", default="classical-best", choices=TEACHERS)
    parser.add_argument("--schedules", nargs="+", type=schedule, default=[(60, 0), (60, 60), (200, 0), (100, 100)])
    args = parser.parse_args()
    torch.set_num_threads(1)
    instance = paper_instance(args.n, 0)
    tensors = instance.to_torch()
    paths = sample_paths(instance, PATHS_SEED, 64, EVAL_HORIZON)
    teacher, parameters = teacher_policy(instance, args.teacher)
    warm_start_module.teacher_policy = lambda *a, **k: (copy.deepcopy(teacher), parameters)  # build the teacher once
    teacher_cost = evaluate(copy.deepcopy(teacher), tensors, paths).discounted_cost
    for plain, dagger in args.schedules:
        config = TrainConfig(**NETWORK, imitation_updates=plain, imitation_dagger_updates=dagger, imitation_teacher=args.teacher)
        trainer = PathwiseTrainer(config, tensors)
        started = time.perf_counter()
        warm_start_module.warm_start(trainer, instance)
        seconds = time.perf_counter() - started
        excess = evaluate(LearnedPolicy(trainer.model, "greedy"), tensors, paths).discounted_cost - teacher_cost
        mean = float(teacher_cost.mean())
        print(
            json.dumps(
                {
                    "n": args.n,
                    "teacher": args.teacher,
                    "plain_updates": plain,
                    "dagger_updates": dagger,
                    "teacher_mean": round(mean, 1),
                    "excess_share": round(float(excess.mean()) / mean, 4),
                    "excess_share_se": round(float(excess.std(ddof=1)) / len(excess) ** 0.5 / mean, 4),
                    "seconds": round(seconds, 1),
                    "load": [round(x, 2) for x in os.getloadavg()],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
