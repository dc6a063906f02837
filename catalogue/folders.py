"""A catalogue folder's layout (platform/recommend.py --out; docs/formats.md, "Catalogue folder"): its files and
folders, a supplier's folder name, and the policy a supplier's page recommends as a spec on those files."""

from __future__ import annotations

from pathlib import Path

from policies.lookahead import NAME as LOOKAHEAD
from policies.names import PolicySpec, parse_policy, tables_spec
from policies.user_rule import NAME as USER_RULE

AS_RUN = "as-run"
SUPPLIER_RECORD = "supplier.json"
PROGRESS = "progress.json"
"""A running supplier's stage in its `.partial` folder (stage, done, total), which the driver's bar shows."""
ATTEMPTS = "attempts.jsonl"
"""A supplier folder's attempts: one line per start of its task (attempt, time, node_id, node_ip, node_name, pid)."""
PARTIAL = ".partial"
"""The suffix of a supplier's folder while its task writes it."""
BOUND = "bound"
HELD_OUT = "held-out"
BACKTEST = "backtest"
MANIFEST = "catalogue.json"
FORMAT = "or-transformer-platform/catalogue"
FIT = "fit"
SUPPLIERS = "suppliers"
RULES = "rules"


def folder_name(supplier: str) -> str:
    """A supplier's folder under suppliers/ (and its route in the decision service): its name with every character but
    ASCII letters, digits, '-', '_' and '.' as '_', and where that changed the name (or leaves only dots) the first 8
    hex digits of its SHA-256 after it, so that two names never share a folder by their replaced characters."""
    import hashlib

    safe = "".join(c if (c.isascii() and c.isalnum()) or c in "-_." else "_" for c in supplier)
    if safe == supplier and safe.strip("."):
        return safe
    return f"{safe.strip('.') or 'supplier'}-{hashlib.sha256(supplier.encode()).hexdigest()[:8]}"


def partial_folder(folder: Path) -> Path:
    """Where a supplier's task writes its folder `folder` until the folder is whole (`PARTIAL`)."""
    return folder.with_name(folder.name + PARTIAL)


def recommended_spec(out: Path, folder: str, recommended: str) -> PolicySpec:
    """The policy a supplier's page recommends, as a spec on the catalogue folder `out`'s files: classical-best, the
    lookahead on the supplier's bound tables, or the user's rule from its rows of the rule table."""
    if recommended == LOOKAHEAD:
        return tables_spec(out / SUPPLIERS / folder / BOUND)
    if recommended == USER_RULE:
        return parse_policy(f"{USER_RULE}:{out / RULES / f'{folder}.csv'}")
    return parse_policy(recommended)
