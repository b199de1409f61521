"""The notebooks' stored outputs (figures a reader of the repository sees): written by the slow
tests that execute each notebook on a tiny study, with ATTNLAB_STORE_NOTEBOOKS=1, and checked
to be those of the code they are stored with.

    ATTNLAB_STORE_NOTEBOOKS=1 python -m pytest -m slow tests/test_notebooks.py \
        tests/test_architectures.py -k notebook

A notebook stores, in its metadata, the hash of its code cells' sources when it was executed:
a cell edited since then fails the default lane (``stale``). The slow tests execute every
notebook against the current library whether or not they store it.
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


def stale(path: pathlib.Path) -> str | None:
    """Why the stored notebook's outputs are not its code's, or None."""
    notebook = nbformat.read(path, as_version=4)
    stored = notebook.metadata.get("attnlab", {}).get("code_sha256")
    if stored != code_hash(notebook):
        return f"{path.name}: its code changed since its outputs were stored: {HOW}"
    unrun = [i for i, c in enumerate(notebook.cells)
             if c.cell_type == "code" and c.execution_count is None]
    return f"{path.name}: cells {unrun} were not executed: {HOW}" if unrun else None


def finish(executed, name: str, *scratch: pathlib.Path) -> None:
    """After a test executed notebooks/<name> on a study in the ``scratch`` folders, with STORE
    set: stores it, those folders printed as <tiny study>. (Which figures a tiny study draws
    can depend on its training, so a fresh run is not compared with the stored one.)"""
    if os.environ.get(STORE):
        kept = copy.deepcopy(executed)
        for cell in kept.cells:
            for output in cell.get("outputs", []):
                for folder in scratch:
                    if "text" in output:
                        output["text"] = output["text"].replace(str(folder), "<tiny study>")
        kept.metadata["attnlab"] = {"code_sha256": code_hash(kept)}
        nbformat.write(kept, NOTEBOOKS / name)
