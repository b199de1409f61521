"""The files of run and sweep directories: their names, atomic writes and tolerant reads.

A run directory (``attnlab train --run`` or a sweep's ``runs/<run_id>/``)::

    config.json      the full resolved config (training)
    metrics.jsonl    one JSON object a line (training; the last line may be cut short by a kill)
    summary.json     status and totals, rewritten atomically as the run goes (training)
    checkpoints/     orbax steps (training)
    tensorboard/     event files (training)
    run.json         the sweep's plan of the run
    failure.json     a run that failed outside or around training (sweep worker);
                     failure-<time>.json once the run is retried
    train.log, .lock the sweep worker's log and lock

A sweep directory holds ``runs/``, ``sweep.json``, ``results.parquet`` / ``results.csv``,
``jax_cache/``, ``logs/`` and ``retired/``.

Writers replace a file in one step (a unique temporary file in the same directory, fsync,
``os.replace``), so readers see the old file or the new one and two writers never share a
temporary. Readers choose what a missing or partial file means: :func:`read_json` raises,
:func:`read_json_or_none` returns None.

This is a low layer: it imports nothing of attnlab but :mod:`attnlab.errors`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterator

import platformdirs

from attnlab.errors import AttnlabError, WriteError

# -- a run directory ---------------------------------------------------------------------------
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"  # an imported run's Hugging Face tokenizer (attnlab import-hf)
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CHECKPOINT_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"
RUN_FILE = "run.json"
FAILURE_FILE = "failure.json"
RETRIED_FAILURE_FILE = "failure-{time}.json"  # failure.json of an attempt retried at {time}
LOG_FILE = "train.log"
LOCK_FILE = ".lock"

# -- a sweep directory -------------------------------------------------------------------------
RUNS_DIR = "runs"
SWEEP_FILE = "sweep.json"
TABLE_FILE = "results.parquet"
CSV_FILE = "results.csv"
JAX_CACHE_DIR = "jax_cache"
LOGS_DIR = "logs"
RETIRED_DIR = "retired"
SWEEP_LOCK_FILE = ".sweep.lock"  # held (flock) by the sweep writing the directory; names its pid
TUNE_DIR = "tune"  # a tuned sweep's tuning stage: a sweep directory of its own (sweep.tune)
TUNING_FILE = "tuning.json"  # the tuning stage's table of best learning rates and each arm's pick

# What marks a directory as attnlab's: a command refuses to write into an existing, non-empty
# directory holding none of these (someone else's files) unless asked to (--allow-nonempty).
RUN_DIR_NAMES = frozenset({CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, CHECKPOINT_DIR,
                           TENSORBOARD_DIR, RUN_FILE, FAILURE_FILE, LOG_FILE, LOCK_FILE})
SWEEP_DIR_NAMES = frozenset({RUNS_DIR, SWEEP_FILE, TABLE_FILE, CSV_FILE, JAX_CACHE_DIR, LOGS_DIR,
                             RETIRED_DIR, SWEEP_LOCK_FILE, TUNE_DIR, TUNING_FILE})
# The files a command writes into its directory before any other (its lock, its config): only
# these prove a directory holding anything else is attnlab's. A user's own summary.json or
# results.csv beside their files is not a run or a sweep. (A tuned sweep's study directory
# holds its tuning stage's picks, tuning.json, before the study's own files.)
RUN_DIR_MARKERS = frozenset({LOCK_FILE, CONFIG_FILE, RUN_FILE})
SWEEP_DIR_MARKERS = frozenset({SWEEP_LOCK_FILE, SWEEP_FILE, TUNING_FILE})

# -- statuses ----------------------------------------------------------------------------------
# What summary.json says (training) ...
RUNNING, COMPLETED, DIVERGED, FAILED = "running", "completed", "diverged", "failed"
SUMMARY_STATUSES = (RUNNING, COMPLETED, DIVERGED, FAILED)
# ... and what a sweep makes of a run directory (run_status).
PARTIAL, PENDING = "partial", "pending"
MISSING = "missing"  # a planned run whose run.json vanished (its directory deleted mid-sweep)
FINAL_STATUSES = (COMPLETED, DIVERGED, FAILED)
# A ladder sweep's roles (run.json and the results table's ``role``): the constant-LR phase a
# size's branches share, and a cooldown from its checkpoint.
TRUNK, BRANCH = "trunk", "branch"


def default_cache_dir() -> Path:
    """$ATTNLAB_CACHE_DIR, else the platform's user cache dir (e.g. ~/.cache/attnlab)."""
    return Path(os.environ.get("ATTNLAB_CACHE_DIR") or platformdirs.user_cache_dir("attnlab"))


def compilation_cache_dir(workdir: Path | None, given: str | os.PathLike | None = None
                          ) -> Path | None:
    """Where a sweep's runs keep JAX's compiled programs: ``given`` (--cache-dir), else the cache
    JAX itself was pointed at ($JAX_COMPILATION_CACHE_DIR, shared with other sweeps), else
    ``workdir/jax_cache``; None when there is neither (no sweep directory yet)."""
    chosen = given or os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if chosen:
        return Path(chosen).absolute()
    return workdir / JAX_CACHE_DIR if workdir is not None else None


class WorkdirError(AttnlabError):
    """A run directory holds something this run must not overwrite, or a file it cannot read."""


# -- writing -----------------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a fresh temporary path beside ``path``; on success it replaces ``path``.

    The temporary's name is unique to this writer (a random suffix, created exclusively), so
    concurrent writers of one file cannot clobber each other's half-written data; the last
    ``os.replace`` wins whole. (Not ``mkstemp``: its files are private, mode 0600, and the
    results must stay readable as before.) On an exception the temporary is removed and ``path``
    is left as it was.
    """
    path = Path(path)
    if is_null_device(path):  # written and dropped: the device itself is never replaced
        with tempfile.TemporaryDirectory(prefix="attnlab-discarded-") as scratch:
            yield Path(scratch) / path.name
        return
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.touch(exist_ok=False)  # permissions from the umask, like any new file
        try:
            yield tmp
            with open(tmp, "rb") as handle:  # on disk before the rename makes it visible
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as error:
        # A failed write (ENOSPC, EROFS) names the file the user asked for, not the temporary.
        if error.filename not in (None, str(tmp)):
            raise
        raise OSError(error.errno, error.strerror, str(path)) from error


_ATOMIC_TEMPORARY = re.compile(r"\..+\.[0-9a-f]{32}\.tmp")


def remove_stale_temporaries(directory: Path) -> list[str]:
    """Removes the temporaries of :func:`atomic_path` that a writer killed between creating and
    renaming one (SIGKILL: no cleanup runs) left in ``directory``; returns their names. Call it
    only while holding the directory's lock, when no other writer's temporary can be live."""
    stale = [p for p in directory.iterdir()
             if p.is_file() and _ATOMIC_TEMPORARY.fullmatch(p.name)]
    for path in stale:
        path.unlink(missing_ok=True)
    return [p.name for p in stale]


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Writes ``text`` so that readers see the old file or the new one, never a part."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """``obj`` as indented, key-sorted JSON (NaN allowed: losses can be NaN), atomically."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=True) + "\n")


# -- can it be written? ------------------------------------------------------------------------
#
# Asked by trying, not by ``os.access``: root passes every permission check, and a directory on a
# read-only or pseudo file system (/proc, /sys) or a full disk refuses a write that the modes
# allow. Each probe removes what it made, so a refused command leaves nothing behind.


def existing_ancestor(path: Path) -> Path:
    """``path`` itself or its nearest ancestor that exists."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_can_create_dir(path: str | os.PathLike, flag: str) -> None:
    """Raises WorkdirError (``flag`` and the path named) unless ``path`` is a directory this
    process can write into, or can be created: its nearest existing ancestor is a directory in
    which a directory can be made. Nothing is left behind."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise WorkdirError(f"{flag} {path} exists and is not a directory")
    ancestor = existing_ancestor(path)
    if not ancestor.is_dir():
        raise WorkdirError(f"{flag} {path}: {ancestor} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".attnlab-probe-", dir=ancestor))
    except OSError as e:
        what = "write into it" if ancestor == path else f"create it in {ancestor}"
        raise WorkdirError(f"{flag} {path}: cannot {what} ({e.strerror or e})") from None


def check_not_foreign(path: Path, ours: frozenset[str], markers: frozenset[str], what: str,
                      flag: str, *, allow_nonempty: bool = False) -> None:
    """Raises WorkdirError (naming ``flag``) unless ``path`` is missing, empty, holds one of
    ``markers`` (the files an attnlab ``what``, e.g. "run", writes first), or holds nothing but
    directories named in ``ours`` (an interrupted command's, or a dry run's compilation cache):
    as ``git clone`` does, a directory of someone else's files is not written into unless
    ``allow_nonempty``, even when one of them has a name attnlab also uses."""
    if allow_nonempty or not path.is_dir():
        return
    entries = list(os.scandir(path))
    names = {entry.name for entry in entries}
    leftovers = all(e.name in ours and e.is_dir(follow_symlinks=False) for e in entries)
    if names and not names & markers and not leftovers:
        shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
        raise WorkdirError(f"{flag} {path} is not empty ({len(names)} entries: {shown}) and "
                           f"holds no attnlab {what}; pass an empty or new directory, or "
                           f"--allow-nonempty to write into it anyway")


NULL_DEVICE = "the null device"


def special_file(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it exists and is neither a regular file nor a directory (a named
    pipe, a socket, a device, :data:`NULL_DEVICE`); None otherwise. Read from its status, never
    by opening it."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if is_null_device(path):
        return NULL_DEVICE
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    return "a socket" if stat.S_ISSOCK(mode) else "a device"


def is_null_device(path: str | os.PathLike) -> bool:
    try:
        return os.path.samefile(path, os.devnull)
    except OSError:
        return False


def check_can_write_file(path: str | os.PathLike, flag: str) -> None:
    """Raises WorkdirError (``flag`` and the path named) unless the file ``path`` can be written:
    not a directory, in an existing directory where a file can be created, itself writable if it
    exists. An existing file is opened for appending, which changes nothing in it."""
    path = Path(path)
    parent = path.absolute().parent
    if path.is_dir():
        raise WorkdirError(f"{flag}={path} is a directory; give a file name")
    kind = special_file(path)
    if kind == NULL_DEVICE:
        return  # written as a sink: atomic_path discards what goes to it
    if kind is not None:  # never opened (a FIFO would wait for a reader), nor replaced
        raise WorkdirError(f"{flag}={path} is {kind}, not a regular file; give a file name")
    if parent.exists() and not parent.is_dir():
        raise WorkdirError(f"{flag}={path}: {parent} is a file, not a directory")
    if not parent.is_dir():
        raise WorkdirError(f"{flag}={path}: the directory {parent} does not exist")
    try:
        with tempfile.NamedTemporaryFile(prefix=".attnlab-probe-", dir=parent):
            pass
    except OSError as e:
        raise WorkdirError(f"{flag}={path}: cannot write a file in {parent} "
                           f"({e.strerror or e})") from None
    try:
        if path.exists():
            with open(path, "a"):
                pass
    except OSError as e:
        raise WorkdirError(f"{flag}={path}: not writable ({e.strerror or e})") from None


# -- reading -----------------------------------------------------------------------------------


def read_json(path: str | os.PathLike) -> Any:
    """The JSON in ``path``. Raises WorkdirError naming the file if it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise WorkdirError(f"cannot read {path}: {e}") from None


def read_json_or_none(path: str | os.PathLike) -> Any:
    """The JSON in ``path``, or None if it is missing or cut short (e.g. a run still starting)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_jsonl(path: str | os.PathLike) -> list[Any]:
    """Every whole JSON line of ``path`` ([] if missing); a line cut short by a kill is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The step records of a ``metrics.jsonl``."""
    return [r for r in read_jsonl(path) if isinstance(r, dict) and "step" in r]


def rewind_metrics(path: str | os.PathLike, step: int) -> list[dict]:
    """Drops lines logged after ``step`` (work lost when a run was killed after its last
    checkpoint, about to be redone), rewriting the file atomically; returns the lines kept."""
    path = Path(path)
    if not path.exists():
        return []
    kept = [r for r in read_jsonl(path) if isinstance(r, dict) and r.get("step", 0) <= step]
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
    return kept


# -- a run's state -----------------------------------------------------------------------------


def run_status(run_dir: str | os.PathLike) -> str:
    """completed | diverged | failed | partial | pending, from the files in ``run_dir``.

    A summary that says ``running`` belongs to a process that was killed (or is still running);
    one that says ``failed`` because of KeyboardInterrupt/SystemExit was interrupted, not broken.
    Both count as partial: rerunning resumes them.
    """
    run_dir = Path(run_dir)
    summary = read_json_or_none(run_dir / SUMMARY_FILE)
    if (isinstance(summary, dict) and summary.get("status") in FINAL_STATUSES
            and not _interrupted(summary)):
        return summary["status"]
    if (run_dir / FAILURE_FILE).exists():
        return FAILED
    if any((run_dir / name).exists() for name in (SUMMARY_FILE, METRICS_FILE, CHECKPOINT_DIR)):
        return PARTIAL
    return PENDING


def interrupt_unwound(error: BaseException) -> str | None:
    """Why ``error`` is an interruption, not a failure, if it was raised while a Ctrl-C or
    SIGTERM unwound (a lock released twice, a file closed under a signal); None otherwise."""
    seen, cause = {id(error)}, error.__context__ or error.__cause__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, (KeyboardInterrupt, SystemExit)):
            return f"interrupted ({type(error).__name__} while unwinding: {error})"
        seen.add(id(cause))
        cause = cause.__context__ or cause.__cause__
    return None


def failure_text(error: BaseException) -> str:
    """The error a run's summary records, ``Type: message``; an error raised while an interrupt
    unwound is recorded as a KeyboardInterrupt, so that the run counts as partial (resumable)."""
    unwound = interrupt_unwound(error)
    return f"KeyboardInterrupt: {unwound}" if unwound else f"{type(error).__name__}: {error}"


def _interrupted(summary: dict) -> bool:
    error = str(summary.get("error", ""))
    return summary.get("status") == FAILED and error.startswith(("KeyboardInterrupt",
                                                                 "SystemExit"))


# -- a write that failed -----------------------------------------------------------------------

# The OS errors that say the storage, not the program, refused a write.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG}
# How tensorstore (under orbax) reports them: `Failed writing: "PATH": ...: No space left on
# device [os_error_code='28']`.
_TENSORSTORE_OS_ERROR = re.compile(r"os_error_code='(\d+)'")
_TENSORSTORE_PATH = re.compile(r'(?:Failed writing|local file): "([^"]+)"')
_ORBAX_TMP = re.compile(r"\.orbax-checkpoint-tmp.*$")


def write_failure(error: BaseException | None, default_path: str | os.PathLike = ""
                  ) -> WriteError | None:
    """The :class:`WriteError` that ``error`` (or an exception it was raised from) amounts to,
    in one line naming the path and the OS's reason; None for any other error. A checkpoint is
    named by its step's directory, not by orbax's temporary files inside it."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _WRITE_ERRNOS:
            path = error.filename or default_path
            return WriteError(f"cannot write {path}: {os.strerror(error.errno)}")
        code = _TENSORSTORE_OS_ERROR.search(str(error))
        if code and int(code.group(1)) in _WRITE_ERRNOS:
            found = _TENSORSTORE_PATH.search(str(error))
            path = _ORBAX_TMP.sub("", found.group(1)) if found else default_path
            return WriteError(f"cannot write {path}: {os.strerror(int(code.group(1)))}")
        error = error.__cause__ or error.__context__
    return None
