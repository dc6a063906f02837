"""The trainer's data-parallel path (as inside a Ray Train worker): two gloo ranks, each simulating half
of the rollouts, stay in lock-step — identical weights after every update, global advantage statistics."""


import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from envs.instance import paper_instance
from trainers.pathwise import PathwiseTrainer, TrainConfig, standardize


def worker(rank, world, init_file, results):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        cfg = TrainConfig(batch=8, rollout=3, blocks=1, width=16, heads=2, feed_forward=32, warmup=1, updates=3)
        trainer = PathwiseTrainer(cfg, paper_instance(2, 0).to_torch())
        assert trainer.shard == 4
        for _ in range(2):
            trainer.step()
        flat = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
        local = torch.full((2, 3), float(rank))  # rank 0 holds zeros, rank 1 ones
        results[rank] = (flat, standardize(local), trainer.state.inv.clone())
    finally:
        dist.destroy_process_group()


def test_two_ranks_stay_in_lock_step(tmp_path):
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(worker, args=(2, str(tmp_path / "init"), results), nprocs=2, join=True)
    (w0, std0, inv0), (w1, std1, inv1) = results[0], results[1]
    torch.testing.assert_close(w0, w1)
    # global mean 0.5 and std 0.5 over both ranks: rank 0's zeros become -1, rank 1's ones +1
    torch.testing.assert_close(std0, torch.full((2, 3), -1.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(std1, torch.full((2, 3), 1.0), atol=1e-6, rtol=0)
    assert not torch.equal(inv0, inv1)  # each rank simulates its own rollouts
