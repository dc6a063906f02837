"""The layers of docs/README.md's layout, read from the source (every import, at a module's top or inside a function):
envs/ is the environment alone, no library module imports the scripts' command-line helpers, Ray is reached from the
layers that run on it, its private modules through ray_access/private.py alone, and no module imports itself back."""

from __future__ import annotations

import ast

import pytest
from helpers import ROOT, import_circle, module_imports

LIBRARY = (
    "plumbing", "envs", "run_results", "demand", "policies", "ray_access", "trainers", "solver_workers", "catalogue", "sweeps", "serving",
)  # fmt: skip
"""The packages, bottom first; platform/ (the scripts) and bench/ sit above them."""
COMMAND_LINE = ("cli",)
"""The scripts' shared parser and their --out checks: for platform/ and bench/ alone."""
ENVIRONMENT_MAY_IMPORT = ("envs", "plumbing.errors", "plumbing.validate", "plumbing.files", "plumbing.tables")
"""The project's modules envs/ may import."""
WITHOUT_RAY = ("plumbing", "envs", "run_results", "demand", "policies")


def project_modules(imported: set[str]) -> set[str]:
    """The project's modules among `imported` (a bare package name, as in `from plumbing import validate`, is left to
    the module it names)."""
    return {name for name in imported if "." in name and name.split(".")[0] in LIBRARY}


def outside(imported: set[str], allowed: tuple[str, ...]) -> set[str]:
    """The project's modules among `imported` that are none of `allowed` nor inside one of them."""
    return {name for name in project_modules(imported) if not any(name == a or name.startswith(f"{a}.") for a in allowed)}


def test_envs_is_the_environment_alone():
    """Every module of envs/ imports only envs/ and plumbing's errors, checks and files: not the demand model, the
    policies, the trainers, the command line, nor Ray, RLlib or a solver."""
    for module, imported in module_imports("envs").items():
        assert outside(imported, ENVIRONMENT_MAY_IMPORT) == set(), module
        assert not {name.split(".")[0] for name in imported} & {"ray", "gurobipy", "highspy"}, module


FILE_PLUMBING = ("hashlib", "pyarrow.csv", "pyarrow.parquet")
"""What reads or writes files for a run: hashes, CSV and Parquet tables (run_results/ and plumbing/ hold them)."""


def test_envs_reads_no_table_and_writes_no_results_folder():
    """envs/ holds no results module and imports no file hashing nor CSV/Parquet reader or writer: those are plumbing's
        (tables, hashes) and run_results/'s (run folders). Its one hash is an instance's content hash (envs.instance, which
        hashes its canonical JSON, not a file; an item table is built there as an in-memory pyarrow Table, written by
    plumbing)."""
    assert not (ROOT / "envs" / "results.py").exists() and (ROOT / "run_results" / "records.py").exists()
    for module, imported in module_imports("envs").items():
        found = {name for name in imported if name in FILE_PLUMBING}
        assert found <= ({"hashlib"} if module == "envs.instance" else set()), module


def test_no_library_module_imports_the_command_line_helpers():
    for package in LIBRARY:
        for module, imported in module_imports(package).items():
            assert not {name for name in imported if name.split(".")[0] in COMMAND_LINE}, module


def test_ray_is_reached_from_the_layers_that_run_on_it_and_its_private_modules_through_one_door():
    for package in LIBRARY:
        for module, imported in module_imports(package).items():
            roots = {name.split(".")[0] for name in imported}
            if package in WITHOUT_RAY:
                assert not roots & {"ray", "ray_access"}, module
            if module != "ray_access.private":
                assert not {name for name in imported if name.startswith(("ray._private", "ray._raylet"))}, module


def test_the_library_s_modules_import_each_other_without_a_circle():
    graph = {}
    for package in LIBRARY:
        modules = {f"{package}.{path.stem}" for path in (ROOT / package).glob("*.py")}
        assert modules, package
        graph |= module_imports(package)
    everything = set(graph)
    graph = {module: imported & everything for module, imported in graph.items()}
    assert "trainers.rllib_ppo" in graph["trainers.registry"]  # the graph sees lazy imports
    assert import_circle(graph) is None, " -> ".join(import_circle(graph))


def test_plumbing_imports_nothing_of_the_project_s_but_itself():
    for module, imported in module_imports("plumbing").items():
        assert outside(imported, ("plumbing",)) == set(), module


@pytest.mark.parametrize(
    ("source", "rule"),
    [
        ("from demand.fitting import fit_instance\n", "environment"),
        ("def f():\n    import ray\n", "environment"),
        ("from cli.scripts import script_parser\n", "command line"),
        ("import cli.output_folders\n", "command line"),
    ],
)
def test_the_rules_see_a_forbidden_import_the_controls(tmp_path, source, rule):
    """A module of a made-up envs/ that imports the demand model, Ray (inside a function) or the scripts' parser
    breaks the rule that the tests above check."""
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "bad.py").write_text(source)
    imported = module_imports("envs", tmp_path)["envs.bad"]
    broken = {
        "environment": bool(outside(imported, ENVIRONMENT_MAY_IMPORT)) or "ray" in {name.split(".")[0] for name in imported},
        "command line": any(name.split(".")[0] in COMMAND_LINE for name in imported),
    }
    assert broken[rule]


PARSER = "policies/names.py"
NAME_PREDICATES = ("is_lookahead", "is_checkpoint", "is_policy_name", "policy_path", "policy_name")
"""What parsed a policy's name again wherever it went; a name is parsed once, by policies.names.parse_policy."""


def name_parsing(source: str) -> list[str]:
    """The places in `source` that parse a policy name outside the parser: a call of a name predicate, or a test of a
    prefix (`x.startswith(CHECKPOINT_PREFIX)`, `x.startswith("checkpoint:")`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if called in NAME_PREDICATES:
                found.append(f"line {node.lineno}: {called}()")
            if called == "startswith" and node.args:
                argument = node.args[0]
                text = ast.unparse(argument)
                if text in ("CHECKPOINT_PREFIX", "TABLES_PREFIX") or text.strip("'\"") in ("checkpoint:", "decomposition-lookahead:"):
                    found.append(f"line {node.lineno}: startswith({text})")
    return found


def test_a_policy_name_is_parsed_by_the_parser_alone():
    """No module of the library, the scripts or the benchmarks parses a policy name but policies/names.py: each takes
    a PolicySpec. The controls: made-up code that tests a prefix, or calls a predicate of old, is seen."""
    sources = [path for folder in (*LIBRARY, "cli", "platform", "bench") for path in sorted((ROOT / folder).glob("*.py"))]
    parsing = {str(path.relative_to(ROOT)): name_parsing(path.read_text()) for path in sources}
    del parsing[PARSER]
    assert {path: found for path, found in parsing.items() if found} == {}
    assert name_parsing("if name.startswith(CHECKPOINT_PREFIX):\n    pass\n") and name_parsing("is_lookahead(name)\n")


def shared_names(files: list[str]) -> dict[str, list[str]]:
    """The file names (not __init__.py) that more than one of `files` (paths from the repository's root) carries."""
    folders: dict[str, list[str]] = {}
    for path in sorted(files):
        folder, _, name = path.rpartition("/")
        if name != "__init__.py":
            folders.setdefault(name, []).append(folder)
    return {name: where for name, where in folders.items() if len(where) > 1}


def test_a_file_name_says_its_job_without_its_folder():
    """No two modules of the library or of cli/ share a file name (a script in platform/ and a benchmark in bench/ may
    share one with the module whose job they run or measure: README's layout). A made-up copy of a demand module in
    policies/ is the control."""
    files = [str(p.relative_to(ROOT)) for top in (*LIBRARY, *COMMAND_LINE) for p in (ROOT / top).rglob("*.py")]
    assert shared_names(files) == {}
    assert shared_names([*files, "policies/moment_estimator.py"]) == {"moment_estimator.py": ["demand", "policies"]}


def test_the_named_policies_live_among_the_policies():
    """Policies made by name (a tuned rule, the DP optimum, the lookahead) are made in policies/named_policies.py, which
    imports no trainer: the resolver and the warm start's teacher (trainers/) call it, they do not hold it."""
    imports = module_imports("policies")
    assert "policies.named_policies" in imports and not (ROOT / "trainers" / "named_policies.py").exists()
    assert outside(imports["policies.named_policies"], ("envs", "policies", "plumbing")) == set()


def test_a_policy_s_kind_is_compared_as_its_type_not_as_text():
    """PolicySpec.kind is a policies.names.PolicyKind: no module compares a kind with its text ("dp", "rule", "lookahead",
    "checkpoint"), which a renamed kind would silently stop matching."""
    import re

    pattern = re.compile(r"""kind\s*[!=]=\s*["'](dp|rule|lookahead|checkpoint)["']""")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for package in (*LIBRARY, "platform", "bench")
        for path in (ROOT / package).glob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []


LAW_MODULE = "envs/demand_law.py"
LAW_CALLS = ("poisson", "gamma", "_standard_gamma", "gammaln", "betainc", "pdtr")
"""Calls that draw a demand or evaluate its probability: NumPy's and torch's samplers, scipy's special functions."""
SCIPY_LAWS = ("poisson", "nbinom")


def law_calls(source: str) -> list[str]:
    """The places in `source` that draw or evaluate a law of demand themselves: a call of a sampler or special function
    (`rng.poisson(...)`, `gammaln(...)`), scipy's laws (`stats.nbinom`, `from scipy.stats import poisson`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if called in LAW_CALLS:
                found.append(f"line {node.lineno}: {called}()")
        elif isinstance(node, ast.Attribute) and node.attr in SCIPY_LAWS and getattr(node.value, "id", None) == "stats":
            found.append(f"line {node.lineno}: stats.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scipy"):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name in SCIPY_LAWS + LAW_CALLS]
    return found


def test_the_demand_law_is_written_in_one_module():
    """No library module but envs/demand_law.py draws demand or evaluates its law (the simulators, the DP, the MILP's
    scenarios, the fit and the filter ask that module). The control: a made-up module drawing its own Poisson is seen."""
    found = {
        str(path.relative_to(ROOT)): law_calls(path.read_text())
        for package in LIBRARY
        for path in sorted((ROOT / package).glob("*.py"))
        if str(path.relative_to(ROOT)) != LAW_MODULE
    }
    assert {path: calls for path, calls in found.items() if calls} == {}
    assert (
        law_calls((ROOT / LAW_MODULE).read_text())
        and law_calls("demand = rng.poisson(rate)\n")
        and law_calls("from scipy.stats import nbinom\n")
    )


def name_comparisons(source: str, names: set[str]) -> list[str]:
    """The places in `source` that compare a value with the text of a policy or method name (`x == "classical-best"`,
    `m in ("hpo", "ppo")`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            texts = [
                c.value
                for o in operands
                for c in ([o] if isinstance(o, ast.Constant) else getattr(o, "elts", []))
                if isinstance(c, ast.Constant)
            ]
            found += [f"line {node.lineno}: {text!r}" for text in texts if isinstance(text, str) and text in names]
    return found


def test_policy_and_method_names_are_compared_as_types_not_as_text():
    """No module of the library, the scripts or the benchmarks compares a value with a policy's or a learned method's
    name written out: a policy is a PolicySpec (its kind, its rules), a method a trainers.config.MethodName, and the
    names live in their one table (policies/classical.py's rules, policies/names.py, trainers/config.py). The control:
    made-up code comparing with "classical-best" or "hpo" is seen."""
    from policies.classical import POLICY_NAMES
    from policies.dp_optimal import NAME as DP_OPTIMAL
    from policies.lookahead import NAME as LOOKAHEAD
    from trainers.config import MethodName

    names = {*POLICY_NAMES, DP_OPTIMAL, LOOKAHEAD, *(m.value for m in MethodName)}
    tables = {"policies/classical.py", PARSER, "trainers/config.py"}
    found = {
        str(path.relative_to(ROOT)): name_comparisons(path.read_text(), names)
        for folder in (*LIBRARY, "platform", "bench")
        for path in sorted((ROOT / folder).glob("*.py"))
        if str(path.relative_to(ROOT)) not in tables
    }
    assert {path: where for path, where in found.items() if where} == {}
    assert name_comparisons('if name == "classical-best":\n    pass\n', names)
    assert name_comparisons('ok = method in ("hpo", "ppo")\n', names)
