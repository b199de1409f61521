"""The ``attnlab`` console script: a thin dispatcher to each package's own command.

Each sub-command is a function ``main(argv: list[str]) -> int`` living next to the code it drives
(e.g. ``attnlab/scaling/cli.py``); this file only routes to it, so importing the CLI stays cheap
and layers keep pointing one way (the commands import the library, never the reverse).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
from typing import Iterator

from attnlab.cli_flags import HelpRequested
from attnlab.errors import AttnlabError

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C
# After the first Ctrl-C / SIGTERM a command winds down (a sweep gives its workers time to finish
# their checkpoint saves); if it has not exited by then (the main thread stuck in a long XLA
# compilation, which Python cannot interrupt), or on a second Ctrl-C, the process exits at once.
# Nothing is lost either way: every file is written atomically and orbax commits a checkpoint by
# renaming it, so the run resumes from its latest checkpoint.
HARD_EXIT_SECONDS = 30.0

# name -> (module, function, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "model-info": ("attnlab.train.cli", "model_info_main",
                   "parameter counts and FLOPs per token of a config"),
    "train": ("attnlab.train.cli", "train_main", "train one model; resumes in the same workdir"),
    "generate": ("attnlab.train.cli", "generate_main", "sample text from a trained run"),
    "sweep": ("attnlab.sweep.cli", "sweep_main", "run a grid / isoflop / curves sweep"),
    "fit": ("attnlab.scaling.cli", "fit_main", "fit Kaplan or Chinchilla scaling laws"),
    "plot": ("attnlab.plots.cli", "plot_main", "draw the standard scaling plots"),
    "extrapolate": ("attnlab.extrapolation.cli", "extrapolate_main",
                    "evaluate a run at longer context lengths"),
    "quickstart": ("attnlab.study", "quickstart_main",
                   "the quick scaling study: sweep, Chinchilla fit, plots"),
}

# Flags naming a file a command writes: checked here, before the command loads or fits anything.
OUTPUT_FLAGS: dict[str, tuple[str, ...]] = {"fit": ("json",), "plot": ("out",)}

USAGE = "usage: attnlab <command> [flags]\n\ncommands:\n" + "\n".join(
    f"  {name:<12} {help_}" for name, (_, _, help_) in COMMANDS.items()
) + "\n\n`attnlab <command> --help` shows a command's flags.\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        sys.stderr.write(f"error: unknown command {name!r}; the commands are "
                         f"{', '.join(COMMANDS)} (attnlab --help)\n")
        return 2
    module_name, function_name, _ = COMMANDS[name]
    with interrupt_handling():
        try:
            check_output_paths(name, rest)
            command = getattr(importlib.import_module(module_name), function_name)
            return int(command(rest) or 0)
        except HelpRequested as e:
            sys.stdout.write(e.text)
            return 0
        except AttnlabError as e:
            sys.stderr.write(f"error: {e}\n")
            _quiet_from_now_on()
            return 2
        except KeyboardInterrupt:  # commands that have more to say catch it themselves
            sys.stderr.write(f"\ninterrupted (attnlab {name})\n")
            return EXIT_INTERRUPTED


def check_output_paths(name: str, argv: list[str]) -> None:
    """Refuses an output file that cannot be written (a directory, a missing or read-only parent
    directory), naming the flag, before the command does any work."""
    for flag in OUTPUT_FLAGS.get(name, ()):
        for i, arg in enumerate(argv):
            if arg.startswith(f"--{flag}="):
                path = arg.partition("=")[2]
            elif arg == f"--{flag}" and i + 1 < len(argv):
                path = argv[i + 1]
            else:
                continue
            if not path:
                continue
            parent = os.path.dirname(os.path.abspath(path))
            if os.path.isdir(path):
                raise AttnlabError(f"--{flag}={path} is a directory; give a file name")
            if not os.path.isdir(parent):
                raise AttnlabError(f"--{flag}={path}: the directory {parent} does not exist")
            if not os.access(parent, os.W_OK) or (os.path.exists(path)
                                                  and not os.access(path, os.W_OK)):
                raise AttnlabError(f"--{flag}={path}: not writable")


def _quiet_from_now_on() -> None:
    """After the one error line, nothing more on stderr: libraries' background threads (e.g.
    tensorstore's callbacks after a damaged checkpoint failed to read) print tracebacks while
    the interpreter shuts down, which would bury that line. Only in the ``attnlab`` process
    itself, not when ``main`` is called from Python (tests)."""
    if sys.argv and os.path.basename(sys.argv[0]) in ("attnlab", "cli.py", "__main__.py"):
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def interrupt_handling(hard_exit_seconds: float = HARD_EXIT_SECONDS) -> Iterator[None]:
    """SIGTERM behaves as Ctrl-C (KeyboardInterrupt: the command records what it was doing as
    interrupted and exits 130), and the process cannot hang on an interrupt.

    Python runs signal handlers in the main thread between bytecodes, so while it sits in one
    long C call (compiling an enormous model) Ctrl-C does nothing. A watchdog thread sees each
    signal through ``signal.set_wakeup_fd`` the moment it arrives: on a second Ctrl-C/SIGTERM,
    or ``hard_exit_seconds`` after the first, it prints one line and exits with 130 at once.
    Only in the main thread (the ``attnlab`` process); everything is restored on the way out.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous_term = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    interrupts = (signal.SIGINT, signal.SIGTERM)

    def hard_exit(why: str) -> None:
        os.write(2, f"\n{why}; exiting now (rerun the same command to resume)\n".encode())
        os._exit(EXIT_INTERRUPTED)

    def watch() -> None:
        seen = 0
        timer = None
        while True:
            data = os.read(read_fd, 64)
            if not data or 0 in data:  # closed, or the sentinel: the command is over
                break
            for signum in data:
                if signum in interrupts:
                    seen += 1
                    if seen >= 2:
                        hard_exit("interrupted again")
                    timer = threading.Timer(hard_exit_seconds, hard_exit,
                                            args=("still busy after the interrupt",))
                    timer.daemon = True
                    timer.start()
        if timer is not None:
            timer.cancel()

    watcher = threading.Thread(target=watch, name="attnlab-interrupts", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGTERM, previous_term)
        os.write(write_fd, b"\0")
        watcher.join(timeout=1.0)
        os.close(write_fd)
        if not watcher.is_alive():
            os.close(read_fd)


if __name__ == "__main__":
    sys.exit(main())
