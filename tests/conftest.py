"""Shared test set-up: run from the repository root so that configs/ and experiments/ resolve."""

import os
import pathlib
import signal
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Tests compile the same tiny programs again and again, in this process, in the other xdist
# worker and in the commands they start: JAX's persistent compilation cache lets every one after
# the first load the executable instead (set before jax is imported, and inherited by child
# processes). A test that counts compilations turns it off for itself (``no_compilation_cache``).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
# Compiling is two thirds of the default lane (6,466 programs, 857 s of its first 1,117 tests,
# 2026-11-27), and its tiny programs run for microseconds: XLA's optimizations cost more than
# they save there. Without them a program compiles in about half the time, and the commands
# the tests start inherit this; tests/test_compiler_options.py checks that a run trained both
# ways ends at the same losses (users' commands compile with every optimization).
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")


def pytest_configure(config):
    """Under ``--dist loadgroup``, refuses a pytest and pytest-xdist that would spread a group's
    tests over workers (each computing the group's shared fixture again) without a word."""
    if config.getoption("dist", "no") != "loadgroup":
        return
    from importlib.metadata import version

    from packaging.version import Version

    xdist = Version(version("pytest-xdist"))
    if Version(pytest.__version__) >= Version("9.2") and xdist <= Version("3.8.0"):
        raise pytest.UsageError(
            f"--dist loadgroup does not group tests with pytest {pytest.__version__} and "
            f"pytest-xdist {xdist} (pytest-xdist#1386): "
            "install the dev extra's pytest (pip install -e '.[dev]')")


def pytest_collection_modifyitems(config, items):
    """The tests tests/lanes.py moves out of the default lane run in the slow one."""
    from lanes import moved

    for item in items:
        if moved(item.nodeid):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _run_from_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def _as_a_terminal_starts_it() -> None:
    """The tests signal the commands they start as a terminal's Ctrl-C would, and a command
    keeps a signal it inherited as ignored. A shell script's background job starts with SIGINT
    and SIGQUIT ignored (nohup adds SIGHUP), so the suite puts them, and SIGTERM, at their
    defaults, unblocked, as a foreground job from a terminal has them."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT))
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for s in (signal.SIGTERM, signal.SIGQUIT):
        if signal.getsignal(s) is signal.SIG_IGN:
            signal.signal(s, signal.SIG_DFL)


_as_a_terminal_starts_it()
# SIGINT's and SIGTERM's handlers as the test process starts, before any fixture ran a command
# in it.
_START_SIGNAL_HANDLERS = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}


@pytest.fixture(autouse=True)
def _restore_signal_handlers():
    """A command run in-process may ignore SIGINT/SIGTERM on its way out
    (attnlab.interrupts.ignore_from_now_on), in a test or in a module or session fixture set up
    before this one: the handlers the process started with are put back before each test and
    after it."""
    def restore():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, list(_START_SIGNAL_HANDLERS))
        for s, handler in _START_SIGNAL_HANDLERS.items():
            if handler is not None:
                signal.signal(s, handler)

    restore()
    yield
    restore()


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


@pytest.fixture
def no_compilation_cache():
    """Turns the persistent compilation cache off for one test (one that counts compilations)."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # jax decides once per process whether the cache is used
    yield
    jax.config.update("jax_enable_compilation_cache", True)
    compilation_cache.reset_cache()


@pytest.fixture(autouse=True)
def _optimized_where_marked(request):
    """A test marked ``optimized`` runs its programs far longer than it compiles them (fits by
    the hundred, simulations of many fits), where the unoptimized programs above cost more than
    they save: the default lane's fit tests take 83 s optimized against 189 s, the cluster
    coverage simulation 125 s against 322 s (2026-11-28). JAX's in-memory caches do not key on
    the flag, so they are cleared whenever it changes (the persistent cache does key on it)."""
    unoptimized = (os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] == "1"
                   and request.node.get_closest_marker("optimized") is None)
    jax = sys.modules.get("jax")  # not imported yet: nothing compiled, the variable decides
    if jax is None and not unoptimized:
        import jax
    if jax is not None and jax.config.read("jax_disable_most_optimizations") != unoptimized:
        jax.clear_caches()
        jax.config.update("jax_disable_most_optimizations", unoptimized)
    yield


@pytest.fixture(autouse=True)
def _uncached_tests_compile_as_a_user_would(request, monkeypatch):
    """A test that signals a command mid-run waits for a moment to signal it: its commands
    compile as a user's would, not from programs other tests left in the shared cache (which
    can finish the run before the signal lands)."""
    if request.node.get_closest_marker("uncached"):
        monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)


@pytest.fixture
def fit_cli(capsys):
    """``attnlab fit`` with these arguments: (exit code, stdout, stderr stripped)."""
    from attnlab.scaling.cli import fit_main

    def run(args):
        code = fit_main(args)
        captured = capsys.readouterr()
        return code, captured.out, captured.err.strip()
    return run
