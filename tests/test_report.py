"""The report on a sweep's results directory (sweeps/report.py computes it, sweeps/render.py writes it,
platform/report.py RESULTS_DIR runs it) on a small synthetic results directory: every evaluation folder is
real (run_results.records.write_evaluation) but holds hand-chosen per-episode costs, so every table cell, paired
interval and binned curve value below is worked out by hand from those numbers."""

import csv
import json
import math
import shutil
from html.parser import HTMLParser

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, TINY, run_script

from envs.evaluation import Evaluation, evaluate
from envs.exogenous import HELDOUT_SEED, sample_paths
from envs.instance import paper_instance
from plumbing.errors import InputError
from policies.classical import RULES, make_policy, zero_policy
from run_results.records import manifest, write_evaluation, write_parquet
from solver_workers.solver_run import DECISION_COLUMNS, decision_summary
from sweeps import render as rn
from sweeps import report as rp
from sweeps.results_dir import BASELINES_SCHEMA, CURVES_SCHEMA, TRIALS_SCHEMA, read_results, write_tables
from trainers.checkpoint import save_checkpoint
from trainers.pathwise_config import build_network
from trainers.registry import method_config

EPISODES, HORIZON = 8, 10
RUN = {**TINY, "updates": 40}
SWEEP = {
    "sizes": [1, 4],
    "seeds": 3,
    "methods": ["hpo", "or-transformer"],
    "overrides": {"all": RUN},
    "evaluation": {"episodes": EPISODES, "horizon": HORIZON},
    "baselines": {
        "classical_best": True,
        "dp_optimal": True,
        "bound": {"time_limit": 10},
        "milp": [
            {"name": "milp-highs", "scenarios": 3, "plan_horizon": 5, "time_limit": 2},
            {"name": "milp-short", "episodes": 2, "horizon": 5, "sizes": [4]},
        ],
    },
}
D = np.array([-3, -2, -1, 0, 0, 1, 2, 3], dtype=float)  # mean 0, s.d. 2: s.e. over 8 episodes 2 / sqrt(8) = 0.7071
E = np.array([-2, -2, -1, -1, 1, 1, 2, 2], dtype=float)  # classical-best's: mean 0, s.e. sqrt(20 / 7) / sqrt(8) = 0.5976
# Against classical-best, D - E = [-1, 0, 0, 1, -1, 0, 0, 1]: s.e. sqrt(4 / 7) / sqrt(8) = 0.26726 and the 95% half-width
# t(0.975, 7) * 0.26726 = 2.364624 * 0.26726 = 0.63197 around the difference of the means.
CLASSICAL = {"family": "base-stock", "reorder_z": 0.0, "cover": 2, "order_up_to_z": 1.0, "cycle_stock": 0.0}

# (method, n, seed): status, held-out mean of the greedy opening (the sampled one is 1 higher), reason
TRIALS = {
    ("or-transformer", 1, 0): ("completed", 100.0, None),
    ("or-transformer", 1, 1): ("completed", 102.0, None),
    ("or-transformer", 1, 2): ("completed", 104.0, None),
    ("hpo", 1, 0): ("completed", 101.0, None),
    ("hpo", 1, 1): ("diverged", 110.4, "cost above the threshold"),
    ("hpo", 1, 2): ("failed", None, "RuntimeError: worker died"),
    ("or-transformer", 4, 0): ("completed", 400.0, None),
    ("or-transformer", 4, 1): ("failed", None, "OSError: disk full"),
    ("or-transformer", 4, 2): ("interrupted", None, "the sweep stopped before this trial finished; --resume continues it"),
    ("hpo", 4, 0): ("failed", None, "ValueError: a"),
    ("hpo", 4, 1): ("failed", None, "ValueError: b"),
    ("hpo", 4, 2): ("failed", None, "ValueError: c"),
}
# n -> baseline: (mean, offsets); milp-short at n = 4 runs 2 episodes x 5 decisions
BASELINES = {
    1: {"classical-best": (110.0, E), "milp-highs": (112.0, D), "dp-optimal": (99.0, D), "bound": (90.0, D)},
    4: {"classical-best": (440.0, E), "milp-highs": (440.3, D), "milp-short": (200.0, np.array([-1.0, 1.0])), "bound": (380.0, D)},
}
SOLVE_SECONDS = {1: [2.0], 4: [3.0, 5.0]}  # cycled over the decisions; build_seconds 0.5 at n = 1, 1.0 at n = 4
BUILD_SECONDS = {1: 0.5, 4: 1.0}


def evaluation(mean: float, offsets: np.ndarray, horizon: int = HORIZON) -> Evaluation:
    return Evaluation(mean + offsets, tuple(range(len(offsets))), horizon)


def write_results(root) -> None:
    """The synthetic results directory, in sweeps/runner.py's layout."""
    insts = {n: paper_instance(n, 0) for n in SWEEP["sizes"]}
    rows, curves = [], []
    for (method, n, seed), (status, mean, reason) in TRIALS.items():
        folder = root / "trials" / f"{method}-n{n}-s{seed}"
        row = {"method": method, "n": n, "seed": seed, "status": status, "reason": reason, "updates": 40, "checkpoint": None}
        if mean is not None:
            for opening, shift in (("greedy", 0.0), ("sampled", 1.0)):
                write_evaluation(folder / opening, f"{method}-{opening}", evaluation(mean + shift, D), HELDOUT_SEED, {}, instance=insts[n])
            row |= {"greedy_mean": mean, "sampled_mean": mean + 1, "checkpoint": str(folder.relative_to(root) / "checkpoint.pt")}
            if seed == 0:  # the decision time loads the first finished seed's policy
                config = method_config(method, "cpu", {**RUN, "seed": seed})
                save_checkpoint(
                    folder / "checkpoint.pt", config, insts[n], {"model": build_network(config, n).state_dict(), "update": 40}, status
                )
        rows.append(row)
        cost10 = 300.0 + 10 * seed if (method, n) == ("or-transformer", 1) else 1000.0 / (1 + seed)
        updates = 40 if status == "completed" else 20
        curves += [
            {"method": method, "n": n, "seed": seed, "update": u, "cost10": cost10, "wall_seconds": float(u)} for u in range(1, updates + 1)
        ]
    write_parquet(pa.Table.from_pylist(rows, schema=TRIALS_SCHEMA), root / "trials.parquet")
    write_parquet(pa.Table.from_pylist(curves, schema=CURVES_SCHEMA), root / "curves.parquet")
    summary_rows = []
    for n, baselines in BASELINES.items():
        for name, (mean, offsets) in baselines.items():
            horizon = 5 if name == "milp-short" else HORIZON
            tables, extra, policy, params = None, None, name, None
            if name.startswith("milp"):
                decisions = [
                    {
                        "episode": e,
                        "decision": t,
                        "open": 0,
                        "status": "optimal",
                        "solve_seconds": SOLVE_SECONDS[n][(e * horizon + t) % len(SOLVE_SECONDS[n])],
                        "build_seconds": BUILD_SECONDS[n],
                        "objective": 0.0,
                        "bound": 0.0,
                        "gap": 0.0,
                        "time_limited": False,
                        "fallback": False,
                        "rows": 1,
                        "columns": 1,
                        "nonzeros": 1,
                        "quantity": [1.0] * n,
                    }
                    for e in range(len(offsets))
                    for t in range(horizon)
                ]
                tables = {"decisions.parquet": pa.Table.from_pylist(decisions).select([*DECISION_COLUMNS, "quantity"])}
                extra = decision_summary(decisions)  # as solver_workers.solver_run.run_milp writes it
            elif name == "bound":
                policy, extra = "perfect-information-bound", {"kind": "lower-bound"}
            elif name == "classical-best":
                params = {**CLASSICAL, "tuning_mean": 1.0, "tuning_se": 0.1}
            s = write_evaluation(
                root / "baselines" / f"n{n}" / name,
                policy,
                evaluation(mean, offsets, horizon),
                HELDOUT_SEED,
                {},
                params,
                extra,
                instance=insts[n],
                tables=tables,
            )
            summary_rows.append(
                {
                    "n": n,
                    "name": name,
                    "mean": s["mean"],
                    "se": s["se"],
                    "episodes": s["episodes"],
                    "horizon": horizon,
                    "seconds_per_decision": None,
                }
            )
    write_parquet(pa.Table.from_pylist(summary_rows, schema=BASELINES_SCHEMA), root / "baselines.parquet")
    record = {
        "format": "or-transformer-platform/sweep",
        "version": 1,
        "sweep": SWEEP,
        "started": "2026-01-28T10:00:00+0000",
        **manifest(SWEEP),
        "instance_hashes": {f"n{n}": inst.content_hash() for n, inst in insts.items()},
        "finished": "2026-01-28T11:00:00+0000",
    }
    (root / "sweep.json").write_text(json.dumps(record))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep") / "results"
    write_results(root)
    return root


@pytest.fixture(scope="module")
def report(results):
    report = rp.build_report(results)
    rp.time_decisions(report, "cpu")
    return report


def cells(table: rn.Table) -> dict[tuple[str, str], str]:
    """(row's first cell, header) -> cell, with the best cell as **x** and the second as <ins>x</ins> (as in table.md)."""
    marked = {"best": "**{}**", "second": "<ins>{}</ins>"}
    return {
        (row[0], h): marked[table.styles[(i, j)]].format(c) if (i, j) in table.styles else c
        for i, row in enumerate(table.rows)
        for j, (h, c) in enumerate(zip(table.header, row))
    }


def test_cost_table_cells_by_hand(report):
    got = cells(rn.cost_table(report))
    assert rn.cost_table(report).header == [
        "n",
        "OR-Transformer",
        "HPO",
        "classical-best",
        "milp-highs",
        "milp-short",
        "dp-optimal",
        "bound",
    ]
    # n = 1: OR-Transformer's seeds 100, 102, 104: mean 102, s.e. across seeds 2 / sqrt(3) = 1.15; HPO's finished seeds 101 and
    # 110.4 (diverged): 105.7 ± 4.7; dp-optimal (99) is the best policy, OR-Transformer second; the bound is never ranked.
    assert got[("1", "OR-Transformer")] == "<ins>102.0 ± 1.2</ins>"
    assert got[("1", "HPO")] == "105.7 ± 4.7 (2 of 3 seeds; 1 failed)"
    assert got[("1", "classical-best")] == "110.00 ± 0.60"
    assert got[("1", "milp-highs")] == "112.00 ± 0.71"
    assert got[("1", "milp-short")] == "—"
    assert got[("1", "dp-optimal")] == "**99.00 ± 0.71**"
    assert got[("1", "bound")] == "90.00 ± 0.71"
    # n = 4: one finished OR-Transformer seed (its s.e. over episodes, marked †); HPO has no finished trial; milp-short ran
    # 2 episodes x 5 decisions (marked ‡, s.e. sqrt(2) / sqrt(2) = 1, not ranked although cheapest).
    assert got[("4", "OR-Transformer")] == "**400.00 ± 0.71† (1 of 3 seeds; 1 failed, 1 interrupted)**"
    assert got[("4", "HPO")] == "failed (3 of 3 seeds)"
    assert got[("4", "classical-best")] == "<ins>440.00 ± 0.60</ins>"
    assert got[("4", "milp-highs")] == "440.30 ± 0.71"
    assert got[("4", "milp-short")] == "200.0 ± 1.0‡"
    assert got[("4", "dp-optimal")] == "—"
    notes = " ".join(rn.cost_table(report).notes)
    assert "† one finished seed" in notes and "milp-short at n = 4: 2 episodes x 5 decisions" in notes
    assert "hpo-n1-s2 failed: RuntimeError: worker died" in notes and "hpo-n4-s1 failed: ValueError: b" in notes
    assert "or-transformer-n4-s2 interrupted" in notes


def test_per_item_reduction_gap_and_divergence_by_hand(report):
    per_item = cells(rn.per_item_table(report))
    assert per_item[("4", "OR-Transformer")] == "100.00 ± 0.18" and per_item[("4", "classical-best")] == "110.00 ± 0.15"
    assert per_item[("4", "HPO")] == "failed (3 of 3 seeds)"
    reduction = cells(rn.reduction_table(report))  # 1 - OR-Transformer / method
    assert [reduction[("1", h)] for h in ("HPO", "classical-best", "milp-highs", "milp-short", "dp-optimal")] == [
        "3.5%",
        "7.3%",
        "8.9%",
        "n/a",
        "-3.0%",
    ]
    assert [reduction[("4", h)] for h in ("HPO", "classical-best", "milp-highs", "milp-short", "dp-optimal")] == [
        "n/a",
        "9.1%",
        "9.2%",
        "n/a",
        "n/a",
    ]
    gap = cells(rn.gap_table(report))  # method / bound - 1
    assert [gap[("1", h)] for h in ("OR-Transformer", "HPO", "classical-best", "milp-highs", "dp-optimal")] == [
        "13.3%",
        "17.4%",
        "22.2%",
        "24.4%",
        "10.0%",
    ]
    assert [gap[("4", h)] for h in ("OR-Transformer", "HPO", "classical-best", "milp-highs", "milp-short")] == [
        "5.3%",
        "n/a",
        "15.8%",
        "15.9%",
        "n/a",
    ]
    diverged = cells(rn.diverged_table(report))
    assert diverged[("1", "HPO")] == "1 of 3 (33.3%)" and diverged[("1", "OR-Transformer")] == "0 of 3 (0.0%)"


def test_csv_holds_every_cell_with_its_numbers(report):
    rows = {(r["n"], r["column"]): r for r in csv.DictReader(rn.csv_text(report).splitlines())}
    assert len(rows) == 2 * 7
    ours = rows[("1", "or-transformer")]
    assert float(ours["mean"]) == pytest.approx(102) and float(ours["se"]) == pytest.approx(2 / math.sqrt(3)) and ours["se_over"] == "seeds"
    assert ours["rank"] == "2" and float(ours["gap_to_bound"]) == pytest.approx(102 / 90 - 1) and ours["opening"] == "greedy"
    assert (
        rows[("4", "or-transformer")]["se_over"] == "episodes of one seed"
        and rows[("4", "or-transformer")]["not_finished"] == "1 failed; 1 interrupted"
    )
    assert rows[("4", "hpo")]["cell"] == "failed (3 of 3 seeds)" and rows[("4", "hpo")]["mean"] == ""
    assert float(rows[("4", "milp-highs")]["reduction_by_or_transformer"]) == pytest.approx(1 - 400 / 440.3)
    assert rows[("4", "milp-short")]["rank"] == "" and rows[("4", "milp-short")]["horizon"] == "5"


def test_paired_comparisons_by_hand(report):
    table = rn.paired_table(report)
    got = {(r[0], r[1]): r for r in table.rows}
    assert set(got) == {
        ("1", "OR-Transformer"),
        ("1", "HPO"),
        ("1", "milp-highs"),
        ("1", "dp-optimal"),
        ("4", "OR-Transformer"),
        ("4", "HPO"),
        ("4", "milp-highs"),
        ("4", "milp-short"),
    }
    # every interval is the difference of the means ± 0.632 (above)
    assert got[("1", "OR-Transformer")][2:4] == ["3", "-8.00"] and got[("1", "OR-Transformer")][5:] == ["3 of 3", "0 of 3"]
    assert got[("1", "HPO")][2:] == [
        "2",
        "-4.30",
        "s0: -9.00 [-9.63, -8.37]; s1: +0.40 [-0.23, +1.03]",
        "1 of 2",
        "0 of 2",
    ]  # 101 - 110, 110.4 - 110
    assert got[("1", "milp-highs")][2:] == ["1", "+2.00", "+2.00 [+1.37, +2.63]", "0 of 1", "1 of 1"]
    assert got[("4", "milp-highs")][3:] == ["+0.30", "+0.30 [-0.33, +0.93]", "0 of 1", "0 of 1"]
    assert got[("4", "HPO")][2:5] == ["0", "n/a", "failed (3 of 3 seeds)"]
    assert got[("4", "milp-short")][4] == "not paired: 2 episodes x 5 decisions, classical-best 8 x 10"


def test_binned_curve_by_hand():
    updates = np.arange(1, 9, dtype=float)
    falling, flat = np.array([8, 6, 4, 2, 2, 2, 2, 2.0]), np.full(8, 4.0)
    # window 2: falling -> [8, 7, 5, 3, 2, 2, 2, 2]; 3 bins over [1, 8]: edges 1, 2, 4, 8 -> {1}, {2, 3}, {4..8}
    one = rp.binned_curve([(updates, falling)], bins=3, window=2)
    np.testing.assert_allclose(one.update, [math.sqrt(2), math.sqrt(8), math.sqrt(32)])
    np.testing.assert_allclose(one.mean, [8, 6, 2.2])
    np.testing.assert_allclose(one.low, [8, 5.2, 2.0])  # 10th-90th percentile of [7, 5] and [3, 2, 2, 2, 2]
    np.testing.assert_allclose(one.high, [8, 6.8, 2.6])
    two = rp.binned_curve([(updates, falling), (updates, flat)], bins=3, window=2)
    np.testing.assert_allclose(two.mean, [6, 5, 3.1])  # per bin (8 + 4) / 2, (6 + 4) / 2, (2.2 + 4) / 2
    np.testing.assert_allclose(two.high - two.mean, [2, 1, 0.9])  # s.e. of two values a, b: |a - b| / 2
    np.testing.assert_allclose(two.low, two.mean - [2, 1, 0.9])
    np.testing.assert_array_equal(two.seeds, [2, 2, 2])


def test_figure_one_conventions_on_the_results(report):
    """OR-Transformer at n = 1: three constant curves (300, 310, 320) over updates 1..40 in the default 24 log bins."""
    binned = rp.binned_curve(rp.seed_curves(report.results, report.entries[(1, "or-transformer")]))
    np.testing.assert_allclose(binned.mean, 310)
    np.testing.assert_allclose(binned.high - binned.mean, 10 / math.sqrt(3))
    step = 40 ** (1 / 24)  # edges 40^(j/24); centres the geometric means of consecutive edges
    assert binned.update[0] == pytest.approx(math.sqrt(step)) and binned.update[-1] == pytest.approx(40 / math.sqrt(step))
    # edges 1, 1.166, 1.360, 1.586, 1.849, 2.157, 2.515, 2.933, 3.420, 3.988, 4.651, ...: update 1 is in bin 0, 2 in bin 4, 3 in
    # bin 7, and 4..40 fill bins 9..23 (from bin 9 on every bin is wider than one update): 18 bins are not empty
    assert len(binned.update) == 18
    # only finished seeds: HPO at n = 1 has seeds 0 (40 updates) and 1 (diverged, 20), not the failed seed 2
    assert [len(u) for u, _ in rp.seed_curves(report.results, report.entries[(1, "hpo")])] == [40, 20]


def test_reference_lines_are_the_first_ten_held_out_decisions(report):
    inst = paper_instance(1, 0)
    tinst = inst.to_torch()
    # classical-best from its stored parameters: the first 10 steps of a 50-step traced evaluation, discounted
    policy = make_policy(tinst, RULES[CLASSICAL["family"]], {k: v for k, v in CLASSICAL.items() if k != "family"})
    trace = evaluate(policy, tinst, sample_paths(inst, HELDOUT_SEED, EPISODES, 50), trace=True).trace
    expected = (trace.cost[:, :10] * inst.gamma ** np.arange(10)).sum(1).mean()
    assert report.references[1]["classical-best"] == pytest.approx(expected, rel=1e-6)
    # the MILP's recorded decisions never open an order: the zero policy's cost
    zero = evaluate(zero_policy, tinst, sample_paths(inst, HELDOUT_SEED, EPISODES, 10)).mean
    assert report.references[1]["milp-highs"] == pytest.approx(zero, rel=1e-6)
    assert "milp-short" not in report.references[4] and any("milp-short at n = 4: no reference line" in n for n in report.reference_notes)


def test_decision_time_against_the_milp(results, report, monkeypatch):
    """Each learned policy is timed on one state and on the held-out batch, and the table divides each MILP's
    build + solve seconds by the one-state time. The timer is replaced by one that answers 2 ms for a call on one
    state and 50 ms for the batch, so the cells are known: 2.5 s / 2 ms = 1,250x at n = 1. Breaks if the two
    timings are swapped or the ratio is inverted or taken against the batch."""
    assert all(r["one_state"] > 0 for r in report.timings if not r["absent"])  # the real timer ran

    def timer(call, device):
        open_order, _ = call()
        return 0.002 if len(open_order) == 1 else 0.05

    monkeypatch.setattr(rp, "timed", timer)
    timed_report = rp.build_report(results)
    rp.time_decisions(timed_report, "cpu")
    rows = {(r["n"], r["column"]): r for r in timed_report.timings}
    assert set(rows) == {(1, "or-transformer"), (1, "hpo"), (4, "or-transformer"), (4, "hpo")}
    assert rows[(4, "hpo")]["absent"] == "failed (3 of 3 seeds)" and rows[(4, "hpo")]["one_state"] is None
    for key in ((1, "or-transformer"), (1, "hpo"), (4, "or-transformer")):
        assert rows[key]["one_state"] == 0.002 and rows[key]["batch"] == 0.05 and rows[key]["batch_size"] == EPISODES
    assert report.milp_times[1] == {"milp-highs": pytest.approx(2.5)}  # solve 2.0 + build 0.5
    assert report.milp_times[4] == {"milp-highs": pytest.approx(5.0), "milp-short": pytest.approx(5.0)}  # mean of 3 and 5, + 1
    table = rn.decision_table(timed_report)
    row = next(r for r in table.rows if r[:2] == ["1", "HPO"])
    assert row[2:6] == ["2 ms", f"50 ms ({EPISODES} states)", "2.5 s", "1,250x"]


def test_decision_timer_takes_the_median_of_its_repeats_after_one_warm_up(monkeypatch):
    """A clock that each call advances by a known duration: the warm-up (100 s) is not counted and the result is
    the median of the REPEATS timed calls. Breaks with a mean, a counted warm-up or a lost repeat."""
    durations = iter([100.0, 1.0, 2.0, 9.0, 3.0, 4.0, 8.0, 7.0])
    clock = [0.0]
    monkeypatch.setattr(rp.time, "perf_counter", lambda: clock[0])

    def call():
        clock[0] += next(durations)

    assert rp.REPEATS == 7 and rp.timed(call, "cpu") == 4.0
    assert next(durations, None) is None


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.sources, self.links, self.cells, self.text, self._cell = [], [], [], [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.sources.append(attrs.get("src", ""))
        self.links += [v for k, v in attrs.items() if k in ("src", "href") and tag != "img"]
        if tag == "td":
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "td":
            self.cells.append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def test_outputs_and_the_self_contained_page(report, tmp_path):
    written = rn.write_report(report, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        ["table.md", "table.csv", "curves.png", "curves.svg", "decision_time.png", "index.html"]
    )
    assert written["curves.png"].read_bytes().startswith(b"\x89PNG") and b"<svg" in written["curves.svg"].read_bytes()
    md = written["table.md"].read_text()
    assert "| 1 | <ins>102.0 ± 1.2</ins> | 105.7 ± 4.7 (2 of 3 seeds; 1 failed) |" in md and "(greedy opening)" in md
    page = Page()
    page.feed(written["index.html"].read_text())
    page.close()
    assert len(page.sources) == 2 and all(s.startswith("data:image/png;base64,") for s in page.sources)
    assert page.links == []  # no script, stylesheet or link to fetch
    for row in csv.DictReader(rn.csv_text(report).splitlines()):
        assert row["cell"] in page.cells, row["cell"]
    text = "".join(page.text)
    assert report.results.record["git_commit"] in text and "2026-01-28T11:00:00+0000" in text and "milp-short" in text


def test_sampled_opening_is_selectable_and_stated(results):
    sampled = rp.build_report(results, opening="sampled")
    table = rn.cost_table(sampled)
    assert "(sampled opening)" in table.title and cells(table)[("1", "OR-Transformer")] == "<ins>103.0 ± 1.2</ins>"
    with pytest.raises(InputError, match="opening: expected one of"):
        rp.build_report(results, opening="best")


def test_results_markdown_writes_the_command_above_each_table(report, tmp_path, monkeypatch):
    """docs/results.md holds the headline, the cost table and the paired comparisons and, with the decomposition bound
    in the sweep, each policy's distance above the tightest bound and the paired differences to its relaxed policies with
    the hand-worked row of test_report_pairs_every_policy_with_the_decomposition_bound."""
    command = "python platform/report.py results/quick --out results/quick/report --markdown docs/results.md"
    shown = [
        "Headline: the best policy of each size",
        "Mean discounted cost over 10 decisions (greedy opening)",
        "Paired comparisons against classical-best",
    ]
    for sweep_report, titles in (
        (report, shown),
        (
            decomposition_report(tmp_path, monkeypatch),
            [
                *shown[:2],
                "Distance above the tightest lower bound (mean / bound - 1; one-sided 95% figure)",
                shown[2],
                "Paired difference to the decomposition bound's relaxed policies",
            ],
        ),
    ):
        sections = rn.results_markdown(sweep_report, command).split("## ")[1:]
        assert [s.splitlines()[0] for s in sections] == titles
        for section in sections:
            assert section.index("--markdown docs/results.md") < section.index("| n |")
    assert "| 1 | classical-best | 1 | +15.00 (15.8%) | +15.00 [+14.37, +15.63] |" in sections[-1]


def test_bad_results_directories(results, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="holds no sweep.json: not a results directory"):
        read_results(empty)
    record = json.loads((results / "sweep.json").read_text())
    (empty / "sweep.json").write_text(json.dumps(record))
    with pytest.raises(InputError, match="has no trials.parquet: the sweep has not finished a run"):
        read_results(empty)
    (empty / "sweep.json").write_text(json.dumps(record | {"version": 3}))
    with pytest.raises(InputError, match="field 'version' is 3, this code reads version 2"):
        read_results(empty)
    (empty / "sweep.json").write_text(json.dumps(record | {"sweep": {**SWEEP, "sizes": "all"}}))
    with pytest.raises(InputError, match="field 'sweep': sweep field 'sizes'"):
        read_results(empty)


def test_a_finished_trial_without_its_evaluation_is_an_error(results, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(results, broken)
    (broken / "trials" / "hpo-n1-s1" / "greedy" / "costs.parquet").write_bytes(b"changed")
    with pytest.raises(
        InputError, match="trial hpo-n1-s1 is diverged in trials.parquet, but its greedy evaluation does not read: .*checksum"
    ):
        rp.build_report(broken)


def test_script_modes_and_errors(results, tmp_path):
    done = run_script("report.py", results, "--markdown", tmp_path / "results.md")
    assert done.returncode == 0, done.stderr
    assert "| 4 | **400.00 ± 0.71† (1 of 3 seeds; 1 failed, 1 interrupted)** | failed (3 of 3 seeds) |" in done.stdout
    assert f"report: {results / 'report' / 'index.html'}" in done.stdout and (results / "report" / "curves.svg").is_file()
    assert (
        f"python platform/report.py {results} --out {results / 'report'} --markdown {tmp_path / 'results.md'}"
        in (tmp_path / "results.md").read_text()
    )
    (tmp_path / "nothing").mkdir()
    for args, message in (
        ([tmp_path / "nothing"], "holds neither sweep.json (a results directory of platform/sweep.py) nor summary.json"),
        ([results, "--bound", results], "--bound compares evaluation folders"),
    ):
        bad = run_script("report.py", *args)
        assert bad.returncode == 2 and bad.stderr.startswith("error: ") and message in bad.stderr and "Traceback" not in bad.stderr, (
            bad.stderr
        )


def test_an_existing_report_is_replaced_only_with_overwrite(results, tmp_path):
    """A report folder that holds a report and an existing --markdown file are refused (and left as they were) unless
    --overwrite is given, which writes the report again."""
    out, notes = tmp_path / "report", tmp_path / "notes.md"
    assert run_script("report.py", results, "--out", out).returncode == 0
    page = (out / "index.html").read_bytes()
    again = run_script("report.py", results, "--out", out)
    assert again.returncode == 2 and f"--out '{out}' holds a report (" in again.stderr and "--overwrite" in again.stderr, again.stderr
    notes.write_text("mine")
    markdown = run_script("report.py", results, "--out", tmp_path / "other", "--markdown", notes)
    assert markdown.returncode == 2 and f"--markdown '{notes}' exists" in markdown.stderr and notes.read_text() == "mine"
    assert (out / "index.html").read_bytes() == page and not (tmp_path / "other").exists()
    replaced = run_script("report.py", results, "--out", out, "--markdown", notes, "--overwrite")
    assert replaced.returncode == 0 and "| 4 |" in notes.read_text(), replaced.stderr


def test_a_fifth_method_in_the_registry_reaches_the_report_and_the_dry_run(tmp_path, monkeypatch):
    """Registering a method is the only edit: its label, column and throughput come from trainers.registry.
    The fake method trains like OR-Transformer (its family's config accepts the name); sweeps.spec reads
    the registry's names when it is imported, so they are re-read here as a new import would."""
    from sweeps import spec as spec_module
    from sweeps.runner import dry_run, training_hours
    from sweeps.spec import SweepSpec
    from trainers import pathwise_config, registry

    monkeypatch.setitem(
        registry.METHODS, "fake", registry.Method("fake", "pathwise", fixed_size=False, label="Fake-Former", throughput=1000.0)
    )
    monkeypatch.setattr(pathwise_config, "METHODS", (*pathwise_config.METHODS, "fake"))
    monkeypatch.setattr(spec_module, "METHOD_NAMES", tuple(registry.METHODS))
    # the dry run: 1000 updates x 64 rollouts x 10 steps at 1000 transitions/s is 640 s at n = 1, and twice that at n = 32
    # (the throughput taken as inversely proportional to n above 16): 1920 s = 0.533 learner-hours
    spec = SweepSpec.from_dict(
        {
            "sizes": [1, 32],
            "seeds": 1,
            "methods": ["fake"],
            "overrides": {"fake": {"updates": 1000, "batch": 64}},
            "baselines": {"classical_best": False, "dp_optimal": False},
        }
    )
    assert sum(training_hours(spec, t) for t in spec.trials()) == pytest.approx(1920 / 3600)
    lines = dry_run(spec, [{"CPU": 2.0, "GPU": 0.0}])
    assert "  fake: 1 CPU, 0 GPU per trial (1 Ray Train workers)" in lines and any("about 0.5 learner-hours" in line for line in lines)
    # the report: HPO's only seed failed, the fake method's finished with the costs 50 + D
    sweep = {
        "sizes": [1],
        "seeds": 1,
        "methods": ["fake", "hpo"],
        "overrides": {"all": RUN},
        "evaluation": {"episodes": EPISODES, "horizon": HORIZON},
        "baselines": {"classical_best": False, "dp_optimal": False},
    }
    root, inst = tmp_path / "results", paper_instance(1, 0)
    folder = root / "trials" / "fake-n1-s0"
    for opening in ("greedy", "sampled"):
        write_evaluation(folder / opening, f"fake-{opening}", evaluation(50.0, D), HELDOUT_SEED, {}, instance=inst)
    config = method_config("fake", "cpu", {**RUN, "seed": 0})
    save_checkpoint(folder / "checkpoint.pt", config, inst, {"model": build_network(config, 1).state_dict(), "update": 40}, "completed")
    rows = [
        {"method": "fake", "n": 1, "seed": 0, "status": "completed", "updates": 40, "greedy_mean": 50.0},
        {"method": "hpo", "n": 1, "seed": 0, "status": "failed", "reason": "ValueError: a", "updates": 3},
    ]
    write_parquet(pa.Table.from_pylist(rows, schema=TRIALS_SCHEMA), root / "trials.parquet")
    write_parquet(CURVES_SCHEMA.empty_table(), root / "curves.parquet")
    write_parquet(BASELINES_SCHEMA.empty_table(), root / "baselines.parquet")
    record = {
        "format": "or-transformer-platform/sweep",
        "version": 1,
        "sweep": sweep,
        **manifest(sweep),
        "instance_hashes": {"n1": inst.content_hash()},
    }
    (root / "sweep.json").write_text(json.dumps(record))
    report = rp.build_report(root)
    rp.time_decisions(report, "cpu")
    assert report.columns == [("hpo", "learned"), ("fake", "learned")]  # the registry's order: the new method last
    table = rn.cost_table(report)
    assert table.header == ["n", "HPO", "Fake-Former"]
    assert cells(table) == {("1", "n"): "1", ("1", "HPO"): "failed (1 of 1 seeds)", ("1", "Fake-Former"): "**50.00 ± 0.71†**"}
    timing = next(r for r in report.timings if r["column"] == "fake")
    assert math.isfinite(timing["one_state"]) and timing["one_state"] > 0 and timing["batch_size"] == EPISODES
    assert [r[:2] for r in rn.decision_table(report).rows] == [["1", "HPO"], ["1", "Fake-Former"]]


def test_milp_seconds_per_decision_is_build_plus_solve_in_the_table_and_the_report(results, report, tmp_path):
    """The hand-made decision rows above: n = 1 solves in 2 s and builds in 0.5 s (2.5 s per decision); n = 4 solves in 3 s
    and 5 s alternately and builds in 1 s (5 s). baselines.parquet, rebuilt by the sweep's writer, holds the same numbers
    as the report's decision-time table; the baselines without decisions.parquet have none."""
    copy = tmp_path / "results"
    shutil.copytree(results, copy)
    write_tables(read_results(copy).spec, copy, {})
    table = {(r["n"], r["name"]): r["seconds_per_decision"] for r in pq.read_table(copy / "baselines.parquet").to_pylist()}
    assert table == {
        (1, "classical-best"): None,
        (1, "milp-highs"): pytest.approx(2.5),
        (1, "dp-optimal"): None,
        (1, "bound"): None,
        (4, "classical-best"): None,
        (4, "milp-highs"): pytest.approx(5.0),
        (4, "milp-short"): pytest.approx(5.0),
        (4, "bound"): None,
    }
    assert {(n, m): t for n, times in report.milp_times.items() for m, t in times.items()} == {
        k: v for k, v in table.items() if v is not None
    }


def decomposition_report(tmp_path, monkeypatch):
    """This module's synthetic results directory with a decomposition bound of hand-chosen per-episode costs 95 + D
    (n = 1) and 390 + D (n = 4), DP value 96.0, conservatively 94.5; its report."""
    from envs.exogenous import HELDOUT_SEED
    from run_results.records import write_evaluation
    from sweeps import report as rp

    monkeypatch.setitem(SWEEP, "baselines", {**SWEEP["baselines"], "decomposition": {"factor_points": 41, "coarse_points": 21}})
    root = tmp_path / "results"
    write_results(root)
    figures = {
        "dp_value": 96.0,
        "conservative_value": 94.5,
        "equal_shares": {"value": 93.0, "conservative": 91.0},
        "cumulative_cost": [float(10 * (t + 1)) for t in range(HORIZON)],
    }
    for n, mean in ((1, 95.0), (4, 390.0)):
        write_evaluation(
            root / "baselines" / f"n{n}" / "decomposition-bound",
            "decomposition-bound",
            evaluation(mean, D),
            HELDOUT_SEED,
            {},
            None,
            {"kind": "lower-bound", **figures},
            instance=paper_instance(n, 0),
        )
    return rp.build_report(root)


def test_report_pairs_every_policy_with_the_decomposition_bound(tmp_path, monkeypatch):
    """decomposition_report: classical-best (110 + E) is 15 above the relaxed policies (95 + D) at n = 1,
    E - D = [1, 0, 0, -1, 1, 0, 0, -1], so the 95% half-width is t(0.975, 7) sqrt(4 / 7) / sqrt(8) = 0.63197
    (as in test_paired_comparisons_by_hand); 15 / 95 = 15.8%. The Figure 1 line is the bound's mean cumulative cost at the 10th decision."""
    import csv

    from sweeps import render as rn

    report = decomposition_report(tmp_path, monkeypatch)
    assert ("decomposition-bound", "bound") in report.columns and all(e.column != "decomposition-bound" for e in report.ranked(1))
    gaps = {(r["n"], r["column"]): r for r in report.relaxed_differences}
    ((_, classical),) = gaps[(1, "classical-best")]["paired"]
    assert classical.mean_difference == pytest.approx(15.0) and classical.ci_high - 15.0 == pytest.approx(0.63197, abs=1e-5)
    table = rn.relaxed_difference_table(report)
    row = next(r for r in table.rows if r[0] == "1" and r[1] == "classical-best")
    assert row[3] == "+15.00 (15.8%)" and row[4] == "+15.00 [+14.37, +15.63]"
    assert report.references[1]["decomposition-bound"] == 100.0
    assert any("the bound is its DP value 96.0, conservatively 94.5 at the best split" in note for note in rn.cost_table(report).notes)
    rows = {(r["n"], r["column"]): r for r in csv.DictReader(rn.csv_text(report).splitlines())}
    assert float(rows[("1", "classical-best")]["paired_difference_share"]) == pytest.approx(15.0 / 95.0)


def test_the_page_the_csv_and_the_docs_give_the_paired_difference_one_definition(tmp_path, monkeypatch):
    """The relaxed policies' paired difference and the bound (the DP value) are two figures, named by their definition
    (policies.decomposition.PAIRED_DIFFERENCE) in the page, in docs/methods.md, and with the same numbers in the
    page and table.csv: catches the page calling the paired figure "how much any policy could still gain, at most"
    while its DP value says otherwise, and a CSV column that holds another figure than the page."""
    import csv
    import html

    from policies.decomposition import PAIRED_DIFFERENCE
    from sweeps import render as rn

    report = decomposition_report(tmp_path, monkeypatch)
    written = rn.write_report(report, tmp_path / "out")
    page = html.unescape(written["index.html"].read_text())
    assert PAIRED_DIFFERENCE in page and "could still gain" not in page
    methods = " ".join((ROOT / "docs" / "methods.md").read_text().split())
    assert PAIRED_DIFFERENCE in methods
    rows = {(r["n"], r["column"]): r for r in csv.DictReader(written["table.csv"].read_text().splitlines())}
    classical = rows[("1", "classical-best")]
    assert float(classical["paired_difference_to_relaxed_policies"]) == pytest.approx(15.0)
    assert (
        classical["paired_difference_ci"] == "+15.00 [+14.37, +15.63]"
        and classical["decomposition_bound"] == "DP value 96.0, conservatively 94.5"
    )
    row = next(r for r in rn.relaxed_difference_table(report).rows if r[:2] == ["1", "classical-best"])
    assert row[3] == "+15.00 (15.8%)" and row[4] == classical["paired_difference_ci"] and row[7] == classical["decomposition_bound"]
    assert all(f"<td>{cell}</td>" in page for cell in row)  # the page shows the table's row, numbers and bound alike


def test_headline_names_each_size_best_policy_with_its_paired_gaps(report, tmp_path, monkeypatch):
    """decomposition_report by hand: at n = 1 dp-optimal (99 + D) is the cheapest policy, -11 against classical-best
    (110 + E; half-width 0.63197, above) and +4 above the relaxed policies (95 + D: the same offsets, so no spread),
    4 / 95 = 4.2%; at n = 4 OR-Transformer's one finished seed (400 + D) is, -40 and +10 (10 / 390 = 2.6%), while
    milp-short's 200 on its own episodes is not ranked. Catches a headline that ranks the bound or a policy off the
    held-out set, pairs against the wrong reference, or drops the bound's DP value."""
    from sweeps import render as rn

    table = rn.headline_table(decomposition_report(tmp_path, monkeypatch))
    assert table.title == rn.HEADLINE and rn.tables(decomposition_report(tmp_path, monkeypatch))[0].title == rn.HEADLINE
    one, four = table.rows
    assert one[:2] == ["1", "dp-optimal"] and one[3] == "-11.00 (-11.00 [-11.63, -10.37])"
    assert one[4] == "+4.00 (+4.00 [+4.00, +4.00]) (4.2%)" and one[5] == "DP value 96.0, conservatively 94.5"
    assert four[:2] == ["4", "OR-Transformer"] and four[3] == "-40.00 (s0: -40.00 [-40.63, -39.37])"
    assert four[4] == "+10.00 (s0: +10.00 [+10.00, +10.00]) (2.6%)"
    without_bound = rn.headline_table(report)  # a sweep without the decomposition bound: no columns for it
    assert without_bound.header == ["n", "best policy", "mean", "- classical-best (95% CI of each seed)"]
    assert [row[:2] for row in without_bound.rows] == [["1", "dp-optimal"], ["4", "OR-Transformer"]]
    assert "bound's" not in without_bound.intro


def test_the_tightest_bound_is_the_highest_valid_figure_named_and_each_policy_is_placed_above_it(tmp_path, monkeypatch):
    """sweeps.report.tightest_bounds by hand on decomposition_report (DP value 96.0 at both sizes, no schedule recorded): the
    constant split's 96.0; with a schedule figure 96.8 that one; at n = 1 dp-optimal's exact optimum 97.5 above both, its
    relaxation (97.0, the caps raised) where caps are fractional, and nothing from an item DP on a coarse lattice (an
    approximation, not a bound). The headline's distance: dp-optimal's 99 (s.e. 2 / sqrt(8)) / 97.5 - 1 = +1.54%, one-sided
    95% (99 + 1.6449 x 0.70711) / 97.5 - 1 = +2.73%. Catches a report that quotes a weaker bound than it holds, names the
    wrong relaxation, or takes a coarse-lattice value for a bound."""
    from sweeps import render as rn
    from sweeps.report import tightest_bounds

    report = decomposition_report(tmp_path, monkeypatch)
    assert report.tightest == {n: {"value": 96.0, "relaxation": "constant split"} for n in (1, 4)}
    for n in (1, 4):
        report.entries[(n, "decomposition-bound")].runs[0].summary["tightest_bound"] = {
            "value": 96.8,
            "relaxation": "shares by period and factor",
        }
    exact = report.entries[(1, "dp-optimal")].runs[0].summary
    for parameters, expected in (
        ({"expected_cost": 97.5, "exact": True}, {"value": 97.5, "relaxation": "exact optimum"}),
        ({"expected_cost": 97.9, "exact": False, "relaxed_expected_cost": 97.0}, {"value": 97.0, "relaxation": "exact optimum"}),
        ({"expected_cost": 97.5, "exact_lattice": False}, {"value": 96.8, "relaxation": "shares by period and factor"}),
    ):
        exact["parameters"] = parameters
        tightest = tightest_bounds(report.results, report.entries)
        assert tightest == {1: expected, 4: {"value": 96.8, "relaxation": "shares by period and factor"}}, parameters
    exact["parameters"] = {"expected_cost": 97.5, "exact": True}
    report.tightest = tightest_bounds(report.results, report.entries)
    one = rn.headline_table(report).rows[0]
    assert one[1] == "dp-optimal" and one[-2:] == ["97.5 (exact optimum)", "+1.54% (95% at most +2.73%)"]
    table = rn.tightest_table(report)
    assert table.rows[0][:2] == ["1", "97.5 (exact optimum)"] and table.rows[1][1] == "96.8 (shares by period and factor)"


def test_a_learned_method_s_distance_to_the_bound_keeps_the_episodes_luck():
    """Seeds evaluated on the same held-out episodes share those episodes' luck, which the spread across seeds leaves out:
    two seeds of means 100 and 102 (s.e. across seeds 1) with s.e. 3 and 5 over the episodes estimate their expected cost
    with s.e. hypot(4, 1) = 4.123, not 1; a baseline's is its s.e. over episodes. Catches a one-sided 95% figure below zero
    for a learned method whose held-out mean fell below the bound by the episodes' luck (seen at n = 1 of `make run`)."""
    from pathlib import Path

    from sweeps.report import Entry, Run

    def run(mean, se):
        return Run(0, Path("."), {"summary": {"mean": mean, "se": se}})

    learned = Entry(1, "hpo", "learned", [run(100.0, 3.0), run(102.0, 5.0)])
    assert learned.se == pytest.approx(1.0) and learned.expected_cost_se == pytest.approx(math.hypot(4.0, 1.0))
    baseline = Entry(1, "classical-best", "baseline", [run(110.0, 2.5)])
    assert baseline.expected_cost_se == baseline.se == 2.5
