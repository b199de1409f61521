"""Files a command writes where the user points it (``--json``, ``--plot``): checked
before the command does any work, written whole or not at all, and never over a file that the
command did not write itself.

A run's or a sweep's own files (config.json, summary.json, metrics.jsonl, results.csv, anything
under checkpoints/) are refused whatever the flags say: they are stored nowhere else. Any other
existing file is replaced only if the same command wrote it last, as a ledger in the user cache
directory records (path, size, modification time; :func:`record`, called by the dispatcher once
the command has succeeded), or with ``--overwrite``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from attnlab import rundir
from attnlab.rundir import WorkdirError

FIGURE_SUFFIXES = (".png", ".pdf", ".svg")
LEDGER_FILE = "outputs.json"  # in rundir.default_cache_dir()
# Folders of a run whose every file is the run's (orbax's checkpoint files, TensorBoard events).
_RUN_FOLDERS = (rundir.CHECKPOINT_DIR, rundir.TENSORBOARD_DIR)


def check(path: str | os.PathLike, flag: str, command: str, *, figure: bool,
          overwrite: bool) -> None:
    """Raises WorkdirError naming ``flag`` unless ``command`` may write ``path``."""
    path = Path(path)
    owner = owning_directory(path)
    if owner is not None:
        raise WorkdirError(f"{flag}={path} is a file of the {owner}; it is stored nowhere "
                           "else, so it is never overwritten: give another file name")
    rundir.check_can_write_file(path, flag)
    if rundir.is_null_device(path):
        sys.stderr.write(f"note: {flag}={path} is the null device: the output is discarded\n")
        return
    if figure and path.suffix.lower() not in FIGURE_SUFFIXES:
        raise WorkdirError(f"{flag}={path}: a figure is written as "
                           f"{', '.join(FIGURE_SUFFIXES)}; give a name ending in one of them")
    if path.exists() and not overwrite and not written_by(path, command):
        raise WorkdirError(f"{flag}={path} exists and attnlab {command} did not write it; "
                           "give another file name, or --overwrite to replace it")


def owning_directory(path: Path) -> str | None:
    """'run DIR' or 'sweep DIR' if ``path`` is one of that directory's own files, else None."""
    path = path.absolute()
    for folder in path.parents:
        if folder.name in _RUN_FOLDERS and _is_run(folder.parent):
            return f"run {folder.parent}"
    parent = path.parent
    if _is_run(parent) and (path.name in rundir.RUN_DIR_NAMES
                            or path.name in (rundir.TOKENIZER_FILE, rundir.RUN_FILE)
                            or path.name.startswith("failure-")):
        return f"run {parent}"
    if (parent / rundir.SWEEP_FILE).is_file() and path.name in rundir.SWEEP_DIR_NAMES:
        return f"sweep {parent}"
    return None


def _is_run(folder: Path) -> bool:
    return any((folder / name).is_file() for name in (rundir.RUN_FILE, rundir.CONFIG_FILE,
                                                      rundir.SUMMARY_FILE))


def write_json(path: str | os.PathLike, payload: Any, *, indent: int = 2) -> None:
    """``payload`` as JSON, atomically: readers see the old file or the new one."""
    with rundir.atomic_path(path) as tmp:
        tmp.write_text(json.dumps(payload, indent=indent) + "\n")


def save_figure(figure, path: str | os.PathLike, **savefig) -> Path:
    """``figure.savefig(path, **savefig)`` atomically: a failed write (a full disk) leaves the
    old figure whole."""
    path = Path(path)
    with rundir.atomic_path(path) as tmp:
        figure.savefig(tmp, format=path.suffix.lower().lstrip(".") or "png", **savefig)
    return path


def _ledger_path() -> Path:
    return rundir.default_cache_dir() / LEDGER_FILE


def _stamp(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def record(path: str | os.PathLike, command: str) -> None:
    """Notes that ``command`` wrote ``path`` as it is now. A ledger that cannot be written only
    costs an ``--overwrite`` next time."""
    path = Path(path).absolute()
    ledger = rundir.read_json_or_none(_ledger_path())
    ledger = ledger if isinstance(ledger, dict) else {}
    ledger = {p: entry for p, entry in ledger.items() if Path(p).exists()}
    ledger[str(path)] = {"command": command, "stamp": _stamp(path)}
    try:
        _ledger_path().parent.mkdir(parents=True, exist_ok=True)
        rundir.write_json_atomic(_ledger_path(), ledger)
    except OSError:
        pass


def written_by(path: Path, command: str) -> bool:
    """Whether ``command`` wrote ``path`` and nothing changed it since."""
    ledger = rundir.read_json_or_none(_ledger_path())
    entry = ledger.get(str(path.absolute())) if isinstance(ledger, dict) else None
    try:
        return (isinstance(entry, dict) and entry.get("command") == command
                and entry.get("stamp") == _stamp(path))
    except OSError:
        return False
