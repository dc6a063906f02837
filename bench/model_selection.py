"""What validation costs a training run (trainers.model_selection): for each n, the `cpu` preset's OR-Transformer (paper
instance, seed 0, one torch thread, no warm start) makes --updates updates, timed, and its network is scored once on
the default validation set (64 paths x 50 steps), timed. The share is one validation's seconds over those of
validate_every (the default, 100) updates and the validation: the part of a run's time that validation takes (the
goal: at most 10% at n <= 64). One JSON line per n, with the machine's load.

  python bench/model_selection.py [--sizes 16 64] [--updates 5]
"""

import argparse
import json
import os
import time

import torch

from envs.instance import paper_instance
from trainers import registry
from trainers.model_selection import Validation
from trainers.pathwise import PathwiseTrainer
from trainers.pathwise_config import NO_WARM_START, TrainConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--updates", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for n in args.sizes:
        instance = paper_instance(n, 0)
        config = registry.method_config("or-transformer", "cpu", NO_WARM_START)
        assert isinstance(config, TrainConfig)
        trainer = PathwiseTrainer(config, instance.to_torch("cpu"))
        trainer.step()  # the first update allocates
        start = time.perf_counter()
        for _ in range(args.updates):
            trainer.step()
        update_seconds = (time.perf_counter() - start) / args.updates
        validation = Validation(instance, config.validation_episodes, config.validation_horizon, "cpu")
        start = time.perf_counter()
        score = validation.score(trainer.model, trainer.update)
        validation_seconds = time.perf_counter() - start
        share = validation_seconds / (config.validate_every * update_seconds + validation_seconds)
        print(
            json.dumps(
                {
                    "n": n,
                    "update_seconds": round(update_seconds, 3),
                    "validation_seconds": round(validation_seconds, 3),
                    "validate_every": config.validate_every,
                    "validation_share": round(share, 4),
                    "goal_share": 0.10,
                    "validation_cost": round(score.cost, 1),
                    "load": [round(x, 2) for x in os.getloadavg()],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
