"""Every third-party module the package imports is a declared runtime dependency.

`pip install -e .` (the README's main command) installs only `[project].dependencies`; a module
that the `dev` extra happens to bring in transitively would pass the test suite yet break a
user's first run (it happened with platformdirs).
"""

import ast
import importlib.metadata
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
OPTIONAL = {"ray", "submitit", "lm_eval"}  # the ray, slurm and eval extras: imported where used,
# or a clear error


def _imported_top_level_modules() -> set[str]:
    modules = set()
    for path in (ROOT / "attnlab").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - {"attnlab", "__future__"}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_imported_module_is_a_declared_dependency():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {_normalise(re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0]) for spec in declared}
    distributions = importlib.metadata.packages_distributions()
    missing = {}
    for module in sorted(_imported_top_level_modules() - OPTIONAL):
        providers = {_normalise(d) for d in distributions.get(module, [module])}
        if not providers & declared:
            missing[module] = sorted(providers)
    assert not missing, f"imported but not in [project].dependencies: {missing}"
