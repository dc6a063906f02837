"""plumbing/validate.py: the one set of field checks and the project's YAML loader."""

import argparse
import math

import pytest
import yaml

from cli.scripts import mip_gap, positive_int, seed
from plumbing import validate
from plumbing.errors import InputError


def test_integers_are_integers_and_the_message_names_field_range_and_value():
    assert validate.integer(3, "f", 1, 5) == 3 and isinstance(validate.integer(3, "f", 1), int)
    for bad, shown in ((True, "a boolean true"), (2.0, "2.0"), ("3", 'a string "3"'), (0, "0"), (None, "null")):
        with pytest.raises(InputError, match=r"^f: expected an integer in \[1, 5\], got " + shown.replace("(", r"\(") + "$"):
            validate.integer(bad, "f", 1, 5)
    with pytest.raises(InputError, match=r"^f: expected an integer in \[1, 5\], got 6 \(too big\)$"):
        validate.integer(6, "f", 1, 5, why="too big")
    with pytest.raises(InputError, match=r"^f: expected an integer in \[1, 5\], got 0$"):  # the reason is for the upper bound only
        validate.integer(0, "f", 1, 5, why="too big")


def test_reals_take_ints_and_floats_but_never_strings_booleans_or_non_finite_numbers():
    assert validate.real(2, "f") == 2.0 and isinstance(validate.real(2, "f"), float)
    assert validate.real(0.0, "f", 0) == 0.0
    for bad in ("5e-3", True, [1.0]):
        with pytest.raises(InputError, match="^f: expected a number, got "):
            validate.real(bad, "f")
    for bad in (math.nan, math.inf, -math.inf):  # the message says what is wrong with them: they are not finite
        with pytest.raises(InputError, match="^f: expected a finite number, got "):
            validate.real(bad, "f")
    with pytest.raises(InputError, match=r"^f: expected a number below 1\.8e\+308 \(a float64\), got 1000"):
        validate.real(10**400, "f")
    with pytest.raises(InputError, match=r"^f: expected a number in \(0, 1\), got 0$"):
        validate.real(0, "f", 0, 1, low_open=True, high_open=True)
    with pytest.raises(InputError, match=r"^f: expected a number in \(0, 1\), got 1 \(why\)$"):
        validate.real(1, "f", 0, 1, low_open=True, high_open=True, why="why")


def test_the_shared_rules():
    assert validate.seed(2**31 - 1, "s") == validate.SEED_MAX == 2_147_483_647
    with pytest.raises(
        InputError, match=r"expected an integer in \[0, 2147483647\], got 2147483648 \(the largest seed HiGHS and Gurobi accept\)"
    ):
        validate.seed(2**31, "s")
    assert validate.mip_gap(0, "g") == 0.0 and validate.mip_gap(0.999, "g") == 0.999
    for gap in (1, 5, -0.1):
        with pytest.raises(InputError, match=r"^g: expected a number in \[0, 1\), got "):
            validate.mip_gap(gap, "g")
    assert validate.time_limit(604_800, "t") == 604_800.0
    with pytest.raises(InputError, match=r"expected a number in \(0, 604800\], got 1e\+300 \(a week"):
        validate.time_limit(1e300, "t")
    with pytest.raises(InputError, match=r"expected an integer in \[1, 10000\], got 1000000000 \(the instance bounds"):
        validate.horizon(10**9, "h")
    with pytest.raises(InputError, match=r"expected an integer in \[1, 10000\], got 1000000000000 \(the MILP holds"):
        validate.scenarios(10**12, "s")


def test_flags_use_the_same_rules_and_argparse_names_the_flag():
    assert seed("2147483647") == 2**31 - 1 and positive_int("7") == 7 and mip_gap("5e-3") == 0.005
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected an integer in \[0, 2147483647\], got 2147483648 "):
        seed("2147483648")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected a number in \[0, 1\), got 5 \(a relative gap"):
        mip_gap("5")
    with pytest.raises(argparse.ArgumentTypeError, match=r'^expected an integer >= 1, got a string "0x10"$'):
        positive_int("0x10")


def test_keys_names_unknown_and_missing_keys_and_the_allowed_ones():
    validate.keys({"a": 1}, "w", ["a", "b"], ["a"])
    with pytest.raises(InputError, match=r"^w: unknown keys \['c'\]; missing keys \['a'\]; allowed keys are \['a', 'b'\]$"):
        validate.keys({"c": 1}, "w", ["a", "b"], ["a"])


def test_differences_name_every_changed_field_with_both_values():
    there = {"sizes": [1, 4], "seeds": 2, "baselines": {"milp": [{"gap": 0.005, "solver": "highs"}]}, "preset": "cpu", "hash": "a" * 64}
    here = {"sizes": [1, 4, 16], "seeds": 2, "baselines": {"milp": [{"gap": 0.01, "solver": "highs"}]}, "device": "cuda", "hash": "b" * 64}
    assert validate.differences(there, here) == [
        "baselines.milp[0].gap 0.005 there, 0.01 here",
        'device (absent) there, "cuda" here',
        f"hash {'a' * 16}… there, {'b' * 16}… here",
        'preset "cpu" there, (absent) here',
        "sizes [1, 4] there, [1, 4, 16] here",
    ]
    assert validate.differences(there, dict(there)) == []


def load(text):
    return validate.load_yaml(text, "config file", "c.yaml")


def test_yaml_numbers_are_read_as_written():
    assert load("a: 5e-3\nb: 1E3\nc: -2.5e+2\nd: 16\ne: +0\nf: '5e-3'\ng: [1, 0.5]\n") == {
        "a": 0.005,
        "b": 1000.0,
        "c": -250.0,
        "d": 16,
        "e": 0,
        "f": "5e-3",
        "g": [1, 0.5],
    }
    assert yaml.safe_load("a: 5e-3") == {"a": "5e-3"}  # YAML 1.1, which the loader corrects; yaml.safe_load itself is untouched
    assert load("") is None


@pytest.mark.parametrize(
    "text, read_as", [("0x10", "16"), ("017", "15"), ("0b11", "3"), ("1:30", "90"), ("1_000", "1000"), ("1_0.5", "10.5")]
)
def test_yaml_numbers_not_written_in_decimal_are_refused(text, read_as):
    with pytest.raises(
        InputError,
        match=rf"^config file 'c.yaml': field 'learning_rate' \(line 2\): expected a number written in decimal .*, got {text}, "
        rf"which YAML 1.1 reads as {read_as}",
    ):
        load(f"batch: 4\nlearning_rate: {text}\n")
    with pytest.raises(InputError, match=r"field 'baselines.milp\[1\]'"):
        load(f"baselines:\n  milp: [1, {text}]\n")


def test_a_key_written_twice_is_refused_at_any_depth():
    with pytest.raises(InputError, match=r"^config file 'c.yaml': key 'batch' is written twice \(lines 1 and 3\)"):
        load("batch: 4\nupdates: 2\nbatch: 8\n")
    with pytest.raises(InputError, match=r"key 'overrides.all.updates' is written twice \(lines 3 and 4\)"):
        load("sizes: [1]\noverrides:\n  all: {updates: 1,\n    updates: 2}\n")
    assert load("a: &x {b: 1}\nc: *x\n") == {"a": {"b": 1}, "c": {"b": 1}}  # an alias is not a second key


def test_malformed_yaml_is_one_error_with_the_line_it_stopped_at():
    """The unclosed list of line 1 is found at the colon of the next line (line 2, column 3, 1-based), with the parser's reason."""
    with pytest.raises(InputError, match=r"^config file 'c.yaml' is not valid YAML \(line 2, column 3\): .*expected ',' or '\]'"):
        load("a: [1, 2\n b: 3\n")
