"""RLlib PPO sampling throughput on the batched simulator (one vector env stepping all rollouts) against
the pathwise trainer's transitions per second, measured in the same run, cpu preset sizes (B = 128).

  python bench/rllib.py [--n 4 16 64]
"""

import argparse
import json
import tempfile
import time

import torch

from envs.instance import paper_instance
from ray_access.session import init_ray
from trainers.config import MethodName
from trainers.pathwise import PathwiseTrainer
from trainers.registry import method_config
from trainers.rllib_ppo import build_algorithm


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--updates", type=int, default=5, help="timed updates per measurement")
    args = parser.parse_args()
    torch.set_num_threads(1)
    init_ray(1)
    for n in args.n:
        inst = paper_instance(n, 0)
        for method in ("ppo", "transformer-ppo"):
            config = method_config(method, "cpu")
            with tempfile.TemporaryDirectory() as logdir:
                algo = build_algorithm(config, inst, logdir)
                runner = algo.env_runner
                runner.sample(num_timesteps=config.batch * config.rollout)  # warm-up
                start = time.perf_counter()
                for _ in range(args.updates):
                    runner.sample(num_timesteps=config.batch * config.rollout)
                sampling = args.updates * config.batch * config.rollout / (time.perf_counter() - start)
                algo.train()
                start = time.perf_counter()
                for _ in range(args.updates):
                    algo.train()
                full = args.updates * config.batch * config.rollout / (time.perf_counter() - start)
                algo.stop()
            pathwise_method = MethodName.OR_TRANSFORMER if method == MethodName.TRANSFORMER_PPO else MethodName.HPO
            trainer = PathwiseTrainer(method_config(pathwise_method, "cpu"), inst.to_torch())
            trainer.step()
            start = time.perf_counter()
            for _ in range(args.updates):
                trainer.step()
            pathwise = args.updates * trainer.config.batch * trainer.config.rollout / (time.perf_counter() - start)
            print(
                json.dumps(
                    {
                        "n": n,
                        "method": method,
                        "envs": config.batch,
                        "rllib_sampling_env_steps_per_s": round(sampling),
                        "rllib_full_loop_env_steps_per_s": round(full),
                        "pathwise_method": pathwise_method,
                        "pathwise_transitions_per_s": round(pathwise),
                        "rllib_full_loop_vs_pathwise": round(full / pathwise, 2),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
