"""Runs sweep runs inside one process: the local launcher's worker processes and Ray tasks.

``execute_run(run_dir)`` trains the run planned in ``run_dir/run.json`` with
:func:`attnlab.train.run` (which resumes from the run's latest checkpoint), sending the run's
output to ``run_dir/train.log``. A lock file keeps two processes off one run.

:func:`main` (``attnlab.worker.main(['<json settings>'])``) is a long-lived worker of the
local launcher, so that JAX is imported once per worker rather than once per run. It reads one
JSON request per line on stdin, ``{"runs": [run_dir, ...], "next": [run_dir, ...] or null}``
(several runs: one ensemble), and answers one JSON line per request on stdout (a list, one
answer per run). While it trains ``run`` it compiles ``next``'s programs in a thread
(:meth:`attnlab.train.ProgramCache.precompile`, the sweep's ``compile_ahead``). It dies with its
parent (Linux ``PR_SET_PDEATHSIG``), so killing a sweep with SIGKILL stops its training too.

It lives outside ``attnlab.sweep`` so that a worker process imports only what training needs
(importing the sweep package would add pandas and pyarrow: ~0.4 s per worker start).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Iterator

import jax

from attnlab import rundir
from attnlab.config import from_config_dict
from attnlab.interrupts import (EXIT_INTERRUPTED, raise_keyboard_interrupt,
                                reraising_lost_interrupts)
from attnlab.rundir import (FAILURE_FILE, LOCK_FILE, LOG_FILE, RUN_FILE,
                            remove_stale_temporaries)

_PR_SET_PDEATHSIG = 1


def enable_compilation_cache(cache_dir: str | os.PathLike) -> None:
    """Turns on JAX's persistent compilation cache in ``cache_dir`` for this process.

    The thresholds are lowered to zero so that even the small, fast-compiling programs of tiny
    runs are cached: runs with identical shapes then load their executables instead of
    recompiling them (in later runs and in later sweeps that share the directory).
    """
    jax.config.update("jax_compilation_cache_dir", os.fspath(cache_dir))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


@contextlib.contextmanager
def _run_lock(run_dir: Path) -> Iterator[bool]:
    """Yields True while this process holds the run's lock, False if another process has it.
    The kernel drops the lock when its holder dies, so a killed sweep leaves nothing stale."""
    with open(run_dir / LOCK_FILE, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            remove_stale_temporaries(run_dir)  # a killed earlier holder's half-written files
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """Sends this process's stdout and stderr (Python's and the C libraries') to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def write_failure(run_dir: Path, error: str, details: str = "") -> None:
    """Records a run that failed outside or around training (``failure.json``)."""
    rundir.write_json_atomic(run_dir / FAILURE_FILE, {
        "status": rundir.FAILED, "error": error, "details": details, "time": time.time()})


# In an answer: a write the storage refused (a full disk). The run is left partial, not failed
# (nothing is recorded: it could not be written anyway), and the sweep stops with the error.
STOP_ON = "write_failure"


def execute_run(run_dir: str | os.PathLike, cache_dir: str | None = None,
                programs=None) -> dict:
    """Trains (or resumes) the run in ``run_dir`` in this process, taking its compiled programs
    from ``programs`` (an :class:`attnlab.train.ProgramCache`) when given.

    Returns:
      {'run_id', 'status', 'error', 'seconds'}: status is the summary's (completed / diverged),
      'failed' (an exception; recorded in failure.json), or 'busy' (another process holds the
      run's lock; nothing was done).
    """
    # Imported here, not at the top: the launching process imports this module (through
    # attnlab.sweep) but never trains, so planning a sweep stays free of orbax and TFDS.
    from attnlab import train

    run_dir = Path(run_dir)
    planned = rundir.read_json_or_none(run_dir / RUN_FILE)
    run_id = planned["run_id"] if planned else run_dir.name
    if cache_dir:
        enable_compilation_cache(cache_dir)
    start = time.perf_counter()
    with _run_lock(run_dir) as locked:
        if not locked:
            return {"run_id": run_id, "status": "busy", "error": "another process is running it",
                    "seconds": 0.0}
        with _output_to(run_dir / LOG_FILE):
            try:
                if planned is None:
                    raise FileNotFoundError(f"{run_dir / RUN_FILE} is missing or unreadable")
                cfg = from_config_dict(planned["config"])
                # allow_large: the sweep checked every run's memory before starting
                summary = train.run(cfg, run_dir, progress=True, allow_large=True,
                                    programs=programs)
                status, error = summary["status"], summary.get("error")
            except Exception as e:  # noqa: BLE001 - any failure is recorded with the run
                raise_if_interrupted(e)
                full = rundir.write_failure(e, run_dir)
                if full is not None:  # the run stays partial; the sweep stops (STOP_ON)
                    return {"run_id": run_id, "status": rundir.PARTIAL, "error": str(full),
                            "seconds": time.perf_counter() - start, STOP_ON: True}
                status, error = rundir.FAILED, f"{type(e).__name__}: {e}"
                traceback.print_exc()
                write_failure(run_dir, error, traceback.format_exc())
    return {"run_id": run_id, "status": status, "error": error,
            "seconds": time.perf_counter() - start}


def raise_if_interrupted(error: BaseException) -> None:
    """Raises KeyboardInterrupt if ``error`` was raised while an interrupt unwound (a lock
    released twice, a file closed under a signal): the run was interrupted, not broken, and
    resumes when the sweep is rerun."""
    unwound = rundir.interrupt_unwound(error)
    if unwound:
        raise KeyboardInterrupt(unwound) from error


def execute_runs(run_dirs: list[str | os.PathLike], cache_dir: str | None = None,
                 programs=None) -> list[dict]:
    """Trains the runs in ``run_dirs``: one alone (:func:`execute_run`), several as one ensemble
    (:func:`execute_ensemble`). Returns one answer per run, in order."""
    if len(run_dirs) == 1:
        return [execute_run(run_dirs[0], cache_dir, programs)]
    return execute_ensemble(run_dirs, cache_dir, programs)


def execute_ensemble(run_dirs: list[str | os.PathLike], cache_dir: str | None = None,
                     programs=None) -> list[dict]:
    """Trains the runs planned in ``run_dirs`` as one ensemble
    (:func:`attnlab.train.ensemble.run_ensemble`), each into its own directory. The output goes
    to the first run's ``train.log`` (the others' logs say so). A run another process holds is
    answered 'busy' and left out; a failure is recorded with every member."""
    from attnlab.train.ensemble import run_ensemble  # see execute_run

    run_dirs = [Path(d) for d in run_dirs]
    if cache_dir:
        enable_compilation_cache(cache_dir)
    start = time.perf_counter()
    answers: dict[Path, dict] = {}
    with contextlib.ExitStack() as stack:
        members = []
        for run_dir in run_dirs:
            if stack.enter_context(_run_lock(run_dir)):
                members.append(run_dir)
            else:
                answers[run_dir] = {"run_id": run_dir.name, "status": "busy",
                                    "error": "another process is running it", "seconds": 0.0}
        if members:
            answers.update(_train_members(members, run_ensemble, programs, start))
    return [answers[d] for d in run_dirs]


def _train_members(members: list[Path], run_ensemble, programs, start: float) -> dict:
    for other in members[1:]:
        with open(other / LOG_FILE, "a") as log:
            log.write(f"trained in an ensemble with {', '.join(m.name for m in members)}; "
                      f"its output is in {members[0] / LOG_FILE}\n")
    with _output_to(members[0] / LOG_FILE):
        try:
            planned = [rundir.read_json_or_none(m / RUN_FILE) for m in members]
            missing = [m for m, p in zip(members, planned) if p is None]
            if missing:
                raise FileNotFoundError(f"{missing[0] / RUN_FILE} is missing or unreadable")
            cfgs = [from_config_dict(p["config"]) for p in planned]
            summaries = run_ensemble(cfgs, members, progress=True, allow_large=True,
                                     programs=programs)
            outcomes = [(s["status"], s.get("error")) for s in summaries]
        except Exception as e:  # noqa: BLE001 - any failure is recorded with every member
            raise_if_interrupted(e)
            full = rundir.write_failure(e, members[0])
            if full is not None:  # the members stay partial; the sweep stops (STOP_ON)
                seconds = time.perf_counter() - start
                return {m: {"run_id": m.name, "status": rundir.PARTIAL, "error": str(full),
                            "seconds": seconds, STOP_ON: True} for m in members}
            traceback.print_exc()
            error = f"{type(e).__name__}: {e}"
            for member in members:
                write_failure(member, error, traceback.format_exc())
            outcomes = [(rundir.FAILED, error)] * len(members)
    seconds = time.perf_counter() - start
    return {m: {"run_id": m.name, "status": status, "error": error, "seconds": seconds}
            for m, (status, error) in zip(members, outcomes)}


def precompile_run(run_dir: str | os.PathLike, programs) -> str:
    """Compiles the programs of the run planned in ``run_dir`` into ``programs`` (an
    :class:`attnlab.train.ProgramCache`) and returns a line for the worker's log. Writes
    nothing; a problem with the run is left for its execution to report."""
    name = Path(run_dir).name
    planned = rundir.read_json_or_none(Path(run_dir) / RUN_FILE)
    if planned is None:
        return f"{name}: nothing compiled ahead (no readable {RUN_FILE})"
    start = time.perf_counter()
    try:
        programs.precompile(from_config_dict(planned["config"]))
    except Exception as e:  # noqa: BLE001 - executing the run raises it again, with the run
        return f"{name}: nothing compiled ahead ({type(e).__name__}: {e})"
    return f"{name}: programs compiled ahead in {time.perf_counter() - start:.1f} s"


def _die_with_parent(parent_pid: int) -> None:
    """Asks the kernel to SIGKILL this process when its parent dies (Linux only)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the line above took effect
        os._exit(1)


def _log_to(path: Path):
    """Sends this process's stdout and stderr to ``path`` (appending; its folder is created) and
    returns a line-buffered handle on it for the worker's own lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    return os.fdopen(os.dup(2), "w", buffering=1)


def expose_host_devices(n: int) -> None:
    """Before JAX starts: XLA:CPU shows ``n`` devices, each running its own program, so an
    ensemble split over them uses every core (one device's small ops leave the others idle).
    Accelerators' devices are unaffected; a device count the user set is kept."""
    flags = os.environ.get("XLA_FLAGS", "")
    if n > 1 and "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


def main(argv: list[str] | None = None) -> int:
    """Worker loop. ``argv[0]`` is JSON: parent_pid, cpus (list or null), cache_dir, log_path,
    host_devices.
    Ends the process (``os._exit``) once stdin closes.

    The sweep starts its workers before it checks its runs, so that their imports overlap the
    checks; a worker therefore writes nothing before its first request: until then anything it
    prints goes to the sweep's stderr, from then on to ``log_path``.
    """
    argv = sys.argv[1:] if argv is None else argv
    settings = json.loads(argv[0])
    _die_with_parent(settings["parent_pid"])
    if settings.get("cpus"):
        # Before JAX starts: XLA sizes its CPU thread pool by the CPUs this process may use.
        os.sched_setaffinity(0, settings["cpus"])
    expose_host_devices(settings.get("host_devices", 1))
    # SIGTERM stops a run as Ctrl-C does: training records it as interrupted (partial, resumed
    # by the next invocation) after its pending checkpoint save, and the worker exits 130.
    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)
    # Answers go to a private copy of stdout; anything else printed goes to stderr (the log).
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    log = None  # the worker's log (once the first request came) while a run has stderr
    ahead = None  # the thread compiling the next run's programs
    try:
        # Ctrl-C raises KeyboardInterrupt from here on (the launcher started the worker with
        # SIGINT's default action, so that one during its imports ends it without a traceback);
        # one that lands in a garbage-collector callback is raised again, not printed and lost.
        sys.unraisablehook = reraising_lost_interrupts(sys.unraisablehook)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # Training's imports (orbax, TFDS: ~0.6 s) while the sweep checks its runs.
        from attnlab import train
        # Runs of one shape share their compiled programs. Host devices beyond the first are
        # there for ensembles: a lone run keeps one, as on a worker that shows one device.
        programs = train.ProgramCache(devices=jax.devices()[:1] if jax.default_backend() == "cpu"
                                      and settings.get("host_devices", 1) > 1 else None)
        for line in sys.stdin:
            if not line.strip():
                continue
            request = json.loads(line)
            if log is None:  # the sweep has checked its runs and made its directory
                log = _log_to(Path(settings["log_path"]))
                if settings.get("cache_dir"):  # before the first compilation (maybe ahead)
                    enable_compilation_cache(settings["cache_dir"])
            if ahead is not None:
                ahead.join()  # it was compiling this run's programs
            ahead = None
            if request.get("next") and len(request["next"]) == 1:  # a lone run's programs
                ahead = threading.Thread(
                    target=lambda upcoming: log.write(precompile_run(upcoming, programs) + "\n"),
                    args=(request["next"][0],), name="precompile", daemon=True)
                ahead.start()
            result = execute_runs(request["runs"], settings.get("cache_dir"), programs)
            answers.write(json.dumps(result) + "\n")
    except KeyboardInterrupt:
        if log is not None:  # else it was still waiting for its first run
            sys.stderr.write("worker interrupted; its run resumes on the next invocation\n")
            sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)  # no answer: the launcher treats the run as partial
    # stdin closed: every run's files were closed before its answer. Skips the interpreter's
    # teardown with JAX, TensorFlow and orbax loaded (~1.5 s that the sweep waits for).
    answers.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
