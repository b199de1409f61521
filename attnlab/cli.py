"""The ``attnlab`` console script: a thin dispatcher to each package's own command.

Each sub-command is a function ``main(argv: list[str]) -> int`` living next to the code it drives
(e.g. ``attnlab/scaling/cli.py``); this file only routes to it, so importing the CLI stays cheap
and layers keep pointing one way (the commands import the library, never the reverse).
"""

from __future__ import annotations

import importlib
import sys

from attnlab.cli_flags import HelpRequested
from attnlab.errors import AttnlabError

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
        sys.stderr.write(f"error: unknown command {name!r}\n\n{USAGE}")
        return 2
    module_name, function_name, _ = COMMANDS[name]
    command = getattr(importlib.import_module(module_name), function_name)
    try:
        return int(command(rest) or 0)
    except HelpRequested as e:
        sys.stdout.write(e.text)
        return 0
    except AttnlabError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
