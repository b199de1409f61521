"""Launchers: who executes a sweep's runs.

local  K long-lived worker processes (``attnlab.worker.main``), each training one run
       at a time in-process (with ``compile_ahead``, compiling the programs of the run it will
       train next meanwhile). JAX is imported once per worker; a worker that crashes (segfault,
       out-of-memory kill) costs only its current run, which is recorded as failed, and a
       fresh worker takes over. With K > 1 each worker is pinned to its own cpu_count // K
       cores (sched_setaffinity before JAX starts), which sizes XLA's CPU thread pool, so the
       workers do not oversubscribe the machine, and each may allocate 1/K of an
       accelerator's memory (JAX preallocates 75% of a GPU for the first process to start,
       which left the others out of memory in XLA's autotuning on a lent H200).
ray    one Ray task per run with the spec's resource request (sweep.resources.cpus / gpus), on an
       existing cluster (``--ray-address``) or a local one started for the sweep. Ray is an
       optional dependency (``pip install 'attnlab[ray]'``), imported only here.

Both call ``on_result(run_dir, result)`` from the launching process as each run ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import psutil

from attnlab.sweep.crashes import (LauncherError, SweepInterrupted, record_crash,
                                   refuse_local_settings)
from attnlab.sweep.slurm import Slurm
from attnlab.sweep.sections import Resources
from attnlab.worker import execute_runs

OnResult = Callable[[Path, dict], None]
# Ctrl-C to the sweep's process group while a worker still imports JAX would print a
# KeyboardInterrupt traceback: until worker.main takes the signal over, it ends the worker as the
# default action does (silently; the launcher counts -SIGINT as interrupted).
_WORKER_MAIN = ("import signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                "from attnlab.worker import main; sys.exit(main(sys.argv[1:]))")
_INTERRUPTED = (-signal.SIGINT, -signal.SIGTERM, 128 + signal.SIGINT, 128 + signal.SIGTERM)
STOP_GRACE_SECONDS = 10.0  # how long interrupted workers get to wind down before SIGKILL
RAY_GRACE_SECONDS = 5.0  # how long a local Ray's processes get to exit after ray.shutdown()
SHARED_MEMORY = 0.9  # of an accelerator's memory, split between the workers sharing it
# JAX's own settings of how a process takes accelerator memory: one the user set is kept.
_MEMORY_SETTINGS = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE",
                    "XLA_PYTHON_CLIENT_ALLOCATOR")


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        name = signal.Signals(-returncode).name
        hint = " - out of memory?" if -returncode == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exit code {returncode}"


def memory_share(share: float, environ: dict[str, str] | None = None) -> dict[str, str]:
    """JAX's setting for a process that shares an accelerator, taking ``share`` of it (< 1) of
    the memory it may use; none if it has a device to itself or the user set how JAX allocates."""
    environ = os.environ if environ is None else environ
    if share >= 1 or any(name in environ for name in _MEMORY_SETTINGS):
        return {}
    return {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{SHARED_MEMORY * share:.3f}"}


def worker_environment(workers: int) -> dict[str, str]:
    """The environment of one of ``workers`` local processes sharing this machine."""
    return {**os.environ, **memory_share(1 / workers)}


class WorkerProcess:
    """One ``attnlab.worker`` subprocess; executes runs one at a time. ``workers``: how many
    share this machine (each gets its share of an accelerator's memory)."""

    def __init__(self, *, cpus: list[int] | None, cache_dir: str, log_path: Path,
                 device_per_core: bool = False, workers: int = 1):
        # The worker opens its log itself at its first request (see worker.main): it may be
        # started before the sweep's directory exists.
        cores = len(cpus) if cpus else len(os.sched_getaffinity(0))
        settings = {"parent_pid": os.getpid(), "cpus": cpus, "cache_dir": cache_dir,
                    "log_path": str(log_path), "host_devices": cores if device_per_core else 1}
        self.process = subprocess.Popen(
            # -c rather than -m: the package imports the module, which -m would run twice.
            [sys.executable, "-c", _WORKER_MAIN, json.dumps(settings)],
            env=worker_environment(workers), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, bufsize=1)

    def execute(self, unit: list[Path], stopping: threading.Event | None = None,
                upcoming: list[Path] | None = None) -> list[dict]:
        """Runs one unit (a run, or several as one ensemble), compiling the ``upcoming`` unit's
        programs meanwhile; one answer per run. If the worker dies, records the runs as failed,
        unless it died of SIGINT/SIGTERM or while the sweep is ``stopping`` (Ctrl-C,
        SIGTERM): then it raises SweepInterrupted and records nothing, so the runs stay partial
        (resumed from their latest checkpoints by the next invocation), never failed."""
        request = {"runs": [str(d) for d in unit],
                   "next": [str(d) for d in upcoming] if upcoming else None}
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            answer = self.process.stdout.readline()
        except (BrokenPipeError, OSError, ValueError):  # ValueError: the pipe was closed
            answer = ""
        if answer:
            return json.loads(answer)
        returncode = self.process.wait()
        if returncode in _INTERRUPTED or (stopping is not None and stopping.is_set()):
            raise SweepInterrupted(_describe_exit(returncode))
        return [record_crash(run_dir, _describe_exit(returncode)) for run_dir in unit]

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if self.alive:
            try:
                self.process.stdin.close()
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        if self.alive:
            self.process.kill()
            self.process.wait()

    def interrupt(self) -> None:
        """Asks the worker to stop its run as Ctrl-C would (SIGINT: training raises
        KeyboardInterrupt, finishes its pending checkpoint save and exits)."""
        if self.alive:
            try:
                self.process.send_signal(signal.SIGINT)
            except OSError:
                pass


def cpu_slots(parallel: int) -> list[list[int] | None]:
    """The cores each of ``parallel`` workers is pinned to (None: no pinning, for one worker)."""
    if parallel == 1 or not hasattr(os, "sched_getaffinity"):
        return [None] * parallel
    cpus = sorted(os.sched_getaffinity(0))
    per_worker = max(1, len(cpus) // parallel)
    return [[cpus[(i * per_worker + j) % len(cpus)] for j in range(per_worker)]
            for i in range(parallel)]


def start_workers(parallel: int, *, cache_dir: str, logs_dir: Path,
                  device_per_core: bool = False) -> list[WorkerProcess]:
    """Starts ``parallel`` workers for :func:`run_local` (pinned as :func:`cpu_slots` says);
    they import JAX and training while the caller goes on, and write nothing before their
    first run. ``device_per_core``: on CPU a worker sees one XLA device per core it may use,
    so that an ensemble's member groups run side by side (attnlab.train.sharding.ensemble_mesh).
    Sweeps leave it off: on a 2-core CPU two groups ran no faster than one (0.72-1.00x of a
    lone run against 0.85-1.18x, docs/benchmarks.md "Ensembles")."""
    return [WorkerProcess(cpus=cpus, cache_dir=cache_dir, log_path=logs_dir / f"worker-{i}.log",
                          device_per_core=device_per_core, workers=parallel)
            for i, cpus in enumerate(cpu_slots(parallel))]


def run_local(units: list[list[Path]], on_result: OnResult, *, parallel: int, cache_dir: str,
              logs_dir: Path, compile_ahead: bool = False,
              started: list[WorkerProcess] | None = None, device_per_core: bool = False) -> None:
    """Executes the units (a run, or several runs trained as one ensemble) on ``parallel``
    local worker processes (in the given order), reporting each run; with ``compile_ahead``
    each worker claims its next unit early and compiles it meanwhile. ``started``: workers from
    :func:`start_workers` (else each slot starts its own); every worker is closed on return."""
    todo: queue.Queue[list[Path]] = queue.Queue()
    for unit in units:
        todo.put(unit)
    lock = threading.Lock()
    workers: list[WorkerProcess] = list(started or [])
    errors: list[BaseException] = []
    stop = threading.Event()

    def take() -> list[Path] | None:
        try:
            return todo.get_nowait()
        except queue.Empty:
            return None

    def slot(index: int, cpus: list[int] | None) -> None:
        # A replacement worker is started from this thread: PR_SET_PDEATHSIG follows the thread
        # that forked it, which lives until the worker is closed.
        worker = started[index] if started else None
        ran = False
        try:
            unit = take()
            while unit is not None and not stop.is_set():
                # Claimed now, so that the worker compiles its programs while unit trains;
                # it stays this slot's unit even if the worker dies.
                upcoming = take() if compile_ahead else None
                if worker is None or not worker.alive:
                    if worker is not None:  # it crashed; its run is recorded as failed
                        worker.close()
                    with lock:  # no worker starts once the sweep is stopping
                        if stop.is_set():
                            break
                        worker = WorkerProcess(cpus=cpus, cache_dir=cache_dir,
                                               log_path=logs_dir / f"worker-{index}.log",
                                               device_per_core=device_per_core,
                                               workers=parallel)
                        workers.append(worker)
                ran = True
                answers = worker.execute(unit, stop, upcoming)
                with lock:
                    for run_dir, result in zip(unit, answers, strict=True):
                        on_result(run_dir, result)
                unit = upcoming if compile_ahead else take()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            stop.set()
            errors.append(e)
        finally:
            if worker is not None and ran:
                worker.close()
            elif worker is not None:  # it never got a run: it may still be importing
                worker.kill()

    threads = [threading.Thread(target=slot, args=(i, cpus), daemon=True)
               for i, cpus in enumerate(cpu_slots(parallel))]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.5)  # short waits keep Ctrl-C responsive
    except BaseException:
        stop.set()  # before any worker dies: its run is then partial, not failed
        stop_workers(workers, lock)
        raise
    if errors:
        raise errors[0]


def stop_workers(workers: list[WorkerProcess], lock: threading.Lock,
                 grace_seconds: float = STOP_GRACE_SECONDS) -> None:
    """Interrupts every worker (SIGINT), gives them ``grace_seconds`` to finish their pending
    checkpoint saves and record their runs as interrupted, then kills what is left. A second
    Ctrl-C (or SIGTERM) meanwhile kills them at once. Either way their runs stay resumable:
    training writes atomically and orbax commits a checkpoint by renaming it."""
    with lock:
        workers = list(workers)
    try:
        for worker in workers:
            worker.interrupt()
        deadline = time.monotonic() + grace_seconds
        for worker in workers:
            while worker.alive and time.monotonic() < deadline:
                time.sleep(0.05)
    except BaseException:  # noqa: BLE001 - a second interrupt: stop waiting
        pass
    finally:
        for worker in workers:
            worker.kill()


# ------------------------------------------------------------------------------------------------
# Ray


def import_ray():
    """Imports Ray, or explains how to install it."""
    try:
        import ray
    except ImportError:
        raise LauncherError("--launcher=ray needs Ray: pip install 'attnlab[ray]' "
                            "(or pip install 'ray[default]')") from None
    return ray


def _ray_task(unit: list[str], cache_dir: str) -> list[dict]:
    """Body of one Ray task (a module-level function, so Ray workers import it by name): a run,
    or several as one ensemble."""
    return execute_runs(unit, cache_dir)


def run_ray(units: list[list[Path]], on_result: OnResult, *, resources: Resources,
            cache_dir: str, address: str | None = None) -> None:
    """Submits one Ray task per unit (a run, or several runs trained as one ensemble) and
    reports each run as its unit ends.

    Uses the already initialised Ray (``ray.init`` called by the caller), else connects to
    ``address`` (``auto``, ``ray://host:10001``, ...), else starts a local cluster for the sweep.
    Run directories must be on a filesystem every node sees.
    """
    ray = import_ray()
    # This process's children before it connected to Ray (None: Ray was connected already):
    # those not among them at the end are the local cluster's, if it started one.
    preexisting = None
    if not ray.is_initialized():
        preexisting = {child.pid for child in psutil.Process().children(recursive=True)}
        # ray.init replaces the driver's SIGTERM handler with sys.exit(15): put the command's
        # back, so that SIGTERM stops the sweep as Ctrl-C does (exit 130, runs resumable)
        main = threading.current_thread() is threading.main_thread()
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            ray.init(address=address or None, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise LauncherError(f"--ray-address={address!r}: cannot start or reach a Ray "
                                f"cluster: {e}") from None
        finally:
            for sig, handler in handlers.items():
                if main and handler is not None:
                    signal.signal(sig, handler)
    pending = {}
    try:
        # A fraction of a GPU per task: several tasks share one device and its memory.
        shared = memory_share(resources.gpus) if resources.gpus else {}
        task = ray.remote(_ray_task).options(
            num_cpus=resources.cpus, num_gpus=resources.gpus, max_retries=0,
            retry_exceptions=False, **({"runtime_env": {"env_vars": shared}} if shared else {}))
        pending = {task.remote([str(d) for d in unit], cache_dir): unit for unit in units}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            unit = pending.pop(done[0])
            try:
                answers = ray.get(done[0])
            except ray.exceptions.RayError as e:  # the task's process died (OOM, crash)
                answers = [record_crash(d, f"Ray: {type(e).__name__}") for d in unit]
            for run_dir, result in zip(unit, answers, strict=True):
                on_result(run_dir, result)
    except BaseException:
        # A local cluster started here is shut down below, which stops its tasks. Cancelling
        # them first races with their replies, and Ray's core worker aborts the whole command
        # when a reply arrives for a task it has just cancelled ("Tried to complete task that
        # was not pending"), before its cluster is shut down.
        if preexisting is None or address:
            for ref in pending:
                ray.cancel(ref, force=True)
        raise
    finally:
        if preexisting is not None:
            _shutdown_ray(ray, preexisting)


def _shutdown_ray(ray, preexisting: set[int]) -> None:
    """``ray.shutdown()`` (which stops a local cluster this process started, or disconnects from
    another), then kills whatever of the local cluster's processes outlived it. Ray's per-node
    agents notice their raylet's death by polling, which on a loaded machine can take longer
    than the command takes to exit; they would be left behind, orphaned."""
    started = [child for child in psutil.Process().children(recursive=True)
               if child.pid not in preexisting]
    ray.shutdown()
    _, alive = psutil.wait_procs(started, timeout=RAY_GRACE_SECONDS)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=RAY_GRACE_SECONDS)


# ------------------------------------------------------------------------------------------------
# The launchers as parts: a sweep resolves its launcher once and asks it, never its name.


@dataclasses.dataclass
class Local:
    """``parallel`` worker processes on this machine, started before the sweep's checks so
    that their imports overlap them."""

    parallel: int = 1
    compile_ahead: bool = False
    workers: list[WorkerProcess] = dataclasses.field(default_factory=list)

    name = "local"

    @classmethod
    def from_flags(cls, *, parallel: int, compile_ahead: bool, ray_address: str | None) -> Local:
        if ray_address:
            raise LauncherError(f"--ray-address={ray_address} applies to --launcher=ray; the "
                                f"local launcher starts its own workers")
        return cls(parallel=parallel, compile_ahead=compile_ahead)

    def check(self) -> None:
        pass

    def start(self, cache_dir: str, logs_dir: Path) -> None:
        self.workers = start_workers(self.parallel, cache_dir=cache_dir, logs_dir=logs_dir)

    def longest_first(self) -> bool:
        """Whether runs go side by side, so that the longest should start first."""
        return self.parallel > 1

    def run(self, units: list[list[Path]], on_result: OnResult, *, cache_dir: str,
            logs_dir: Path, resources: Resources) -> None:
        run_local(units, on_result, parallel=self.parallel, cache_dir=cache_dir,
                  logs_dir=logs_dir, compile_ahead=self.compile_ahead, started=self.workers)
        self.workers = []  # run_local closed them: a later phase starts its own

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()
        self.workers = []


@dataclasses.dataclass
class Ray:
    """One Ray task per unit, scheduled by the spec's resource request."""

    address: str | None = None

    name = "ray"

    @classmethod
    def from_flags(cls, *, parallel: int, compile_ahead: bool, ray_address: str | None) -> Ray:
        refuse_local_settings(parallel, compile_ahead, "Ray runs as many runs at once as "
                                                       "sweep.resources lets the cluster fit")
        return cls(address=ray_address)

    def check(self) -> None:
        import_ray()

    def start(self, cache_dir: str, logs_dir: Path) -> None:
        pass

    def longest_first(self) -> bool:
        return True

    def run(self, units: list[list[Path]], on_result: OnResult, *, cache_dir: str,
            logs_dir: Path, resources: Resources) -> None:
        run_ray(units, on_result, resources=resources, cache_dir=cache_dir, address=self.address)

    def close(self) -> None:
        pass


LAUNCHERS = {launcher.name: launcher for launcher in (Local, Ray, Slurm)}


def launcher_named(name: str, *, parallel: int = 1, compile_ahead: bool = False,
                   ray_address: str | None = None) -> Local | Ray | Slurm:
    """The launcher ``--launcher=name`` asks for, with its settings checked."""
    if name not in LAUNCHERS:
        raise LauncherError(f"--launcher={name!r}: valid launchers are {', '.join(LAUNCHERS)}")
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise LauncherError(f"--parallel={parallel!r}: must be an integer >= 1")
    return LAUNCHERS[name].from_flags(parallel=parallel, compile_ahead=compile_ahead,
                                      ray_address=ray_address)
