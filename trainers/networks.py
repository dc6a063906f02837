"""Policy networks with the three outputs of the hybrid policy, eq. (policy_factorization):
the order-opening logit (eq. order_head), the capped quantity fractions (eq. quantity_head, Q = qbar *
fraction) and the normalised value (eq. value_head).

* `ORTransformer`: three token encoders with disjoint parameters, eq. (three_transformers).
* `HPOPerceptron`: three perceptrons (two hidden layers of 512, tanh) on the flat 11n + 4 input.

Both take item tokens [B, n, 11], the global token [B, 4] and an optional padding mask [B, n]
(True = a real item).

A Transformer's global readouts (open logit, value) update only h_0 in the last block: the other rows of
that block reach neither h_0 nor any gradient, so this is the same function with a quarter less attention.
An OR-Transformer may read the global token's setup-cost feature per item (`setup_feature` "per-item", not the
paper's): K / (n c_scale sigma_ref) instead of eq. (global_features)'s K / (c_scale sigma_ref), divided by the number
of real items inside the network. On instances whose K grows with n (the paper's K = 10 n) the paper's feature grows
with n, so a network trained at one n reads a setup cost it never saw at another (docs/methods.md, "Size").

An encoder may recompute its blocks in the backward pass instead of keeping their activations
(`checkpoint_blocks`, activation checkpointing): the same gradient for about a tenth of the memory
(the paper's encoder at n = 1,024; trainers.memory measures both).

`compile_blocks` compiles the blocks, not the encoders: one code object whose graphs every block of the three
encoders shares (the parameters are graph inputs), with the batch dimension dynamic, so the graphs depend only on
how a block is called (grad mode, all rows or h_0 alone, trainable or frozen parameters), never on the micro-batch,
on t = 0 against t >= 1 (the embeddings run eagerly) or on the network: 6 in all (docs/methods.md, "Memory").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from envs.features import GLOBAL_FEATURES, ITEM_FEATURES


def autocast(precision: str, device: torch.device, cache_enabled: bool = True):
    """The networks' arithmetic: bfloat16 autocast under `precision` "bfloat16", else float32 (autocast off)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bfloat16", cache_enabled=cache_enabled)


class PolicyOutputs(NamedTuple):
    open_logit: torch.Tensor  # [B]   p = sigmoid(open_logit)
    quantity_fraction: torch.Tensor  # [B, n] in (0, 1); Q = qbar * fraction
    value: torch.Tensor  # [B]   V(s) in normalised-cost units


@dataclass(frozen=True)
class TransformerShape:
    blocks: int = 4  # M
    width: int = 128  # d
    heads: int = 8
    feed_forward: int = 512  # 4d


SETUP_FEATURES = ("paper", "per-item")
"""How an OR-Transformer reads the global token's setup cost (module docstring)."""


class SelfAttention(nn.Module):
    """Full non-causal multi-head attention without query/key/value bias; `keep` masks padded keys.
    `rows` selects the query rows (every row is a key and a value): [B, S, d] -> [B, len(rows), d]."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} must be divisible by heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None, rows: slice = slice(None)) -> torch.Tensor:
        B, S, d = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)  # 3 x [B, H, S, dh]
        mask = None if keep is None else keep[:, None, None, :]  # [B, 1, 1, S]
        y = F.scaled_dot_product_attention(q[:, :, rows], k, v, attn_mask=mask)  # [B, H, R, dh]
        return self.out(y.transpose(1, 2).reshape(B, y.shape[2], d))


class Block(nn.Module):
    """Pre-norm Transformer block, zero dropout; updates the token rows `rows` (all by default): [B, S, d] -> [B, len(rows), d]."""

    def __init__(self, shape: TransformerShape):
        super().__init__()
        self.norm1 = nn.LayerNorm(shape.width)
        self.attention = SelfAttention(shape.width, shape.heads)
        self.norm2 = nn.LayerNorm(shape.width)
        self.mlp = nn.Sequential(nn.Linear(shape.width, shape.feed_forward), nn.GELU(), nn.Linear(shape.feed_forward, shape.width))

    def forward(self, x, keep, rows: slice = slice(None)):
        x = x[:, rows] + self.attention(self.norm1(x), keep, rows)
        return x + self.mlp(self.norm2(x))


class TokenEncoder(nn.Module):
    """E_G, E_I and T^r of eq. (three_transformers): [B, 4], [B, n, 11] -> [B, 1 + n, d].
    No positional or item-index embedding, so item order only permutes the item rows. With `rows` the
    last block updates only those rows (the earlier blocks need every row as a key and a value) and the
    result is [B, len(rows), d]."""

    def __init__(self, shape: TransformerShape, setup_per_item: bool = False):
        super().__init__()
        self.setup_per_item = setup_per_item
        self.embed_global = nn.Linear(GLOBAL_FEATURES, shape.width)
        self.embed_item = nn.Linear(ITEM_FEATURES, shape.width)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.blocks))
        self.norm = nn.LayerNorm(shape.width)
        self.checkpoint_blocks = False
        """Recompute each block in the backward pass instead of keeping its activations (module docstring)."""
        self.compiled_blocks: list[nn.Module] | None = None
        """The blocks under torch.compile (`compile_blocks`); a plain list, so the state dict names each parameter once."""

    def compile_blocks(self, mode: str | None = None, backend: str = "inductor") -> None:
        """torch.compile each block for the forward and backward passes of training (module docstring); decisions
        (inference mode: validation, a DAgger student) run the eager blocks. `mode` "reduce-overhead" also replays
        the compiled blocks as CUDA graphs."""
        self.compiled_blocks = [torch.compile(block, mode=mode, backend=backend) for block in self.blocks]

    def forward(self, items, glob, item_mask=None, rows: slice = slice(None)):
        if self.setup_per_item:  # K / (c_scale sigma_ref) divided by the real items of each row
            count = items.new_full(glob.shape[:1], items.shape[1]) if item_mask is None else item_mask.sum(-1).to(glob.dtype)
            glob = torch.cat([glob[:, :1] / count[:, None], glob[:, 1:]], dim=-1)
        x = torch.cat([self.embed_global(glob)[:, None], self.embed_item(items)], dim=1)
        keep = None
        if item_mask is not None:  # the global token is always attended to
            keep = torch.cat([torch.ones_like(item_mask[:, :1]), item_mask], dim=1)
        recompute = self.checkpoint_blocks and torch.is_grad_enabled()
        blocks = self.blocks
        if self.compiled_blocks is not None and not torch.is_inference_mode_enabled():
            blocks = self.compiled_blocks
            torch._dynamo.maybe_mark_dynamic(x, 0)  # one graph for every micro-batch size
        for index, block in enumerate(blocks):
            block_rows = rows if index == len(self.blocks) - 1 else slice(None)
            x = checkpoint(block, x, keep, block_rows, use_reentrant=False) if recompute else block(x, keep, block_rows)
        return self.norm(x)


class GlobalReadout(nn.Module):
    """A token encoder and a scalar head on the final global representation h_0: [B]. The last block computes
    h_0 only (see the module docstring)."""

    def __init__(self, shape: TransformerShape, setup_per_item: bool = False):
        super().__init__()
        self.encoder = TokenEncoder(shape, setup_per_item)
        self.head = nn.Linear(shape.width, 1)

    def forward(self, items, glob, item_mask=None):
        return self.head(self.encoder(items, glob, item_mask, slice(0, 1))[:, 0])[:, 0]


class ItemReadout(nn.Module):
    """A token encoder and one head shared by all item representations h_i: [B, n] (or [B, n, outputs])."""

    def __init__(self, shape: TransformerShape, outputs: int = 1, setup_per_item: bool = False):
        super().__init__()
        self.encoder = TokenEncoder(shape, setup_per_item)
        self.head = nn.Linear(shape.width, outputs)

    def forward(self, items, glob, item_mask=None):
        out = self.head(self.encoder(items, glob, item_mask)[:, 1:])
        return out[..., 0] if out.shape[-1] == 1 else out


class FlatPerceptron(nn.Module):
    """Two hidden layers with tanh on the concatenated 11n + 4 input (fixed n, no padding)."""

    def __init__(self, n: int, hidden: int, per_item: int = 0):
        """per_item = 0: one scalar [B]; 1: one value per item [B, n]; k > 1: [B, n, k]."""
        super().__init__()
        self.n, self.per_item = n, per_item
        self.net = nn.Sequential(
            nn.Linear(ITEM_FEATURES * n + GLOBAL_FEATURES, hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, max(n * per_item, 1)),
        )

    def forward(self, items, glob, item_mask=None):
        if item_mask is not None and not bool(item_mask.all()):
            raise ValueError("a perceptron has a fixed input of 11n + 4 features: padded item slots are not supported")
        if items.shape[1] != self.n:
            raise ValueError(f"this perceptron was built for n = {self.n} items, got {items.shape[1]}")
        out = self.net(torch.cat([items.flatten(1), glob], dim=-1))
        if self.per_item == 0:
            return out[:, 0]
        return out if self.per_item == 1 else out.view(out.shape[0], self.n, self.per_item)


class ThreeNetworks(nn.Module):
    """The hybrid policy's three networks with disjoint parameters: `open_net` (phi) gives the
    order-opening logit [B], `quantity_net` (kappa) the quantity logits [B, n], `critic_net` (psi)
    the normalised value [B]."""

    open_net: nn.Module
    quantity_net: nn.Module
    critic_net: nn.Module

    def networks(self) -> dict[str, list[nn.Parameter]]:
        """Parameter groups clipped separately."""
        return {name: list(getattr(self, f"{name}_net").parameters()) for name in ("open", "quantity", "critic")}

    def open_logit(self, items, glob, item_mask=None):
        """w_Y^T h_0^Y + c_Y, eq. (order_head)."""
        return self.open_net(items, glob, item_mask)

    def quantity_fraction(self, items, glob, item_mask=None):
        """sigmoid(w_Q^T h_i^Q + c_Q), eq. (quantity_head); Q_i = qbar_i times this."""
        return torch.sigmoid(self.quantity_net(items, glob, item_mask))

    def value(self, items, glob, item_mask=None):
        """V_psi(s), eq. (value_head)."""
        return self.critic_net(items, glob, item_mask)

    def compile_networks(self, mode: str | None = None, backend: str = "inductor") -> None:
        """torch.compile the three networks, forward and backward; `mode` "reduce-overhead" replays CUDA graphs."""
        for network in (self.open_net, self.quantity_net, self.critic_net):
            network.compile(mode=mode, backend=backend)

    def forward(self, items, glob, item_mask=None) -> PolicyOutputs:
        return PolicyOutputs(
            self.open_logit(items, glob, item_mask), self.quantity_fraction(items, glob, item_mask), self.value(items, glob, item_mask)
        )


class ORTransformer(ThreeNetworks):
    """OR-Transformer: three encoders, eq. (three_transformers), with disjoint parameters."""

    def __init__(self, shape: TransformerShape = TransformerShape(), setup_feature: str = "paper"):
        super().__init__()
        per_item = setup_feature == "per-item"
        self.open_net = GlobalReadout(shape, per_item)
        self.quantity_net = ItemReadout(shape, setup_per_item=per_item)
        self.critic_net = GlobalReadout(shape, per_item)

    def compile_networks(self, mode: str | None = None, backend: str = "inductor") -> None:
        """torch.compile the blocks of the three encoders (TokenEncoder.compile_blocks); the embeddings, the final
        norms and the heads run eagerly."""
        for network in (self.open_net, self.quantity_net, self.critic_net):
            network.encoder.compile_blocks(mode, backend)


class HPOPerceptron(ThreeNetworks):
    """HPO: three perceptrons (two hidden layers, tanh) on the flat 11n + 4 input."""

    def __init__(self, n: int, hidden: int = 512):
        super().__init__()
        self.open_net = FlatPerceptron(n, hidden)
        self.quantity_net = FlatPerceptron(n, hidden, per_item=1)
        self.critic_net = FlatPerceptron(n, hidden)
