"""How a terminal starts a foreground command, for the tests that signal one: Ctrl-C, SIGTERM
and SIGQUIT at their defaults and unblocked, whatever the test process inherited (a shell
script's background job, for one, runs with SIGINT and SIGQUIT ignored, and so would every
command it starts)."""

import signal

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)


def as_a_terminal_starts_it() -> None:
    """A ``preexec_fn`` for ``subprocess.Popen``."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
    for s in SIGNALS:
        signal.signal(s, signal.SIG_DFL)
