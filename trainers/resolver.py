"""One resolver of every policy name (policies/names.py): evaluate.py, decide.py, the decision service and the
sweep's baselines make their policies here.

A named policy is made on the instance it acts on (policies/named_policies.py) in the `form` the caller needs: the
evaluator knows the horizon (finite tables); a decision for a state without a period (decide.py, the service) uses
the stationary tables. checkpoint:PATH is a trained policy of any learned method (trainers.registry).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envs.evaluation import EVAL_HORIZON, Policy
from envs.instance import Instance
from plumbing.errors import InputError
from policies.lookahead import FORMS
from policies.named_policies import named_policy
from policies.names import PolicySpec, named_label, parse_policy
from trainers.checkpoint import checkpoint_file, network_of
from trainers.policy import MODES, PRECISIONS
from trainers.registry import load_policy

DETERMINISTIC = "deterministic"
"""The mode of a named policy: it has no sampled opening."""


@dataclass(frozen=True)
class ResolvedPolicy:
    """A policy made from its name, and what a result or a service says about it."""

    spec: PolicySpec
    """The name, parsed."""
    policy: Policy
    label: str
    """The method name its evaluation is written under: `<method>-<mode>` for a checkpoint (as train.py names
    its evaluations), the policy's name without a tables folder otherwise (policies.names.named_label)."""
    parameters: dict[str, Any]
    """For a summary: the tuned or solved parameters, or the checkpoint's path, method, mode and status."""
    instance: Instance
    """The instance it acts on: the one given, or a checkpoint's own when none was."""
    mode: str
    """greedy or sampled for a learned policy; `deterministic` for a named one."""
    checkpoint_file: str | None = None
    """The checkpoint file a learned policy was read from (a run folder's best.pt or checkpoint.pt)."""

    @property
    def learned(self) -> bool:
        """Whether it is a trained network (checkpoint:PATH)."""
        return self.spec.learned

    def network_note(self) -> str:
        """Which network a learned policy is, for a script's result line: the file read and its network, best (with its
        validation score) or last (with the run's status where it did not complete); "" for a named policy."""
        if not self.learned:
            return ""
        p = self.parameters
        if p["network"] == "best":
            which = f"the best network, of update {p['update']}, validation {p['validation_cost']:.2f} ± {p['validation_se']:.2f}"
        else:
            status = "" if p["training_status"] == "completed" else f", training {p['training_status']}"
            which = f"the network of update {p['update']}{status}"
        return f" ({self.checkpoint_file}: {which})"


def resolve(
    name: PolicySpec | str,
    instance: Instance | None = None,
    horizon: int = EVAL_HORIZON,
    mode: str = "greedy",
    form: str = FORMS[0],
    device="cpu",
    progress: bool = False,
    precision: str = "float32",
) -> ResolvedPolicy:
    """Returns the policy `name` (a spec, or a name parsed here) names on `instance` (needed by every named policy; a checkpoint acts on
    its own instance unless one is given). `mode` and `precision` (bfloat16 or float32) apply to a pathwise checkpoint (a named policy
    refuses other than greedy and float32), `form` to the lookahead; `horizon` is the evaluation's, for which classical families and the
    lookahead's threshold are tuned and the DP solved. Raises InputError on a bad mode, precision or form."""
    spec = parse_policy(name)  # a Python call's name; a spec passes as it is
    if mode not in MODES:
        raise InputError(f"mode: expected one of {list(MODES)}, got {mode!r}")
    if precision not in PRECISIONS:
        raise InputError(f"precision: expected one of {list(PRECISIONS)}, got {precision!r}")
    if form not in FORMS:
        raise InputError(f"lookahead form: expected one of {list(FORMS)}, got {form!r}")
    if spec.learned:
        path = spec.path
        policy, ckpt = load_policy(path, mode, device, instance, precision)
        method = ckpt["config"].method
        parameters = {"checkpoint": path, "mode": mode, "method": method, "training_status": ckpt["status"], **network_of(ckpt["trainer"])}
        if precision != "float32":
            parameters["precision"] = precision
        return ResolvedPolicy(spec, policy, f"{method}-{mode}", parameters, instance or ckpt["instance"], mode, str(checkpoint_file(path)))
    if mode != "greedy":
        raise InputError(f"mode '{mode}': applies to checkpoint:PATH only; policy '{spec}' is deterministic")
    if precision != "float32":
        raise InputError(f"precision '{precision}': applies to checkpoint:PATH only; policy '{spec}' has no network")
    if instance is None:
        raise InputError(f"policy '{spec}': needs an instance (--instance)")
    policy, parameters = named_policy(instance, spec, horizon, device, form, progress)
    return ResolvedPolicy(spec, policy, named_label(spec, form), parameters, instance, DETERMINISTIC)
