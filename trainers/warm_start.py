"""The optional warm start of a pathwise run (not the paper's; `imitation_updates` or `imitation_dagger_updates` > 0):
before update 1, `warm_start` makes that many supervised updates imitating a teacher policy (trainers.imitation),
first on the teacher's own states, then (DAgger) on states the student visits, with its own Adam at a constant
`imitation_learning_rate`; the paper's optimiser, learning-rate schedule and streams then start as without
it. It keeps the world-size invariance: every rank acts with the same teacher (rank 0 tunes a classical one,
the others make it from its parameters), simulates its rows of the teacher's rollouts from a common stream,
and the gradients are averaged; at its end every rank takes rank 0's weights. A run saves the warm start under
way every `checkpoint_every` imitation updates (the trainer's `state_dict`, `imitation`), and resumes it from there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from envs.dynamics import State, initial_state
from envs.evaluation import Policy
from envs.exogenous import FactorDemandStream
from envs.instance import Instance, TensorInstance
from policies.classical import policy_from_parameters
from trainers.collectives import all_gather_rows, global_sum, rank_and_world
from trainers.imitation import Frontier, StudentMix, TeacherRollouts, imitation_losses, replay_clock, teacher_policy
from trainers.memory import MemoryPlan
from trainers.networks import ThreeNetworks
from trainers.pathwise_config import TrainConfig
from trainers.policy import LearnedPolicy
from trainers.streams import TEACHER_STREAM, stream_seed

TEACHER_WAIT = timedelta(hours=24)
"""How long the other ranks wait for rank 0's teacher (tuning classical-best or building the lookahead's tables
at n = 1,024 takes far longer than a process group's default timeout)."""


class Imitating(Protocol):
    """What the warm start reads and writes of its trainer (trainers.pathwise.PathwiseTrainer, which calls it): its config,
    tensors and network, this rank's rows, its memory plan, the warm start under way (`imitation`, the plain checkpoint state
    this module writes after each imitation update but the last) and its record once done."""

    config: TrainConfig
    instance: TensorInstance
    model: ThreeNetworks
    rows: slice
    memory: MemoryPlan
    imitation: dict[str, Any] | None
    warm_start_record: dict[str, Any] | None

    def warm_start_due(self) -> bool: ...

    def update_settings(self) -> AbstractContextManager: ...

    def gradient_step(self, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]: ...


def warm_start(
    trainer: Imitating, source: Instance, progress: bool = False, after_update: Callable[[int], bool] | None = None
) -> dict[str, Any] | None:
    """Runs the warm start (module docstring) of `trainer` (a trainers.pathwise.PathwiseTrainer) on `source`, the instance its tensors come
    from (the teacher is built on it), from its start or from the imitation update a checkpoint holds; every rank calls it (collectives).
    `after_update(done)` is called after each imitation update but the last, with the trainer's `state_dict` holding the warm start at
    that update; if it returns True the warm start stops there and returns None. Else returns its record, also kept on the trainer: the
    teacher and its parameters, the last update's losses and greedy agreement (before that update's step), seconds of every attempt."""
    config, instance = trainer.config, trainer.instance
    if not trainer.warm_start_due():
        raise RuntimeError(
            f"no warm start is due: config fields 'imitation_updates' {config.imitation_updates} and "
            f"'imitation_dagger_updates' {config.imitation_dagger_updates}, done: {trainer.warm_start_record is not None}"
        )
    resumed = trainer.imitation
    started = time.perf_counter()
    teacher, parameters = build_teacher(trainer, source, resumed["teacher_parameters"] if resumed else None, progress)
    tuning_seconds = time.perf_counter() - started + (resumed["tuning_seconds"] if resumed else 0.0)
    earlier_seconds = resumed["seconds"] if resumed else 0.0
    stream = FactorDemandStream(instance, config.batch, seed=stream_seed(config.seed, TEACHER_STREAM))
    optimizer = torch.optim.Adam(trainer.model.parameters(), lr=config.imitation_learning_rate, eps=config.adam_eps)
    if resumed:
        rollout_state, done = resumed["rollout_state"], int(resumed["updates_done"])
        factor = rollout_state["factor"].to(instance.device)
        state = State(*(rollout_state[f][trainer.rows].to(instance.device) for f in ("inv", "pipe")), factor[trainer.rows])
        start = Frontier(state, factor, resumed["rng"])
        replay_clock(teacher, done * config.rollout, state, instance)
        optimizer.load_state_dict(resumed["optimizer"])
    else:
        factor, done = stream.initial_factor(), 0
        start = Frontier(initial_state(instance, factor[trainer.rows]), factor, stream.generator.get_state())
    rollouts = TeacherRollouts(teacher, instance, stream, start, trainer.rows)
    _, world = rank_and_world()
    mix = StudentMix(LearnedPolicy(trainer.model, "greedy"), config.imitation_student_share, stream.generator, trainer.rows)
    trainer.model.train()  # LearnedPolicy set eval mode (no dropout anywhere: the same network either way)
    plain, total = config.imitation_updates, config.imitation_updates + config.imitation_dagger_updates
    bar = tqdm(total=total, initial=done, desc=f"warm start: imitate {config.imitation_teacher}", disable=not progress)
    with bar:
        for update in range(done, total):
            optimizer.zero_grad(set_to_none=True)
            with trainer.update_settings():
                batch = rollouts.next_update(config.rollout, mix=None if update < plain else mix)
                chunks = trainer.memory.state_chunks(batch.open_order.shape[0])
                loss = imitation_losses(trainer.model, batch, chunks, config.precision, backward=True)
            trainer.gradient_step(optimizer)
            bar.update(1)
            if update + 1 < total and after_update is not None:
                frontier = rollouts.frontier()  # every rank gathers the rows together, whether or not a checkpoint follows
                trainer.imitation = {
                    "updates_done": update + 1,
                    "optimizer": optimizer.state_dict(),
                    "rollout_state": {
                        "inv": all_gather_rows(frontier.state.inv),
                        "pipe": all_gather_rows(frontier.state.pipe),
                        "factor": frontier.factor,
                    },
                    "rng": frontier.rng,
                    "teacher_parameters": parameters,
                    "tuning_seconds": tuning_seconds,
                    "seconds": earlier_seconds + time.perf_counter() - started,
                }
                if after_update(update + 1):
                    return None
    trainer.imitation = None
    if world > 1:
        for tensor in trainer.model.state_dict().values():
            dist.broadcast(tensor, src=0)
    final = (global_sum(torch.stack([value.detach().double() for value in loss[1:]])) / world).tolist()
    trainer.warm_start_record = {
        "updates": config.imitation_updates,
        "dagger_updates": config.imitation_dagger_updates,
        "student_share": config.imitation_student_share,
        "teacher": config.imitation_teacher,
        "teacher_parameters": parameters,
        **dict(zip(("open_loss", "quantity_loss", "critic_loss", "open_agreement"), final)),
        "tuning_seconds": tuning_seconds,
        "seconds": earlier_seconds + time.perf_counter() - started,
    }
    return trainer.warm_start_record


def build_teacher(trainer: Imitating, source: Instance, parameters: dict[str, Any] | None, progress: bool) -> tuple[Policy, dict[str, Any]]:
    """Returns the teacher on `source` and its parameters, built by rank 0 alone while the other ranks wait (up to TEACHER_WAIT, on a gloo
    group of their own): for a classical family they make the rule from its parameters (policies.classical.policy_from_parameters), for
    the lookahead they receive rank 0's policy with its tables. A resumed warm start (`parameters`) is not tuned again: a classical rule is
    made from them; the lookahead keeps its threshold and reads its tables from DIR again, or computes them when the teacher has no DIR."""
    device, name = trainer.instance.device, trainer.config.teacher
    lookahead = name.lookahead
    if parameters is not None and not lookahead:
        return policy_from_parameters(source.to_torch(device), parameters), parameters
    rank, world = rank_and_world()
    waiting = dist.new_group(backend="gloo", timeout=TEACHER_WAIT) if world > 1 else None  # made before rank 0 builds
    threshold = parameters["threshold"] if parameters is not None else None
    built = teacher_policy(source, name, device=device, progress=progress, threshold=threshold) if rank == 0 else None
    if built is not None and parameters is not None:
        built = (built[0], parameters)  # the record keeps the first build's tuning
    if world == 1:
        return built
    shared = [(built if lookahead else built[1]) if rank == 0 else None]  # a lookahead's tables travel without device copies
    dist.broadcast_object_list(shared, src=0, group=waiting)
    dist.destroy_process_group(waiting)
    if rank == 0:
        return built
    if lookahead:
        return shared[0]
    return policy_from_parameters(source.to_torch(device), shared[0]), shared[0]
