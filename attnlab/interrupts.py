"""Ctrl-C and SIGTERM: one behaviour for every command, worker and checkpoint save.

- SIGTERM behaves as Ctrl-C: ``KeyboardInterrupt`` is raised in the main thread, the command
  records what it was doing as interrupted (a partial run, resumed by the next invocation) and
  exits with :data:`EXIT_INTERRUPTED`.
- :func:`deferred` holds an interrupt back while a library is in the middle of something that
  must not be cut (orbax committing a checkpoint: interrupted inside its finalize-thread join it
  logs a traceback) and raises it right after.
- :func:`watchdog` makes sure the process cannot hang on an interrupt (see its docstring).
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
    previous = {s: signal.signal(s, lambda signum, frame: pending.append(signum))
                for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if pending:
            # Replayed through the handler the block displaced, so a watchdog counts it (a
            # second interrupt exits there); raised here with the signal's name.
            handler = previous[pending[0]]
            with contextlib.suppress(KeyboardInterrupt):
                if callable(handler):
                    handler(pending[0], None)
            raise KeyboardInterrupt(signal.Signals(pending[0]).name)


def ignore_from_now_on() -> None:
    """For a process about to exit: a late Ctrl-C must not turn its exit status into a death by
    SIGINT (the status 130 or 2 it already decided is the one the caller should see)."""
    if _in_main_thread():
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)


@contextlib.contextmanager
def watchdog(hard_exit_seconds: float = HARD_EXIT_SECONDS) -> Iterator[None]:
    """SIGTERM behaves as Ctrl-C inside the block, and the process cannot hang on an interrupt.

    Python runs signal handlers in the main thread between bytecodes, so while it sits in one
    long C call (compiling an enormous model) Ctrl-C does nothing. A watchdog thread sees each
    signal through ``signal.set_wakeup_fd`` the moment it arrives: on a second Ctrl-C/SIGTERM,
    or ``hard_exit_seconds`` after the first, it prints one line and exits with 130 at once.
    Only in the main thread (the ``attnlab`` process); everything is restored on the way out.

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

    def on_signal(signum, frame):
        # The main thread counts too: on a loaded machine the watcher thread may not run before
        # the second KeyboardInterrupt has unwound the command.
        nonlocal handled
        handled += 1
        if handled >= 2:
            hard_exit("interrupted again")
        raise_keyboard_interrupt(signum, frame)

    # A signal the process inherited as ignored stays ignored (a `command &` in a script without
    # job control must not die of the script's Ctrl-C; Python keeps an ignored SIGINT too).
    previous_handlers = {s: signal.signal(s, on_signal) for s in SIGNALS
                         if signal.getsignal(s) is not signal.SIG_IGN}
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
        yield
    finally:
        sys.unraisablehook = previous_unraisable
        signal.set_wakeup_fd(previous_fd)
        for s, handler in previous_handlers.items():
            signal.signal(s, handler)
        os.write(write_fd, b"\0")
        watcher.join(timeout=1.0)
        os.close(write_fd)
        if not watcher.is_alive():
            os.close(read_fd)
