"""Symmetry-preserving state representation: eqs. (feature_scales), (item_features), (global_features)."""

from __future__ import annotations

import torch

from envs.dynamics import State
from envs.instance import Instance, InstanceError, TensorInstance

ITEM_FEATURES = 11
GLOBAL_FEATURES = 4
GLOBAL_SCALE_CONSTANT = 100.0  # the fixed constant in 1 / (100 (1 - gamma)), eq. (global_features)


def check_one_factor(instance: Instance, what: str) -> None:
    """Refuse, in one line, an instance with k >= 2 factors: the tokens hold one factor F_t (eq. global_features)
    and each item's loading on it (eq. item_features, signed where loadings are)."""
    if instance.factors > 1:
        raise InstanceError(
            f"{what}: the network's features (eqs. item_features, global_features) hold one factor F_t and each item's "
            f"loading on it, and this instance has {instance.demand_model()}; the classical rules, the decomposition "
            "bound and its lookahead and the MILPs take it (docs/model.md)"
        )


def item_tokens(instance: TensorInstance, state: State) -> torch.Tensor:
    """x_{i,t}, eq. (item_features): [B, n, 11]."""
    batch, n = state.inv.shape
    sigma = instance.sigma  # [n]
    dynamic = torch.cat([((state.inv - instance.mu) / sigma)[..., None], state.pipe / sigma[:, None]], dim=-1)  # [B, n, 4]
    static = torch.stack(
        [
            instance.h / instance.c_scale,
            instance.b / instance.c_scale,
            torch.log1p(instance.lam),
            torch.sqrt(instance.lam) / instance.sigma_ref,
            instance.qbar / sigma,
            instance.beta if instance.directions is None else instance.beta * instance.directions[:, 0],  # signed at k = 1
            instance.lead,
        ],
        dim=-1,
    )  # [n, 7]
    return torch.cat([dynamic, static.expand(batch, n, 7)], dim=-1)


def global_token(instance: TensorInstance, state: State) -> torch.Tensor:
    """g_t, eq. (global_features): [B, 4]."""
    constants = (
        instance.K / (instance.c_scale * instance.sigma_ref),
        instance.gamma,
        1.0 / (GLOBAL_SCALE_CONSTANT * (1.0 - instance.gamma)),
    )
    # filled on the state's device: no host-to-device copy, so no synchronisation with a GPU
    return torch.stack([*(torch.full_like(state.factor, value) for value in constants), state.factor], dim=-1)


def flat_features(instance: TensorInstance, state: State) -> torch.Tensor:
    """The concatenated 11n + 4 input of the perceptron baselines: item tokens (item-major), then g_t."""
    return torch.cat([item_tokens(instance, state).flatten(1), global_token(instance, state)], dim=-1)
