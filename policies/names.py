"""The grammar of policy names and the one parser of them: a name is parsed where it enters (a flag, a config or
sweep file, the decision service's config, a Python call) into a typed `PolicySpec`, and past that point code passes
the spec; trainers/resolver.py turns a spec into a policy.

* a classical family or classical-best (policies.classical.POLICY_NAMES), tuned on training paths;
* dp-optimal: the exact n = 1 optimum (policies.dp_optimal);
* decomposition-lookahead: the joint rule on the decomposition bound's per-item values (policies.lookahead),
  its tables computed when the policy is made, or decomposition-lookahead:DIR with the tables that a
  decomposition bound run wrote in DIR (platform/bound.py --kind decomposition --out DIR);
* checkpoint:PATH: a trained policy of any learned method: a checkpoint file, or a run folder, whose best.pt (the
  network of the lowest validation cost) it means, or its checkpoint.pt where it has none;
* user-rule:PATH: the user's own reorder rule, one (s, S) or (R, S) per item from the rule table PATH
  (policies/user_rule.py).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from enum import StrEnum

from plumbing.errors import InputError
from policies.classical import POLICY_NAMES, RULES_OF, Rule
from policies.dp_optimal import NAME as DP_OPTIMAL
from policies.lookahead import FORMS
from policies.lookahead import NAME as LOOKAHEAD
from policies.user_rule import NAME as USER_RULE

CHECKPOINT_PREFIX = "checkpoint:"
TABLES_PREFIX = f"{LOOKAHEAD}:"
RULE_TABLE_PREFIX = f"{USER_RULE}:"
NAMED_POLICIES = (*POLICY_NAMES, DP_OPTIMAL, LOOKAHEAD)
ALLOWED = f"one of {list(NAMED_POLICIES)}, {CHECKPOINT_PREFIX}PATH, {TABLES_PREFIX}DIR or {RULE_TABLE_PREFIX}PATH"
"""The allowed values, as an error message says them."""


class PolicyKind(StrEnum):
    """The kinds of policy a name can mean: a tuned classical rule or classical-best, the DP optimum (n <= 3), the
    decomposition lookahead, a learned policy's checkpoint, the user's own rule from a table."""

    RULE = "rule"
    DP = "dp"
    LOOKAHEAD = "lookahead"
    CHECKPOINT = "checkpoint"
    USER_RULE = "user-rule"


@dataclass(frozen=True)
class PolicySpec:
    """A policy name parsed (`parse_policy`): its `kind`; for checkpoint:PATH, decomposition-lookahead:DIR and
    user-rule:PATH, the `path` it reads; for a rule, the `rules` it tunes (each a family and its factor flag: none for zero, one for a
    variant, every variant for classical-best); `name` is the text as given, which results and messages show."""

    name: str
    kind: PolicyKind
    path: str | None = None
    rules: tuple[Rule, ...] = field(default=(), compare=False)

    @property
    def learned(self) -> bool:
        return self.kind is PolicyKind.CHECKPOINT

    @property
    def lookahead(self) -> bool:
        return self.kind is PolicyKind.LOOKAHEAD

    @property
    def optimum(self) -> bool:
        return self.kind is PolicyKind.DP

    def __str__(self) -> str:
        return self.name


def parse_policy(text, where: str = "policy", shown=repr) -> PolicySpec:
    """`text` as a PolicySpec, where a name enters (a flag, a config or sweep file, a service's config, a Python call;
    a spec passes as it is); anything else is an InputError `<where>: expected <ALLOWED>, got <shown(text)>`."""
    if isinstance(text, PolicySpec):
        return text
    if isinstance(text, str):
        prefixes = (
            (CHECKPOINT_PREFIX, PolicyKind.CHECKPOINT),
            (TABLES_PREFIX, PolicyKind.LOOKAHEAD),
            (RULE_TABLE_PREFIX, PolicyKind.USER_RULE),
        )
        for prefix, kind in prefixes:
            if text.startswith(prefix) and len(text) > len(prefix):
                return PolicySpec(text, kind, text[len(prefix) :])
        if text in RULES_OF:
            return PolicySpec(text, PolicyKind.RULE, rules=RULES_OF[text])
        named = {LOOKAHEAD: PolicyKind.LOOKAHEAD, DP_OPTIMAL: PolicyKind.DP}
        if text in named:
            return PolicySpec(text, named[text])
    raise InputError(f"{where}: expected {ALLOWED}, got {shown(text)}")


def checkpoint_spec(path) -> PolicySpec:
    """The spec of a learned policy's checkpoint file or run folder `path` (what checkpoint:PATH parses into)."""
    return PolicySpec(f"{CHECKPOINT_PREFIX}{path}", PolicyKind.CHECKPOINT, str(path))


def tables_spec(folder) -> PolicySpec:
    """The spec of the lookahead on the tables a decomposition bound run wrote in `folder` (decomposition-lookahead:DIR)."""
    return PolicySpec(f"{TABLES_PREFIX}{folder}", PolicyKind.LOOKAHEAD, str(folder))


def policy_spec(text: str) -> PolicySpec:
    """An argparse type: `text` parsed (`parse_policy`), or argparse's one-line error."""
    try:
        return parse_policy(text)
    except InputError:
        raise argparse.ArgumentTypeError(f"expected {ALLOWED}, got '{text}'") from None


def named_label(spec: PolicySpec, form: str = FORMS[0]) -> str:
    """The method name under which a named policy's evaluation is written: the name, without a tables folder;
    the lookahead's stationary form gets its own (decomposition-lookahead-stationary), so that both forms can
    stand in one report."""
    if spec.lookahead:
        return LOOKAHEAD if form == FORMS[0] else f"{LOOKAHEAD}-{form}"
    if spec.kind is PolicyKind.USER_RULE:
        return USER_RULE
    return spec.name
