"""The layering of attnlab's packages, read from the source (every import statement, also those
inside functions): low layers never import high ones, and no two packages import each other.

See the layer diagram in docs/design.md.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "attnlab"


def unit(module: str) -> str:
    """The layer a module belongs to: its top-level package or module (``attnlab.train``)."""
    return ".".join(module.split(".")[:2])


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every attnlab module ``path`` imports, resolving relative imports."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found.add(source)
            # `from attnlab import train` imports the package attnlab.train
            found.update(f"{source}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("attnlab.") and _exists(name)}


def _exists(module: str) -> bool:
    relative = Path(*module.split(".")[1:])
    return (PACKAGE / relative).is_dir() or (PACKAGE / relative).with_suffix(".py").exists()


def layer_graph() -> dict[str, set[str]]:
    """layer -> the other layers it imports."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = unit(module_name(path))
        targets = {unit(m) for m in imported_modules(path)} - {source, "attnlab"}
        graph.setdefault(source, set()).update(targets)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one layer (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for successor in graph.get(node, ()):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_is_read_from_the_source():
    graph = layer_graph()
    assert "attnlab.model" in graph["attnlab.train"]
    assert "attnlab.train" in graph["attnlab.sweep"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        frozenset({"a", "b", "c"})]


def test_the_config_is_a_leaf_and_the_model_reads_only_it():
    # The config names parts and checks each field alone; attnlab.model resolves it into parts.
    # The schedules are jax-free parts the config asks for its training rules.
    graph = layer_graph()
    assert graph["attnlab.schedules"] <= {"attnlab.errors"}
    assert graph["attnlab.dataclass_io"] <= {"attnlab.errors"}
    assert graph["attnlab.config"] <= {"attnlab.errors", "attnlab.schedules",
                                       "attnlab.dataclass_io"}
    assert graph["attnlab.model"] <= {"attnlab.errors", "attnlab.config", "attnlab.schedules"}


def test_importing_the_config_imports_no_jax():
    code = ("import sys; import attnlab.config\n"
            "print(sorted(m for m in ('jax', 'flax', 'attnlab.model') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("low", ["attnlab.model", "attnlab.data"])
def test_model_and_data_import_no_higher_layer(low):
    higher = {"attnlab.train", "attnlab.sweep", "attnlab.scaling", "attnlab.plots",
              "attnlab.cli", "attnlab.study", "attnlab.extrapolation", "attnlab.results"}
    assert layer_graph()[low] & higher == set()


def test_run_directory_and_results_modules_stay_low():
    graph = layer_graph()
    assert graph["attnlab.rundir"] <= {"attnlab.errors"}
    assert graph["attnlab.results"] <= {"attnlab.errors", "attnlab.rundir", "attnlab.config"}
    assert graph["attnlab.cli_flags"] <= {"attnlab.errors", "attnlab.cli_vocab"}
    assert graph["attnlab.cli_vocab"] == set()
    assert graph["attnlab.identity"] <= {"attnlab.config"}


def test_scaling_works_on_tables_and_imports_no_training_code_or_plots():
    # The plots draw fits (plots -> scaling); `attnlab plot` lives with them, in plots/cli.py.
    assert layer_graph()["attnlab.scaling"] & {
        "attnlab.train", "attnlab.sweep", "attnlab.model", "attnlab.data",
        "attnlab.plots"} == set()


def test_no_import_cycle_between_packages():
    assert [sorted(c) for c in cycles(layer_graph())] == []


def module_graph() -> dict[str, set[str]]:
    """module -> the attnlab modules it imports. ``from package import submodule`` is an edge
    to the submodule only: a package's ``__init__`` re-exporting its modules is no cycle."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name, targets = module_name(path), set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnlab"):
                subs = {f"{node.module}.{a.name}" for a in node.names}
                subs = {m for m in subs if _exists(m)}
                targets |= subs if len(subs) == len(node.names) else subs | {node.module}
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("attnlab.")}
        graph[name] = {m for m in targets if m != name and _exists(m)}
    return graph


def test_no_import_cycle_between_modules():
    # Also TYPE_CHECKING imports: a cycle that only type checkers see still couples two modules.
    assert [sorted(c) for c in cycles(module_graph())] == []


def test_attnlab_help_imports_no_jax():
    code = ("import contextlib, io, sys; from attnlab.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): main(['--help'])\n"
            "print(sorted(m for m in ('jax', 'pandas', 'matplotlib') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=True)
    assert result.stdout.strip() == "[]"


def _longest_chain(graph: dict[str, set[str]], module: str, memo: dict) -> int:
    """1 + the most imports in a row below ``module`` inside ``graph`` (its floor)."""
    if module not in memo:
        memo[module] = 1 + max((_longest_chain(graph, t, memo) for t in graph[module]
                                if t in graph), default=0)
    return memo[module]


def package_graph(package: str) -> dict[str, set[str]]:
    """module -> the modules of ``package`` it imports, for the modules of ``package``."""
    inside = {m: ts for m, ts in module_graph().items()
              if m == package or m.startswith(package + ".")}
    return {m: {t for t in ts if t in inside} for m, ts in inside.items()}


# The scaling core's shared floor: what both wings stand on.
SCALING_FLOOR = {f"attnlab.scaling.{m}" for m in (
    "errors", "bootstrap", "multistart", "equations", "law", "columns", "points", "result",
    "parametric", "huber", "design", "curves", "curvefit")}


def test_the_scaling_wings_never_meet_and_stand_on_one_floor():
    # Laws (scaling/laws/) and tables with the modes they are fitted in (scaling/tables/) each
    # import only the floor and their own wing; the request above joins them.
    graph = package_graph("attnlab.scaling")
    wings = {"laws": "attnlab.scaling.laws", "tables": "attnlab.scaling.tables"}
    for name, wing in wings.items():
        other = next(w for n, w in wings.items() if n != name)
        members = [m for m in graph if m.startswith(wing)]
        assert len(members) > 5, name
        for module in members:
            assert not {t for t in graph[module] if t.startswith(other)}, module
            assert graph[module] <= SCALING_FLOOR | set(members), module
    for module in SCALING_FLOOR:
        assert graph[module] <= SCALING_FLOOR, module


def test_every_fit_goes_through_the_request_and_nothing_imports_a_command():
    graph = module_graph()
    commands = {m for m in graph if m.endswith((".cli", "_cli"))} - {"attnlab.cli"}
    assert "attnlab.scaling.cli" in commands and "attnlab.plots.cli" in commands
    assert [(m, sorted(ts & commands)) for m, ts in graph.items() if ts & commands] == []
    registry = "attnlab.scaling.laws.registry"
    users = {m for m, ts in graph.items() if registry in ts and not m.startswith(
        "attnlab.scaling.laws")}
    # The tables never turn a name into a law: the request, the package's public names, the
    # synthetic data and the figures (which name the law they draw) do.
    assert users <= {"attnlab.scaling.request", "attnlab.scaling", "attnlab.scaling.synthetic",
                     "attnlab.plots.figures"}, users


# scaling: 9 since a law composes another's fit (two_step chains approach 3's; loss_to_loss's
# hold-out sets approach 3 of its target beside it): registry -> law -> approach3 -> floor.
@pytest.mark.parametrize("package, floors", [("attnlab.scaling", 9), ("attnlab.sweep", 8)])
def test_a_package_stays_a_few_floors_high(package, floors):
    graph = package_graph(package)
    memo: dict = {}
    assert max(_longest_chain(graph, m, memo) for m in graph) <= floors
