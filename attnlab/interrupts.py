"""Ctrl-C and SIGTERM: one behaviour for every command, worker and checkpoint save.

- SIGTERM behaves as Ctrl-C: ``KeyboardInterrupt`` is raised in the main thread, the command
  records what it was doing as interrupted (a partial run, resumed by the next invocation) and
  exits with :data:`EXIT_INTERRUPTED`.
- :func:`deferred` holds an interrupt back while a library is in the middle of something that
  must not be cut (orbax committing a checkpoint: interrupted inside its finalize-thread join it
  logs a traceback) and raises it right after.
- :func:`watchdog` makes sure the process cannot hang on an interrupt (see its docstring).
- Outside the command's watchdog the ``attnlab`` process installs no handler that raises
  (:func:`exit_at_once_on_interrupt` before it, signals ignored after it): a
  ``KeyboardInterrupt`` raised on the way out, in an ``except`` or ``finally`` clause, would
  reach the interpreter (a traceback, then a death by SIGINT, exit -2).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Iterator

EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130: what shells report for Ctrl-C
# After the first Ctrl-C / SIGTERM a command winds down (a sweep gives its workers time to finish
# their checkpoint saves); if it has not exited by then (the main thread stuck in a long XLA
# compilation, which Python cannot interrupt), or on a second Ctrl-C, the process exits at once.
# Nothing is lost either way: every file is written atomically and orbax commits a checkpoint by
# renaming it, so the run resumes from its latest checkpoint.
HARD_EXIT_SECONDS = 30.0
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def raise_keyboard_interrupt(signum, frame):
    """A signal handler: SIGTERM (or any signal) stops the command as Ctrl-C does."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _in_main_thread() -> bool:
    # Python lets only the main thread install signal handlers.
    return threading.current_thread() is threading.main_thread()


def _install(handlers: dict) -> KeyboardInterrupt | None:
    """Installs every handler of ``{signal: handler}``, even when a signal arrives between two
    installs and a handler already installed raises (Python runs pending handlers inside
    ``signal.signal`` and between bytecodes): that interrupt is returned, for the caller to raise
    once everything is in place, instead of leaving the other signals with stale handlers."""
    interrupted = None
    while True:
        try:
            for s, handler in handlers.items():
                signal.signal(s, handler)
            return interrupted
        except KeyboardInterrupt as e:
            interrupted = e


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Ctrl-C / SIGTERM arriving inside the block are remembered and raised as
    ``KeyboardInterrupt`` when it ends, so the block itself is never cut in the middle.
    The watchdog still sees them (``signal.set_wakeup_fd`` is independent of the handler), so a
    block that never ends cannot keep the process alive."""
    if not _in_main_thread():
        yield
        return
    pending: list[int] = []
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    try:
        # Inside the try: an interrupt that arrives while the holders go in is still raised with
        # every handler put back.
        interrupted = _install({s: lambda signum, frame: pending.append(signum)
                                for s in SIGNALS})
        if interrupted is not None:
            raise interrupted
        yield
    finally:
        interrupted = _install(previous)
        if pending:
            # Replayed through the handler the block displaced, so a watchdog counts it (a
            # second interrupt exits there); raised here with the signal's name.
            handler = previous[pending[0]]
            with contextlib.suppress(KeyboardInterrupt):
                if callable(handler):
                    handler(pending[0], None)
            raise KeyboardInterrupt(signal.Signals(pending[0]).name)
        if interrupted is not None:
            raise interrupted


def reraising_lost_interrupts(previous):
    """An unraisable-exception hook for a process whose Ctrl-C raises ``KeyboardInterrupt``: one
    raised while Python ran a garbage-collector callback (JAX registers one) would be printed as
    "Exception ignored ... Traceback" and lost; this raises it again in the main thread instead,
    in silence. Everything else goes to ``previous``. The interrupt is raised from another
    thread once the hook has returned: raised from the hook itself it would land in the hook."""
    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            _interrupt_main_after_return()
            return
        previous(unraisable)

    return hook


def _interrupt_main_after_return(delay: float = 0.05) -> None:
    """Interrupts the main thread ``delay`` seconds after the caller lets it. The thread waits
    for ``go`` first: ``Thread.start`` blocks until the thread runs, and an interrupt sent
    before it returned (a timer firing on a loaded machine) would land in the caller."""
    import _thread
    import time

    go = threading.Event()

    def later() -> None:
        go.wait()
        time.sleep(delay)
        _thread.interrupt_main()

    threading.Thread(target=later, daemon=True).start()
    go.set()


def ignore_from_now_on() -> None:
    """For a process about to exit: a late Ctrl-C must not turn its exit status into a death by
    SIGINT (the status 130 or 2 it already decided is the one the caller should see)."""
    if _in_main_thread():
        _install({s: signal.SIG_IGN for s in SIGNALS})


def exit_at_once_on_interrupt() -> None:
    """For the ``attnlab`` process before its command starts (and after it ends, unless the
    command's :func:`watchdog` left the signals ignored): Ctrl-C / SIGTERM exit with 130 at once,
    in one line. A handler that raises ``KeyboardInterrupt`` there could not be caught
    everywhere: raised in an ``except`` or ``finally`` clause on the way out, it reaches the
    interpreter, which prints a traceback and kills itself with SIGINT (exit -2)."""
    if _in_main_thread():
        _install({s: _exit_interrupted for s in SIGNALS
                  if signal.getsignal(s) is not signal.SIG_IGN})


def _exit_interrupted(signum, frame) -> None:
    os.write(2, b"\ninterrupted\n")
    os._exit(EXIT_INTERRUPTED)


@contextlib.contextmanager
def watchdog(hard_exit_seconds: float = HARD_EXIT_SECONDS, *,
             leave_ignored: bool = False) -> Iterator[None]:
    """SIGTERM behaves as Ctrl-C inside the block, and the process cannot hang on an interrupt.

    Python runs signal handlers in the main thread between bytecodes, so while it sits in one
    long C call (compiling an enormous model) Ctrl-C does nothing. A watchdog thread sees each
    signal through ``signal.set_wakeup_fd`` the moment it arrives: on a second Ctrl-C/SIGTERM,
    or ``hard_exit_seconds`` after the first, it prints one line and exits with 130 at once.
    Only in the main thread (the ``attnlab`` process); everything is restored on the way out,
    or, with ``leave_ignored`` (a process that exits right after the block), Ctrl-C and SIGTERM
    are left ignored. Once the block is over an interrupt no longer raises: the command's outcome
    is decided, and a ``KeyboardInterrupt`` raised on the way out (in a ``finally`` clause, the
    caller's ``except``) could escape every handler and kill the process by SIGINT (exit -2).

    A ``KeyboardInterrupt`` raised while Python runs a garbage-collector callback (JAX registers
    one; tracing a large model collects often) is printed as "Exception ignored" and lost, so
    the command would run on: that too exits at once, with one line.
    """
    if not _in_main_thread():
        yield
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def hard_exit(why: str) -> None:
        os.write(2, f"\n{why}; exiting now (rerun the same command to resume)\n".encode())
        os._exit(EXIT_INTERRUPTED)

    handled = 0
    over = threading.Event()  # the block has ended: interrupts count, but no longer raise

    def on_signal(signum, frame):
        # The main thread counts too: on a loaded machine the watcher thread may not run before
        # the second KeyboardInterrupt has unwound the command.
        nonlocal handled
        handled += 1
        if handled >= 2:
            hard_exit("interrupted again")
        if not over.is_set():
            raise_keyboard_interrupt(signum, frame)

    # A signal the process inherited as ignored stays ignored (a `command &` in a script without
    # job control must not die of the script's Ctrl-C; Python keeps an ignored SIGINT too).
    previous_handlers = {s: signal.getsignal(s) for s in SIGNALS
                         if signal.getsignal(s) is not signal.SIG_IGN}
    interrupted = _install({s: on_signal for s in previous_handlers})
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch() -> None:
        seen = 0
        timer = None
        while True:
            data = os.read(read_fd, 64)
            if not data:
                break
            # Signals that arrived before the sentinel (the command is over) still count.
            for signum in data.partition(b"\0")[0]:
                if signum in SIGNALS:
                    seen += 1
                    if seen >= 2:
                        hard_exit("interrupted again")
                    timer = threading.Timer(hard_exit_seconds, hard_exit,
                                            args=("still busy after the interrupt",))
                    timer.daemon = True
                    timer.start()
            if 0 in data:
                break
        if timer is not None:
            timer.cancel()

    previous_unraisable = sys.unraisablehook

    def unraisable(info) -> None:
        if isinstance(info.exc_value, KeyboardInterrupt):
            hard_exit("interrupted")
        previous_unraisable(info)

    sys.unraisablehook = unraisable
    watcher = threading.Thread(target=watch, name="attnlab-interrupts", daemon=True)
    watcher.start()
    try:
        if interrupted is not None:  # arrived while the handlers went in: before the block
            raise interrupted
        yield
    finally:
        over.set()  # first: from here on no handler of ours raises
        sys.unraisablehook = previous_unraisable
        signal.set_wakeup_fd(previous_fd)
        interrupted = _install({s: signal.SIG_IGN if leave_ignored else handler
                                for s, handler in previous_handlers.items()})
        os.write(write_fd, b"\0")
        watcher.join(timeout=1.0)
        os.close(write_fd)
        if not watcher.is_alive():
            os.close(read_fd)
        if interrupted is not None:  # a restored handler raised (called from Python): pass it on
            raise interrupted
