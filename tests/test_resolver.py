"""The one resolver of every policy name (trainers/resolver.py): each prefix resolved once, the same labels and
parameters for every caller, and names or options that do not apply refused."""

import re

import numpy as np
import pytest
from conftest import INSTANCE

from envs.evaluation import evaluate
from envs.exogenous import sample_paths
from plumbing.errors import InputError
from policies.classical import zero_policy
from policies.names import ALLOWED, TABLES_PREFIX, PolicySpec, named_label, parse_policy
from serving.decisions import load_decider
from trainers.resolver import DETERMINISTIC, resolve


def test_a_checkpoint_resolves_to_its_method_and_mode_on_its_own_instance(trained):
    """checkpoint:PATH: the label train.py gives its evaluations (<method>-<mode>), the checkpoint's own instance when
    none is given, and the same decisions as the service's Decider (which resolves here too)."""
    run = trained["or-transformer"]
    name = f"checkpoint:{run.checkpoint}"
    for mode in ("greedy", "sampled"):
        resolved = resolve(name, mode=mode)
        assert resolved.learned and resolved.mode == mode and resolved.label == f"or-transformer-{mode}"
        assert resolved.instance.content_hash() == INSTANCE.content_hash()
        assert resolved.parameters == {
            "checkpoint": str(run.checkpoint),
            "mode": mode,
            "method": "or-transformer",
            "training_status": "completed",
            "network": "last",
            "update": 2,
        }
    paths = sample_paths(INSTANCE, 5, 4, 6)
    ours = evaluate(resolve(name).policy, INSTANCE.to_torch(), paths).discounted_cost
    decider = load_decider(name)
    assert decider.info["method"] == "or-transformer" and decider.mode == "greedy"
    assert np.array_equal(ours, evaluate(decider.policy, INSTANCE.to_torch(), paths).discounted_cost)


def test_a_named_policy_is_deterministic_and_labelled_by_its_name():
    resolved = resolve("zero", INSTANCE, horizon=6)
    assert not resolved.learned and resolved.mode == DETERMINISTIC and resolved.label == "zero"
    paths = sample_paths(INSTANCE, 5, 4, 6)
    ours = evaluate(resolved.policy, INSTANCE.to_torch(), paths).discounted_cost
    assert np.array_equal(ours, evaluate(zero_policy, INSTANCE.to_torch(), paths).discounted_cost)


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("best", {}, f"policy: expected {ALLOWED}"),
        ("checkpoint:", {}, "policy: expected"),
        ("zero", {"mode": "sampled"}, "mode 'sampled': applies to checkpoint:PATH only; policy 'zero' is deterministic"),
        ("zero", {"mode": "eager"}, "mode: expected one of ['greedy', 'sampled']"),
        ("zero", {"form": "infinite"}, "lookahead form: expected one of ['finite', 'stationary']"),
        ("classical-best", {"instance": None}, "policy 'classical-best': needs an instance"),
    ],
)
def test_names_and_options_that_do_not_apply_are_refused(name, options, message):
    with pytest.raises(InputError) as error:
        resolve(name, **{"instance": INSTANCE, **options})
    assert message in str(error.value)


def test_the_name_grammar():
    """A name parses into its kind and the path it reads; prefixes need a path; a spec passes as it is; a bad name is
    one error naming where it entered and the allowed values; both lookahead forms keep their labels."""
    assert parse_policy("checkpoint:run/checkpoint.pt") == PolicySpec("checkpoint:run/checkpoint.pt", "checkpoint", "run/checkpoint.pt")
    assert parse_policy(f"{TABLES_PREFIX}runs/dec") == PolicySpec(f"{TABLES_PREFIX}runs/dec", "lookahead", "runs/dec")
    assert [parse_policy(name).kind for name in ("zero", "classical-best", "dp-optimal", "decomposition-lookahead")] == [
        "rule",
        "rule",
        "dp",
        "lookahead",
    ]
    spec = parse_policy("zero")
    assert parse_policy(spec) is spec and str(spec) == "zero" and spec.path is None and not spec.learned
    for bad in ("checkpoint:", f"{TABLES_PREFIX}", "zeroes", 3):
        with pytest.raises(InputError, match=re.escape(f"sweep field 'policy': expected {ALLOWED}, got {bad!r}")):
            parse_policy(bad, "sweep field 'policy'")
    assert named_label(parse_policy(f"{TABLES_PREFIX}runs/dec"), "stationary") == "decomposition-lookahead-stationary"


def test_a_learned_policy_says_which_network_it_is():
    """The result line's note: best.pt's network with its update and validation score; a run's last network with its
    update, and the training status where it did not complete (a run interrupted before any update: update 0); nothing
    for a named policy."""
    from trainers.resolver import ResolvedPolicy

    def note(parameters, learned=True, file="runs/a/checkpoint.pt"):
        spec = parse_policy(f"checkpoint:{file}" if learned else "classical-best")
        return ResolvedPolicy(spec, None, "hpo-greedy", parameters, INSTANCE, "greedy", file if learned else None).network_note()

    best = {"network": "best", "update": 120, "validation_cost": 5406.781, "validation_se": 12.345, "training_status": "completed"}
    assert note(best, file="runs/a/best.pt") == " (runs/a/best.pt: the best network, of update 120, validation 5406.78 ± 12.35)"
    assert note({"network": "last", "update": 0, "training_status": "interrupted"}) == (
        " (runs/a/checkpoint.pt: the network of update 0, training interrupted)"
    )
    assert note({"network": "last", "update": 2, "training_status": "completed"}) == " (runs/a/checkpoint.pt: the network of update 2)"
    assert note({}, learned=False) == ""


def test_a_checkpoint_s_networks_may_run_in_bfloat16_and_nothing_else_takes_a_precision(trained):
    """precision bfloat16: an OR-Transformer checkpoint's policy runs its networks in bfloat16 and its parameters (and
    the service's info) say so; float32 records nothing new. A named policy and a PPO checkpoint refuse it, in one
    line naming why; a precision outside the two is refused by name."""
    name = f"checkpoint:{trained['or-transformer'].checkpoint}"
    half = resolve(name, precision="bfloat16")
    assert half.policy.precision == "bfloat16" and half.parameters["precision"] == "bfloat16"
    assert "precision" not in resolve(name).parameters and resolve(name).policy.precision == "float32"
    assert load_decider(name, precision="bfloat16").info["precision"] == "bfloat16"
    with pytest.raises(InputError, match=r"^precision 'bfloat16': applies to checkpoint:PATH only; policy 'zero' has no network$"):
        resolve("zero", INSTANCE, precision="bfloat16")
    with pytest.raises(InputError, match=r"^precision bfloat16: applies to or-transformer and hpo checkpoints; '.+' holds a ppo policy$"):
        resolve(f"checkpoint:{trained['ppo'].checkpoint}", precision="bfloat16")
    with pytest.raises(InputError, match=r"^precision: expected one of \['float32', 'bfloat16'\], got 'float16'$"):
        resolve(name, precision="float16")


def test_evaluate_py_takes_the_precision_of_a_checkpoint_s_networks(trained, tmp_path):
    from conftest import run_script

    from run_results.records import read_evaluation

    INSTANCE.save(tmp_path / "instance.json")
    flags = ["--instance", tmp_path / "instance.json", "--episodes", 2, "--horizon", 3, "--precision", "bfloat16"]
    run_script("evaluate.py", *flags, "--policy", f"checkpoint:{trained['or-transformer'].folder}", "--out", tmp_path / "half", check=True)
    assert read_evaluation(tmp_path / "half")["summary"]["parameters"]["precision"] == "bfloat16"
    refused = run_script("evaluate.py", *flags, "--policy", "zero", "--out", tmp_path / "zero")
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "error: precision 'bfloat16': applies to checkpoint:PATH only; policy 'zero' has no network"
    )
