"""The catalogue's one page (catalogue.md and a self-contained index.html of the same rows): per supplier and in total,
the recommended policy, its expected cost with its standard error, its proven distance above the tightest lower bound
(and the one-sided 95% figure), its backtest savings against the user's rule and recorded orders with paired 95%
intervals, the fit's flags on the supplier's items, and the command that serves the recommendation."""

from __future__ import annotations

import html
from pathlib import Path

from catalogue.folders import AS_RUN, SUPPLIERS, recommended_spec
from policies.user_rule import NAME as USER_RULE


def money(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


def saving(comparison: dict | None) -> str:
    """A paired comparison (recommended minus reference) as the saving it means: '12.3 [4.5, 20.1]' saved per window,
    a negative figure where the recommendation cost more; 'n/a' without the reference."""
    if comparison is None:
        return "n/a"
    if comparison["ci"] is None:
        return f"{-comparison['mean_difference']:,.1f} (one window: no interval)"
    low, high = sorted([-comparison["ci"][1], -comparison["ci"][0]])
    return f"{-comparison['mean_difference']:,.1f} [{low:,.1f}, {high:,.1f}]"


def serve_command(out: Path, record: dict, folder: str) -> str:
    """The command that serves the supplier's recommended policy alone (platform/serve.py on its instance)."""
    policy = recommended_spec(out, folder, record["recommended"])
    return f"python platform/serve.py --instance {out / SUPPLIERS / folder / 'instance.json'} --policy {policy}"


def supplier_flags(flags: list[str], items: list[str]) -> list[str]:
    """The fit's flags that name one of `items` ("item 'NAME': ...")."""
    prefixes = tuple(f"item '{item}'" for item in items)
    return [flag for flag in flags if flag.startswith(prefixes)]


def rows(out: Path, records: list[tuple[str, dict]], flags: list[str]) -> list[dict[str, str]]:
    """One row per supplier: its figures as the page shows them."""
    shown = []
    for folder, r in records:
        best = r["held_out"][r["recommended"]]
        shown.append(
            {
                "supplier": r["supplier"],
                "items": str(r["n"]),
                "K": f"{r['K']:g}",
                "recommended": r["recommended"],
                "expected cost": f"{money(best['mean'])} ± {money(best['se'])}",
                "tightest bound": f"{money(r['bound']['tightest']['value'])} ({r['bound']['tightest']['relaxation']})",
                "above the bound": f"{100 * best['above_bound']:+.2f}% (at most {100 * best['above_bound_95']:+.2f}%)",
                "saves vs your rule (backtest)": saving(against(r, USER_RULE)),
                "saves vs your orders (backtest)": saving(against(r, AS_RUN)),
                "fit flags": str(len(supplier_flags(flags, r["items"] or []))),
                "serve": serve_command(out, r, folder),
            }
        )
    return shown


def against(record: dict, reference: str) -> dict | None:
    """The backtest's paired comparison of the recommended policy with `reference` (user-rule or as-run): recommended
    minus reference per window, so a negative mean is what the recommendation saves; None where either is missing."""
    recommended = record["recommended"]
    for row in record["backtest"]["comparisons"]:
        if {row["a"], row["b"]} == {recommended, reference}:
            sign = 1.0 if row["a"] == recommended else -1.0
            low, high = row["ci_low"], row["ci_high"]
            interval = None if low is None else sorted([sign * low, sign * high])
            return {"mean_difference": sign * row["mean_difference"], "se": row["se"], "ci": interval, "windows": row["windows"]}
    return None


def total_row(total: dict, paired: dict | None) -> dict[str, str]:
    vs_rule = "n/a" if paired is None else saving({"mean_difference": paired["mean_difference"], "ci": paired["ci"]}) + " (held-out)"
    return {
        "supplier": "total",
        "expected cost": f"{money(total['mean'])} ± {money(total['se'])}",
        "tightest bound": money(total["bound"]),
        "above the bound": f"{100 * total['above_bound']:+.2f}% (at most {100 * total['above_bound_95']:+.2f}%)",
        "saves vs your rule (backtest)": vs_rule,
    }


COLUMNS = (
    "supplier", "items", "K", "recommended", "expected cost", "tightest bound", "above the bound",
    "saves vs your rule (backtest)", "saves vs your orders (backtest)", "fit flags",
)  # fmt: skip
INTRO = (
    "Expected cost: the mean discounted cost of {episodes} held-out episodes of {horizon} periods, ± its standard error. "
    "Above the bound: how far that cost lies above the tightest proven lower bound on any policy's expected cost "
    "(a one-sided 95% figure beside it). Savings: per backtest window of {window} periods of your history, your rule's "
    "(or your recorded orders') cost minus the recommendation's, with a paired 95% interval; the total's saving against "
    "your rule is on the held-out episodes."
)


def markdown(out: Path, records: list[tuple[str, dict]], total: dict, paired: dict | None, flags: list[str], settings: dict) -> str:
    table = rows(out, records, flags)
    lines = ["# Catalogue", "", INTRO.format(**settings), "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in [*table, total_row(total, paired)]:
        lines.append("| " + " | ".join(row.get(c, "") for c in COLUMNS) + " |")
    lines += [
        "",
        "## Serving the recommendations",
        "",
        f"Every supplier's at once: `python platform/serve.py --catalogue {out}`, then POST a",
        "state to /SUPPLIER/decide (the supplier's folder name). Each alone:",
        "",
    ]
    lines += [f"* {row['supplier']}: `{row['serve']}`" for row in table]
    lines += ["", "## The fit's flags", ""] + ([f"* {flag}" for flag in flags] or ["None."])
    return "\n".join(lines) + "\n"


def page_html(markdown_rows: list[dict[str, str]], intro: str, flags: list[str], commands: list[tuple[str, str]], out: Path) -> str:
    """The same table as a self-contained HTML page (no script, no external file)."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(row.get(c, ''))}</td>" for c in COLUMNS) + "</tr>" for row in markdown_rows)
    serve = "".join(f"<li>{html.escape(name)}: <code>{html.escape(command)}</code></li>" for name, command in commands)
    flagged = "".join(f"<li>{html.escape(flag)}</li>" for flag in flags) or "<li>None.</li>"
    everyone = f"python platform/serve.py --catalogue {out}"
    style = "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #999;padding:4px 8px}"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>Catalogue</title><style>{style}</style></head><body>"
        f"<h1>Catalogue</h1><p>{html.escape(intro)}</p><table><tr>{head}</tr>{body}</table>"
        f"<h2>Serving the recommendations</h2><p>Every supplier's at once: <code>{html.escape(everyone)}</code>, then POST a "
        f"state to /SUPPLIER/decide (the supplier's folder name). Each alone:</p><ul>{serve}</ul>"
        f"<h2>The fit's flags</h2><ul>{flagged}</ul></body></html>\n"
    )


def write_page(out: Path, records: list[tuple[str, dict]], total: dict, paired: dict | None, flags: list[str], settings: dict) -> None:
    """catalogue.md and index.html under `out`."""
    from plumbing.files import atomic_write_text

    table = rows(out, records, flags)
    atomic_write_text(out / "catalogue.md", markdown(out, records, total, paired, flags, settings))
    commands = [(row["supplier"], row["serve"]) for row in table]
    atomic_write_text(out / "index.html", page_html([*table, total_row(total, paired)], INTRO.format(**settings), flags, commands, out))
