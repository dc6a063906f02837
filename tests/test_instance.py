"""Validation, the paper family, and file round trips."""

import json
import math
import re

import numpy as np
import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet as pq
import pytest
import torch

from envs.dynamics import initial_state, step
from envs.instance import PAPER_MAX_N, Instance, InstanceError, paper_instance
from plumbing.errors import InputError
from plumbing.validate import HORIZON_MAX

GOOD = dict(h=[1.0, 2.0], b=[7.0, 9.0], lam=[3.0, 4.0], beta=[0.2, 0.0], lead=[1, 4], qbar=[12.0, 16.0], K=20.0, gamma=0.95, rho=0.8)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("h", [1.0, 0.0], "'h': expected numbers in (0, 1e+06], got 0 (item 1)"),
        ("b", [-1.0, 9.0], "'b': expected numbers in (0, 1e+06], got -1 (item 0)"),
        ("lam", [3.0, float("nan")], "'lam': expected finite numbers"),
        ("beta", [-0.1, 0.0], "'beta': expected numbers in [0, 2], got -0.1 (item 0)"),
        ("lead", [0, 4], "'lead': expected integers in 1..4"),
        ("lead", [1, 5], "'lead': expected integers in 1..4"),
        ("lead", [1.5, 2], "'lead': expected integers in 1..4"),
        ("qbar", [12.0, float("inf")], "'qbar': expected finite numbers"),
        ("qbar", [12.0], "'qbar': expected 2 values"),
        ("h", [], "'h': expected at least one item"),
        ("K", -1.0, "'K': expected a number in [0, 1e+12], got -1.0"),
        ("gamma", 1.0, "'gamma': expected a number in (0, 1), got 1.0"),
        ("gamma", 0.0, "'gamma': expected a number in (0, 1), got 0.0"),
        ("rho", 1.0, "'rho': expected a number in [0, 1), got 1.0"),
        ("rho", float("nan"), "'rho': expected a finite number in [0, 1), got NaN"),
        ("K", "ten", "'K': expected a number"),
        ("lead", ["2", 3], "'lead': expected a list of numbers, got a string \"2\" for item 0"),
        ("lead", "2", "'lead': expected a list of numbers, got a string \"2\""),
        ("h", [1.0, "2.0"], "'h': expected a list of numbers, got a string \"2.0\" for item 1"),
        ("lead", [True, 4], "'lead': expected a list of numbers, got a boolean true for item 0"),
        ("qbar", [12.0, None], "'qbar': expected a list of numbers, got null for item 1"),
        ("b", [[7.0], [9.0]], "'b': expected a one-dimensional list"),
        ("lam", [3, 10**400], "'lam': expected finite numbers"),
        ("gamma", "0.95", "'gamma': expected a number in (0, 1), got a string \"0.95\""),
        ("K", True, "'K': expected a number in [0, 1e+12], got a boolean true"),
        ("rho", None, "'rho': expected a number in [0, 1), got null"),
        ("K", 10**400, "'K': expected a number in [0, 1e+12], got 1000"),
        # upper bounds (docs/formats.md): the simulation's float32 costs stay finite
        ("h", [1.0, 1e308], "'h': expected numbers in (0, 1e+06], got 1e+308 (item 1) (larger values overflow"),
        ("lam", [1e308, 3.0], "'lam': expected numbers in (0, 1e+06], got 1e+308 (item 0) (larger values overflow"),
        ("qbar", [12.0, 1e9], "'qbar': expected numbers in (0, 1e+08], got 1e+09 (item 1)"),
        ("beta", [0.2, 1e300], "'beta': expected numbers in [0, 2], got 1e+300 (item 1) (the demand rate's factor"),
        ("K", 1e13, "'K': expected a number in [0, 1e+12], got 10000000000000.0 (larger values overflow"),
    ],
)
def test_every_validation_error_names_the_field(field, value, message):
    with pytest.raises(InstanceError, match=re.escape(message)):
        Instance(**{**GOOD, field: value})


def test_integers_are_numbers():
    inst = Instance(**{**GOOD, "h": [1, 2], "qbar": [12, 16], "K": 20, "gamma": 0.95, "rho": 0})
    assert inst.h.dtype == np.float64 and inst.K == 20.0 and isinstance(inst.K, float) and inst.rho == 0.0


def test_json_file_with_text_numbers(tmp_path):
    data = Instance(**GOOD).to_dict()
    data["items"]["lead"] = ["1", "4"]
    (tmp_path / "i.json").write_text(json.dumps(data))
    with pytest.raises(InstanceError, match="'lead': expected a list of numbers, got a string \"1\" for item 0"):
        Instance.load(tmp_path / "i.json")


def test_json_missing_and_unknown_keys():
    data = Instance(**GOOD).to_dict()
    del data["items"]["beta"]
    data["items"]["colour"] = [1, 2]
    with pytest.raises(InstanceError, match=r"unknown keys \['colour'\]; missing keys \['beta'\]"):
        Instance.from_dict(data)
    with pytest.raises(InstanceError, match=r"unknown keys \['Kappa'\]"):
        Instance.from_dict({**Instance(**GOOD).to_dict(), "Kappa": 1})


def test_json_round_trip(tmp_path):
    inst = paper_instance(16, 3)
    inst.save(tmp_path / "i.json")
    back = Instance.load(tmp_path / "i.json")
    for name in ("h", "b", "lam", "beta", "lead", "qbar"):
        np.testing.assert_array_equal(getattr(back, name), getattr(inst, name))
    assert (back.K, back.gamma, back.rho) == (inst.K, inst.gamma, inst.rho)
    assert json.loads((tmp_path / "i.json").read_text())["items"]["lead"] == [int(v) for v in inst.lead]


def test_bad_json_file(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InstanceError, match="not valid JSON"):
        Instance.load(tmp_path / "bad.json")
    with pytest.raises(InputError, match="does not exist"):
        Instance.load(tmp_path / "missing.json")


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_item_table_round_trip(tmp_path, suffix):
    inst = paper_instance(8, 1)
    path = tmp_path / f"items{suffix}"
    table = inst.item_table()
    pyarrow.csv.write_csv(table, path) if suffix == ".csv" else pq.write_table(table, path)
    back = Instance.from_table(path, K=inst.K, gamma=inst.gamma, rho=inst.rho)
    for name in ("h", "b", "lam", "beta", "lead", "qbar"):
        np.testing.assert_array_equal(getattr(back, name), getattr(inst, name))


def test_item_table_errors(tmp_path):
    path = tmp_path / "items.csv"
    path.write_text("h,b,lam,beta,lead\n1,7,3,0.2,1\n")
    with pytest.raises(InstanceError, match=r"missing keys \['qbar'\]"):
        Instance.from_table(path, K=1, gamma=0.9, rho=0.5)
    pq.write_table(
        pa.table({"h": [1.0, None], "b": [7.0, 8], "lam": [3.0, 3], "beta": [0.1, 0], "lead": [1, 2], "qbar": [9.0, 9]}),
        tmp_path / "t.parquet",
    )
    with pytest.raises(InstanceError, match="'h': 1 missing values"):
        Instance.from_table(tmp_path / "t.parquet", K=1, gamma=0.9, rho=0.5)
    path.write_text('h,b,lam,beta,lead,qbar\n1,7,3,0.2,1,12\n"1,5",7,3,0.2,1,12\n')  # a decimal comma: the column is text
    with pytest.raises(InstanceError, match="column 'h': expected numbers, got string values \\(first: \"1,5\" in data row 2\\)"):
        Instance.from_table(path, K=1, gamma=0.9, rho=0.5)
    path.write_text("h,b,lam,beta,lead,qbar\n1,7,3,0.2,true,12\n")
    with pytest.raises(InstanceError, match="column 'lead': expected numbers, got bool values"):
        Instance.from_table(path, K=1, gamma=0.9, rho=0.5)
    pq.write_table(pa.table({"h": ["1.0"], "b": [7.0], "lam": [3.0], "beta": [0.1], "lead": [1], "qbar": [9.0]}), tmp_path / "t.parquet")
    with pytest.raises(InstanceError, match="column 'h': expected numbers, got string values$"):
        Instance.from_table(tmp_path / "t.parquet", K=1, gamma=0.9, rho=0.5)
    with pytest.raises(InputError, match="is a directory"):
        Instance.from_table(tmp_path, K=1, gamma=0.9, rho=0.5)
    (tmp_path / "items.json").write_text("{}")
    with pytest.raises(InstanceError, match="expected a .csv or .parquet"):
        Instance.from_table(tmp_path / "items.json", K=1, gamma=0.9, rho=0.5)


def test_paper_family_ranges_and_nesting():
    big = paper_instance(1024, 5)
    assert big.K == 10240 and big.gamma == 0.95 and big.rho == 0.8
    assert big.h.min() >= 0.6 and big.h.max() <= 2.0
    assert big.b.min() >= 6.0 and big.b.max() <= 11.4
    assert big.lam.min() >= 2.0 and big.lam.max() <= 7.0
    assert big.beta.min() >= 0.2 and big.beta.max() <= 0.6
    assert set(big.lead.tolist()) == {1.0, 2.0, 3.0, 4.0}
    np.testing.assert_array_equal(big.qbar, 4 * big.lam)
    assert len({(h, b, lam) for h, b, lam in zip(big.h, big.b, big.lam)}) == 1024
    small = paper_instance(16, 5)
    np.testing.assert_array_equal(small.lam, big.lam[:16])
    assert small.K == 160
    assert not np.array_equal(paper_instance(16, 6).lam, small.lam)
    with pytest.raises(InstanceError, match=r"'n': expected an integer in \[1, 42075\], got 0"):
        paper_instance(0, 0)
    with pytest.raises(InstanceError, match=r"'seed': expected an integer in \[0, 2147483647\], got -1"):
        paper_instance(4, -1)


def test_the_paper_family_holds_15_x_55_x_51_items():
    # h in 0.6..2.0, b in 6.0..11.4, lam in 2.0..7.0 on a 0.1 grid: 15, 55 and 51 values
    assert PAPER_MAX_N == 15 * 55 * 51 == 42_075
    with pytest.raises(InstanceError, match=r"got 42076 \(the paper family has 42,075 distinct"):
        paper_instance(42_076, 0)


def test_values_at_their_upper_bounds_keep_every_cost_finite_in_float32_over_the_longest_horizon():
    """Every instance value at its bound, the factor held at 10 (|F| > 10 has probability below 2e-23) and
    demand at its rate lam e^(10 beta - beta^2 / 2) = 1e6 e^18 every step, for HORIZON_MAX steps: ordering
    nothing (the backlog grows) and ordering qbar every step (the stock grows)."""
    inst = Instance(h=[1e6, 1e6], b=[1e6, 1e6], lam=[1e6, 1e6], beta=[2.0, 2.0], lead=[1, 4], qbar=[1e8, 1e8], K=1e12, gamma=0.999, rho=0.0)
    tinst = inst.to_torch()
    demand = torch.full((1, 2), 1e6 * math.exp(18.0))
    factor = torch.full((1,), 10.0)
    for open_order, quantity in ((torch.zeros(1), torch.zeros(1, 2)), (torch.ones(1), torch.full((1, 2), 1e8))):
        state, total = initial_state(tinst, factor), torch.zeros(1)
        for t in range(HORIZON_MAX):
            state, cost = step(tinst, state, open_order, quantity, demand, factor)
            total = total + inst.gamma**t * cost
        assert torch.isfinite(total).all() and torch.isfinite(state.inv).all() and float(total) > 1e12


def test_a_refused_instance_file_names_the_file_and_the_item_by_its_name(tmp_path):
    """A fitted instance file (item names under 'source') with a negative lam for its second item: the refusal names the
    file and the item as the user knows it ('gadget'), not only the internal index; without names, the index."""
    data = {"K": 20.0, "gamma": 0.95, "rho": 0.8, "items": {name: list(GOOD[name]) for name in ("h", "b", "lam", "beta", "lead", "qbar")}}
    data["items"]["lam"][1] = -1.0
    (tmp_path / "plain.json").write_text(json.dumps(data))
    (tmp_path / "fitted.json").write_text(json.dumps(data | {"source": {"item_names": ["widget", "gadget"]}}))
    with pytest.raises(
        InstanceError, match=rf"^instance file '{tmp_path}/fitted.json': instance field 'lam': .* got -1 \(item 'gadget'\)$"
    ):
        Instance.load(tmp_path / "fitted.json")
    with pytest.raises(InstanceError, match=r"got -1 \(item 1\)$"):
        Instance.load(tmp_path / "plain.json")
