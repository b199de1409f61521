"""Command-line flags for sub-commands that take a config file.

The Flax-examples convention: ``--config=configs/x.py`` names a file whose ``get_config()`` returns
an ``ml_collections.ConfigDict``, and ``--config.model.n_layers=4`` overrides one field.
ml_collections' absl flags do the parsing; each call gets its own ``FlagValues`` so that no global
flag state leaks between sub-commands (or between tests).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import ml_collections
from absl import flags
from ml_collections import config_flags

from attnlab.errors import AttnlabError


class UsageError(AttnlabError):
    """Bad command-line usage (unknown flag, missing required flag)."""


class HelpRequested(Exception):
    """``--help`` was given; ``text`` lists the command's flags. The CLI prints it and exits 0."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


def help_text(prog: str, extra: list["Flag"], *, config_required: bool = True,
              description: str = "") -> str:
    lines = [description.strip(), ""] if description else []
    config = "--config=FILE" if config_required else "[--config=FILE]"
    lines += [f"usage: {prog} {config} [--config.SECTION.KEY=VALUE ...] [flags]", "", "flags:",
             "  --config=FILE  a config file defining get_config()"
             + ("" if config_required else " (optional)"),
             "  --config.SECTION.KEY=VALUE  override one field, e.g. --config.model.n_layers=4"]
    for flag in extra:
        choices = f" ({'|'.join(flag.enum_values)})" if flag.enum_values else ""
        required = ", required" if flag.required else f", default {flag.default!r}"
        lines.append(f"  --{flag.name}{choices}  {flag.help}{required}")
    return "\n".join(lines) + "\n"


@dataclasses.dataclass
class Flag:
    """A plain flag beside --config: DEFINE_<kind>(name, default, help)."""

    name: str
    kind: str  # "string" | "integer" | "float" | "bool" | "enum"
    default: Any
    help: str
    enum_values: tuple[str, ...] = ()
    required: bool = False


def parse(argv: list[str], extra: list[Flag] = (), *, prog: str = "attnlab",
          config_required: bool = True, description: str = "") -> flags.FlagValues:
    """Parses ``argv`` (without the program name) into a fresh FlagValues.

    Returns the FlagValues; ``values.config`` is the ConfigDict with overrides applied.
    Raises UsageError naming the flag at fault, HelpRequested for ``--help``.
    """
    if any(arg in ("-h", "--help", "--helpfull") for arg in argv):
        raise HelpRequested(help_text(prog, list(extra), config_required=config_required,
                                      description=description))
    values = flags.FlagValues()
    args = [prog, *argv]
    # sys_argv: the overrides are read from these args, not from the process's sys.argv.
    config_flags.DEFINE_config_file(
        "config", None, "Path to a config file defining get_config().", flag_values=values,
        lock_config=True, sys_argv=args)
    definers: dict[str, Callable] = {
        "string": flags.DEFINE_string, "integer": flags.DEFINE_integer,
        "float": flags.DEFINE_float, "bool": flags.DEFINE_bool,
    }
    for flag in extra:
        if flag.kind == "enum":
            flags.DEFINE_enum(flag.name, flag.default, list(flag.enum_values), flag.help,
                              flag_values=values)
        else:
            definers[flag.kind](flag.name, flag.default, flag.help, flag_values=values)
    try:
        values(args)
    except flags.Error as e:  # unknown flag, bad value, bad override path
        raise UsageError(str(e)) from None
    except (FileNotFoundError, OSError) as e:
        raise UsageError(f"--config: cannot read config file: {e}") from None
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        bad = [a.split("=")[0] for a in argv if a.startswith("--config.")]
        raise UsageError(f"bad config override among {', '.join(bad)}: no such field {e}") from None
    config = values["config"].value
    if config is not None and not isinstance(config, ml_collections.ConfigDict):
        # ml_collections defers file errors into a placeholder object; surface them now.
        path = values["config"].serialize().partition("=")[2]
        raise UsageError(f"--config: cannot load config file {path!r} (missing, or no get_config())")
    if config_required and config is None:
        raise UsageError("--config is required, e.g. --config=configs/default.py")
    for flag in extra:
        if flag.required and values[flag.name].value in (None, ""):
            raise UsageError(f"--{flag.name} is required")
    return values
