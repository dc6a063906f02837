"""platform/decide.py on checkpoints of all four methods: its answer is the policy's decision, recomputed here
from the networks' outputs; states the instance cannot produce and non-finite decisions are refused."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import INSTANCE, METHODS, clear_of_one_half, run_script

from envs.dynamics import State
from envs.features import flat_features, global_token, item_tokens
from envs.instance import Instance
from plumbing.errors import InputError
from policies.classical import RULES, make_policy
from serving.decisions import Decider, read_states
from trainers.registry import load_policy

# INSTANCE (conftest): paper_instance(2, 0), lead times [3, 3]: in_transit[i][2] is always 0
QBAR, BOUND = INSTANCE.qbar.tolist(), (10_000 * (INSTANCE.qbar + INSTANCE.lam)).tolist()  # decide.py's bound on |inventory|
STATES = [
    {"inventory": [1, 2], "in_transit": [[0, 0, 0], [3, 1, 0]], "factor": 0.5},
    {"inventory": [-40, 80.5], "in_transit": [[24.8, 0, 0], [0, 22.4, 0]], "factor": -2},
    {
        "inventory": [BOUND[0], -BOUND[1]],
        "in_transit": [[QBAR[0], QBAR[0], 0], [QBAR[1], QBAR[1], 0]],
        "factor": 10,
    },  # the edges of the bounds
    {"inventory": [-BOUND[0], BOUND[1]], "in_transit": [[0, 0, 0], [0, 0, 0]], "factor": -10.0},
]


@pytest.fixture(scope="module")
def checkpoints(trained):
    """The session's tiny two-update run of every method on INSTANCE (conftest.trained)."""
    return {method: run.checkpoint for method, run in trained.items()}


def network_decision(policy, state: State):
    """(p, fraction) straight from the networks: sigmoid of the open logit, and the quantity fraction
    (pathwise: the sigmoid head; RLlib: the mean a / (a + b) of the Beta with a, b = 1 + softplus)."""
    tinst = INSTANCE.to_torch()
    with torch.no_grad():
        if hasattr(policy, "model"):
            items, glob = item_tokens(tinst, state), global_token(tinst, state)
            return torch.sigmoid(policy.model.open_logit(items, glob)), policy.model.quantity_fraction(items, glob)
        inputs = policy.module.forward_inference({"obs": flat_features(tinst, state)})["action_dist_inputs"]
        a, b = (1 + F.softplus(inputs[:, 1:].reshape(len(inputs), -1, 2)[..., k]) for k in (0, 1))
        return torch.sigmoid(inputs[:, 0]), a / (a + b)


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
@pytest.mark.parametrize("method", METHODS)
def test_decide_answers_the_policy_decision(checkpoints, method, mode, tmp_path):
    """Catches a decide.py answer that is not the policy's (wrong head, wrong probability, O != Y Q, a sampled answer
    that is not the stream's first draw) or not in the service's shape (a list of answer objects for a list)."""
    (tmp_path / "state.json").write_text(json.dumps(STATES))
    result = run_script("decide.py", "--checkpoint", checkpoints[method], "--state", tmp_path / "state.json", "--mode", mode)
    assert result.returncode == 0, result.stderr[-2000:]
    answers = json.loads(result.stdout)
    assert (
        isinstance(answers, list)
        and len(answers) == 4
        and all(set(a) == {"open", "open_probability", "quantity", "order"} for a in answers)
    )
    open_order, p, quantity = (np.array([a[key] for a in answers]) for key in ("open", "open_probability", "quantity"))
    assert open_order.shape == p.shape == (4,) and quantity.shape == (4, 2)
    assert set(open_order.tolist()) <= {0, 1} and np.all((0 <= p) & (p <= 1))
    assert np.all((0 <= quantity) & (quantity <= INSTANCE.qbar * (1 + 1e-6)))
    np.testing.assert_array_equal(np.array([a["order"] for a in answers]), open_order[:, None] * quantity)  # O = Y Q

    policy, _ = load_policy(checkpoints[method], mode)
    state = State(*(torch.tensor([s[key] for s in STATES], dtype=torch.float32) for key in ("inventory", "in_transit", "factor")))
    p_net, fraction = network_decision(policy, state)
    np.testing.assert_allclose(p, p_net.numpy(), rtol=1e-5, atol=1e-6)
    if mode == "greedy":
        clear = clear_of_one_half(p_net.numpy())
        np.testing.assert_array_equal(open_order[clear], (p_net.numpy() > 0.5).astype(int)[clear])
        np.testing.assert_allclose(quantity, (INSTANCE.to_torch().qbar * fraction).numpy(), rtol=1e-5)
    else:  # the first draw of the seeded stream, as decide.py makes it
        sampled = policy.decide(state, INSTANCE.to_torch())
        np.testing.assert_array_equal(open_order, sampled.open.int().numpy())
        np.testing.assert_allclose(quantity, sampled.quantity.numpy(), rtol=1e-5)


def test_one_state_object_gets_one_answer_object(checkpoints, tmp_path):
    """Catches decide.py answering one state in another shape than POST /decide does (it printed batch-shaped columns)."""
    (tmp_path / "state.json").write_text(json.dumps(STATES[1]))
    result = run_script("decide.py", "--checkpoint", checkpoints["hpo"], "--state", tmp_path / "state.json")
    assert result.returncode == 0, result.stderr[-2000:]
    answer = json.loads(result.stdout)
    assert isinstance(answer, dict) and set(answer) == {"open", "open_probability", "quantity", "order"}
    assert len(answer["quantity"]) == 2 and answer["order"] == [answer["open"] * q for q in answer["quantity"]]
    assert "1 states decided in" in result.stderr


def test_a_non_finite_decision_is_an_error(checkpoints, tmp_path):
    payload = torch.load(checkpoints["hpo"], weights_only=True)
    payload["trainer"]["model"] = {k: torch.full_like(v, float("nan")) for k, v in payload["trainer"]["model"].items()}
    torch.save(payload, tmp_path / "nan.pt")
    (tmp_path / "state.json").write_text(json.dumps(STATES[0]))
    result = run_script("decide.py", "--checkpoint", tmp_path / "nan.pt", "--state", tmp_path / "state.json")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stdout == "" and "gives a non-finite open probability or quantity for state 0" in result.stderr


LEAD_ONE = Instance(
    h=[1.0, 2.0], b=[7.0, 9.0], lam=[3.0, 4.0], beta=[0.2, 0.0], lead=[1, 4], qbar=[12.0, 16.0], K=20.0, gamma=0.95, rho=0.8
)
VALID = {"inventory": [1, 2], "in_transit": [[0, 0, 0], [16, 16, 16]], "factor": 0}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"inventory": [150_000, 2]}, None),  # |I_0| <= 10^4 (qbar_0 + lam_0) = 150000
        ({"inventory": [150_001, 2]}, r"'inventory'\[0\]: 150001 is outside \[-150000, 150000\]"),
        ({"inventory": [1, -200_001]}, r"'inventory'\[1\]: -200001 is outside \[-200000, 200000\]"),
        ({"factor": -10}, None),
        ({"factor": 10.01}, r"'factor': 10.01 is outside \[-10, 10\]"),
        ({"in_transit": [[0, 0, 0], [16, 16, 16.001]]}, r"'in_transit'\[1\]\[2\]: 16.001 exceeds qbar_1 = 16"),
        ({"in_transit": [[0, 0, 0], [0, -0.5, 0]]}, r"'in_transit'\[1\]\[1\]: -0.5 is negative"),
        ({"in_transit": [[0.1, 0, 0], [0, 0, 0]]}, r"'in_transit'\[0\]\[0\]: expected 0, got 0.1: item 0 has lead time L = 1"),
        ({"in_transit": [[0, 0, 0], [0, 0]]}, r"'in_transit'\[1\]: expected 3 numbers \(slots l = 1..3\), got a list of 2"),
        ({"in_transit": [[0, 0, 0]]}, r"'in_transit': expected 2 lists \(one per item\) of 3 numbers, got a list of 1"),
        ({"in_transit": "[[0, 0, 0], [0, 0, 0]]"}, r"'in_transit': expected 2 lists .* got a string"),
        ({"inventory": [1, "2"]}, r"'inventory'\[1\]: expected a number, got a string \"2\""),
        ({"in_transit": [[0, 0, 0], [0, True, 0]]}, r"'in_transit'\[1\]\[1\]: expected a number, got a boolean true"),
        ({"in_transit": [[0, 0, 0], [0, 0, float("nan")]]}, r"'in_transit'\[1\]\[2\]: expected a finite number, got NaN"),
        ({"in_transit": [[0, 0, 0], [10**400, 0, 0]]}, r"'in_transit'\[1\]\[0\]: expected a number below 1\.8e\+308 \(a float64\), got 1"),
        ({"in_transit": [[0, 0, 0], [0, [1], 0]]}, r"'in_transit'\[1\]\[1\]: expected a number, got a list of 1"),
        ({"inventory": [1, None]}, r"'inventory'\[1\]: expected a number, got null"),
        ({"factor": float("inf")}, r"'factor': expected a finite number, got Infinity"),
        ({"factor": 10**400}, r"'factor': expected a number below 1\.8e\+308 \(a float64\), got 1000000000"),
        ({"factor": True}, r"'factor': expected a number, got a boolean true"),
        ({"factor": [0.5]}, r"'factor': expected a number \(k = 1: the instance has the paper's model .*\), got a list of 1"),
    ],
)
def test_states_outside_the_instance_are_refused(change, message):
    states = json.loads(json.dumps([VALID, {**VALID, **change}]))  # as a file or a request body reads them
    if message is None:
        assert read_states(states, LEAD_ONE, "state file").batch == 2
    else:
        with pytest.raises(InputError, match="state 1 field " + message):
            read_states(states, LEAD_ONE, "state file")


@pytest.mark.parametrize(
    "text, message",
    [
        ("[]", "an empty list"),
        ('"state"', 'expected a state object or a list of them, got a string "state"'),
        ("[[1, 2]]", "state 0: expected an object"),
        ('{"inventory": [1, 2], "in_transit": [[0, 0, 0], [0, 0, 0]], "factor": 0, "time": 3}', r"state 0: unknown keys \['time'\]"),
    ],
)
def test_state_files_that_are_not_a_batch_of_states_are_refused(text, message):
    with pytest.raises(InputError, match=message):
        read_states(json.loads(text), LEAD_ONE, "state file")


THREE_FACTORS = Instance(
    h=[1.0, 2.0],
    b=[7.0, 9.0],
    lam=[3.0, 4.0],
    beta=None,
    lead=[1, 2],
    qbar=[30.0, 30.0],
    loadings=[[0.6, -0.2, 0.1], [-0.3, 0.0, 0.4]],
    overdispersion=[0.5, 0.0],
    K=20.0,
    gamma=0.95,
    rho=0.8,
)
VALID_THREE = {"inventory": [1, 2], "in_transit": [[0, 0, 0], [5, 0, 0]], "factor": [0.5, -1.0, 2.0]}
THREE_WORDS = r"\(k = 3: the instance has 3 factors, signed loadings, negative-binomial demand\)"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"factor": [10, -10, 0]}, None),
        ({"factor": 0.5}, rf"'factor': expected 3 numbers \[F_1..F_3\] {THREE_WORDS}, got 0.5"),
        ({"factor": [0.5, 1.0]}, rf"'factor': expected 3 numbers \[F_1..F_3\] {THREE_WORDS}, got a list of 2"),
        ({"factor": [0.5, 1.0, 0, 0]}, r"'factor': expected 3 numbers .* got a list of 4"),
        ({"factor": [0.5, "1", 0]}, r"'factor'\[1\]: expected a number, got a string \"1\""),
        ({"factor": [0.5, 1.0, -10.5]}, r"'factor'\[2\]: -10.5 is outside \[-10, 10\]"),
    ],
)
def test_a_state_of_k_factors_holds_k_numbers(change, message):
    states = json.loads(json.dumps([VALID_THREE, {**VALID_THREE, **change}]))
    if message is None:
        batch = read_states(states, THREE_FACTORS, "state file")
        assert batch.factor.shape == (2, 3) and batch.factor[1].tolist() == change["factor"]
    else:
        with pytest.raises(InputError, match="state 1 field " + message):
            read_states(states, THREE_FACTORS, "state file")


def test_a_factor_aware_rule_answers_states_of_three_factors_from_each_item_s_exposure():
    """base-stock-factor with z = 0, no cycle stock and cover 1 raises item i towards its mean demand over L_i + 1
    periods given its exposure u_i = beta_i . F / |beta_i|: lam_i sum_{j=0..L_i} exp(|beta_i| rho^j u_i - |beta_i|^2 rho^2j / 2)
    (the lognormal mean of eq. conditional_demand_rate); overdispersion leaves the mean alone."""
    rule = make_policy(
        THREE_FACTORS.to_torch(), RULES["base-stock-factor"], {"reorder_z": 0.0, "cover": 1, "order_up_to_z": 0.0, "cycle_stock": 0.0}
    )
    decider = Decider(rule, THREE_FACTORS, learned=False, mode="deterministic", label="policy 'base-stock-factor'", info={})
    factors = [[0.5, -1.0, 2.0], [-2.0, 1.0, -1.5]]
    states = [{"inventory": [0, 0], "in_transit": [[0, 0, 0], [0, 0, 0]], "factor": f} for f in factors]
    answer = decider.decide(read_states(states, THREE_FACTORS, "request body"))
    norm = np.linalg.norm(THREE_FACTORS.loadings, axis=1)
    for row, factor in enumerate(factors):
        exposure = THREE_FACTORS.loadings @ np.array(factor) / norm
        expected = [
            THREE_FACTORS.lam[i] * sum(np.exp(norm[i] * 0.8**j * exposure[i] - norm[i] ** 2 * 0.8 ** (2 * j) / 2) for j in range(lead + 1))
            for i, lead in enumerate([1, 2])
        ]
        assert answer.open[row].item() == 1
        np.testing.assert_allclose(answer.quantity[row].numpy(), expected, rtol=1e-5)


def test_decide_py_serves_a_named_policy_on_three_factors_and_a_checkpoint_refuses_them(checkpoints, tmp_path):
    THREE_FACTORS.save(tmp_path / "inst.json")
    (tmp_path / "state.json").write_text(json.dumps([VALID_THREE, {**VALID_THREE, "factor": [-1.0, 0.0, 1.0]}]))
    done = run_script(
        "decide.py", "--policy", "base-stock-factor", "--instance", tmp_path / "inst.json", "--state", tmp_path / "state.json"
    )
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout)
    assert len(answers) == 2 and all(len(a["quantity"]) == 2 and a["open"] in (0, 1) for a in answers)
    for method in ("or-transformer", "ppo"):
        refused = run_script(
            "decide.py", "--checkpoint", checkpoints[method], "--instance", tmp_path / "inst.json", "--state", tmp_path / "state.json"
        )
        assert refused.returncode == 2 and refused.stderr.count("error:") == 1
        assert "checkpoint" in refused.stderr and "3 factors, signed loadings, negative-binomial demand" in refused.stderr
