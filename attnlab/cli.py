"""The ``attnlab`` console script: a thin dispatcher to each package's own command.

Each sub-command is a function ``main(argv: list[str]) -> int`` living next to the code it drives
(e.g. ``attnlab/scaling/cli.py``); this file only routes to it, so importing the CLI stays cheap
and layers keep pointing one way (the commands import the library, never the reverse).
"""

from __future__ import annotations

import importlib
import os
import sys

from attnlab import cli_flags, outputs, rundir
from attnlab.cli_flags import Flag, HelpRequested
from attnlab.errors import AttnlabError
from attnlab.interrupts import (EXIT_INTERRUPTED, deferred, exit_at_once_on_interrupt,
                                ignore_from_now_on, watchdog)

# name -> (module, function, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "env": ("attnlab.train.cli", "env_main",
            "versions, devices, MFU peak and the fast paths this machine has"),
    "model-info": ("attnlab.train.model_info_cli", "model_info_main",
                   "parameter counts and FLOPs per token of a config"),
    "train": ("attnlab.train.cli", "train_main", "train one model; resumes in the same --run"),
    "prepare": ("attnlab.train.cli", "prepare_main",
                "build a config's corpus into the cache (as the first train does)"),
    "generate": ("attnlab.train.generate_cli", "generate_main",
                 "sample text from a trained run"),
    "sweep": ("attnlab.sweep.cli", "sweep_main",
              "run a sweep of any registered mode (and its tuning stage)"),
    "fit": ("attnlab.scaling.cli", "fit_main", "fit a registered scaling law to a results table"),
    "compare": ("attnlab.scaling.compare_cli", "compare_main",
                "compare a sweep's arms at matched points, with intervals over seeds"),
    "plot": ("attnlab.plots.cli", "plot_main", "draw the standard scaling plots"),
    "extrapolate": ("attnlab.extrapolation.cli", "extrapolate_main",
                    "evaluate a run at longer context lengths"),
    "coord-check": ("attnlab.coord_check", "coord_check_main",
                    "muP coordinate check: activation sizes across widths, sp vs mup"),
    "quickstart": ("attnlab.study", "quickstart_main",
                   "the quick scaling study: sweep, Chinchilla fit, plots"),
    "import-hf": ("attnlab.hf.cli", "import_main",
                  "read a Hugging Face checkpoint directory into a new run"),
    "export-hf": ("attnlab.hf.cli", "export_main",
                  "write a run's checkpoint as a Hugging Face checkpoint directory"),
    "eval": ("attnlab.eval.cli", "eval_main",
             "score a run on multiple-choice tasks: accuracy, gold-answer CE, bits per byte"),
    "icl": ("attnlab.icl.cli", "icl_main",
            "evaluate a run on its in-context learning task"),
    "attention": ("attnlab.icl.cli", "attention_main",
                  "draw every head's attention map and score its induction pattern"),
}

# name -> "module:attribute" of its flags (a list of attnlab.cli_flags.Flag, or a function
# returning one): the dispatcher rewrites their old spellings before it checks output paths.
FLAG_LISTS: dict[str, str] = {
    "env": "attnlab.train.cli:ENV_FLAGS",
    "model-info": "attnlab.train.model_info_cli:MODEL_INFO_FLAGS",
    "train": "attnlab.train.cli:TRAIN_FLAGS", "prepare": "attnlab.train.cli:PREPARE_FLAGS",
    "generate": "attnlab.train.generate_cli:GENERATE_FLAGS", "sweep": "attnlab.sweep.cli:FLAGS",
    "fit": "attnlab.scaling.cli:fit_flags", "compare": "attnlab.scaling.compare_cli:COMPARE_FLAGS",
    "plot": "attnlab.plots.cli:plot_flags", "extrapolate": "attnlab.extrapolation.cli:FLAGS",
    "coord-check": "attnlab.coord_check:command_flags",
    "quickstart": "attnlab.study.quickstart:FLAGS", "import-hf": "attnlab.hf.cli:IMPORT_FLAGS",
    "export-hf": "attnlab.hf.cli:EXPORT_FLAGS", "eval": "attnlab.eval.cli:EVAL_FLAGS",
    "icl": "attnlab.icl.cli:ICL_FLAGS",
    "attention": "attnlab.icl.cli:ATTENTION_FLAGS",
}

# Flags naming a file a command writes (True: a figure), checked here before the command loads
# or fits anything (attnlab.outputs). These commands also take --overwrite.
OUTPUT_FLAGS: dict[str, dict[str, bool]] = {
    "env": {"json": False}, "fit": {"json": False}, "compare": {"json": False},
    "eval": {"json": False},
    "plot": {"plot": True}, "icl": {"json": False, "plot": True},
    "attention": {"plot": True, "json": False}, "coord-check": {"json": False, "plot": True},
    "model-info": {"plot": True},
}
OVERWRITE_HELP = ("  --overwrite  replace an existing output file that this command did not "
                  "write (a run's or sweep's own files never are)\n")

# The lines name no variants (modes, laws, tasks): each command's --help lists them from its
# registry, so this stays cheap to import and cannot go stale.
USAGE = "usage: attnlab <command> [flags]\n\ncommands:\n" + "\n".join(
    f"  {name:<12} {help_}" for name, (_, _, help_) in COMMANDS.items()
) + "\n\n`attnlab <command> --help` shows a command's flags.\n"


def main(argv: list[str] | None = None, *, exiting: bool = False) -> int:
    """Runs one command; ``exiting``: the process exits right after (the console script), so
    Ctrl-C and SIGTERM are left ignored once the command is over."""
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
    with watchdog(leave_ignored=exiting):
        try:
            # Imported with interrupts held: a KeyboardInterrupt raised inside a native module's
            # initialisation (jaxlib's, which the commands import) aborts the interpreter
            # (exit -6) instead of ending the command with 130.
            with deferred():
                module = importlib.import_module(module_name)
            command = getattr(module, function_name)
            rest = cli_flags.canonical_argv(rest)  # every spelling absl reads, before any check
            rest = rename_old_flags(name, rest)
            rest, overwrite = _overwrite_flag(name, rest)
            check_output_paths(name, rest, overwrite=overwrite)
            code = int(command(rest) or 0)
            if code == 0:
                record_outputs(name, rest)
            return code
        except HelpRequested as e:
            sys.stdout.write(e.text + (OVERWRITE_HELP if name in OUTPUT_FLAGS else ""))
            return 0
        except (AttnlabError, OSError) as e:
            sys.stderr.write(f"error: {_one_line(e)}\n")
            _quiet_from_now_on()
            return 2
        except KeyboardInterrupt:  # commands that have more to say catch it themselves
            sys.stderr.write(f"\ninterrupted (attnlab {name})\n")
            return EXIT_INTERRUPTED
        except Exception as e:  # noqa: BLE001 - only an accelerator's out-of-memory is ours
            if not _out_of_memory(e):
                raise
            sys.stderr.write(f"error: out of memory: {_first_line(e)} (the model or batch is "
                             f"too large for this device; --allow-large skips the estimate "
                             f"that refuses such configs up front)\n")
            _quiet_from_now_on()
            return 2


def _one_line(error: Exception) -> str:
    """An attnlab error as it is; an OS error (a full disk, a read-only or pseudo file system,
    a missing directory) as its reason and the file it names."""
    if isinstance(error, AttnlabError) or not isinstance(error, OSError):
        return str(error)
    if (failure := rundir.write_failure(error)) is not None:  # the storage refused a write
        return str(failure)
    where = f": {error.filename}" if error.filename else ""
    return f"{error.strerror or str(error) or type(error).__name__}{where}"


def _out_of_memory(error: Exception) -> bool:
    """An allocation larger than the device's memory, as XLA reports it (RESOURCE_EXHAUSTED on
    accelerators, "Out of memory allocating N bytes" on a CPU)."""
    text = str(error)
    return (type(error).__name__ in ("XlaRuntimeError", "JaxRuntimeError")
            and ("RESOURCE_EXHAUSTED" in text or "Out of memory" in text))


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    line = lines[0] if lines else type(error).__name__
    for prefix in ("RESOURCE_EXHAUSTED: ", "INTERNAL: ", "Error dispatching computation: "):
        line = line.removeprefix(prefix)
    return line


def command_flags(name: str) -> list[Flag]:
    """The flags of command ``name`` (FLAG_LISTS), [] for a command without a list."""
    where = FLAG_LISTS.get(name)
    if where is None:
        return []
    module_name, _, attribute = where.partition(":")
    found = getattr(importlib.import_module(module_name), attribute)
    return list(found() if callable(found) else found)


def rename_old_flags(name: str, argv: list[str]) -> list[str]:
    """``argv`` in the current spellings of the command's flags; a notice on stderr for each
    old one (the command's own parse then finds none)."""
    argv, notices = cli_flags.rename_old_flags(argv, command_flags(name))
    for notice in notices:
        sys.stderr.write(notice + "\n")
    return argv


def _overwrite_flag(name: str, argv: list[str]) -> tuple[list[str], bool]:
    """``argv`` without ``--overwrite`` / ``--nooverwrite``, and whether it was given (only
    the commands that write files take it)."""
    if name not in OUTPUT_FLAGS:
        return argv, False
    kept = [arg for arg in argv if arg not in ("--overwrite", "--nooverwrite")]
    given = [arg for arg in argv if arg in ("--overwrite", "--nooverwrite")]
    return kept, bool(given) and given[-1] == "--overwrite"


def check_output_paths(name: str, argv: list[str], *, overwrite: bool = False) -> None:
    """Refuses an output file that cannot be written (a directory, a missing or read-only parent
    directory, a file system that takes no files), that is a run's or sweep's own file, that
    exists and was not written by this command (unless ``overwrite``), or a figure not named
    .png/.pdf/.svg: naming the flag, before the command does any work."""
    named: dict[str, str] = {}
    for flag, figure in OUTPUT_FLAGS.get(name, {}).items():
        if f"--{flag}=" in argv:  # an empty name would write nothing, silently
            raise rundir.WorkdirError(f"--{flag}= names no file: give a file name, or leave "
                                      f"it out")
        for path in flag_values(argv, flag):
            outputs.check(path, f"--{flag}", name, figure=figure, overwrite=overwrite)
            other = named.setdefault(os.path.abspath(path), flag)
            if other != flag and not rundir.is_null_device(path):
                raise rundir.WorkdirError(f"--{other} and --{flag} both name {path}: the second "
                                          f"would replace the first; give each its own file")


def record_outputs(name: str, argv: list[str]) -> None:
    """Notes the files this command's output flags name as its own (attnlab.outputs)."""
    for flag in OUTPUT_FLAGS.get(name, {}):
        for path in flag_values(argv, flag):
            if os.path.isfile(path):
                outputs.record(path, name)


def flag_values(argv: list[str], flag: str) -> list[str]:
    """The non-empty values of ``--flag=V`` / ``--flag V`` in ``argv``."""
    found = []
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{flag}="):
            found.append(arg.partition("=")[2])
        elif arg == f"--{flag}" and i + 1 < len(argv):
            found.append(argv[i + 1])
    return [value for value in found if value]


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


def console_main() -> int:
    """The ``attnlab`` console script: :func:`main`, then an exit that a late Ctrl-C (a second one
    while the command was already winding down) cannot turn into a death by SIGINT.

    No handler that raises ``KeyboardInterrupt`` is installed here outside the command's
    watchdog: raised in the ``except`` or ``finally`` below it would reach the interpreter (a
    traceback, then exit -2). Before the command an interrupt exits 130 at once; after it the
    watchdog leaves the signals ignored."""
    exit_at_once_on_interrupt()
    try:
        code = main(exiting=True)
    except KeyboardInterrupt:  # one that arrived as the command's watchdog was ending
        code = EXIT_INTERRUPTED
    finally:
        ignore_from_now_on()
    # CPython remembers a KeyboardInterrupt that escaped code run by exec() of a string (how
    # dataclasses and namedtuple build methods, so an interrupt during an import can) and then
    # exits by SIGINT whatever status sys.exit gives; a string exec that succeeds forgets it.
    exec("None")
    return code


if __name__ == "__main__":
    sys.exit(console_main())
