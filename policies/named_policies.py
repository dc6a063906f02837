"""Policies that are not learned, made by name on the instance they act on (policies/names.py's NAMED_POLICIES,
decomposition-lookahead:DIR and user-rule:PATH): a classical family tuned on training paths for `horizon` steps, the DP
optimum (n <= 3), the decomposition lookahead (its tables read from a bound run's folder, or computed now by
policies/decomposition.py), or the user's own rule from a rule table (policies/user_rule.py). trainers/resolver.py makes
every policy name through here, learned ones through the registry; the warm start's teacher (trainers/imitation.py,
below the registry) uses this module directly.
"""

from __future__ import annotations

from typing import Any

from envs.evaluation import Policy
from envs.instance import Instance
from policies.classical import tuned_policy
from policies.decomposition import lookahead_policy
from policies.joint_dp import optimal_policy
from policies.lookahead import FORMS
from policies.names import PolicyKind, PolicySpec
from policies.user_rule import user_rule_policy


def named_policy(
    instance: Instance,
    spec: PolicySpec,
    horizon: int,
    device="cpu",
    form: str = FORMS[0],
    progress: bool = False,
    threshold: float | None = None,
) -> tuple[Policy, dict[str, Any]]:
    """(policy, parameters for a summary) of the named policy `spec` on `instance`; `form` and `threshold` are the
    lookahead's: finite-horizon tables for `horizon` steps or the stationary ones, and its c (None: tuned)."""
    if threshold is not None and not spec.lookahead:
        raise ValueError(f"threshold: the lookahead's c, given for policy {spec.name!r}")
    if spec.optimum:
        return optimal_policy(instance, horizon, device, progress=progress)
    if spec.lookahead:
        return lookahead_policy(instance, horizon, device, form=form, bound=spec.path, threshold=threshold, progress=progress)
    if spec.kind is PolicyKind.USER_RULE:
        return user_rule_policy(instance, spec.path, device)
    return tuned_policy(instance, spec.name, spec.rules, horizon, device=device, progress=progress)
