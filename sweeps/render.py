"""The report on a sweep's results directory (computed by sweeps/report.py) as text and figures: the
paper's cost table and the others, Markdown, CSV, one self-contained HTML page and the figures. Every number
is computed in sweeps/report.py; this module only formats them. platform/report.py RESULTS_DIR runs it.

  write_report(report, "results/quick/report")      table.md, table.csv, curves.png/.svg, index.html, and decision_time.png
                                                    when the report holds decision times (sweeps.report.time_decisions)
  results_markdown(report, command)                 the headline, cost table and paired comparisons for docs/results.md

How cells are shown:

* A value is mean ± s.e., the s.e. to two significant digits and the mean to the same decimals. A learned
  method with one finished seed shows that seed's s.e. over the held-out episodes, marked †. Failed,
  interrupted and pending trials are counted in the cell ("failed (1 of 3 seeds)"). table.csv holds the
  same cells in long form, one row per size and column, with every number behind them.
* The best ranked policy of each size is bold, the second underlined. A baseline evaluated on its own
  episodes or horizon is shown, marked ‡, and not ranked.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from plumbing.files import atomic_write, atomic_write_text
from policies.classical import CLASSICAL_BEST
from policies.decomposition import PAIRED_DIFFERENCE, RELAXED_POLICIES, above_bound, above_text, certificate_note, dp_figures, tightest_text
from policies.joint_dp import SWEEP_ITEMS
from sweeps.report import DECOMPOSITION, REFERENCE_DECISIONS, REPEATS, Entry, Report, binned_curve, seed_curves
from sweeps.results_dir import Results
from trainers.config import MethodName
from trainers.registry import METHODS

OPENING_TEXT = {"greedy": "Y = 1{p > 0.5}; PPO: the Beta mean", "sampled": "Y ~ Bernoulli(p); PPO: draws from its distribution"}
"""How each held-out evaluation of a trial opens an order (sweeps.results_dir.OPENINGS)."""
ONE_SEED = "†"
OWN_EVALUATION = "‡"


def label(column: str) -> str:
    """A learned method's label (trainers.registry), else the baseline's name."""
    return METHODS[column].label if column in METHODS else column


def decimals(scale: float) -> int:
    """Decimals that show `scale` (an s.e. or a half-width) to two significant digits."""
    return max(0, 1 - math.floor(math.log10(scale))) if scale > 0 else 2


def number(mean: float, se: float | None = None) -> str:
    """mean ± se with the s.e. to two significant digits and the mean to the same decimals."""
    d = decimals(se if se else abs(mean))
    return f"{mean:,.{d}f}" if se is None else f"{mean:,.{d}f} ± {se:,.{d}f}"


def cell(entry: Entry) -> str:
    """The cost table's cell of `entry` (module docstring)."""
    if not entry.runs:
        return entry.without_runs
    marks = (ONE_SEED if entry.one_seed else "") + (OWN_EVALUATION if entry.own_evaluation else "")
    text = number(entry.mean, entry.se) + marks
    if entry.kind == "learned" and entry.unfinished:
        text += (
            f" ({len(entry.runs)} of {entry.seeds} seeds; "
            + ", ".join(f"{count} {status}" for status, count in entry.unfinished.items())
            + ")"
        )
    return text


@dataclass
class Table:
    """A rendered table: cells as text, `styles` (row, column) -> best | second."""

    title: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    styles: dict[tuple[int, int], str] = field(default_factory=dict)
    intro: str = ""


def percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def cost_table(report: Report) -> Table:
    spec = report.results.spec
    cols = report.columns
    table = Table(f"Mean discounted cost over {spec.horizon} decisions ({report.opening} opening)", ["n", *(label(c) for c, _ in cols)], [])
    table.intro = (
        f"{spec.episodes} held-out episodes of {spec.horizon} decisions per size. Learned methods, {report.opening} opening "
        f"({OPENING_TEXT[report.opening]}): the mean over finished seeds of each seed's mean, ± one standard error across seeds. "
        "Baselines: one evaluation, ± one s.e. over its episodes. Lower is better; the best policy of each size is bold, the "
        "second underlined (the bound is not a policy and is not ranked)."
    )
    for i, n in enumerate(spec.sizes):
        table.rows.append([str(n), *(cell(report.entries[(n, c)]) for c, _ in cols)])
        ranked = report.ranked(n)
        for style, entry in zip(("best", "second"), ranked):
            table.styles[(i, 1 + [c for c, _ in cols].index(entry.column))] = style
    cells = [report.entries[k] for k in report.entries]
    if any(e.one_seed for e in cells):
        table.notes.append(
            f"{ONE_SEED} one finished seed: no standard error across seeds exists; the s.e. shown is over the held-out "
            "episodes of that seed."
        )
    own = [e for e in cells if e.own_evaluation]
    if own:
        table.notes.append(
            f"{OWN_EVALUATION} evaluated on its own held-out episodes or horizon, so not ranked: "
            + "; ".join(
                f"{e.column} at n = {e.n}: {e.runs[0].summary['episodes']} episodes x {e.runs[0].summary['horizon']} decisions" for e in own
            )
        )
    if any(e.absent == "—" for e in cells):
        table.notes.append(
            f"— not part of the sweep at this size (dp-optimal runs at n <= {SWEEP_ITEMS} only; a MILP may be limited to some sizes)."
        )
    for n in spec.sizes:
        if (figures := dp_value(report, n)) is not None:
            s = report.entries[(n, DECOMPOSITION)].runs[0].summary
            table.notes.append(
                f"{DECOMPOSITION} at n = {n}: its cell is the {RELAXED_POLICIES}' simulated cost on these episodes, not the bound; "
                f"the bound is its {figures} at the best split (equal shares: "
                f"{dp_figures(s['equal_shares']['value'], s['equal_shares']['conservative'])})"
                + (f"; {certificate_note(s['search'])}." if "search" in s else ".")
            )
    table.notes += report.notes
    return table


HEADLINE = "Headline: the best policy of each size"
TIGHTEST_HEADER = "tightest lower bound (relaxation)"
ABOVE_TIGHTEST = "above it: mean / bound - 1 (one-sided 95%)"
TIGHTEST_NOTE = (
    "The tightest lower bound is the highest of the decomposition run's figures on its factor chain (the constant split's DP "
    "value, the shares by period and factor, at two items the joint optimum) and, where dp-optimal runs, the exact optimum "
    "(its caps raised where they are fractional); the policy's distance to the optimum on that chain is at most its expected "
    "cost's distance above the bound: the held-out mean estimates it (below the bound by the episodes' luck, as can be), and "
    "the one-sided 95% figure (the mean + 1.645 s.e. of the episodes, and of the seeds for a learned method) bounds it with "
    "95% confidence."
)
BEST_POLICY = "best policy"
AGAINST_CLASSICAL_BEST = "- classical-best (95% CI of each seed)"
AGAINST_RELAXED_POLICIES = f"- the {RELAXED_POLICIES} (% of their mean)"


def headline_table(report: Report) -> Table:
    """Per size: the cheapest policy on the held-out set (Report.ranked), its paired difference to classical-best and,
    with the decomposition bound in the sweep, its paired difference to the bound's relaxed policies beside the bound."""
    paired = {(r["n"], r["column"]): r for r in report.paired if r["paired"]}
    relaxed = {(r["n"], r["column"]): r for r in report.relaxed_differences if r["paired"]}
    header = ["n", BEST_POLICY, "mean", AGAINST_CLASSICAL_BEST]
    with_bound = report.results.spec.baselines.decomposition is not None
    if with_bound:
        header += [AGAINST_RELAXED_POLICIES, BOUND_HEADER]
    if report.tightest:
        header += [TIGHTEST_HEADER, ABOVE_TIGHTEST]
    table = Table(HEADLINE, header, [])
    table.intro = (
        "The cheapest policy of each size on the held-out episodes (the bound is not a policy) and its paired difference "
        "to classical-best" + (", to the decomposition bound's relaxed policies and the bound (the tables below)." if with_bound else ".")
    )
    if report.tightest:
        table.intro += " " + TIGHTEST_NOTE
    for n in report.results.spec.sizes:
        ranked = report.ranked(n)
        if not ranked:
            table.rows.append([str(n), "none evaluated", *("n/a" for _ in header[2:])])
            continue
        best = ranked[0]
        against_best = "reference" if best.column == CLASSICAL_BEST else paired_text(paired.get((n, best.column)))
        row = [str(n), label(best.column), cell(best), against_best]
        if with_bound:
            gap = relaxed.get((n, best.column))
            share = f" ({percent(gap['share'])})" if gap and gap["share"] is not None else ""
            row += [paired_text(gap) + share, dp_value(report, n) or "n/a"]
        if report.tightest:
            bound = report.tightest.get(n)
            row += [tightest_text(bound), above_text(best.mean, best.expected_cost_se, bound["value"])] if bound else ["n/a", "n/a"]
        table.rows.append(row)
    return table


def paired_text(row: dict | None) -> str:
    """A paired_rows row as 'mean (each seed's CI)', n/a without a pair."""
    if row is None:
        return "n/a"
    mean, seeds = paired_intervals(row)
    return f"{mean} ({seeds})"


def dp_value(report: Report, n: int) -> str | None:
    """The decomposition bound's certified figures at size n (its DP value, conservatively), None without them."""
    bound = report.entries.get((n, DECOMPOSITION))
    if bound is None or not bound.runs:
        return None
    s = bound.runs[0].summary
    return dp_figures(s["dp_value"], s["conservative_value"])


def tightest_fields(bound: dict | None, entry: Entry | None) -> list:
    """The CSV's tightest bound, its relaxation and the entry's distance above it (mean / bound - 1, its one-sided 95% figure)."""
    if bound is None:
        return [None, None, None, None]
    above = above_bound(entry.mean, entry.expected_cost_se, bound["value"]) if entry is not None and entry.runs else (None, None)
    return [bound["value"], bound["relaxation"], *above]


def per_item_table(report: Report) -> Table:
    spec = report.results.spec
    table = Table("Cost per item (mean / n)", ["n", *(label(c) for c, _ in report.columns)], [])
    for n in spec.sizes:
        entries = [report.entries[(n, c)] for c, _ in report.columns]
        table.rows.append([str(n), *(number(e.mean / n, e.se / n) if e.runs else cell(e) for e in entries)])
    return table


def reduction_table(report: Report) -> Table | None:
    """1 - OR-Transformer / method, per size: what OR-Transformer saves against each policy."""
    if MethodName.OR_TRANSFORMER not in report.results.spec.methods:
        return None
    others = [c for c, kind in report.columns if c != MethodName.OR_TRANSFORMER and kind != "bound"]
    table = Table("Cost reduction of OR-Transformer (1 - OR-Transformer / method)", ["n", *(label(c) for c in others)], [])
    for n in report.results.spec.sizes:
        table.rows.append([str(n), *(percent(report.reductions[(n, c)]) if (n, c) in report.reductions else "n/a" for c in others)])
    table.notes.append("n/a: one of the two has no evaluation on the sweep's held-out episodes and horizon.")
    return table


def gap_table(report: Report) -> Table | None:
    """method / bound - 1 per size."""
    if report.results.spec.baselines.bound is None:
        return None
    others = [c for c, kind in report.columns if kind != "bound"]
    table = Table("Gap to the perfect-information bound (method / bound - 1)", ["n", *(label(c) for c in others)], [])
    for n in report.results.spec.sizes:
        table.rows.append([str(n), *(percent(report.bound_ratios[(n, c)]) if (n, c) in report.bound_ratios else "n/a" for c in others)])
    table.notes.append("n/a: the method or the bound has no evaluation on the sweep's held-out episodes and horizon.")
    return table


def tightest_table(report: Report) -> Table | None:
    """Every policy's distance above the tightest lower bound of its size (report.tightest), with the bound named."""
    if not report.tightest:
        return None
    others = [c for c, kind in report.columns if kind != "bound"]
    table = Table(
        "Distance above the tightest lower bound (mean / bound - 1; one-sided 95% figure)",
        ["n", TIGHTEST_HEADER, *(label(c) for c in others)],
        [],
    )
    table.intro = TIGHTEST_NOTE
    for n in report.results.spec.sizes:
        bound = report.tightest.get(n)
        row = [str(n), tightest_text(bound) if bound else "n/a"]
        for c in others:
            e = report.entries[(n, c)]
            row.append(above_text(e.mean, e.expected_cost_se, bound["value"]) if bound and e.on_heldout_set else "n/a")
        table.rows.append(row)
    table.notes.append("n/a: no bound at this size, or the method has no evaluation on the sweep's held-out episodes and horizon.")
    return table


def diverged_table(report: Report) -> Table | None:
    learned = [c for c, kind in report.columns if kind == "learned"]
    if not learned:
        return None
    table = Table("Diverged seeds (of the sweep's seeds)", ["n", *(label(c) for c in learned)], [])
    for n in report.results.spec.sizes:
        entries = [report.entries[(n, c)] for c in learned]
        table.rows.append([str(n), *(f"{e.diverged} of {e.seeds} ({percent(e.diverged / e.seeds)})" for e in entries)])
    return table


def paired_table(report: Report) -> Table:
    table = Table(
        "Paired comparisons against classical-best",
        ["n", "method", "seeds paired", "mean difference", "95% CI of each seed", "CI below zero", "CI above zero"],
        [],
    )
    table.intro = (
        "cost - classical-best's cost on the same held-out episodes (envs.evaluation.paired_comparison: the 95% t-interval "
        "over episodes); a negative difference is cheaper than classical-best. Learned methods: one interval per finished "
        "seed and the share of seeds whose interval lies below (above) zero."
    )
    _paired_rows(table, report.paired)
    if not any(kind == "baseline" and c == CLASSICAL_BEST for c, kind in report.columns):
        table.notes.append("The sweep has no classical-best baseline: nothing to pair against.")
    return table


RELAXED_DIFFERENCE_HEADER = "mean paired difference (% of the relaxed policies' mean)"
BOUND_HEADER = "the bound: DP value (conservatively)"


def relaxed_difference_table(report: Report) -> Table | None:
    """Every policy's paired difference to the decomposition bound's relaxed policies (PAIRED_DIFFERENCE), with the
    bound, its DP value, beside it."""
    if report.results.spec.baselines.decomposition is None:
        return None
    table = Table(
        f"Paired difference to the {RELAXED_POLICIES}",
        ["n", "method", "seeds paired", RELAXED_DIFFERENCE_HEADER, "95% CI of each seed", "CI below zero", "CI above zero", BOUND_HEADER],
        [],
    )
    table.intro = PAIRED_DIFFERENCE
    _paired_rows(table, report.relaxed_differences, share=True)
    for row in table.rows:
        row.append(dp_value(report, int(row[0])) or "n/a")
    return table


def paired_intervals(row: dict) -> tuple[str, str]:
    """A paired_rows row's mean and each seed's 95% CI as text, with the decimals of the intervals' half-widths."""
    d = decimals(float(np.mean([(c.ci_high - c.ci_low) / 2 for _, c in row["paired"]])))
    seeds = "; ".join(
        ("" if seed is None else f"s{seed}: ") + f"{c.mean_difference:+,.{d}f} [{c.ci_low:+,.{d}f}, {c.ci_high:+,.{d}f}]"
        for seed, c in row["paired"]
    )
    return f"{row['mean']:+,.{d}f}", seeds


def _paired_rows(table: Table, paired: list, share: bool = False) -> None:
    """One row per (n, method) of report.paired-style rows; with `share`, the mean also in % of the reference's mean."""
    for row in paired:
        k = len(row["paired"])
        if not k:
            table.rows.append([str(row["n"]), label(row["column"]), "0", "n/a", row["not_paired"] or "n/a", "n/a", "n/a"])
            continue
        diffs = [c for _, c in row["paired"]]
        mean, seeds = paired_intervals(row)
        table.rows.append(
            [
                str(row["n"]),
                label(row["column"]),
                str(k),
                mean + (f" ({percent(row['share'])})" if share and row["share"] is not None else ""),
                seeds,
                f"{sum(c.ci_high < 0 for c in diffs)} of {k}",
                f"{sum(c.ci_low > 0 for c in diffs)} of {k}",
            ]
        )
    table.notes += sorted({r["not_paired"] for r in paired if r["paired"] and r["not_paired"]})


def seconds(value: float) -> str:
    return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:,.3g} s"


def ratio(value: float) -> str:
    return f"{value:,.0f}x" if value >= 100 else f"{value:.2g}x"


def decision_table(report: Report) -> Table | None:
    """The decision times (None when the report was not timed: sweeps.report.time_decisions)."""
    if report.timings is None:
        return None
    milps = [m.name for m in report.results.spec.baselines.milp]
    header = ["n", "policy", "one state", "held-out batch", *(h for m in milps for h in (f"{m} per decision", f"{m} / one state"))]
    table = Table(f"Decision time ({report.device}, median of {REPEATS} calls)", header, [])
    table.intro = (
        "Wall time of one decision of each learned policy (the first finished seed's checkpoint) on one state and on the "
        "initial states of every held-out episode at once, against each MILP's mean build + solve seconds per decision "
        "(its decisions.parquet), and their ratio."
    )
    for row in report.timings:
        if row["absent"]:
            cells = [row["absent"], "n/a"]
        else:
            cells = [seconds(row["one_state"]), f"{seconds(row['batch'])} ({row['batch_size']} states)"]
        for m in milps:
            t = report.milp_times[row["n"]].get(m)
            cells += [seconds(t) if t is not None else "n/a", ratio(t / row["one_state"]) if t is not None and row["one_state"] else "n/a"]
        table.rows.append([str(row["n"]), label(row["column"]), *cells])
    return table


def tables(report: Report) -> list[Table]:
    return [
        t
        for t in (
            headline_table(report),
            cost_table(report),
            per_item_table(report),
            reduction_table(report),
            gap_table(report),
            tightest_table(report),
            diverged_table(report),
            paired_table(report),
            relaxed_difference_table(report),
            decision_table(report),
        )
        if t is not None
    ]


# ---- rendering ------------------------------------------------------------------------------------


TEXT_COLUMNS = ("method", "policy", "95% CI of each seed", BEST_POLICY, AGAINST_CLASSICAL_BEST, AGAINST_RELAXED_POLICIES)


def markdown(table: Table, command: str | None = None) -> str:
    styled = {"best": "**{}**", "second": "<ins>{}</ins>"}
    lines = [f"## {table.title}", ""]
    if command:
        lines += ["Regenerate with:", "", "```", command, "```", ""]
    if table.intro:
        lines += [table.intro, ""]
    lines += ["| " + " | ".join(table.header) + " |", "|" + "".join(" --- |" if h in TEXT_COLUMNS else " ---: |" for h in table.header)]
    for i, row in enumerate(table.rows):
        cells = [styled[table.styles[(i, j)]].format(c) if (i, j) in table.styles else c for j, c in enumerate(row)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if table.notes:
        lines += [""] + [f"- {note}" for note in table.notes]
    return "\n".join(lines) + "\n"


def manifest_lines(results: Results) -> list[str]:
    r = results.record
    commit = r.get("git_commit") or "unknown"
    return [
        f"results directory: {results.root}",
        f"git commit: {commit}" + (" (with uncommitted changes)" if r.get("git_dirty") else ""),
        f"started {r.get('started', '?')}, finished {r.get('finished') or 'not finished'}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in (r.get("versions") or {}).items() if v),
        "hardware: " + ", ".join(f"{k} {v}" for k, v in (r.get("hardware") or {}).items() if v),
    ]


def markdown_report(report: Report) -> str:
    head = [f"# Report on the sweep in {report.results.root}", "", *(f"- {line}" for line in manifest_lines(report.results)), ""]
    return "\n".join(head) + "\n" + "\n".join(markdown(t) for t in tables(report))


def results_markdown(report: Report, command: str) -> str:
    """The headline, the cost table, the paired comparisons against classical-best and, with the decomposition bound in
    the sweep, the paired differences to its relaxed policies, as Markdown for docs/results.md, with `command` (the one
    that regenerates them) written above each table."""
    head = [
        f"# Results of the sweep in `{report.results.root}`",
        "",
        "Generated by `platform/report.py`; do not edit by hand.",
        "",
        *(f"- {line}" for line in manifest_lines(report.results)),
        "",
    ]
    shown = (headline_table(report), cost_table(report), tightest_table(report), paired_table(report), relaxed_difference_table(report))
    return "\n".join(head) + "\n" + "\n".join(markdown(t, command) for t in shown if t is not None)


def csv_text(report: Report) -> str:
    """The cost table in long form: one row per size and column, with every number behind the cell, and the paired
    difference to the decomposition bound's relaxed policies as in its table (PAIRED_DIFFERENCE), the bound beside it."""
    spec = report.results.spec
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(
        [
            "n",
            "column",
            "kind",
            "opening",
            "cell",
            "mean",
            "se",
            "se_over",
            "per_item_mean",
            "seeds",
            "finished_seeds",
            "diverged_seeds",
            "not_finished",
            "episodes",
            "horizon",
            "rank",
            "reduction_by_or_transformer",
            "gap_to_bound",
            "paired_difference_to_relaxed_policies",
            "paired_difference_share",
            "paired_difference_ci",
            "decomposition_bound",
            "tightest_bound",
            "tightest_relaxation",
            "above_tightest",
            "above_tightest_95",
        ]
    )
    relaxed = {(r["n"], r["column"]): r for r in report.relaxed_differences if r["paired"]}
    for n in spec.sizes:
        ranked = [e.column for e in report.ranked(n)]
        for column, kind in report.columns:
            e = report.entries[(n, column)]
            over = "" if not e.runs else "episodes" if kind != "learned" else "seeds" if len(e.runs) > 1 else "episodes of one seed"
            difference = relaxed.get((n, column))
            writer.writerow(
                [
                    n,
                    column,
                    kind,
                    report.opening if kind == "learned" else "",
                    cell(e),
                    e.mean,
                    e.se,
                    over,
                    None if e.mean is None else e.mean / n,
                    e.seeds if kind == "learned" else "",
                    len(e.runs) if kind == "learned" else "",
                    e.diverged if kind == "learned" else "",
                    "; ".join(f"{c} {s}" for s, c in e.unfinished.items()),
                    e.runs[0].summary["episodes"] if e.runs else None,
                    e.horizon,
                    ranked.index(column) + 1 if column in ranked else None,
                    report.reductions.get((n, column)),
                    report.bound_ratios.get((n, column)),
                    difference and difference["mean"],
                    difference and difference["share"],
                    difference and paired_intervals(difference)[1],
                    dp_value(report, n),
                    *tightest_fields(report.tightest.get(n), e if kind != "bound" and e.on_heldout_set else None),
                ]
            )
    return out.getvalue()


def html_table(table: Table) -> str:
    tags = {"best": "strong", "second": "u"}
    rows = ["<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in table.header) + "</tr>"]
    for i, row in enumerate(table.rows):
        cells = []
        for j, text in enumerate(row):
            body = html.escape(text)
            if (i, j) in table.styles:
                tag = tags[table.styles[(i, j)]]
                body = f"<{tag}>{body}</{tag}>"
            cells.append(f"<td>{body}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in table.notes)
    return (
        f"<h2>{html.escape(table.title)}</h2>\n"
        + (f"<p>{html.escape(table.intro)}</p>\n" if table.intro else "")
        + "<table>\n"
        + "\n".join(rows)
        + "\n</table>\n"
        + (f"<ul class='notes'>{notes}</ul>\n" if notes else "")
    )


STYLE = (
    "body{font-family:sans-serif;max-width:80em;margin:2em auto;padding:0 1em}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #bbb;padding:.25em .6em;text-align:right}th{background:#eee}img{max-width:100%}"
    "pre{background:#f6f6f6;padding:1em;overflow:auto}.notes{font-size:.9em;color:#444}"
)


def html_page(report: Report, images: dict[str, bytes]) -> str:
    """One self-contained page: every table, the figures as data: URIs (PNG) and the sweep's manifest."""
    results = report.results
    figures = "".join(
        f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{base64.b64encode(images[name]).decode()}'>"
        f"<figcaption>{html.escape(caption)}</figcaption></figure>\n"
        for name, caption in FIGURES.items()
        if name in images
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in report.reference_notes)
    body = [
        f"<h1>Report on the sweep in {html.escape(str(results.root))}</h1>",
        "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in manifest_lines(results)) + "</ul>",
        *(html_table(t) for t in tables(report)),
        "<h2>Figures</h2>",
        figures,
        f"<ul class='notes'>{notes}</ul>" if notes else "",
        "<h2>Sweep file</h2>",
        f"<pre>{html.escape(yaml.safe_dump(results.record['sweep'], sort_keys=False))}</pre>",
        "<h2>Instances (content hashes)</h2>",
        "<ul>"
        + "".join(f"<li>{html.escape(k)}: {html.escape(str(v))}</li>" for k, v in results.record["instance_hashes"].items())
        + "</ul>",
    ]
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>Sweep report</title>"
        f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


FIGURES = {
    "curves.png": "Training curves: cost10 against update, ten-update moving average in 24 log-spaced bins; line the mean over seeds, "
    "band one s.e. across seeds (one seed: 10th-90th percentile in the bin); dashed: the baselines' cost over the first "
    "10 held-out decisions.",
    "decision_time.png": "Seconds per decision: each learned policy on one state against each MILP.",
}


# ---- figures --------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_bytes(figure, fmt: str) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format=fmt, dpi=120, bbox_inches="tight", metadata={"Date": None} if fmt == "svg" else None)
    return buffer.getvalue()


def curves_figure(report: Report):
    """Figure 1: one panel per size, log-log cost10 against update, the baselines' 10-decision costs as lines."""
    plt = _pyplot()
    spec = report.results.spec
    learned = [c for c, kind in report.columns if kind == "learned"]
    figure, axes = plt.subplots(1, len(spec.sizes), figsize=(4.2 * len(spec.sizes), 3.6), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, n in zip(axes[0], spec.sizes):
        drawn = False
        for k, method in enumerate(learned):
            curves = seed_curves(report.results, report.entries[(n, method)])
            if not curves:
                continue
            binned = binned_curve(curves)
            color = colors[k % len(colors)]
            ax.plot(binned.update, binned.mean, color=color, label=f"{label(method)} ({len(curves)} seed{'s' if len(curves) > 1 else ''})")
            ax.fill_between(binned.update, binned.low, binned.high, color=color, alpha=0.25, linewidth=0)
            drawn = True
        for k, (name, value) in enumerate(report.references[n].items()):
            ax.axhline(
                value,
                color="black" if name == CLASSICAL_BEST else colors[(len(learned) + k) % len(colors)],
                linestyle="--",
                linewidth=1,
                label=f"{name} (first {REFERENCE_DECISIONS} decisions)",
            )
        if drawn:
            ax.set_xscale("log")
            ax.set_yscale("log")
        else:
            ax.text(0.5, 0.5, "no training curve", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(f"n = {n}")
        ax.set_xlabel("update")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    axes[0][0].set_ylabel(f"cost over {REFERENCE_DECISIONS} steps (cost10)")
    figure.tight_layout()
    return figure


def decision_figure(report: Report):
    """Seconds per decision (log scale), grouped by size: each learned policy on one state, and each MILP."""
    plt = _pyplot()
    sizes = report.results.spec.sizes
    series = {
        label(c): {r["n"]: r["one_state"] for r in report.timings if r["column"] == c} for c, kind in report.columns if kind == "learned"
    }
    series |= {m.name: {n: report.milp_times[n].get(m.name) for n in sizes} for m in report.results.spec.baselines.milp}
    figure, ax = plt.subplots(figsize=(max(5.0, 0.5 * len(sizes) * max(1, len(series))), 3.6))
    width = 0.8 / max(1, len(series))
    for k, (name, values) in enumerate(series.items()):
        ax.bar(np.arange(len(sizes)) + k * width, [np.nan if values.get(n) is None else values[n] for n in sizes], width, label=name)
    ax.set_xticks(np.arange(len(sizes)) + width * (len(series) - 1) / 2, [f"n = {n}" for n in sizes])
    ax.set_yscale("log")
    ax.set_ylabel("seconds per decision")
    if series:
        ax.legend(fontsize=7)
    figure.tight_layout()
    return figure


REPORT_FILES = ("table.md", "table.csv", "curves.png", "curves.svg", "index.html", "decision_time.png")
"""What write_report writes into its folder."""


def write_report(report: Report, out, markdown_file=None, command: str | None = None) -> dict[str, Path]:
    """Write every output into `out` (each file atomically; decision_time.png only when the report holds decision times,
    else a previous report's is removed); with `markdown_file`, also results_markdown there."""
    plt = _pyplot()
    out = Path(out)
    curves = curves_figure(report)
    images = {"curves.png": figure_bytes(curves, "png"), "curves.svg": figure_bytes(curves, "svg")}
    plt.close(curves)
    if report.timings is not None:
        decisions = decision_figure(report)
        images["decision_time.png"] = figure_bytes(decisions, "png")
        plt.close(decisions)
    texts = {"table.md": markdown_report(report), "table.csv": csv_text(report), "index.html": html_page(report, images)}
    written = {}
    for name, data in images.items():
        atomic_write(out / name, lambda tmp, data=data: tmp.write_bytes(data))
        written[name] = out / name
    for name, text in texts.items():
        atomic_write_text(out / name, text)
        written[name] = out / name
    for name in set(REPORT_FILES) - set(written):
        (out / name).unlink(missing_ok=True)
    if markdown_file is not None:
        atomic_write_text(Path(markdown_file), results_markdown(report, command or f"python platform/report.py {report.results.root}"))
        written["markdown"] = Path(markdown_file)
    return written
