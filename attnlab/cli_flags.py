"""Command-line flags of every ``attnlab`` sub-command: one parser, one ``--help``, one error style.

Flags are ``--name=value`` (absl; ``--name value`` too, and ``--flag`` / ``--noflag`` for booleans).
Commands that take a config follow the Flax-examples convention: ``--config=configs/x.py`` names a
file whose ``get_config()`` returns an ``ml_collections.ConfigDict``, and
``--config.model.n_layers=4`` overrides one field; commands without one (``fit``, ``plot``) pass
``takes_config=False``. Each call gets its own ``FlagValues``, so no global flag state leaks
between sub-commands (or between tests). Bad usage raises :class:`UsageError` naming the flag,
which the dispatcher prints as one ``error: ...`` line with exit code 2.
"""

from __future__ import annotations

import dataclasses
import os
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
              takes_config: bool = True, description: str = "") -> str:
    lines = [description.strip(), ""] if description else []
    if takes_config:
        config = "--config=FILE" if config_required else "[--config=FILE]"
        lines += [f"usage: {prog} {config} [--config.SECTION.KEY=VALUE ...] [flags]", "",
                  "flags:", "  --config=FILE  a config file defining get_config()"
                  + ("" if config_required else " (optional)"),
                  "  --config.SECTION.KEY=VALUE  override one field, e.g. "
                  "--config.model.n_layers=4"]
    else:
        lines += [f"usage: {prog} [flags]", "", "flags:"]
    for flag in extra:
        choices = f" ({'|'.join(flag.enum_values)})" if flag.enum_values else ""
        if flag.required:
            note = " (required)"
        elif flag.default in (None, ""):
            note = ""  # unset unless given
        else:
            note = f" (default {flag.default!r})"
        lines.append(f"  --{flag.name}{choices}  {flag.help}{note}")
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
          config_required: bool = True, takes_config: bool = True,
          description: str = "") -> flags.FlagValues:
    """Parses ``argv`` (without the program name) into a fresh FlagValues.

    Args:
      extra: the command's flags besides ``--config``.
      config_required: ``--config`` must be given (else it is optional).
      takes_config: False for commands without a config file: no ``--config`` flag at all.
      description: the first lines of ``--help``.

    Returns the FlagValues; ``values.config`` is the ConfigDict with overrides applied.
    Raises UsageError naming the flag at fault, HelpRequested for ``--help``.
    """
    if any(arg in ("-h", "--help", "--helpfull") for arg in argv):
        raise HelpRequested(help_text(prog, list(extra), config_required=config_required,
                                      takes_config=takes_config, description=description))
    argv, scale = _scale_as_config_argument(list(argv)) if takes_config else (list(argv), None)
    values = flags.FlagValues()
    args = [prog, *argv]
    if takes_config:
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
        positional = values(args)[1:]
    except flags.Error as e:  # unknown flag, bad value, bad override path
        if scale is not None and "get_config() takes 0 positional" in str(e):
            raise UsageError(f"--config.scale={scale}: this config file's get_config() takes no "
                             f"scale argument (only experiment files have scales)") from None
        raise UsageError(str(e)) from None
    except (FileNotFoundError, OSError) as e:
        raise UsageError(f"--config: cannot read config file: {e}") from None
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        bad = [a.split("=")[0] for a in argv if a.startswith("--config.")]
        raise UsageError(f"bad config override among {', '.join(bad)}: no such field {e}") from None
    if positional:
        raise UsageError(f"unexpected argument {positional[0]!r}: flags take the form "
                         f"--name=value (see {prog} --help)")
    if takes_config:
        _check_config(values, config_required)
    for flag in extra:
        if flag.required and values[flag.name].value in (None, ""):
            raise UsageError(f"--{flag.name} is required")
    return values


def _check_config(values: flags.FlagValues, required: bool) -> None:
    config = values["config"].value
    if config is not None and not isinstance(config, ml_collections.ConfigDict):
        # ml_collections defers file errors into a placeholder object; surface them now.
        path = values["config"].serialize().partition("=")[2]
        raise UsageError(f"--config: cannot load config file {path!r} (missing, or no get_config())")
    if required and config is None:
        raise UsageError("--config is required, e.g. --config=configs/default.py")


def _scale_as_config_argument(argv: list[str]) -> tuple[list[str], str | None]:
    """``--config=x.py --config.scale=gpu`` means ``--config=x.py:gpu``.

    An experiment file's sizes are chosen inside ``get_config(scale)``, so overriding the
    ``scale`` field after the call would relabel the CPU plan instead of picking the GPU one.
    This rewrites the ``--config`` argument so that get_config receives the scale (the override
    stays, and sets the field to the same value). Returns the new argv and the scale (or None).
    """
    scale = None
    for i, arg in enumerate(argv):
        if arg.startswith("--config.scale="):
            scale = arg.partition("=")[2]
        elif arg == "--config.scale" and i + 1 < len(argv):
            scale = argv[i + 1]
    if scale is None:
        return argv, None
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            prefix, path = "--config=", arg.partition("=")[2]
        elif arg == "--config" and i + 1 < len(argv):
            prefix, path, i = "", argv[i + 1], i + 1
        else:
            continue
        if not os.path.exists(path) and ":" in path:  # ml_collections reads file.py:arg
            file, _, given = path.rpartition(":")
            if given != scale:
                raise UsageError(f"--config.scale={scale} contradicts --config={path}: "
                                 f"give the scale once")
            return argv, scale
        argv[i] = f"{prefix}{path}:{scale}"
        return argv, scale
    raise UsageError(f"--config.scale={scale} needs --config=FILE (an experiment file)")
