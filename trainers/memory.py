"""The memory an update may take, and the micro-batches that keep it there (the same gradient, bounded memory).

Each pass of an update (trainers.pathwise: the rollout with the quantity network in the graph, then the critic and
open networks on stored, detached tokens; the warm start's fits) goes through its rollouts or states in micro-batches
of its own and adds up the gradients, so the peak grows with the micro-batch, not with B. What the update stores of
every state until its end (`StateBytes.stored`) grows with B; the budget counts it first and the micro-batches share
the rest. The bytes one state keeps are measured, not modelled: one state's forward runs under
`torch.autograd.graph.saved_tensors_hooks`, so the figure follows the network, n, the dtype, autocast and activation
checkpointing (whose backward recomputes one block at a time: `StateBytes.recomputed`).

The budget is the config's `memory_budget` (GiB), or by default two fifths of a GPU's free memory, or on the CPU a
quarter of the available RAM, at most CPU_BUDGET_MAX. The backward pass's working memory and the model come on top
(measured in docs/benchmarks.md, "Memory of an update").
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
from dataclasses import dataclass

import torch

from trainers.config import ConfigError

GIB = 2**30
CPU_BUDGET_MAX = 0.5
"""GiB: the most the default budget takes on a CPU."""
CPU_SHARE, GPU_SHARE = 0.25, 0.4
"""The share of the available RAM (CPU) or of the free device memory (GPU) that the default budget takes."""


def proc_field_bytes(path: str, name: str) -> int | None:
    """The bytes of the line `name:  N kB` of the Linux /proc file `path`, or None where the file or the line is missing."""
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(f"{name}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_bytes(device: torch.device) -> int:
    """The free memory of a GPU, or the RAM the operating system reports available (MemAvailable; the free pages
    where /proc/meminfo is missing)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    available = proc_field_bytes("/proc/meminfo", "MemAvailable")
    return available if available is not None else os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def default_budget(device: torch.device) -> tuple[float, str]:
    """(GiB, how it was chosen) of the default budget on `device` (module docstring)."""
    free = available_bytes(device) / GIB
    if device.type == "cuda":
        return GPU_SHARE * free, f"two fifths of the GPU's {free:.1f} GiB free"
    share = CPU_SHARE * free
    if share > CPU_BUDGET_MAX:
        return CPU_BUDGET_MAX, f"a quarter of {free:.1f} GiB available RAM, at most {CPU_BUDGET_MAX:g} GiB on a CPU"
    return share, f"a quarter of {free:.1f} GiB available RAM"


def saved_bytes(forward, parameters) -> int:
    """Bytes of the distinct storages that autograd saves for the backward pass of `forward()`, but those of
    `parameters` (a linear layer saves its weight too: memory the model holds anyway, not one more per state)."""
    held = {p.untyped_storage().data_ptr() for p in parameters}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in held:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward()
    return sum(storages.values())


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none (macOS, musl)."""
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:
        return None


def release_freed_memory(device: torch.device) -> None:
    """Give the pages of the C heap that freed tensors left back to the operating system (glibc's malloc_trim(0); nothing
    on a GPU or without glibc). glibc keeps a freed tensor below its mmap threshold (which rises to 32 MiB as
    large tensors are freed) in the heap, and the next pass of an update, whose tensors have other sizes, grows the heap
    beside it instead of reusing it: at n = 1,024 the critic and open passes added 0.5 GiB of resident memory to the
    rollout pass's although the live memory did not grow (docs/benchmarks.md, "Memory of an update")."""
    trim = _malloc_trim() if device.type == "cpu" else None
    if trim is not None:
        trim(0)


def accumulate(loss: torch.Tensor) -> None:
    """Add one micro-batch's share of the gradient, that of `loss`, into the parameters' .grad (nothing when no
    parameter reaches it, e.g. an output detached on purpose)."""
    if loss.requires_grad:
        loss.backward()


def balanced(count: int, largest: int) -> int:
    """The micro-batch size that splits `count` into as few micro-batches as `largest` allows, k = ceil(count / largest),
    of size ceil(count / k): equal sizes where k divides `count` (1,024 rollouts at most 260 a pass: 4 of 256, not
    3 of 260 and one of 244), so a compiled pass sees one shape, and never larger than `largest`."""
    return -(-count // -(-count // largest))


def slices(count: int, size: int) -> list[slice]:
    """0 .. count - 1 in consecutive slices of `size` (the last may be shorter)."""
    return [slice(start, min(start + size, count)) for start in range(0, count, size)]


@dataclass(frozen=True)
class StateBytes:
    """What one state keeps for the backward pass of each network, and what the update stores of it, in bytes."""

    quantity: int
    """One rollout step: the quantity network, the features and the simulator step."""
    terminal: int
    """The frozen critic on a rollout's last state (it keeps less than the trainable critic: no weight gradient)."""
    open: int
    critic: int
    recomputed: int = 0
    """With activation checkpointing: one block's activations, held while the backward pass recomputes it."""
    stored: int = 0
    """Held until the update's end: the state's tokens, normalised cost and open decision (for the critic and open
    passes) and its exogenous draws."""
    anchor: int = 0
    """With the anchor term: the quantity network on a stored state, in the open pass beside the open network."""

    def rollout(self, steps: int) -> int:
        """One rollout of `steps` steps: the quantity network on every state, the frozen critic on the last."""
        return steps * self.quantity + self.terminal + self.recomputed

    def kept_until_the_end(self, rollouts: int, steps: int) -> int:
        """What an update of `rollouts` rollouts of `steps` steps stores until its end (`stored` per state)."""
        return rollouts * steps * self.stored

    def readout(self, steps: int) -> int:
        """The critic or the open pass (whichever keeps more) on the `steps` stored states of one rollout."""
        return steps * max(self.open + self.anchor, self.critic)


@dataclass(frozen=True)
class MemoryPlan:
    """The chosen micro-batches of an update and of an imitation update, and why."""

    budget_gib: float
    source: str
    """How the budget was chosen ("config field 'memory_budget'" or the default's rule)."""
    state: StateBytes
    rollouts: int
    """Rollouts per micro-batch of a pathwise update's rollout pass (of this rank's shard)."""
    readout_rollouts: int
    """Rollouts per micro-batch of its critic and open passes on the stored states."""
    states: int
    """States per micro-batch of an imitation update (all three networks on each state)."""
    shard: int
    """Rollouts this rank simulates per update."""
    steps: int

    @staticmethod
    def choose(budget_gib: float, source: str, state: StateBytes, shard: int, steps: int, micro_batch: int = 0) -> MemoryPlan:
        """The fewest micro-batches of each pass whose activations fit `budget_gib` less what the update stores, of
        equal sizes (`balanced`), or `micro_batch` rollouts in every pass when the config fixes it (> 0). A budget
        below what the update stores and one micro-batch of one rollout (or state) is a ConfigError naming `source`."""
        if micro_batch:
            rollouts = min(micro_batch, shard)
            return MemoryPlan(budget_gib, source, state, rollouts, rollouts, rollouts * steps, shard, steps)
        kept = state.kept_until_the_end(shard, steps)
        smallest = max(state.rollout(steps), state.readout(steps), state.quantity + state.open + state.critic + state.recomputed)
        if budget_gib * GIB < kept + smallest:
            raise ConfigError(
                f"{source}: {budget_gib:.3g} GiB is below what an update needs at the least, {(kept + smallest) / GIB:.3g} GiB "
                f"(what it stores of its {shard} x {steps} states until its end, {kept / GIB:.3g} GiB, and the activations of "
                f"a micro-batch of one rollout, {smallest / GIB:.3g} GiB): give at least that, or fewer rollouts ('batch')"
            )
        free = budget_gib * GIB - kept

        def fitting(count: int, each: int) -> int:
            return balanced(count, max(1, min(count, math.floor(free / each))))

        per_state = state.quantity + state.open + state.critic + state.recomputed
        return MemoryPlan(
            budget_gib,
            source,
            state,
            fitting(shard, state.rollout(steps)),
            fitting(shard, state.readout(steps)),
            fitting(shard * steps, per_state),
            shard,
            steps,
        )

    def rollout_chunks(self) -> list[slice]:
        """This rank's rollouts, micro-batch by micro-batch of the rollout pass."""
        return slices(self.shard, self.rollouts)

    def readout_chunks(self) -> list[slice]:
        """This rank's rollouts, micro-batch by micro-batch of the critic and open passes."""
        return slices(self.shard, self.readout_rollouts)

    def state_chunks(self, states: int) -> list[slice]:
        """`states` stored states, micro-batch by micro-batch."""
        return slices(states, self.states)

    def describe(self) -> str:
        passes = math.ceil(self.shard / self.rollouts)
        per_rollout, readout = (bytes_ / GIB for bytes_ in (self.state.rollout(self.steps), self.state.readout(self.steps)))
        stored = self.state.kept_until_the_end(self.shard, self.steps) / GIB
        return (
            f"memory: micro-batches of {self.rollouts} of {self.shard} rollouts ({passes} per update; {per_rollout:.3g} GiB of "
            f"activations per rollout), of {self.readout_rollouts} in the critic and open passes ({readout:.3g} GiB per rollout) "
            f"and of {self.states} states in imitation, for a budget of {self.budget_gib:.3g} GiB ({self.source}), of which the "
            f"update stores {stored:.3g} GiB"
        )
