"""A catalogue (catalogue/): a supplier's JRP cut from the catalogue against the same items built by hand, the supplier
table's and the items' refusals, and the one command's flow on a small catalogue: its figures against the same
commands run one by one, a re-run that keeps whole suppliers, other inputs refused."""

import json

import numpy as np
import pyarrow.csv
import pytest

from catalogue.suppliers import item_suppliers, read_suppliers, supplier_instance, supplier_instances
from envs.instance import Instance, paper_instance
from plumbing.errors import InputError

CATALOGUE = Instance(
    h=np.array([1.0, 2.0, 1.5]), b=np.array([9.0, 8.0, 7.0]), lam=np.array([3.0, 5.0, 2.0]), beta=None,
    loadings=np.array([[0.3, -0.2], [0.1, 0.4], [-0.5, 0.0]]), lead=np.array([1.0, 2.0, 3.0]), qbar=np.array([12.0, 20.0, 9.0]),
    K=0.0, gamma=0.95, rho=0.6, overdispersion=np.array([0.0, 0.5, 1.0]), source={"item_names": ["a", "b", "c"], "step": "1 day"},
)  # fmt: skip


def test_a_supplier_s_jrp_is_its_items_instance_built_by_hand():
    """Items a and c from a supplier with K = 25 and lead 2 for all its items: the instance written out by hand from
    the catalogue's rows (same content hash, names and supplier); the control, the same items with their own leads,
    differs."""
    cut = supplier_instance(CATALOGUE, np.array([0, 2]), "north", 25.0, 2.0)
    by_hand = Instance(
        h=np.array([1.0, 1.5]), b=np.array([9.0, 7.0]), lam=np.array([3.0, 2.0]), beta=None, loadings=np.array([[0.3, -0.2], [-0.5, 0.0]]),
        lead=np.array([2.0, 2.0]), qbar=np.array([12.0, 9.0]), K=25.0, gamma=0.95, rho=0.6, overdispersion=np.array([0.0, 1.0]),
    )  # fmt: skip
    assert cut.content_hash() == by_hand.content_hash()
    assert cut.item_names == ["a", "c"] and cut.source["supplier"] == "north" and cut.source["step"] == "1 day"
    own_leads = supplier_instance(CATALOGUE, np.array([0, 2]), "north", 25.0, float("nan"))
    assert own_leads.lead.tolist() == [1.0, 3.0] and own_leads.content_hash() != by_hand.content_hash()


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_suppliers_cut_the_catalogue_in_the_table_s_order(tmp_path):
    table = read_suppliers(write(tmp_path, "s.csv", "supplier,K,lead\nsouth,10,\nnorth,25,2\nidle,5,\n"))
    cut = supplier_instances(CATALOGUE, ["north", "south", "north"], table)
    assert list(cut) == ["south", "north"]  # idle has no items
    assert cut["south"].item_names == ["b"] and cut["south"].K == 10.0 and cut["south"].lead.tolist() == [2.0]
    assert cut["north"].item_names == ["a", "c"] and cut["north"].lead.tolist() == [2.0, 2.0]


def test_a_supplier_s_folder_is_its_name_where_the_name_is_safe_and_never_shared():
    from catalogue.folders import folder_name

    assert folder_name("north-mill_2.0") == "north-mill_2.0"
    assert folder_name("a/b") != folder_name("a_b") and folder_name("a/b").startswith("a_b-")
    assert folder_name("..") not in (".", "..") and "/" not in folder_name("../x") and folder_name("Müller") != folder_name("M_ller")


@pytest.mark.parametrize(
    "text, message",
    [
        ("supplier,K\nnorth,\n", r"row 1 \(supplier 'north'\): K is missing"),
        ("supplier,K\nnorth,-3\n", r"row 1 \(supplier 'north'\): K"),
        ("supplier,K\nnorth,3\nnorth,4\n", r"row 2 \(supplier 'north'\): a second row for the same supplier"),
        ("supplier,K,lead\nnorth,3,7\n", r"row 1 \(supplier 'north'\): lead: expected a whole number of periods from 1 to 4"),
        ("supplier,K,colour\nnorth,3,red\n", r"columns: expected a header line supplier,K"),
        ("supplier,K\n,3\n", r"row 1: the supplier's name is missing"),
    ],
)
def test_a_bad_supplier_table_is_refused_naming_its_row(tmp_path, text, message):
    with pytest.raises(InputError, match=message):
        read_suppliers(write(tmp_path, "s.csv", text))


def test_an_item_without_a_known_supplier_is_refused_by_name_unless_told_where_it_goes(tmp_path):
    table = read_suppliers(write(tmp_path, "s.csv", "supplier,K\nnorth,3\nrest,1\n"))
    with pytest.raises(InputError, match=r"item 'b': no supplier; name one, or give --unassigned"):
        item_suppliers(["a", "b"], ["north", None], table, "costs.csv")
    with pytest.raises(InputError, match=r"item 'b': supplier 'west' is not in the supplier table"):
        item_suppliers(["a", "b"], ["north", "west"], table, "costs.csv")
    with pytest.raises(InputError, match=r"--unassigned 'nowhere': not a supplier"):
        item_suppliers(["a", "b"], ["north", None], table, "costs.csv", "nowhere")
    assert item_suppliers(["a", "b"], ["north", ""], table, "costs.csv", "rest") == ["north", "rest"]


def test_a_running_supplier_shows_its_stage_on_the_suppliers_bar(tmp_path, ray_session):
    """StageReport writes a supplier's stage when it changes and, within one, at most once a second and at its end;
    running_stages lists the suppliers with a stage in their `.partial` folder (east has none: not running), the first
    `shown` of them; InProcessPool reports each task's count (its bar is off: the count is its own; its worker records
    its Ray node, so the test asks for the session's Ray)."""
    from catalogue.flow import StageReport, running_stages
    from catalogue.folders import PARTIAL, PROGRESS
    from policies.decomposition import DecompositionOptions
    from solver_workers.pool import InProcessPool

    north, south, east = (tmp_path / "suppliers" / name for name in ("north", "south", "east"))
    for folder in (north, south):
        folder.with_name(folder.name + PARTIAL).mkdir(parents=True)
    now = [0.0]
    report = StageReport(north.with_name("north" + PARTIAL) / PROGRESS, clock=lambda: now[0])
    report("bound, items", 1, 3)
    now[0] = 0.9
    report("bound, items", 2, 3)  # within a second of the last, not its end: not written
    assert running_stages([north, south, east]) == "north: bound, items 1/3"
    report("bound, items", 3, 3)
    StageReport(south.with_name("south" + PARTIAL) / PROGRESS)("held-out")
    assert running_stages([north, south, east]) == "north: bound, items 3/3; south: held-out"
    assert running_stages([north, south, east], shown=1) == "north: bound, items 3/3; 1 more"
    calls = []
    pool = InProcessPool(progress=False, report=lambda desc, done, total: calls.append((desc, done, total)))
    task = ("split_values", (paper_instance(1, 0), 0, [1.0], 3, 0, DecompositionOptions()))
    pool.run([task, task], lambda record: [], 3, 1, "split round 1")
    assert calls == [("split round 1", 2, 3), ("split round 1", 3, 3)]


@pytest.fixture(scope="module")
def small_catalogue(tmp_path_factory):
    """Two suppliers of one item each (paper items, one factor), 60 days of simulated demand with the user's recorded
    orders (a week's mean every 7 days), their rules: the inputs of platform/recommend.py."""
    from demand.simulation import simulate_history

    folder = tmp_path_factory.mktemp("catalogue")
    instance = paper_instance(2, seed=3)
    history, costs = simulate_history(instance, seed=5, periods=60, start="2024-01-01", names=["north-1", "south-1"])
    demand = np.asarray(history.column("demand").to_pylist())
    row = np.arange(len(demand))  # item-major: item row // 60, period row % 60
    ordered = np.where(row % 60 % 7 == 0, np.ceil(7 * instance.lam[row // 60]), 0)
    pyarrow.csv.write_csv(history.append_column("ordered", [ordered.astype(np.int64).tolist()]), folder / "history.csv")
    costs = costs.append_column("supplier", [["north", "south"]])
    pyarrow.csv.write_csv(costs, folder / "costs.csv")
    write(folder, "suppliers.csv", "supplier,K\nnorth,6\nsouth,4\n")
    write(folder, "rules.csv", "item,reorder_point,order_up_to\nnorth-1,4,12\nsouth-1,5,14\n")
    return folder


def run(folder, out, **changes):
    from catalogue.flow import CatalogueInputs, CatalogueOptions, run_catalogue

    files = {"history": folder / "history.csv", "costs": folder / "costs.csv", "suppliers": folder / "suppliers.csv"}
    inputs = CatalogueInputs(*(str(files[k]) for k in ("history", "costs", "suppliers")), str(folder / "rules.csv"))
    options = CatalogueOptions(episodes=6, horizon=8, window=10)
    return run_catalogue(inputs, out, options, {"replicates": 2} | changes, workers=2)


def test_the_one_command_equals_the_commands_one_by_one_and_resumes(ray_session, small_catalogue, tmp_path, capsys):
    """The flow (catalogue/flow.py) on two one-item suppliers: the page and each supplier's folder whole; north's
    classical-best and user-rule held-out costs are evaluate.py's (resolve and evaluate on its instance, the same seed),
    its bound is bound.py's (the pool of actors against the task's in-process pool); with one supplier's folder removed
    the re-run keeps the other (its record untouched) and runs it alone; a re-run with other settings is refused."""
    from catalogue.flow import SUPPLIER_RECORD
    from envs.evaluation import evaluate
    from envs.exogenous import sample_paths
    from policies.decomposition import DecompositionOptions
    from solver_workers.solver_run import SolverRun, decomposition_journal, run_decomposition_bound
    from trainers.resolver import resolve

    out = tmp_path / "cat"
    summary = run(small_catalogue, out)
    assert summary["complete"] and set(summary["suppliers"]) == {"north", "south"}
    page = (out / "index.html").read_text()
    assert "| north | 1 | 6 |" in (out / "catalogue.md").read_text() and "<td>north</td>" in page
    assert f"serve.py --catalogue {out}" in page and "{serve}" not in page
    north = json.loads((out / "suppliers" / "north" / SUPPLIER_RECORD).read_text())
    instance = Instance.load(out / "suppliers" / "north" / "instance.json")
    assert instance.K == 6.0 and instance.item_names == ["north-1"]
    paths = sample_paths(instance, summary["identity"]["options"]["seed"], 6, 8)
    for name, label in (("classical-best", "classical-best"), (f"user-rule:{out / 'rules' / 'north.csv'}", "user-rule")):
        alone = evaluate(resolve(name, instance, 8).policy, instance.to_torch(), paths).discounted_cost
        np.testing.assert_allclose(north["held_out_costs"][label], alone, rtol=1e-9)
    run_alone = SolverRun(tmp_path / "bound", summary["identity"]["options"]["seed"], 6, 8, 1)
    options = DecompositionOptions()
    bound = run_decomposition_bound(run_alone, instance, decomposition_journal(run_alone, instance, options), options)
    assert north["bound"]["dp_value"] == pytest.approx(bound["dp_value"], rel=1e-12)
    assert [c["b"] for c in north["backtest"]["comparisons"] if c["a"] == "user-rule"] == ["as-run"]

    kept = (out / "suppliers" / "north" / SUPPLIER_RECORD).stat().st_mtime_ns
    import shutil

    shutil.rmtree(out / "suppliers" / "south")
    again = run(small_catalogue, out)
    assert again["kept"] == {"fit": True, "suppliers": ["north"]}
    assert (out / "suppliers" / "north" / SUPPLIER_RECORD).stat().st_mtime_ns == kept
    assert again["total"]["mean"] == pytest.approx(summary["total"]["mean"], rel=1e-9)
    assert "kept 1 whole supplier folder(s) of a previous run: north" in capsys.readouterr().out
    with pytest.raises(InputError, match="holds a catalogue of other fit"):
        run(small_catalogue, out, replicates=3)
    served_by_supplier(out)


def served_by_supplier(out):
    """The catalogue's services (platform/serve.py --catalogue's applications) answer a state at /north/decide and
    /south/decide as each supplier's recommended policy answers it directly on its own instance."""
    import http.client
    import socket

    from ray import serve

    from catalogue.flow import catalogue_services
    from serving.app import REQUEST_TIMEOUT_S, ServiceConfig, application
    from serving.decisions import read_states

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    state = {"inventory": [-5.0], "in_transit": [[0.0, 0.0, 0.0]], "factor": 0.3}
    serve.start(http_options={"host": "127.0.0.1", "port": port, "request_timeout_s": REQUEST_TIMEOUT_S})
    try:
        expected, targets = {}, []
        for service in catalogue_services(out):
            config = ServiceConfig(policy=service.policy, instance=str(service.instance))
            decider = config.decider()
            route = service.route
            targets.append(serve.RunTarget(application(config, decider), name=f"catalogue-{route}", route_prefix=f"/{route}"))
            expected[route] = decider.decide(read_states(state, decider.instance, "state")).to_json(True)
        serve.run_many(targets)  # both replicas start at once; returns when both applications are running
        assert set(expected) == {"north", "south"} and expected["north"]["quantity"] != expected["south"]["quantity"]
        for route, want in expected.items():
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            connection.request("POST", f"/{route}/decide", body=json.dumps(state), headers={"Content-Type": "application/json"})
            answer = json.loads(connection.getresponse().read())
            connection.close()
            np.testing.assert_allclose(answer["quantity"], want["quantity"], rtol=1e-5)
            assert answer["open"] == want["open"]
    finally:
        serve.shutdown()


def test_simulate_history_writes_a_catalogue_s_inputs(tmp_path):
    """simulate_history.py --suppliers 2 on five paper items: blocks of 3 and 2 items with K = 10 n_s (the paper's
    K = 10 n shared by item counts), the rule of thumb s = ceil(lam (L + 1)), S = s + ceil(3 lam), and the weekly
    orders (every 7 periods, 7 lam rounded up to cases of 6) in the history's ordered column."""
    import math

    import pyarrow.csv
    from conftest import run_script

    instance = paper_instance(5, seed=2)
    instance.save(tmp_path / "inst.json")
    result = run_script(
        "simulate_history.py", "--instance", tmp_path / "inst.json", "--periods", "15", "--out", tmp_path / "h.csv",
        "--costs", tmp_path / "c.csv", "--suppliers", "2", "--supplier-table", tmp_path / "s.csv", "--rules", tmp_path / "r.csv",
        "--orders",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    costs = pyarrow.csv.read_csv(tmp_path / "c.csv").to_pydict()
    assert costs["supplier"] == ["supplier-1"] * 3 + ["supplier-2"] * 2
    assert pyarrow.csv.read_csv(tmp_path / "s.csv").to_pydict() == {"supplier": ["supplier-1", "supplier-2"], "K": [30.0, 20.0]}
    rules = pyarrow.csv.read_csv(tmp_path / "r.csv").to_pydict()
    for i in range(5):
        s = math.ceil(instance.lam[i] * (instance.lead[i] + 1))
        assert (rules["reorder_point"][i], rules["order_up_to"][i]) == (s, s + math.ceil(3 * instance.lam[i]))
    history = pyarrow.csv.read_csv(tmp_path / "h.csv").to_pydict()
    week = [6 * math.ceil(7 * lam / 6) for lam in instance.lam]
    assert history["ordered"] == [week[row // 15] if row % 15 % 7 == 0 else 0 for row in range(75)]
