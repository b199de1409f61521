"""The repository's experiment files and scripts as modules, for the tests that read them."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_module(relative: str | Path):
    """The file at ``relative`` (from the repository root, or absolute), run as a new module."""
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
