"""Floating-point operations of OR-Transformer's networks and of one pathwise update, counted from the network's
dimensions (trainers/networks.py), and the model FLOPs utilisation (MFU) of a measured update, as nanoGPT estimates it.

What is counted is what torch.utils.flop_counter.FlopCounterMode counts: 2 m n k for every matrix product (the
Linear layers, without their biases) and 4 R S d_h for each head's attention of R query rows over S keys (the two
products Q K^T and P V); layer norms, GELU, softmax and the simulator are left out (a few percent).

One encoder's forward on one state of n items (S = n + 1 tokens, width d, feed-forward f, M blocks), the last block
updating R rows (R = S for the quantity network's item readout, 1 for the global readouts):

    embeddings 2 (4 + 11 n) d;  each earlier block 2 S d 3d + 4 S^2 d + 2 S d^2 + 4 S d f;
    the last block 2 S d 3d + 4 R S d + 2 R d^2 + 4 R d f;  the head 2 R_head d (R_head = n items, or 1).

One update of B rollouts of T steps (trainers/pathwise.py `hybrid_losses`): on each of the B T states the open
network's forward without a graph (it samples Y), the quantity network's forward and its backward (twice the forward:
the input and the weight gradients), the critic's and the open network's forward and backward on the stored states;
on each rollout's last state the frozen critic's forward and its backward to the state (about one forward more).
At the paper's dimensions (d = 128, 8 heads, f = 512, 4 blocks) and n = 1,024: 3.77 GFLOP per state for the quantity
network, 2.93 for the open network and the critic, 332 TFLOP per update of B = 1,024, T = 10.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from envs.features import GLOBAL_FEATURES, ITEM_FEATURES
from trainers.networks import TransformerShape

PEAK_FLOPS = {
    ("H100", "bfloat16"): 989e12,
    ("H200", "bfloat16"): 989e12,
    ("A100", "bfloat16"): 312e12,
    ("H100", "float32"): 67e12,
    ("H200", "float32"): 67e12,
    ("A100", "float32"): 19.5e12,
}
"""Dense peak FLOP/s by card (a substring of torch.cuda.get_device_name) and precision, from the vendors' data sheets
(SXM cards; float32 without TF32). A card not listed gets no MFU."""


def encoder_flops(shape: TransformerShape, n: int, rows: int, head_rows: int) -> float:
    """One token encoder's forward on one state (module docstring): the last block updates `rows` rows and the head
    reads `head_rows`."""
    d, f, tokens = shape.width, shape.feed_forward, n + 1
    embed = 2 * (GLOBAL_FEATURES + ITEM_FEATURES * n) * d
    full = 2 * tokens * d * 3 * d + 4 * tokens * tokens * d + 2 * tokens * d * d + 4 * tokens * d * f
    last = 2 * tokens * d * 3 * d + 4 * rows * tokens * d + 2 * rows * d * d + 4 * rows * d * f
    return float(embed + (shape.blocks - 1) * full + last + 2 * head_rows * d)


@dataclass(frozen=True)
class NetworkFlops:
    """Forward FLOPs of each of the three networks on one state."""

    open: float
    quantity: float
    critic: float

    @classmethod
    def of(cls, shape: TransformerShape, n: int) -> NetworkFlops:
        readout = encoder_flops(shape, n, 1, 1)
        return cls(readout, encoder_flops(shape, n, n + 1, n), readout)

    def update(self, batch: int, steps: int) -> float:
        """One pathwise update of `batch` rollouts of `steps` steps (module docstring)."""
        per_state = self.open + 3 * self.quantity + 3 * self.critic + 3 * self.open
        return batch * steps * per_state + batch * 2 * self.critic


def peak_flops(device_name: str, precision: str) -> float | None:
    """The card's dense peak FLOP/s at `precision` (PEAK_FLOPS), None for a card not listed (and for a CPU)."""
    return next((peak for (card, kind), peak in PEAK_FLOPS.items() if card in device_name and kind == precision), None)


def mfu(flops_per_update: float, seconds_per_update: float, peak: float | None) -> float | None:
    """Achieved FLOP/s over the peak: the share of the card's arithmetic an update uses (None without a peak)."""
    return None if peak is None else flops_per_update / seconds_per_update / peak


@dataclass(frozen=True)
class UpdateArithmetic:
    """What one pathwise update of an OR-Transformer config computes on this process (its B / W rollouts), and the
    card's peak at the config's precision (None on a CPU or a card not in PEAK_FLOPS)."""

    flops: float
    card: str
    peak: float | None

    @classmethod
    def of(cls, config, n: int, device: str | torch.device, world: int = 1) -> UpdateArithmetic:
        shape = TransformerShape(config.blocks, config.width, config.heads, config.feed_forward)
        flops = NetworkFlops.of(shape, n).update(config.batch, config.rollout) / world
        card = torch.cuda.get_device_name(device) if str(device).startswith("cuda") else "cpu"
        return cls(flops, card, peak_flops(card, config.precision))

    def utilisation(self, seconds: float) -> float | None:
        """The MFU of an update that took `seconds` (None without a peak)."""
        return mfu(self.flops, seconds, self.peak)

    def figures(self, seconds: float) -> dict:
        """An update that took `seconds`: its TFLOP, the achieved TFLOP/s and the MFU, as the benchmarks print them."""
        utilisation = self.utilisation(seconds)
        return {
            "card": self.card,
            "tflop_per_update": round(self.flops / 1e12, 4),
            "achieved_tflop_per_s": round(self.flops / seconds / 1e12, 3),
            "mfu": None if utilisation is None else round(utilisation, 4),
        }
