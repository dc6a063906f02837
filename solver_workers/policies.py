"""Every policy by name, in one place: platform/evaluate.py, platform/decide.py, the decision service
(serving/decisions.py), the sweep's baselines and the imitation warm start's teacher (trainers/imitation.py)
look names up here. It sits in solver_workers, below trainers, sweeps, serving and platform, because the
lookahead's tables come from this layer's decomposition pool.

* a classical family or classical-best (envs.classical.POLICY_NAMES), tuned on training paths;
* dp-optimal: the exact n = 1 optimum (envs.dp_optimal);
* decomposition-lookahead: the joint rule on the decomposition bound's per-item values (envs.lookahead),
  with its tables computed now (solver_workers.lookahead), or decomposition-lookahead:DIR with the tables a
  decomposition bound run wrote in DIR (platform/bound.py --kind decomposition --out DIR);
* checkpoint:PATH: a trained policy of any learned method (trainers.registry).

The lookahead's form follows the caller: the evaluator knows the horizon (finite tables), a decision for
a state without a period (decide.py, serve.py) uses the stationary tables.
"""

from __future__ import annotations

import argparse

from envs.classical import POLICY_NAMES, tuned_policy
from envs.dp_optimal import dp_optimal_policy
from envs.evaluation import EVAL_HORIZON
from envs.instance import Instance
from envs.lookahead import FORMS
from envs.lookahead import NAME as LOOKAHEAD
from solver_workers.lookahead import lookahead_policy

CHECKPOINT_PREFIX = "checkpoint:"
TABLES_PREFIX = f"{LOOKAHEAD}:"
DP_OPTIMAL = "dp-optimal"
NAMED_POLICIES = (*POLICY_NAMES, DP_OPTIMAL, LOOKAHEAD)
PREFIXES = (CHECKPOINT_PREFIX, TABLES_PREFIX)


def is_policy_name(text) -> bool:
    """Whether `text` names a policy: a named policy (NAMED_POLICIES), checkpoint:PATH or decomposition-lookahead:DIR."""
    return isinstance(text, str) and (text in NAMED_POLICIES or any(text.startswith(p) and len(text) > len(p) for p in PREFIXES))


def policy_name(text: str) -> str:
    """An argparse type: a named policy (NAMED_POLICIES), checkpoint:PATH or decomposition-lookahead:DIR."""
    if is_policy_name(text):
        return text
    raise argparse.ArgumentTypeError(f"expected one of {list(NAMED_POLICIES)}, checkpoint:PATH or {TABLES_PREFIX}DIR, got '{text}'")


def policy_path(name: str) -> str | None:
    """The file or folder that a policy name reads (checkpoint:PATH, decomposition-lookahead:DIR), else None."""
    prefix = next((p for p in PREFIXES if name.startswith(p)), None)
    return name[len(prefix) :] if prefix else None


def named_policy(instance: Instance, name: str, horizon: int = EVAL_HORIZON, device="cpu", progress: bool = False, form: str = FORMS[0]):
    """(policy, parameters for a summary) of a named policy (not a checkpoint): the DP optimum (n = 1 only), the
    decomposition lookahead (`form`: finite-horizon tables for `horizon` steps, or stationary), or a classical
    family tuned on training paths for `horizon` steps."""
    if name == DP_OPTIMAL:
        return dp_optimal_policy(instance, horizon, device)
    if name == LOOKAHEAD or name.startswith(TABLES_PREFIX):
        return lookahead_policy(instance, horizon, device, form=form, bound=policy_path(name), progress=progress)
    return tuned_policy(instance, name, horizon, device=device, progress=progress)


def named_label(name: str, form: str = FORMS[0]) -> str:
    """The method name under which a named policy's evaluation is written: the name, without a tables folder;
    the lookahead's stationary form gets its own (decomposition-lookahead-stationary), so that both forms can
    stand in one report."""
    if name == LOOKAHEAD or name.startswith(TABLES_PREFIX):
        return LOOKAHEAD if form == FORMS[0] else f"{LOOKAHEAD}-{form}"
    return name
