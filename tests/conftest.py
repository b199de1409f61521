"""Shared test set-up: run from the repository root so that configs/ and experiments/ resolve."""

import os
import pathlib
import signal

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _run_from_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


@pytest.fixture(autouse=True)
def _restore_signal_handlers():
    """A command run in-process may ignore SIGINT/SIGTERM on its way out
    (attnlab.interrupts.ignore_from_now_on): the next test, and its child processes, must not
    inherit that."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        if handler is not None:
            signal.signal(s, handler)


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
