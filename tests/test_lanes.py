"""tests/lanes.py names tests that exist: a renamed test must not slip back into the default
lane (or out of both) unnoticed."""

import ast
import pathlib

import pytest

from lanes import SLOW_LANE, moved

TESTS = pathlib.Path(__file__).resolve().parent


def _functions(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("entry", sorted(SLOW_LANE))
def test_each_entry_names_a_test_function(entry):
    file, name = entry.split("::")
    assert name.split("[")[0] in _functions(TESTS / file), entry


def test_a_case_entry_moves_that_case_alone():
    case = next(e for e in SLOW_LANE if "[" in e)
    function = case.split("[")[0]
    assert moved(f"tests/{case}") and not moved(f"tests/{function}[another-case]")
    whole = next(e for e in SLOW_LANE if "[" not in e)
    assert moved(f"tests/{whole}") and moved(f"tests/{whole}[any-case]")
