"""The interrupt machinery itself, fast: deferral around checkpoint commits, the console
script's exit status after a late Ctrl-C, and a Ctrl-C swallowed by a garbage-collector callback.
(The end-to-end signal tests, with real training and sweeps, are the slow tests_interrupts.py.)"""

from __future__ import annotations

import ast
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
    def interrupted_while_winding_down(argv=None, *, exiting=False):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "main", interrupted_while_winding_down)
    before = {s: signal.getsignal(s) for s in interrupts.SIGNALS}
    try:
        assert cli.console_main() == interrupts.EXIT_INTERRUPTED
        assert all(signal.getsignal(s) is signal.SIG_IGN for s in interrupts.SIGNALS)
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


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


def test_a_workers_interrupt_swallowed_by_a_gc_callback_is_raised_again():
    """A sweep worker (no watchdog: Ctrl-C is Python's KeyboardInterrupt) does not print the
    "Exception ignored" traceback to the sweep's stderr and run on: the interrupt is raised
    again in its main thread, where the worker catches it."""
    done = _python("""
        import gc, signal, sys, time
        from attnlab.interrupts import reraising_lost_interrupts

        sys.unraisablehook = reraising_lost_interrupts(sys.unraisablehook)
        signal.signal(signal.SIGINT, signal.default_int_handler)

        def interrupted(phase, info):
            raise KeyboardInterrupt

        try:
            gc.callbacks.append(interrupted)
            gc.collect()
            gc.callbacks.remove(interrupted)
            time.sleep(5)
            print("ran on")
        except KeyboardInterrupt:
            print("caught")
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "caught"
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr


def test_the_workers_hook_passes_other_unraisables_on():
    seen = []
    hook = interrupts.reraising_lost_interrupts(seen.append)
    info = type("Info", (), {"exc_value": ValueError("x")})()
    hook(info)
    assert seen == [info]


def _module_run(directory, module: str) -> subprocess.CompletedProcess:
    """``python -m module`` in ``directory`` (as `attnlab` runs), with attnlab importable."""
    return subprocess.run([sys.executable, "-m", module], cwd=directory,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, str(directory)])},
                          capture_output=True, text=True, timeout=60)


def test_an_interrupt_during_an_import_exits_130_not_by_sigint(tmp_path):
    """An interrupt that lands while a module builds code with exec() of a string (dataclasses,
    namedtuple: an import in the command's first second) makes CPython exit by SIGINT (-2)
    after the script's sys.exit(130), unless the console script clears that memory. Run as
    `python -m`, as `attnlab` is: 1 in 30 SIGTERMs at 1.2-1.6 s into `attnlab quickstart` did."""
    (tmp_path / "interrupted_import.py").write_text(textwrap.dedent("""
        import sys
        from attnlab import cli

        def command(argv):
            exec("raise KeyboardInterrupt")  # as SIGTERM inside a dataclass's exec would

        cli.COMMANDS["interrupted-import"] = (__name__, "command", "")
        sys.argv = ["attnlab", "interrupted-import"]
        sys.exit(cli.console_main())
    """))
    done = _module_run(tmp_path, "interrupted_import")
    assert done.returncode == interrupts.EXIT_INTERRUPTED, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr


def test_an_interrupt_while_the_command_module_imports_is_raised_once_it_is_imported(tmp_path):
    """A SIGTERM that lands while the command's module is imported is held until the import
    ends, then ends the command with 130: raised inside a native module's initialisation
    (jaxlib's, 0.8 s into `attnlab sweep`) it aborted the interpreter (exit -6)."""
    (tmp_path / "signalled_import.py").write_text(textwrap.dedent("""
        import os, signal, time
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(20):  # where a handler that raises would run
            time.sleep(0.01)
        print("imported", flush=True)

        def command(argv):
            print("ran", flush=True)
            return 0
    """))
    (tmp_path / "launch.py").write_text(textwrap.dedent("""
        import sys
        from attnlab import cli

        cli.COMMANDS["signalled"] = ("signalled_import", "command", "")
        sys.argv = ["attnlab", "signalled"]
        sys.exit(cli.console_main())
    """))
    done = _module_run(tmp_path, "launch")
    assert done.returncode == interrupts.EXIT_INTERRUPTED, (done.returncode, done.stderr)
    assert done.stdout.split() == ["imported"] and "Traceback" not in done.stderr


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


# Runs the console script once per point, in a forked child: a line-tracer counts the lines it
# executes in cli.py, interrupts.py and contextlib.py from the moment the command has started,
# and delivers a Ctrl-C just before line `k` (the handler runs inside the tracer, so whatever it
# raises is raised at that line). Points are tried until a run ends before reaching its point.
_EVERY_POINT = """
    import contextlib, os, signal, sys, tempfile
    from attnlab import cli, interrupts

    SCENARIO = sys.argv[1]
    TRACED = {os.path.realpath(m.__file__) for m in (cli, interrupts, contextlib)}
    armed = False

    def command(argv):
        global armed
        armed = True
        if SCENARIO == "second":
            os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C: KeyboardInterrupt here
            raise AssertionError("the first Ctrl-C did not interrupt the command")
        return 0

    cli.COMMANDS["fake"] = ("__main__", "command", "")
    sys.argv = ["attnlab", "fake"]

    def run_with_an_interrupt_at(k):
        count = 0
        def local(frame, event, arg):
            nonlocal count
            if armed and event == "line":
                count += 1
                if count == k:
                    os.kill(os.getpid(), signal.SIGINT)
            return local
        sys.settrace(lambda frame, event, arg:
                     local if os.path.realpath(frame.f_code.co_filename) in TRACED else None)
        code = cli.console_main()
        sys.settrace(None)
        print("reached" if count >= k else "ended first", flush=True)
        return code

    k = 0
    while True:
        k += 1
        with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
            pid = os.fork()
            if pid == 0:
                os.dup2(err.fileno(), 2)
                os.dup2(out.fileno(), 1)
                signal.signal(signal.SIGINT, signal.default_int_handler)  # a fresh interpreter's
                sys.exit(run_with_an_interrupt_at(k))
            _, status = os.waitpid(pid, 0)
            err.seek(0)
            out.seek(0)
            stderr, stdout = err.read().decode(), out.read().decode()
        print(repr((k, os.waitstatus_to_exitcode(status), stderr)))
        if "ended first" in stdout or k >= 500:
            break
"""


@pytest.mark.parametrize("scenario", ["second", "late"])
def test_an_interrupt_at_any_line_of_the_way_out_never_kills_the_console_script(scenario):
    """"second": the command is interrupted, and a second Ctrl-C comes at any line from there to
    the exit: always exit 130. "late": the command returns 0 and one Ctrl-C comes at any line
    after that: 0 or 130. Never a traceback or a death by SIGINT (exit -2): a KeyboardInterrupt
    raised in console_main's `except`/`finally` (ignore_from_now_on itself included) used to
    escape to the interpreter."""
    done = _python(_EVERY_POINT.replace("sys.argv[1]", repr(scenario)))
    assert done.returncode == 0, done.stderr
    points = [ast.literal_eval(line) for line in done.stdout.splitlines()]
    assert len(points) > 20  # every line of console_main, main, the watchdog's way out
    allowed = {interrupts.EXIT_INTERRUPTED} if scenario == "second" else {
        0, interrupts.EXIT_INTERRUPTED}
    for k, code, stderr in points:
        assert code in allowed, f"a Ctrl-C at point {k}: exit {code}\n{stderr}"
        assert "Traceback" not in stderr and "Exception ignored" not in stderr, (k, stderr)
    # Both outcomes happen: an interrupt early in the way out still reports the interruption.
    assert {code for _, code, _ in points} == allowed


def test_deferred_puts_every_handler_back_whatever_line_an_interrupt_arrives_at():
    """A Ctrl-C arriving while deferred() puts the handlers back, after SIGINT's and before
    SIGTERM's, used to leave SIGTERM's holder installed for good: every later SIGTERM was
    swallowed. Here a Ctrl-C is delivered at each line of deferred() in turn."""
    before = {s: signal.getsignal(s) for s in interrupts.SIGNALS}
    here = os.path.realpath(interrupts.__file__)
    k = 0
    while True:
        k += 1
        count = 0

        def local(frame, event, arg):
            nonlocal count
            if event == "line":
                count += 1
                if count == k:
                    signal.raise_signal(signal.SIGINT)
            return local

        sys.settrace(lambda frame, event, arg:
                     local if os.path.realpath(frame.f_code.co_filename) == here else None)
        try:
            with interrupts.deferred():
                pass
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        assert {s: signal.getsignal(s) for s in interrupts.SIGNALS} == before, k
        if count < k:
            break
    assert k > 5


def test_an_error_raised_while_an_interrupt_unwinds_counts_as_the_interrupt():
    """A worker records an exception as the run's failure, unless it was raised while a
    Ctrl-C or SIGTERM unwound (a lock released twice on the way out): that run was
    interrupted, and must resume, not be recorded failed."""
    from attnlab.worker import raise_if_interrupted

    def unwinding():
        try:
            raise KeyboardInterrupt("SIGTERM")
        finally:
            raise RuntimeError("release unlocked lock")  # noqa: B012 - what happened

    with pytest.raises(RuntimeError) as caught:
        unwinding()
    with pytest.raises(KeyboardInterrupt, match="release unlocked lock"):
        raise_if_interrupted(caught.value)
    raise_if_interrupted(ValueError("a real failure"))  # not an interrupt: nothing raised


@pytest.mark.parametrize("interrupted", [True, False])
def test_a_summary_failed_while_an_interrupt_unwound_leaves_the_run_resumable(tmp_path,
                                                                              interrupted):
    """Training records its own summary before the worker sees the error: an error raised on
    the way out of a Ctrl-C is written as the interrupt, so the run is partial (the sweep's
    rerun resumes it), while a real failure stays failed."""
    import json

    from attnlab import rundir

    def unwinding():
        try:
            raise KeyboardInterrupt
        finally:
            raise RuntimeError("release unlocked lock")  # noqa: B012 - what happened

    def failing():
        raise RuntimeError("a real failure")

    with pytest.raises(RuntimeError) as caught:
        (unwinding if interrupted else failing)()
    summary = {"status": rundir.FAILED, "error": rundir.failure_text(caught.value)}
    (tmp_path / rundir.SUMMARY_FILE).write_text(json.dumps(summary))
    assert "RuntimeError" in summary["error"]
    assert rundir.run_status(tmp_path) == (rundir.PARTIAL if interrupted else rundir.FAILED)


def test_ctrl_c_to_a_worker_still_importing_ends_it_without_a_traceback():
    """Ctrl-C reaches a sweep's whole process group, its workers too, and a worker started just
    before may still be importing JAX: it ends as SIGINT's default action ends a process (the
    launcher counts that as interrupted), printing nothing."""
    import json
    import time

    from attnlab.sweep import launchers

    settings = {"parent_pid": os.getpid(), "cpus": None, "cache_dir": "", "log_path": "unused",
                "host_devices": 1}
    worker = subprocess.Popen([sys.executable, "-c", launchers._WORKER_MAIN,
                               json.dumps(settings)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(0.3)  # well inside its imports (JAX alone takes about a second here)
    worker.send_signal(signal.SIGINT)
    _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == -signal.SIGINT, stderr.decode()
    assert -signal.SIGINT in launchers._INTERRUPTED and stderr == b""
