"""The trainer's data-parallel path (as inside a Ray Train worker): two gloo ranks, each simulating half
of the rollouts, stay in lock-step (identical weights, global advantage statistics), give the curve of one
process (world-size invariance), and a run interrupted at a checkpoint and resumed, on two workers or on
one, continues the uninterrupted curve."""

from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from envs.instance import paper_instance
from plumbing.errors import InputError
from trainers.checkpoint import read_checkpoint, save_checkpoint
from trainers.pathwise import PathwiseTrainer, standardize
from trainers.pathwise_config import TrainConfig

CONFIG = TrainConfig(batch=8, rollout=5, blocks=1, width=16, heads=2, feed_forward=32, warmup=2, updates=20, learning_rate=1e-3)
INSTANCE = paper_instance(3, 0)
CHECKPOINT_AT = 10


def curve(trainer: PathwiseTrainer, updates: int) -> list[float]:
    return [trainer.step()["cost10"] for _ in range(updates)]


def worker(rank, world, init_file, checkpoint, results):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        trainer = PathwiseTrainer(CONFIG, INSTANCE.to_torch())
        assert trainer.shard == 4
        uninterrupted = curve(trainer, CHECKPOINT_AT)
        state = trainer.state_dict()  # a collective: every rank gathers, rank 0 writes
        if rank == 0:
            save_checkpoint(checkpoint, CONFIG, INSTANCE, state, "running")
        uninterrupted += curve(trainer, CONFIG.updates - CHECKPOINT_AT)
        flat = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
        dist.barrier()  # the checkpoint is written
        resumed = PathwiseTrainer(CONFIG, INSTANCE.to_torch())
        resumed.load_state_dict(read_checkpoint(checkpoint)["trainer"])
        local = torch.full((2, 3), float(rank))  # rank 0 holds zeros, rank 1 ones
        results[rank] = {
            "weights": flat,
            "standardized": standardize(local),
            "inv": trainer.state.inv.clone(),
            "curve": uninterrupted,
            "resumed": curve(resumed, CONFIG.updates - CHECKPOINT_AT),
        }
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """One 2-worker run of CONFIG (checkpoint at update 10) and its resumption from that checkpoint, per rank."""
    tmp = tmp_path_factory.mktemp("data_parallel")
    results = mp.Manager().dict()
    mp.spawn(worker, args=(2, str(tmp / "init"), str(tmp / "checkpoint.pt"), results), nprocs=2, join=True)
    return results[0], results[1], tmp / "checkpoint.pt"


@pytest.fixture(scope="module")
def one_worker():
    return curve(PathwiseTrainer(CONFIG, INSTANCE.to_torch()), CONFIG.updates)


def assert_same_curve(got, expected):
    assert len(got) == len(expected)
    for update, (a, b) in enumerate(zip(got, expected), 1):
        assert abs(a - b) <= 1e-3 * abs(b), f"update {update}: cost10 {a} vs {b}"


def test_two_ranks_stay_in_lock_step(two_workers):
    r0, r1, _ = two_workers
    torch.testing.assert_close(r0["weights"], r1["weights"], rtol=0, atol=0)
    assert r0["curve"] == r1["curve"]  # metrics are averaged over the ranks
    # global mean 0.5 and std 0.5 over both ranks: rank 0's zeros become -1, rank 1's ones +1
    torch.testing.assert_close(r0["standardized"], torch.full((2, 3), -1.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(r1["standardized"], torch.full((2, 3), 1.0), atol=1e-6, rtol=0)
    assert not torch.equal(r0["inv"], r1["inv"])  # each rank simulates its own rollouts


def test_two_workers_give_the_curve_of_one_process(two_workers, one_worker):
    assert len(set(one_worker)) == CONFIG.updates  # a curve that moves, not a constant
    assert_same_curve(two_workers[0]["curve"], one_worker)


def test_resumed_two_worker_run_equals_the_uninterrupted_one(two_workers):
    r0, r1, _ = two_workers
    assert r0["resumed"] == r0["curve"][CHECKPOINT_AT:]
    assert r1["resumed"] == r0["resumed"]


def test_two_worker_checkpoint_holds_the_whole_batch_and_resumes_on_one_worker(two_workers, one_worker):
    r0, r1, checkpoint = two_workers
    ckpt = read_checkpoint(checkpoint)["trainer"]
    assert ckpt["rollout_state"]["inv"].shape == (CONFIG.batch, INSTANCE.n)
    assert ckpt["update"] == CHECKPOINT_AT
    trainer = PathwiseTrainer(CONFIG, INSTANCE.to_torch())
    trainer.load_state_dict(ckpt)
    assert_same_curve(curve(trainer, CONFIG.updates - CHECKPOINT_AT), one_worker[CHECKPOINT_AT:])
    with pytest.raises(InputError, match="rollout state holds 8 rollouts, this run's config field 'batch' is 4"):
        PathwiseTrainer(replace(CONFIG, batch=4), INSTANCE.to_torch()).load_state_dict(ckpt)


def test_a_worker_keeps_its_rows_of_the_whole_batchs_exogenous_draws():
    """exogenous_step for the rows of rank 0 and rank 1 (two streams of one seed, as two workers hold) gives
    the draws of one process holding all 8 rows; drawing only a worker's own rows' demands would not, since
    torch.poisson's use of the generator depends on every rate."""
    from envs.demand_law import demand_rate
    from envs.exogenous import FactorDemandStream
    from trainers.streams import exogenous_step

    inst = paper_instance(3, 0).to_torch(dtype=torch.float64)
    streams = [FactorDemandStream(inst, 8, seed=5) for _ in range(3)]  # one process, rank 0, rank 1
    factors = [s.initial_factor() for s in streams]
    for _ in range(4):
        whole = exogenous_step(streams[0], factors[0], slice(0, 8))
        halves = [exogenous_step(streams[k], factors[k], slice(4 * (k - 1), 4 * k)) for k in (1, 2)]
        torch.testing.assert_close(torch.cat([halves[0][0], halves[1][0]]), whole[0], rtol=0, atol=0)
        for k in (1, 2):
            torch.testing.assert_close(halves[k - 1][1], whole[1], rtol=0, atol=0)  # F_{t+1} of the whole batch on every rank
        factors = [whole[1], halves[0][1], halves[1][1]]
    own_rows, reference = FactorDemandStream(inst, 8, seed=5), FactorDemandStream(inst, 8, seed=5)
    factor = own_rows.initial_factor()
    reference.initial_factor()
    lone = torch.poisson(demand_rate(inst.lam, inst.beta, factor[4:, None]), generator=own_rows.generator)  # rank 1's rows alone
    assert not torch.equal(lone, reference.demand(factor)[4:])
