"""The data-parallel collectives of a pathwise run: which rows of the batch this rank simulates, the whole batch's rows
gathered, sums and gradients over the ranks. In a single process (and in a Ray Train group of one worker) each is the
identity, so the single-process run is the one-worker case (trainers/pathwise.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def distributed() -> bool:
    """A process group of several ranks (Ray Train also makes one of a single worker: no collectives then)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of this data-parallel worker; (0, 1) in a single process."""
    return (dist.get_rank(), dist.get_world_size()) if distributed() else (0, 1)


def shard_rows(shard: int) -> slice:
    """The rows of the whole batch that this rank simulates, `shard` of them: rank k holds k shard .. (k+1) shard - 1."""
    rank, _ = rank_and_world()
    return slice(rank * shard, (rank + 1) * shard)


def all_gather_rows(x: torch.Tensor) -> torch.Tensor:
    """The rows of every rank in rank order (the whole batch): x itself in a single process."""
    if not distributed():
        return x
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def global_sum(x: torch.Tensor) -> torch.Tensor:
    if distributed():
        x = x.clone()
        dist.all_reduce(x)
    return x


def average_gradients(params: list[torch.nn.Parameter], world: int) -> None:
    """Replace every gradient by its mean over the ranks, in one all-reduce of the flattened gradients."""
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    flat /= world
    for g, mean in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(mean.view_as(g))
