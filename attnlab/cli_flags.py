"""Command-line flags of every ``attnlab`` sub-command: one parser, one ``--help``, one error style.

Flags are ``--name=value`` (absl; ``--name value`` too, and ``--flag`` / ``--noflag`` for booleans).
The flags several commands take are declared once, with their meaning, in
:mod:`attnlab.cli_vocab`; their former spellings are rewritten here, with a notice.
Commands that take a config follow the Flax-examples convention: ``--config=configs/x.py`` names a
file whose ``get_config()`` returns an ``ml_collections.ConfigDict``, and
``--config.model.n_layers=4`` overrides one field; a command declares it with
``cli_vocab.CONFIG.flag()`` among its flags, and commands without one (``fit``, ``plot``) pass
``takes_config=False``. Each call gets its own ``FlagValues``, so no global flag state leaks
between sub-commands (or between tests). Bad usage raises :class:`UsageError` naming the flag,
which the dispatcher prints as one ``error: ...`` line with exit code 2.
"""

from __future__ import annotations

import ast
import os
import re
import sys
import traceback
from typing import Callable

import ml_collections
from absl import flags
from ml_collections import config_flags

from attnlab.cli_vocab import CONFIG, Flag, OldName
from attnlab.errors import AttnlabError

__all__ = ["Flag", "HelpRequested", "OldName", "UsageError", "help_text", "parse",
           "refuse_given", "rename_old_flags"]


class UsageError(AttnlabError):
    """Bad command-line usage (unknown flag, missing required flag)."""


def refuse_given(values: flags.FlagValues, names, why: str) -> None:
    """UsageError ``--NAME why`` for the first of ``names`` given on the command line: a flag
    the command, as called, would ignore."""
    for name in names:
        if values[name].present:
            raise UsageError(f"--{name} {why}")


class HelpRequested(Exception):
    """``--help`` was given; ``text`` lists the command's flags. The CLI prints it and exits 0."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


def help_text(prog: str, extra: list[Flag], *, config_required: bool = True,
              takes_config: bool = True, description: str = "") -> str:
    config, extra = _split_config(extra, takes_config, config_required)
    lines = [description.strip(), ""] if description else []
    if config is not None:
        usage = "--config=FILE" if config.required else "[--config=FILE]"
        lines += [f"usage: {prog} {usage} [--config.SECTION.KEY=VALUE ...] [flags]", "",
                  "flags:", f"  --config=FILE  {config.help}"
                  + ("" if config.required else " (optional)"),
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


def _split_config(extra, takes_config: bool,
                  config_required: bool) -> tuple[Flag | None, list[Flag]]:
    """The config flag (declared in ``extra``, else CONFIG when ``takes_config``) and the rest."""
    declared = [flag for flag in extra if flag.kind == "config"]
    rest = [flag for flag in extra if flag.kind != "config"]
    if declared:
        return declared[0], rest
    return (CONFIG.flag(required=config_required) if takes_config else None), rest


def canonical_argv(argv: list[str]) -> list[str]:
    """``argv`` as absl reads it, in one spelling: each ``--flagfile=FILE`` replaced by the
    flags in FILE (absl's own reading of it), and each ``-name[=value]`` written
    ``--name[=value]``. A check of a flag (the output guard's of ``--json``) then sees every
    way of giving it; absl parses the result exactly as it would have parsed ``argv``."""
    try:
        expanded = flags.FlagValues().read_flags_from_files(list(argv), force_gnu=True)
    except flags.Error as e:
        raise UsageError(f"--flagfile: {_one_line(str(e)).removeprefix('ERROR:: ')}") from None
    out = []
    for i, arg in enumerate(expanded):
        if arg == "--":  # absl reads what follows as positional arguments
            return out + expanded[i:]
        previous = out[-1] if out else ""
        takes_value = previous.startswith("--") and "=" not in previous
        if (not takes_value and re.match(r"-[A-Za-z][\w.-]", arg)
                and not arg.startswith("--")):
            arg = "-" + arg
        out.append(arg)
    return out


def rename_old_flags(argv: list[str], extra) -> tuple[list[str], list[str]]:
    """``argv`` with the former spellings of ``extra``'s flags (their ``old_names``) in the
    current ones, and one notice line per former spelling given. A flag given in both its
    former and its current spelling is refused (absl would keep the last silently)."""
    table = {old.name: (flag, old) for flag in extra for old in flag.old_names}
    renamed, notices, current, direct = [], {}, {}, set()
    for i, arg in enumerate(argv):
        if arg == "--":  # absl reads what follows as positional arguments
            renamed += argv[i:]
            break
        found = _renamed(arg, argv[i + 1] if i + 1 < len(argv) else None, table)
        if found is None:
            renamed.append(arg)
            if arg.startswith("-"):
                direct.add(_flag_name(arg))
            continue
        renamed.append(found[0])
        notices.setdefault(found[1], found[2])
        current[_flag_name(found[0])] = found[1]
    for name in sorted(direct.intersection(current)):
        raise UsageError(f"--{current[name]} and --{name} both given: --{current[name]} is "
                         f"the former name of --{name}; give it once")
    return renamed, list(notices.values())


def _flag_name(arg: str) -> str:
    return arg.lstrip("-").partition("=")[0]


def _renamed(arg: str, following: str | None, table) -> tuple[str, str, str] | None:
    """(the argument in its current spelling, the old name, the notice), or None."""
    dashes = "--" if arg.startswith("--") else "-" if arg.startswith("-") else ""
    name, eq, value = arg[len(dashes):].partition("=")
    negated = (dashes and name not in table and name.startswith("no") and not eq
               and name[2:] in table and table[name[2:]][0].kind == "bool")
    name = name[2:] if negated else name
    if not dashes or name not in table:
        return None
    flag, old = table[name]
    given = value if eq else (following if flag.kind != "bool" else None)
    if old.when is not None and (given is None or not old.when(given)):
        return None  # the current flag of that name
    new = f"{dashes}{'no' if negated else ''}{flag.name}{eq}{value}"
    if old.when is None:
        return new, old.name, (f"note: --{old.name} is now --{flag.name}{old.why}; the old "
                               f"name will be removed")
    return new, old.name, (f"note: --{old.name}={given} is now --{flag.name}={given}{old.why}; "
                           f"the old use will be removed")


def parse(argv: list[str], extra: list[Flag] = (), *, prog: str = "attnlab",
          config_required: bool = True, takes_config: bool = True,
          description: str = "") -> flags.FlagValues:
    """Parses ``argv`` (without the program name) into a fresh FlagValues.

    Args:
      extra: the command's flags; a flag of kind "config" (attnlab.cli_vocab.CONFIG) declares
        ``--config``, and then the two arguments below are not read.
      config_required: ``--config`` must be given (else it is optional).
      takes_config: False for commands without a config file: no ``--config`` flag at all.
      description: the first lines of ``--help``.

    Old spellings of the flags (``Flag.old_names``) are rewritten first, each with a notice on
    stderr. Returns the FlagValues; ``values.config`` is the ConfigDict with overrides applied.
    Raises UsageError naming the flag at fault, HelpRequested for ``--help``.
    """
    if any(arg in ("-h", "--help", "--helpfull") for arg in argv):
        raise HelpRequested(help_text(prog, list(extra), config_required=config_required,
                                      takes_config=takes_config, description=description))
    argv, notices = rename_old_flags(list(argv), extra)
    for notice in notices:
        sys.stderr.write(notice + "\n")
    config, extra = _split_config(extra, takes_config, config_required)
    takes_config, config_required = config is not None, bool(config and config.required)
    argv, scale = _scale_as_config_argument(list(argv)) if takes_config else (list(argv), None)
    values = flags.FlagValues()
    args = [prog, *argv]
    if takes_config:
        # sys_argv: the overrides are read from these args, not from the process's sys.argv.
        config_flags.DEFINE_config_file(
            "config", None, config.help, flag_values=values, lock_config=True, sys_argv=args)
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
    config_path = _config_path(argv) if takes_config else None
    if config_path is not None:
        _check_config_file(config_path)
    try:
        positional = values(args)[1:]
    except flags.Error as e:  # unknown flag, bad value, bad override path
        override = next((a for a in argv if a.startswith("--config.")), None)
        if takes_config and _config_value(argv) is None and override and "config." in str(e):
            raise UsageError(f"{override}: overrides a field of a config file; give "
                             f"--config=FILE with it") from None
        given = (f"--config.scale={scale}" if scale is not None else
                 f"--config={_config_value(argv)}" if _config_value(argv) != config_path
                 else None)
        if given and "get_config() takes 0 positional" in str(e):
            raise UsageError(f"{given}: this config file's get_config() takes no scale "
                             f"argument (only experiment files have scales)") from None
        _raise_if_from_config_file(e, config_path)
        raise UsageError(_one_line(str(e))) from None
    except Exception as e:  # noqa: BLE001 - the user's config file can raise anything
        _raise_if_from_config_file(e, config_path)
        if isinstance(e, (FileNotFoundError, OSError)):
            raise UsageError(f"--config: cannot read config file: {e}") from None
        if isinstance(e, AttributeError) and "get_config" in str(e):
            raise UsageError(f"--config={config_path}: the file defines no get_config()") from None
        if isinstance(e, (AttributeError, KeyError, TypeError, ValueError)):
            raise UsageError(_bad_override(e, argv)) from None
        raise
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
    try:
        path = values["config"].serialize().partition("=")[2]
    except Exception:  # noqa: BLE001 - ml_collections: "not parsed" when --config was not given
        path = ""
    if config is not None and not isinstance(config, ml_collections.ConfigDict):
        # ml_collections defers file errors into a placeholder object; surface them now.
        if isinstance(config, (dict, list, tuple, str, int, float)):
            raise UsageError(f"--config={path}: get_config() returned a "
                             f"{type(config).__name__}, not an ml_collections.ConfigDict")
        raise UsageError(f"--config: cannot load config file {path!r} (missing, or no get_config())")
    if config is None and path:
        raise UsageError(f"--config={path}: get_config() returned None (a missing return "
                         f"statement?)")
    if required and config is None:
        raise UsageError("--config is required, e.g. --config=configs/default.py")


def _config_value(argv: list[str]) -> str | None:
    """``--config=FILE[:arg]`` (or ``--config FILE``) as given, None if not given."""
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            return arg.partition("=")[2]
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _config_path(argv: list[str]) -> str | None:
    """The file named by ``--config=FILE[:arg]`` (or ``--config FILE``), None if not given."""
    value = _config_value(argv)
    if value is not None and not os.path.exists(value) and ":" in value:
        value = value.rpartition(":")[0]
    return value


def _check_config_file(path: str) -> None:
    """A missing path, a directory or an unreadable file, named before ml_collections tries."""
    if not path:
        raise UsageError("--config= names no file, e.g. --config=configs/default.py")
    if not os.path.exists(path):
        raise UsageError(f"--config: cannot load config file {path!r}: no such file")
    if os.path.isdir(path):
        raise UsageError(f"--config={path} is a directory, not a Python file defining "
                         f"get_config()")
    if not os.access(path, os.R_OK):
        raise UsageError(f"--config={path}: cannot read the file (permission denied)")
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read(), filename=path)
    except SyntaxError as e:
        raise UsageError(f"--config={path}: {e.filename}, line {e.lineno}: SyntaxError: "
                         f"{e.msg}") from None
    except (OSError, ValueError) as e:  # unreadable, or NUL bytes
        raise UsageError(f"--config={path}: cannot read the file: {e}") from None
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif not isinstance(node, ast.Expr):  # if/try blocks may define it: the loader says
            defined.add("get_config")
    if "get_config" not in defined and "*" not in defined:
        raise UsageError(f"--config={path}: the file defines no get_config()")


def _same_file(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return False
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def _raise_if_from_config_file(error: BaseException, path: str | None) -> None:
    """If ``error`` (or what caused it) was raised by the user's config file, raises a
    UsageError naming that file and line, e.g. ``--config=x.py: x.py, line 3 in get_config:
    ValueError: ...``; otherwise returns."""
    if path is None:
        return
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        where = None
        if isinstance(error, SyntaxError) and _same_file(error.filename, path):
            where = f"{error.filename}, line {error.lineno}"
        else:
            for frame, lineno in traceback.walk_tb(error.__traceback__):
                if _same_file(frame.f_code.co_filename, path):
                    where = f"{frame.f_code.co_filename}, line {lineno} in {frame.f_code.co_name}"
        if where is not None:
            message = error.msg if isinstance(error, SyntaxError) else str(error)
            raise UsageError(f"--config={path}: {where}: {type(error).__name__}: "
                             f"{_one_line(message)}") from None
        error = error.__cause__ or error.__context__


def _one_line(text: str) -> str:
    """A message that may span lines (absl, ml_collections) as one line."""
    return "; ".join(part.strip() for part in str(text).strip().splitlines() if part.strip())


def _bad_override(error: Exception, argv: list[str]) -> str:
    """``--config.model.d_modle: no such field 'd_modle' (did you mean "d_model"?)``."""
    overrides = [a.split("=")[0] for a in argv if a.startswith("--config.")]
    while error.args and isinstance(error.args[0], BaseException):  # AttributeError(KeyError)
        error = error.args[0]
    text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    first, _, rest = str(text).partition("\n")
    name = first.strip().strip("'\"")
    culprit = next((o for o in overrides if name in o.split(".")[1:]), None)
    hint = ""
    if "Did you mean" in rest:
        hint = " (did you mean " + rest.split("Did you mean", 1)[1].split(" instead")[0].strip() + "?)"
    if culprit:
        return f"{culprit}: no such field {name!r}{hint}"
    return (f"bad config override among {', '.join(overrides) or '(none)'}: no such field "
            f"{_one_line(first)}{hint}")


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
