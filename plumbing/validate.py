"""The one set of checks for a value read at a boundary: instance files and item tables, decide.py's
states, training configs, sweep files, solver settings and command-line flags all use these.

One message style: `<where>: expected <allowed values>, got <the value as its file shows it>`, and for
an upper bound the reason in parentheses. `where` names the field ("config field 'batch'", "sweep field
'baselines.milp[0].gap'"); each caller passes its own exception class (an InputError), or
argparse.ArgumentTypeError for a flag.

One rule for numbers: a number is what the file's format writes as one, a string never is. An integer
field takes an integer (not a boolean, not a float); a real field an integer or a float (not a boolean).
The project's YAML loader (`load_yaml`) reads numbers as YAML 1.2 and JSON do: `5e-3` is the number
0.005 (YAML 1.1, and so yaml.safe_load, reads it as a string), and what YAML 1.1 reads as a number the
user did not write as one (`0x10`, `017`, `0b11`, `1:30`, `1_000`) is refused, as is a key written twice
(in YAML and in JSON, `load_json`: a parser would keep the last one silently).

One seed range, [0, 2^31 - 1]: the largest seed HiGHS and Gurobi accept. NumPy and torch take more, but a
seed is a seed wherever it goes (a sweep's seed may become a solver's), so every seed has this range."""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import yaml

from plumbing.errors import InputError, first_line

NESTED_TOO_DEEPLY = "nests lists or objects too deeply to be read (Python's parsers stop at about 1000 levels)"
"""Why a JSON or YAML file that exhausts the parser's recursion is refused (every reader of such files says this)."""
SEED_MAX = 2**31 - 1
"""The largest seed (module docstring)."""

NUMBER_LITERAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
"""A decimal or scientific number as a user writes one (YAML 1.2, JSON, a flag); not 'nan', '0x10' or '1_000'."""

DECIMAL_INTEGER = re.compile(r"[+-]?(0|[1-9]\d*)")
"""An integer as a user writes one; YAML 1.1 also reads 0x10, 017 (octal), 0b11, 1:30 (base 60) and 1_000."""

HORIZON_MAX = 10_000
"""Most simulated steps of an episode, rollout or plan: the instance bounds (envs.instance) keep every
cost finite in float32 over this many steps."""
HORIZON_WHY = "the instance bounds keep costs finite in float32 over at most 10,000 steps"

TIME_LIMIT_MAX = 7 * 24 * 3600.0
"""Most seconds a solver may take for one solve: a week."""
TIME_LIMIT_WHY = "a week; a longer solver time limit is no limit on any machine's clock"

SCENARIOS_MAX = 10_000
"""Most demand scenarios S of a rolling-horizon MILP: 100 times the paper's S = 100 (its model holds 2 S n H stock columns)."""


def is_number(value) -> bool:
    """An int or a float as a JSON or YAML file gives it (NumPy's too); a boolean or a string is not one."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def describe(value) -> str:
    """A value as its file shows it, for error messages: `-1`, `a string "2"`, `a boolean true`, `a list of 2: [1, 2]`."""
    text = json.dumps(value, default=str)
    text = text if len(text) <= 40 else text[:37] + "..."
    if isinstance(value, (bool, np.bool_)):
        return f"a boolean {text}"
    if isinstance(value, str):
        return f"a string {text}"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}: {text}"
    if isinstance(value, dict):
        return f"an object {text}"
    return text


def refuse(where: str, allowed: str, got: str, why: str = "", error: type[Exception] = InputError):
    """The `error` to raise, in the one message style (module docstring)."""
    prefix = f"{where}: " if where else ""
    return error(f"{prefix}expected {allowed}, got {got}" + (f" ({why})" if why else ""))


def integer_range(low: int, high: int | None = None) -> str:
    return f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"


def real_range(low: float = -math.inf, high: float = math.inf, low_open: bool = False, high_open: bool = False) -> str:
    if low > -math.inf and high < math.inf:
        return f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low > -math.inf:
        return f"a number {'>' if low_open else '>='} {low:g}"
    if high < math.inf:
        return f"a number {'<' if high_open else '<='} {high:g}"
    return "a number"


def integer(value, where: str, low: int, high: int | None = None, *, why: str = "", error: type[Exception] = InputError) -> int:
    """`value` as an int in [low, high] (no upper limit without `high`); `why` says why `high` is the limit."""
    if high is not None and is_number(value) and value > high:  # also 1e12 for an integer field: say why it is too large
        raise refuse(where, integer_range(low, high), describe(value), why, error)
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)) or value < low:
        raise refuse(where, integer_range(low, high), describe(value), error=error)
    return int(value)


def real(
    value,
    where: str,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
    why: str = "",
    error: type[Exception] = InputError,
) -> float:
    """`value` as a finite float in the range; `why` says why `high` is the limit."""
    allowed = real_range(low, high, low_open, high_open)
    shown = describe(value)
    if not is_number(value):
        raise refuse(where, allowed, shown, error=error)
    try:
        number = float(value)
    except OverflowError:  # an integer beyond the float range: above any finite upper limit, or refused as too large
        if high < math.inf:
            raise refuse(where, allowed, shown, why, error) from None
        raise refuse(where, f"{allowed} below {sys.float_info.max:.1e} (a float64)", shown, error=error) from None
    if not math.isfinite(number):  # inf or nan: the range alone would look satisfied
        raise refuse(where, "a finite " + allowed.removeprefix("a "), shown, error=error)
    if number < low or (low_open and number == low):
        raise refuse(where, allowed, shown, error=error)
    if number > high or (high_open and number == high):
        raise refuse(where, allowed, shown, why, error)
    return number


def choice(value, where: str, allowed: Iterable, *, error: type[Exception] = InputError):
    """`value` if it is one of the strings `allowed`."""
    allowed = list(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise refuse(where, f"one of {allowed}", describe(value), error=error)
    return value


def boolean(value, where: str, *, error: type[Exception] = InputError) -> bool:
    if not isinstance(value, bool):
        raise refuse(where, "true or false", describe(value), error=error)
    return value


def seed(value, where: str, *, error: type[Exception] = InputError) -> int:
    """A random seed in [0, SEED_MAX] (module docstring)."""
    return integer(value, where, 0, SEED_MAX, why="the largest seed HiGHS and Gurobi accept", error=error)


def horizon(value, where: str, *, error: type[Exception] = InputError) -> int:
    """A number of simulated steps in [1, HORIZON_MAX]."""
    return integer(value, where, 1, HORIZON_MAX, why=HORIZON_WHY, error=error)


def time_limit(value, where: str, *, error: type[Exception] = InputError) -> float:
    """A solver's time limit in seconds, in (0, TIME_LIMIT_MAX]."""
    return real(value, where, 0, TIME_LIMIT_MAX, low_open=True, why=TIME_LIMIT_WHY, error=error)


def scenarios(value, where: str, *, error: type[Exception] = InputError) -> int:
    """A number of MILP demand scenarios in [1, SCENARIOS_MAX]."""
    return integer(value, where, 1, SCENARIOS_MAX, why="the MILP holds 2 S n H stock columns; 100 times the paper's S = 100", error=error)


def mip_gap(value, where: str, *, error: type[Exception] = InputError) -> float:
    """A requested relative MIP gap epsilon_MIP in [0, 1): a gap of 1 or more accepts any incumbent, even the worst."""
    return real(value, where, 0, 1, high_open=True, why="a relative gap of 1 or more accepts any incumbent", error=error)


def keys(mapping: Mapping, where: str, allowed: Iterable, required: Iterable = (), *, error: type[Exception] = InputError) -> None:
    """Refuse a mapping with keys outside `allowed` or without every key of `required`, naming them all."""
    present, allowed = set(mapping), set(allowed)
    unknown, missing = sorted(present - allowed, key=str), sorted(set(required) - present, key=str)
    if unknown or missing:
        parts = ([f"unknown keys {unknown}"] if unknown else []) + ([f"missing keys {missing}"] if missing else [])
        raise error(f"{where}: {'; '.join(parts)}; allowed keys are {sorted(allowed, key=str)}")


def differences(there: Any, here: Any, path: str = "") -> list[str]:
    """Every field where two records (nested mappings and lists) differ, as 'FIELD X there, Y here', FIELD
    a dotted path ("baselines.milp[0].gap"); a field one side lacks shows as (absent)."""
    if isinstance(there, dict) and isinstance(here, dict):
        return [
            line
            for key in sorted(set(there) | set(here), key=str)
            for line in differences(there.get(key, _ABSENT), here.get(key, _ABSENT), f"{path}.{key}" if path else str(key))
        ]
    if isinstance(there, list) and isinstance(here, list) and len(there) == len(here):
        return [line for k, (a, b) in enumerate(zip(there, here)) for line in differences(a, b, f"{path}[{k}]")]
    if there == here:
        return []
    return [f"{path or 'the record'} {_show(there)} there, {_show(here)} here"]


_ABSENT = object()


def _show(value) -> str:
    if value is _ABSENT:
        return "(absent)"
    if isinstance(value, str) and len(value) > 24:  # a content hash: its start tells two apart
        return f"{value[:16]}…"
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


# ---- YAML -----------------------------------------------------------------------------------------


class ProjectLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key written twice and a number not written in decimal (module
    docstring). Every YAML file the project reads (configs, sweep files, states) goes through it."""

    def get_single_data(self):  # the whole document is checked before anything is constructed
        node = self.get_single_node()
        if node is None:
            return None
        _check_node(node, "", set())
        return self.construct_document(node)


ProjectLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"), list("-+0123456789."))
"""YAML 1.2's scientific numbers without a dot or an exponent sign (5e-3, 1E3), which YAML 1.1 leaves as strings."""


class YamlFieldError(yaml.YAMLError):
    """A YAML document parses, but a field is written in a way the project refuses."""


_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_SPECIAL_FLOAT = re.compile(r"[+-]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)")


def _check_node(node: yaml.Node, path: str, seen: set[int]) -> None:
    if id(node) in seen:  # an alias: checked where its anchor is
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        lines: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else id(key_node)
            field = f"{path}.{key}" if path else str(key)
            if key in lines:
                raise YamlFieldError(
                    f"key '{field}' is written twice (lines {lines[key]} and {key_node.start_mark.line + 1}); write each key once"
                )
            lines[key] = key_node.start_mark.line + 1
            _check_node(value_node, field, seen)
    elif isinstance(node, yaml.SequenceNode):
        for k, item in enumerate(node.value):
            _check_node(item, f"{path}[{k}]", seen)
    elif isinstance(node, yaml.ScalarNode):
        text = node.value
        written = (node.tag == _INT_TAG and DECIMAL_INTEGER.fullmatch(text)) or (
            node.tag == _FLOAT_TAG and (NUMBER_LITERAL.fullmatch(text) or _SPECIAL_FLOAT.fullmatch(text))
        )
        if node.tag in (_INT_TAG, _FLOAT_TAG) and not written:
            read_as = yaml.load(text, Loader=yaml.SafeLoader)
            raise YamlFieldError(
                f"field '{path or '(document)'}' (line {node.start_mark.line + 1}): expected a number written in decimal (like "
                f"16 or 5e-3), "
                f"got {text}, which YAML 1.1 reads as {read_as!r} (hexadecimal, octal, binary, base 60 or with '_'); "
                "quote it if it is text"
            )


def load_yaml(text: str, what: str, path) -> Any:
    """Parse the YAML `text` of the input file `path` with ProjectLoader; one InputError naming `what` and
    the path for malformed YAML, a key written twice or a number not written in decimal."""
    try:
        return yaml.load(text, Loader=ProjectLoader)
    except YamlFieldError as exc:
        raise InputError(f"{what} '{path}': {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)  # where the parser stopped (1-based in the message), when it knows
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None)
        raise InputError(
            f"{what} '{path}' is not valid YAML{where}: {first_line(exc)}" + (f": {problem}" if problem and mark is not None else "")
        ) from None
    except RecursionError:
        raise InputError(f"{what} '{path}' {NESTED_TOO_DEEPLY}") from None


# ---- JSON -----------------------------------------------------------------------------------------


class JsonKeyError(ValueError):
    """A JSON object writes a key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise JsonKeyError(f"key '{key}' is written twice in one object; write each key once")
        data[key] = value
    return data


def load_json(text: str, what: str, path, error: type[Exception] = InputError) -> Any:
    """Parse the JSON `text` of the input file `path`; one `error` naming `what` and the path for malformed JSON
    or a key written twice in one object."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except JsonKeyError as exc:
        raise error(f"{what} '{path}': {exc}") from None
    except json.JSONDecodeError as exc:
        raise error(f"{what} '{path}' is not valid JSON: {first_line(exc)}") from None
    except RecursionError:
        raise error(f"{what} '{path}' {NESTED_TOO_DEEPLY}") from None
