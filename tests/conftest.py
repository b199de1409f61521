"""Shared test set-up: run from the repository root so that configs/ and experiments/ resolve."""

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _run_from_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


@pytest.fixture
def register(monkeypatch):
    """``register(registry, cls)``: adds a part to one of the model's registries for this test
    (the one registry line of a new part). ``resolve`` caches per config, so its cache is
    emptied around the test: a config resolved with the part must not outlive it."""
    from attnlab.model import resolve

    def add(registry, cls):
        monkeypatch.setitem(registry, cls.name, cls)
        resolve.cache_clear()
        return cls.name

    yield add
    resolve.cache_clear()
