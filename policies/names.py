"""The grammar of policy names, shared by every entry point (evaluate.py, decide.py, serve.py, sweeps, the
warm start's teacher); trainers/resolver.py turns a name into a policy.

* a classical family or classical-best (policies.classical.POLICY_NAMES), tuned on training paths;
* dp-optimal: the exact n = 1 optimum (policies.dp_optimal);
* decomposition-lookahead: the joint rule on the decomposition bound's per-item values (policies.lookahead),
  its tables computed when the policy is made, or decomposition-lookahead:DIR with the tables that a
  decomposition bound run wrote in DIR (platform/bound.py --kind decomposition --out DIR);
* checkpoint:PATH: a trained policy of any learned method: a checkpoint file, or a run folder, whose best.pt (the
  network of the lowest validation cost) it means, or its checkpoint.pt where it has none.
"""

from __future__ import annotations

import argparse

from policies.classical import POLICY_NAMES
from policies.dp_optimal import NAME as DP_OPTIMAL
from policies.lookahead import FORMS
from policies.lookahead import NAME as LOOKAHEAD

CHECKPOINT_PREFIX = "checkpoint:"
TABLES_PREFIX = f"{LOOKAHEAD}:"
NAMED_POLICIES = (*POLICY_NAMES, DP_OPTIMAL, LOOKAHEAD)
PREFIXES = (CHECKPOINT_PREFIX, TABLES_PREFIX)
ALLOWED = f"one of {list(NAMED_POLICIES)}, {CHECKPOINT_PREFIX}PATH or {TABLES_PREFIX}DIR"
"""The allowed values, as an error message says them."""


def is_policy_name(text) -> bool:
    """Whether `text` names a policy: a named policy (NAMED_POLICIES), checkpoint:PATH or decomposition-lookahead:DIR."""
    return isinstance(text, str) and (text in NAMED_POLICIES or any(text.startswith(p) and len(text) > len(p) for p in PREFIXES))


def policy_name(text: str) -> str:
    """An argparse type: a policy name (`is_policy_name`)."""
    if is_policy_name(text):
        return text
    raise argparse.ArgumentTypeError(f"expected {ALLOWED}, got '{text}'")


def policy_path(name: str) -> str | None:
    """The file or folder that a policy name reads (checkpoint:PATH, decomposition-lookahead:DIR), else None."""
    prefix = next((p for p in PREFIXES if name.startswith(p)), None)
    return name[len(prefix) :] if prefix else None


def is_checkpoint(name: str) -> bool:
    """Whether `name` is checkpoint:PATH (a learned policy)."""
    return name.startswith(CHECKPOINT_PREFIX)


def is_lookahead(name: str) -> bool:
    """Whether `name` is the decomposition lookahead, with or without a tables folder."""
    return name == LOOKAHEAD or name.startswith(TABLES_PREFIX)


def named_label(name: str, form: str = FORMS[0]) -> str:
    """The method name under which a named policy's evaluation is written: the name, without a tables folder;
    the lookahead's stationary form gets its own (decomposition-lookahead-stationary), so that both forms can
    stand in one report."""
    if is_lookahead(name):
        return LOOKAHEAD if form == FORMS[0] else f"{LOOKAHEAD}-{form}"
    return name
