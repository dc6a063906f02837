"""The user's practice as baselines: their own rule (policies/user_rule.py: a hand-worked (s, S) and (R, S) path, the rule
table's refusals, the name every script resolves) and their recorded orders replayed as they ran (the backtest's as-run)."""

from pathlib import Path

import numpy as np
import pytest
import torch

from envs.evaluation import evaluate
from envs.exogenous import ExogenousPaths
from envs.instance import Instance
from plumbing.errors import InputError
from policies.user_rule import UserRulePolicy, read_rule_table, user_rule_policy

TWO = Instance(
    h=np.array([1.0, 1.0]), b=np.array([10.0, 10.0]), lam=np.array([2.0, 3.0]), beta=np.array([0.2, 0.2]),
    lead=np.array([1.0, 2.0]), qbar=np.array([100.0, 100.0]), K=5.0, gamma=0.9, rho=0.5,
    source={"item_names": ["north", "south"]},
)  # fmt: skip
DEMAND = [[3.0, 4.0], [2.0, 5.0], [4.0, 1.0]]


def hand_path_cost(rule_table, tmp_path) -> float:
    path = tmp_path / "rules.csv"
    path.write_text(rule_table)
    policy, _ = user_rule_policy(TWO, path)
    paths = ExogenousPaths(torch.zeros(1, 4), torch.tensor([DEMAND]), seed=0, episodes=(0,))
    return float(evaluate(policy, TWO.to_torch(), paths).discounted_cost[0])


def test_the_rule_on_a_hand_worked_path(tmp_path):
    """north (s = 1, S = 6), south (R = 2, S = 12), from I_0 = lam (L + 1) = (4, 9), K = 5, h = 1, b = 10, gamma = 0.9:
    t = 0: positions (4, 9); south is reviewed and below 12: order 3 (it arrives at t = 2); Z = (1, 5); C = 5 + 6 = 11.
    t = 1: north's position 1 is at its s: order 5 (on hand at t = 2); south is not reviewed; Z = (-1, 0); C = 5 + 10.
    t = 2: positions (4, 3); south is reviewed: order 9; Z = (0, 2); C = 5 + 2 = 7.
    Total 11 + 0.9 15 + 0.81 7 = 30.17. The control: north reordering below s only (not at it) orders nothing at t = 1
    (C = 10), and at t = 2 north is short 5 (Z = (-5, 2)): C = 5 + 50 + 2 = 57, a total of 66.17."""
    table = "item,reorder_point,order_up_to,review_period\nnorth,1,6,\nsouth,,12,2\n"
    assert hand_path_cost(table, tmp_path) == pytest.approx(30.17, abs=1e-4)
    below_only = "item,reorder_point,order_up_to,review_period\nnorth,0.999,6,\nsouth,,12,2\n"
    assert hand_path_cost(below_only, tmp_path) == pytest.approx(66.17, abs=1e-4)


def test_each_order_is_capped_at_qbar_and_the_clock_restarts_per_rollout():
    capped = UserRulePolicy(torch.tensor([50.0]), torch.tensor([10.0]), torch.tensor([0]))
    one = Instance(
        h=np.ones(1), b=np.ones(1), lam=np.ones(1), beta=np.zeros(1), lead=np.ones(1), qbar=np.full(1, 7.0), K=1.0, gamma=0.9, rho=0.0
    )
    from envs.dynamics import initial_state

    state = initial_state(one.to_torch(), torch.zeros(1))  # position 2 <= 10: S - x = 48, capped at 7
    open_order, quantity = capped(state, one.to_torch())
    assert open_order.tolist() == [1.0] and quantity.tolist() == [[7.0]]
    periodic = UserRulePolicy(torch.tensor([50.0]), torch.tensor([-np.inf]), torch.tensor([3]))
    due = [periodic(state, one.to_torch())[0].item() for _ in range(4)]
    periodic.reset()
    assert due == [1.0, 0.0, 0.0, 1.0] and periodic(state, one.to_torch())[0].item() == 1.0


@pytest.mark.parametrize(
    "table, message",
    [
        (
            "item,reorder_point,order_up_to\nnorth,7,6\nsouth,1,2\n",
            r"row 1 \(item 'north'\): reorder_point: expected a number .* up to order_up_to \(6\), got 7",
        ),
        ("item,reorder_point,order_up_to\nnorth,1,-6\nsouth,1,2\n", r"row 1 \(item 'north'\): order_up_to: expected a number from 0"),
        (
            "item,reorder_point,order_up_to,review_period\nnorth,1,6,2\nsouth,1,2,\n",
            r"row 1 \(item 'north'\): expected exactly one .* got both",
        ),
        (
            "item,reorder_point,order_up_to,review_period\nnorth,,6,\nsouth,1,2,\n",
            r"row 1 \(item 'north'\): expected exactly one .* got neither",
        ),
        (
            "item,review_period,order_up_to\nnorth,1.5,6\nsouth,1,2\n",
            r"row 1 \(item 'north'\): review_period: expected a whole number of periods >= 1, got 1.5",
        ),
        ("item,reorder_point,order_up_to\nnorth,1,6\nnorth,1,2\n", r"row 2 \(item 'north'\): a second row for the same item"),
        ("item,reorder_point,order_up_to\nnorth,1,6\nwest,1,2\n", r"item 'west': not an item of the instance"),
        ("item,reorder_point,order_up_to\nnorth,1,6\n", r"no rule for item 'south' of the instance; every item needs its rule"),
        ("item,reorder,order_up_to\nnorth,1,6\n", r"columns: expected a header line item,order_up_to and reorder_point"),
    ],
)
def test_a_bad_rule_table_is_refused_naming_its_row(tmp_path, table, message):
    path = tmp_path / "rules.csv"
    path.write_text(table)
    with pytest.raises(InputError, match=message):
        user_rule_policy(TWO, path)


def test_a_rule_table_reads_back_what_it_states(tmp_path):
    path = tmp_path / "rules.csv"
    path.write_text("item,reorder_point,order_up_to,review_period\nsouth,,12,2\nnorth,1,6,\n")
    table = read_rule_table(path)
    assert table.items == ["south", "north"] and table.review_period.tolist() == [2, 0]
    _, parameters = user_rule_policy(TWO, path)
    assert parameters["reorder_point_items"] == 1 and parameters["review_period_items"] == 1


def test_user_rule_path_is_a_policy_name_every_script_resolves(tmp_path):
    """user-rule:PATH parses into its kind and path, resolves (trainers.resolver, which evaluate, backtest, decide and
    the service use) to the rule on the instance, and is written under the method name user-rule."""
    from policies.names import PolicyKind, parse_policy
    from trainers.resolver import resolve

    path = tmp_path / "rules.csv"
    path.write_text("item,reorder_point,order_up_to\nnorth,1,6\nsouth,2,12\n")
    spec = parse_policy(f"user-rule:{path}")
    assert spec.kind is PolicyKind.USER_RULE and spec.path == str(path) and not spec.rules
    resolved = resolve(spec, TWO, horizon=3)
    assert resolved.label == "user-rule" and resolved.parameters["rule_table"] == str(path)
    paths = ExogenousPaths(torch.zeros(1, 4), torch.tensor([DEMAND]), seed=0, episodes=(0,))
    direct, _ = user_rule_policy(TWO, path)
    assert evaluate(resolved.policy, TWO.to_torch(), paths).mean == evaluate(direct, TWO.to_torch(), paths).mean
    with pytest.raises(InputError, match="user-rule:PATH"):
        parse_policy("user-rule:")


ORDERS = [[0.0, 3.0], [5.0, 0.0], [0.0, 9.0]]
"""The orders the rule of test_the_rule_on_a_hand_worked_path places on DEMAND: its path, recorded."""


def test_recorded_orders_replay_to_the_hand_worked_cost():
    """The orders (0, 3), (5, 0), (0, 9) on DEMAND from I_0 = (4, 9) are the hand-worked rule's path: 30.17 in each
    window (the clock restarts per window). The control: the orders one period late cost more (north is short at t = 1)."""
    from envs.history_replay import recorded_orders, replay

    demand, ordered = np.array(DEMAND * 2), np.array(ORDERS * 2)
    costs = replay(recorded_orders(ordered, 3), TWO.to_torch(), demand, np.zeros(7), 3).discounted_cost
    np.testing.assert_allclose(costs, [30.17, 30.17], atol=1e-4)
    late = np.array([[0.0, 0.0], *ORDERS[:2]] * 2)
    assert replay(recorded_orders(late, 3), TWO.to_torch(), demand, np.zeros(7), 3).discounted_cost.min() > 30.17 + 1


def history_with_orders(tmp_path, ordered_cell: str = "0") -> Path:
    rows = ["item,period,demand,ordered"]
    for t in range(6):
        for i, item in enumerate(("north", "south")):
            cell = ordered_cell if (t, item) == (0, "north") else str(int(ORDERS[t % 3][i]))
            rows.append(f"{item},{t},{int(DEMAND[t % 3][i])},{cell}")
    path = tmp_path / "history.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_the_backtest_replays_the_history_s_orders_as_they_ran(tmp_path):
    """platform/backtest.py on a history with an `ordered` column: an as-run folder with 30.17 in each of its two
    windows, beside the policy asked for, and paired with it in backtest.json."""
    import json

    import pyarrow.parquet as pq
    from conftest import run_script

    TWO.save(tmp_path / "instance.json")
    out = tmp_path / "bt"
    result = run_script(
        "backtest.py", "--history", history_with_orders(tmp_path), "--instance", tmp_path / "instance.json", "--policy", "zero",
        "--window", "3", "--out", out,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads((out / "backtest.json").read_text())
    assert [row["folder"] for row in record["policies"]] == ["zero", "as-run"]
    assert [(row["a"], row["b"]) for row in record["comparisons"]] == [("zero", "as-run")]
    np.testing.assert_allclose(
        pq.read_table(out / "as-run" / "costs.parquet").column("discounted_cost").to_numpy(), [30.17, 30.17], atol=1e-4
    )
    assert "backtest:as-run: mean 30.17" in result.stdout


def test_a_bad_order_is_refused_naming_its_item_and_period(tmp_path):
    from demand.sales_history import history_matrix

    assert history_matrix(history_with_orders(tmp_path)).ordered[:3].tolist() == ORDERS
    with pytest.raises(InputError, match=r"item 'north' period 0: column 'ordered': expected a non-negative integer \(units ordered\)"):
        history_matrix(history_with_orders(tmp_path, "-2"))
    with pytest.raises(InputError, match=r"item 'north' period 0: column 'ordered'.*got nothing"):
        history_matrix(history_with_orders(tmp_path, ""))
