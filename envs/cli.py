"""Small helpers shared by the scripts in platform/: argument types and one-line errors."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from envs.instance import InstanceError


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def read_file(path, what: str):
    """Parse a JSON (.json) or YAML (other suffixes, yaml.safe_load) file; a missing or malformed file is one
    ValueError naming `what` ("state file", "config file")."""
    import json
    from pathlib import Path

    import yaml

    path = Path(path)
    json_file = path.suffix.lower() == ".json"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ValueError(f"{what} '{path}' does not exist") from None
    try:
        return json.loads(text) if json_file else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{what} '{path}' is not valid {'JSON' if json_file else 'YAML'}: {exc}") from None


def run_cli(main: Callable[[], int | None]) -> None:
    """Run a script's main; bad input ends with one line 'error: ...' and exit status 2."""
    try:
        sys.exit(main() or 0)
    except (InstanceError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
