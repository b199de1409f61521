"""The interrupt machinery itself, fast: deferral around checkpoint commits, the console
script's exit status after a late Ctrl-C, and a Ctrl-C swallowed by a garbage-collector callback.
(The end-to-end signal tests, with real training and sweeps, are the slow tests_interrupts.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from attnlab import cli, interrupts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_inside_deferred_is_raised_when_the_block_ends(sig):
    before = {s: signal.getsignal(s) for s in interrupts.SIGNALS}
    reached_the_end_of_the_block = False
    with pytest.raises(KeyboardInterrupt, match=sig.name):
        with interrupts.deferred():
            signal.raise_signal(sig)  # the handler runs here, synchronously
            reached_the_end_of_the_block = True
    assert reached_the_end_of_the_block
    assert {s: signal.getsignal(s) for s in interrupts.SIGNALS} == before


def test_deferred_without_an_interrupt_changes_nothing():
    before = {s: signal.getsignal(s) for s in interrupts.SIGNALS}
    with interrupts.deferred():
        pass
    assert {s: signal.getsignal(s) for s in interrupts.SIGNALS} == before


def test_console_main_turns_a_late_interrupt_into_130_and_ignores_later_ones(monkeypatch):
    def interrupted_while_winding_down(argv=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "main", interrupted_while_winding_down)
    before = {s: signal.getsignal(s) for s in interrupts.SIGNALS}
    try:
        assert cli.console_main() == interrupts.EXIT_INTERRUPTED
        assert all(signal.getsignal(s) is signal.SIG_IGN for s in interrupts.SIGNALS)
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _default_signals() -> None:
    # A child inherits an ignored SIGINT (pytest-xdist's workers ignore it), and the watchdog
    # rightly leaves an inherited SIG_IGN alone; these tests are about a terminal's Ctrl-C.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60,
                          preexec_fn=_default_signals)


def test_an_interrupt_swallowed_by_a_gc_callback_exits_130_in_one_line():
    """Python prints an exception raised in a gc callback as "Exception ignored" and goes on;
    inside the watchdog it ends the command instead, without a traceback."""
    done = _python("""
        import gc, time
        from attnlab.interrupts import watchdog

        def interrupted(phase, info):
            raise KeyboardInterrupt("SIGINT")

        with watchdog(hard_exit_seconds=60):
            gc.callbacks.append(interrupted)
            gc.collect()
            gc.callbacks.remove(interrupted)
            time.sleep(5)
        print("ran on")
    """)
    assert done.returncode == interrupts.EXIT_INTERRUPTED, done.stderr
    assert "ran on" not in done.stdout
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "interrupted; exiting now (rerun the same command to resume)"]


def test_a_second_interrupt_exits_at_once_even_when_the_first_was_caught():
    done = _python("""
        import os, signal, time
        from attnlab.interrupts import watchdog

        with watchdog(hard_exit_seconds=60):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
            except KeyboardInterrupt:
                pass  # a command winding down (a sweep waiting for its workers)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        print("ran on")
    """)
    assert done.returncode == interrupts.EXIT_INTERRUPTED, done.stderr
    assert "ran on" not in done.stdout
    assert "interrupted again; exiting now" in done.stderr


@pytest.mark.parametrize("first_inside_deferred", [False, True])
def test_a_second_interrupt_exits_even_when_the_watcher_thread_never_runs(first_inside_deferred):
    """On a loaded machine the watcher thread may not be scheduled before the second
    KeyboardInterrupt unwinds the command (CI saw exit -2, death by SIGINT): the main thread's
    handler counts the interrupts too. Here the watcher is blinded (no wakeup fd), so only the
    handler can exit; a first interrupt held back by deferred() still counts."""
    done = _python(f"""
        import os, signal, time
        from attnlab.interrupts import deferred, watchdog

        with watchdog(hard_exit_seconds=60):
            signal.set_wakeup_fd(-1)  # the watcher sees nothing from here on
            try:
                if {first_inside_deferred}:
                    with deferred():
                        os.kill(os.getpid(), signal.SIGINT)
                        time.sleep(0.5)
                else:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(5)
            except KeyboardInterrupt:
                pass
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        print("ran on")
    """)
    assert done.returncode == interrupts.EXIT_INTERRUPTED, done.stderr
    assert "ran on" not in done.stdout
    assert done.stderr.strip().splitlines() == [
        "interrupted again; exiting now (rerun the same command to resume)"]
