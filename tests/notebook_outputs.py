"""The notebooks' stored outputs (figures a reader of the repository sees): written by the slow
tests that execute each notebook on a tiny study, with ATTNLAB_STORE_NOTEBOOKS=1, and checked
to be those of the code they are stored with.

    ATTNLAB_STORE_NOTEBOOKS=1 python -m pytest -m slow tests/test_notebooks.py \
        tests/test_architectures.py -k notebook

A notebook stores, in its metadata, the hash of its code cells' sources when it was executed:
a cell edited since then fails the default lane (``stale``); and an execution whose figures or
results differ in number, cell by cell, from the stored ones fails the slow lane (``compare``).
"""

from __future__ import annotations

import copy
import hashlib
import os
import pathlib

import nbformat

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
STORE = "ATTNLAB_STORE_NOTEBOOKS"
HOW = f"{STORE}=1 python -m pytest -m slow tests/test_notebooks.py tests/test_architectures.py -k notebook"


def code_hash(notebook) -> str:
    sources = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    return hashlib.sha256("\n\0".join(sources).encode()).hexdigest()


def shape(notebook) -> list[tuple[int, int]]:
    """Per code cell, its figures and its results (streams left out: a warning may come or
    not)."""
    return [(sum("image/png" in o.get("data", {}) for o in cell.outputs),
             sum(o.output_type == "execute_result" for o in cell.outputs))
            for cell in notebook.cells if cell.cell_type == "code"]


def stale(path: pathlib.Path) -> str | None:
    """Why the stored notebook's outputs are not its code's, or None."""
    notebook = nbformat.read(path, as_version=4)
    stored = notebook.metadata.get("attnlab", {}).get("code_sha256")
    if stored != code_hash(notebook):
        return f"{path.name}: its code changed since its outputs were stored: {HOW}"
    unrun = [i for i, c in enumerate(notebook.cells)
             if c.cell_type == "code" and c.execution_count is None]
    return f"{path.name}: cells {unrun} were not executed: {HOW}" if unrun else None


def finish(executed, name: str, scratch: pathlib.Path) -> None:
    """After a test executed notebooks/<name> on a study in ``scratch``: stores it (STORE set;
    the scratch path printed as <tiny study>), else checks its figures against the stored."""
    path = NOTEBOOKS / name
    if os.environ.get(STORE):
        kept = copy.deepcopy(executed)
        for cell in kept.cells:
            for output in cell.get("outputs", []):
                if "text" in output:
                    output["text"] = output["text"].replace(str(scratch), "<tiny study>")
        kept.metadata["attnlab"] = {"code_sha256": code_hash(kept)}
        nbformat.write(kept, path)
        return
    stored = nbformat.read(path, as_version=4)
    assert shape(stored) == shape(executed), (
        f"{name}: its stored figures and results differ from what its code draws now "
        f"(per cell: stored {shape(stored)}, now {shape(executed)}): {HOW}")
