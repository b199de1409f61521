"""``run_sweep``: plan, skip what is done, launch the rest, keep the results table current.

A sweep directory::

    DIR/runs/<run_id>/      one per run: run.json (the plan), then training's files
    DIR/results.parquet     one row per run (and results.csv), rebuilt after every run
    DIR/sweep.json          the latest invocation's spec summary and run ids
    DIR/jax_cache/          JAX's persistent compilation cache, shared by the sweep's runs
    DIR/logs/               the local launcher's worker logs
    DIR/retired/            earlier attempts of diverged runs retried with --retry-failed

Rerunning the same command is always safe: completed, diverged and failed runs are skipped
(failed and diverged ones are retried only with ``retry_failed``), partial ones resume from their
latest checkpoint, pending ones start. A run directory is written before its run starts and
training writes atomically, so a sweep killed at any moment (even with SIGKILL) loses at most
the steps since each running run's last checkpoint.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Iterator

import pandas as pd
from tqdm.auto import tqdm

from attnlab import results, rundir
from attnlab.errors import WriteError
from attnlab.ensembles import ENSEMBLE_MAX, check_choice, members_per_program
from attnlab.ensembles import groups as ensemble_groups
from attnlab.sweep import launchers
from attnlab.sweep.planner import PlannedRun, plan
from attnlab.sweep.sections import SweepSpecError
from attnlab.sweep.definition import SweepSpec
from attnlab.worker import STOP_ON


class SweepDirError(rundir.WorkdirError):
    """The sweep directory cannot hold this sweep (a file, not writable, another sweep's or a
    training run's directory, or in use by another sweep)."""


def check_sweep_dir(workdir: Path, name: str, *, allow_nonempty: bool = False) -> None:
    """Refuses, before anything is written, a directory this sweep must not write into.

    Raises SweepDirError naming the directory: a file; not writable; a training run's directory
    (``attnlab train --run``); the directory of another sweep (``sweep.json`` names another
    spec: its rows would be merged into this sweep's results table); in use by another sweep
    (its lock is held); a directory of someone else's files (unless ``allow_nonempty``).
    """
    try:
        rundir.check_can_create_dir(workdir, "--sweep")
    except rundir.WorkdirError as e:
        raise SweepDirError(str(e)) from None
    if not workdir.exists():
        return
    found = [f for f in (rundir.CONFIG_FILE, rundir.SUMMARY_FILE, rundir.CHECKPOINT_DIR)
             if (workdir / f).exists()]
    if found:
        raise SweepDirError(f"--sweep {workdir} holds a training run ({found[0]}), not a "
                            f"sweep: pass another --sweep")
    try:
        rundir.check_not_foreign(workdir, rundir.SWEEP_DIR_NAMES, rundir.SWEEP_DIR_MARKERS,
                                 "sweep", "--sweep", allow_nonempty=allow_nonempty)
    except rundir.WorkdirError as e:
        raise SweepDirError(str(e)) from None
    previous = rundir.read_json_or_none(workdir / rundir.SWEEP_FILE)
    if isinstance(previous, dict) and previous.get("name") not in (None, name):
        raise SweepDirError(f"--sweep {workdir} holds sweep {previous['name']!r}, not "
                            f"{name!r}: pass another --sweep (one sweep per directory)")
    if (workdir / rundir.SWEEP_LOCK_FILE).exists():  # refused before the costlier checks
        with open(workdir / rundir.SWEEP_LOCK_FILE) as handle:
            _take_lock(handle, workdir)  # released as the file closes


@contextlib.contextmanager
def sweep_lock(workdir: Path) -> Iterator[None]:
    """Holds ``DIR/.sweep.lock`` (flock) while this process writes the sweep directory.

    A second sweep on the same directory gets SweepDirError naming the holder's pid. The kernel
    releases the lock when its holder dies (even by SIGKILL), so a stale lock file from a dead
    process is simply taken over.
    """
    handle = open(workdir / rundir.SWEEP_LOCK_FILE, "a+")
    try:
        _take_lock(handle, workdir)
    except SweepDirError:
        handle.close()
        raise
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        rundir.remove_stale_temporaries(workdir)  # a killed earlier sweep's half-written tables
        yield
    finally:
        with contextlib.suppress(OSError):
            handle.seek(0)
            handle.truncate()
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def _take_lock(handle, workdir: Path) -> None:
    """flock ``handle`` (the sweep's lock file) or raise SweepDirError naming its holder."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(handle)
        raise SweepDirError(f"{workdir} is in use by another sweep ({holder}); wait for it to "
                            f"end, or stop it, then rerun") from None


def _holder(handle, patience: float = 2.0) -> str:
    """The lock holder's record. The holder writes it just after taking the lock, so an empty
    file means it is between the two: wait briefly for it rather than name no one."""
    deadline = time.monotonic() + patience
    while True:
        handle.seek(0)
        holder = handle.read().strip()
        if holder or time.monotonic() > deadline:
            return holder or "a process that has not said its pid yet"
        time.sleep(0.02)


def run_record(spec: SweepSpec, run: PlannedRun) -> dict:
    """What ``run.json`` holds: the run's config and the planned quantities the results table
    shows before (and besides) training's summary."""
    return {
        "run_id": run.run_id, "sweep": spec.name, "mode": spec.mode, "source": spec.source,
        "axes": run.axes, "budget": run.budget, "params": run.params,
        "flops_per_token": run.flops_per_token, "tokens": run.tokens, "steps": run.steps,
        "tokens_per_step": run.cfg.data.batch_size * run.cfg.data.seq_len,
        "config": run.cfg.to_dict(),
        # On a grid of rates, each run's multiple of its rule's rate: the table's lr_factor, so
        # that `attnlab compare --by=lr_factor --baseline=1` sets every rate against the rule.
        **({"lr_factor": run.lr_factor} if spec.tries_rates else {}),
        **({"role": run.role, "trunk": run.cfg.train.branch_from or None,
            "shared_tokens": run.shared_tokens} if run.role else {}),
    }


def prepare_run_dirs(spec: SweepSpec, runs: list[PlannedRun], workdir: Path) -> list[Path]:
    """Creates ``runs/<run_id>/run.json`` for every planned run (rewritten only if it changed)."""
    run_dirs = []
    for run in runs:
        run_dir = workdir / rundir.RUNS_DIR / run.run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        record = run_record(spec, run)
        if rundir.read_json_or_none(run_dir / rundir.RUN_FILE) != json.loads(json.dumps(record)):
            rundir.write_json_atomic(run_dir / rundir.RUN_FILE, record)
        run_dirs.append(run_dir)
    rundir.write_json_atomic(workdir / rundir.SWEEP_FILE, {
        "name": spec.name, "mode": spec.mode, "scale": spec.scale, "source": spec.source,
        "planned_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "runs": [r.run_id for r in runs]})
    return run_dirs


def check_data(runs: list[PlannedRun], max_epochs: float = 0.0) -> list[str]:
    """Prepares each corpus of ``runs`` and checks every run against it, before any run starts.

    A bad data source (a missing or empty path, an unknown dataset, a corpus too small for the
    windows) is then one error naming its field, raised here, instead of a failed run per
    configuration. Returns a note for each run whose token budget repeats data; with
    ``max_epochs`` > 0 (``sweep.max_epochs``) a run that would read its training split more
    often is refused: a corpus built from the machine's own files (pystdlib) differs in size
    between machines, so a plan checked on one can repeat data on another.
    """
    # Here, not at the top: importing attnlab.sweep (to plan) stays free of orbax and TFDS.
    from attnlab.data import prepare
    from attnlab.train.preflight import check_corpus

    corpora = {}
    notes = []
    for run in runs:
        if run.cfg.data not in corpora:
            corpora[run.cfg.data] = prepare(run.cfg.data)
        warned, _ = check_corpus(run.cfg, corpora[run.cfg.data])
        notes += [f"{run.run_id}: {m}" for m in warned]
    if max_epochs > 0:
        _check_epochs(runs, corpora, max_epochs)
    return notes


def _check_epochs(runs: list[PlannedRun], corpora: dict, max_epochs: float) -> None:
    read = {run.run_id: corpora[run.cfg.data].epochs(run.tokens, run.cfg.data.seq_len)
            for run in runs}
    over = [run for run in runs if read[run.run_id] > max_epochs]
    if over:
        worst = max(over, key=lambda run: read[run.run_id])
        corpus = corpora[worst.cfg.data]
        raise SweepSpecError("sweep.max_epochs", f"{len(over)} of {len(runs)} runs would read "
                             f"their training split more than {max_epochs:g} times on this "
                             f"machine ({worst.run_id}: {read[worst.run_id]:.2f} epochs of "
                             f"{corpus.name}, {corpus.num_tokens('train'):,} tokens); use a "
                             "larger corpus or fewer tokens per run")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def longest_first(units: list[list[Path]], runs: list[PlannedRun],
                  run_dirs: list[Path]) -> list[list[Path]]:
    """``units`` ordered by planned FLOPs, the most expensive first.

    With several units at a time this is LPT scheduling (Graham 1969): a sweep in plan order
    often ends on its largest run alone while the other workers idle; started first, the long
    runs overlap with the many short ones. ``run_dirs[i]`` belongs to ``runs[i]``.
    """
    cost = {run_dir: run.trained_flops() for run, run_dir in zip(runs, run_dirs, strict=True)}
    return sorted(units, key=lambda unit: sum(cost[d] for d in unit), reverse=True)


def worker_platform(launcher, spec: SweepSpec) -> str:
    """The platform the runs train on: a GPU for a Ray task that asks for one, else this
    machine's default device's (JAX's 'cpu', 'gpu', 'tpu')."""
    if isinstance(launcher, launchers.Ray) and spec.resources.gpus > 0:
        return "gpu"
    import jax

    return jax.devices()[0].platform


def ensemble_units(spec: SweepSpec, runs: list[PlannedRun], run_dirs: list[Path],
                   todo: set[Path], *, ensemble: str, ensemble_max: int,
                   launcher=None) -> list[list[Path]]:
    """The units of work: groups of runs that one compiled program can train
    (:func:`attnlab.ensembles.groups`, in plan order, at most as many as ``ensemble`` and
    ``ensemble_max`` let one program train on the platform of ``launcher``'s runs
    (:func:`attnlab.ensembles.members_per_program`) and as many as half the machine's memory
    holds), each with a run still to do. A group keeps its finished members (the ensemble
    freezes them): the same groups on every invocation give an interrupted sweep the same
    programs, and so bitwise the same resumed runs."""
    from attnlab.train.memory import machine_memory, training_bytes

    most = members_per_program(ensemble, ensemble_max, worker_platform(launcher, spec))
    config_of = {run_dir: run.cfg for run, run_dir in zip(runs, run_dirs, strict=True)}
    memory, _ = machine_memory()
    units = []
    for group in ensemble_groups(run_dirs, config_of.get, most):
        cap = max(1, int(memory / 2 // training_bytes(config_of[group[0]])["total"]))
        units += [group[i:i + cap] for i in range(0, len(group), cap)]
    return [unit for unit in units if todo.intersection(unit)]


def phases(units: list[list[Path]], runs: list[PlannedRun],
           run_dirs: list[Path]) -> list[list[list[Path]]]:
    """The units in the order their inputs exist: every other run first, then the cooldown
    branches (each starts from its trunk's checkpoint, so it waits for the first phase)."""
    branch = {d for run, d in zip(runs, run_dirs, strict=True) if run.cfg.train.branch_from}
    first = [u for u in units if not branch.intersection(u)]
    second = [u for u in units if branch.intersection(u)]
    return [phase for phase in (first, second) if phase]


def reset_for_retry(workdir: Path, run_dir: Path) -> str | None:
    """Makes a failed or diverged run runnable again; returns what was done (None: nothing).

    failed:   failure.json is kept as failure-<time>.json; training resumes from the run's latest
              checkpoint (a crash or a transient error loses no finished steps).
    diverged: the whole attempt moves to DIR/retired/<run_id>.<n>/ and the run starts afresh
              (its checkpoints lead to the divergence).
    """
    status = rundir.run_status(run_dir)
    if status == rundir.FAILED:
        retried = rundir.RETRIED_FAILURE_FILE.format(time=time.strftime("%Y%m%d-%H%M%S"))
        failure = run_dir / rundir.FAILURE_FILE
        if failure.exists():
            os.replace(failure, run_dir / retried)
        # A summary that says failed would keep the run failed whatever else is moved.
        summary = rundir.read_json_or_none(run_dir / rundir.SUMMARY_FILE)
        if isinstance(summary, dict) and summary.get("status") == rundir.FAILED:
            summary.update(status=rundir.PARTIAL, retried_error=summary.pop("error", None))
            rundir.write_json_atomic(run_dir / rundir.SUMMARY_FILE, summary)
        return "resumed"
    if status == rundir.DIVERGED:
        retired = workdir / rundir.RETIRED_DIR
        retired.mkdir(exist_ok=True)
        n = sum(1 for p in retired.iterdir() if p.name.startswith(run_dir.name + ".")) + 1
        record = (run_dir / rundir.RUN_FILE).read_text()
        os.replace(run_dir, retired / f"{run_dir.name}.{n}")
        run_dir.mkdir()
        rundir.write_text_atomic(run_dir / rundir.RUN_FILE, record)
        return "restarted"
    return None




def run_sweep(spec: SweepSpec, workdir: str | os.PathLike, *, launcher: str = "local",
              parallel: int = 1, retry_failed: bool = False, progress: bool = True,
              ray_address: str | None = None, cache_dir: str | os.PathLike | None = None,
              allow_large: bool = False, compile_ahead: bool = False,
              ensemble: str = "auto", ensemble_max: int = ENSEMBLE_MAX,
              allow_nonempty: bool = False) -> pd.DataFrame:
    """Runs every run of ``spec`` that is not finished yet and returns the results table.

    Args:
      spec: from :func:`attnlab.sweep.load_spec`.
      workdir: the sweep directory (created if missing).
      launcher: 'local' (worker processes on this machine) or 'ray'.
      parallel: local launcher: runs at a time (each worker pinned to cpu_count // parallel
        cores). Ray schedules by sweep.resources instead.
      retry_failed: also rerun failed runs (resuming) and diverged runs (from scratch).
      progress: a progress bar and one line per finished run.
      ray_address: an existing Ray cluster; None uses an initialised Ray or starts a local one.
      cache_dir: JAX's persistent compilation cache (default $JAX_COMPILATION_CACHE_DIR, else
        DIR/jax_cache).
      allow_large: skip the memory estimate (attnlab.train.memory) that refuses runs larger
        than the machine.
      compile_ahead: local launcher: each worker compiles its next run's programs in a thread
        while the current run trains. Saves most of each new shape's compilation (on a 2-core
        CPU: cold 200-step sweeps faster in 3 of 5 rounds, docs/benchmarks.md), but the
        overlapped run's recorded tokens/s and MFU read low, so it is off by default.
      ensemble: 'on': runs that differ only in seeds, learning-rate schedule, length or weight
        decay (:data:`attnlab.ensembles.MAY_DIFFER`) train together as one ensemble, up to
        ``ensemble_max`` at a time and as many as half the machine's memory holds
        (:func:`ensemble_units`); 'off': every run alone; 'auto' (``--ensemble``'s default):
        'on' where the runs train on an accelerator, 'off' on a CPU
        (:func:`attnlab.ensembles.members_per_program` says why).
      allow_nonempty: write into an existing directory that holds other files and no sweep.

    A spec with a tuning stage (``sweep.tune``) is refused by the planner here: run it with
    :func:`attnlab.sweep.stages.run_sweep` (the package's ``run_sweep``), which runs the tuning
    stage, picks each arm's learning rate and then runs the study through this function.

    Raises:
      SweepSpecError / ConfigError: a bad spec, before anything is written or started.
      DataError: a bad data source (see :func:`check_data`), likewise before anything starts.
      LauncherError: bad launcher settings, or Ray missing.
      SweepDirError: ``workdir`` is a file, cannot be created or written, is another sweep's or
        a training run's directory, holds someone else's files (unless ``allow_nonempty``), or
        is in use by another sweep (its lock names the pid).
    """
    chosen = launchers.launcher_named(launcher, parallel=parallel, compile_ahead=compile_ahead,
                                      ray_address=ray_address)
    if isinstance(ensemble_max, bool) or not isinstance(ensemble_max, int) or ensemble_max < 1:
        raise launchers.LauncherError(f"--ensemble-max={ensemble_max!r}: must be an integer >= 1")
    runs = plan(spec)  # every run's config is validated before anything starts
    chosen.check()
    check_choice(ensemble)
    workdir = Path(workdir).absolute()
    check_sweep_dir(workdir, spec.name, allow_nonempty=allow_nonempty)
    unfinished = [run for run in runs if rundir.run_status(
        workdir / rundir.RUNS_DIR / run.run_id) != rundir.COMPLETED]
    cache_dir = rundir.compilation_cache_dir(workdir, cache_dir)
    # Started before the checks below, so that the workers' imports (JAX, orbax, TFDS: ~2 s)
    # overlap them; a worker writes nothing before its first run, and is killed if the checks
    # fail or nothing is left to run.
    if unfinished:
        chosen.start(str(cache_dir), workdir / rundir.LOGS_DIR)
    try:
        if not allow_large:  # every run to do must fit, before anything is written or started
            from attnlab.train.memory import check_training_fits

            for run in unfinished:
                check_training_fits(run.cfg, where=f"run {run.run_id}: ")
        budget_notes = check_data(unfinished, spec.max_epochs)
        workdir.mkdir(parents=True, exist_ok=True)
        with sweep_lock(workdir):
            return _run_sweep(spec, runs, workdir, budget_notes, launcher=chosen,
                              retry_failed=retry_failed, progress=progress,
                              cache_dir=cache_dir, ensemble=ensemble, ensemble_max=ensemble_max)
    except Exception as e:
        # A full disk (the results table, a run's files): one line naming the path; every run
        # not finished stays partial and resumes with the next invocation.
        full = rundir.write_failure(e, workdir)
        if full is not None:
            raise full from None
        raise
    finally:
        chosen.close()  # workers a phase did not use


def _run_sweep(spec: SweepSpec, runs: list[PlannedRun], workdir: Path, budget_notes: list[str],
               *, launcher: launchers.Local | launchers.Ray, retry_failed: bool,
               progress: bool, cache_dir: Path, ensemble: str,
               ensemble_max: int) -> pd.DataFrame:
    """run_sweep's work once the directory is checked and locked, ``launcher`` started."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    run_dirs = prepare_run_dirs(spec, runs, workdir)

    say = tqdm.write if progress else (lambda _: None)
    if retry_failed:
        for run_dir in run_dirs:
            action = reset_for_retry(workdir, run_dir)
            if action:
                say(f"{run_dir.name}: retrying ({action})")
    statuses = collections.Counter(rundir.run_status(d) for d in run_dirs)
    todo = [d for d in run_dirs if rundir.run_status(d) not in rundir.FINAL_STATUSES]
    units = ensemble_units(spec, runs, run_dirs, set(todo), ensemble=ensemble,
                           ensemble_max=ensemble_max, launcher=launcher)
    if launcher.longest_first():
        units = longest_first(units, runs, run_dirs)
    say(f"sweep {spec.name} ({spec.mode}): {len(runs)} runs in {workdir}; "
        + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))
        + (f"; running {len(todo)}" if todo else "; nothing to run")
        + (f" in {len(units)} ensembles and lone runs" if len(units) < len(todo) else ""))
    for note in budget_notes:  # about the data, not progress: shown without the bar too
        (say if progress else _stderr)(note)
    results.write_table(workdir)
    if not todo:
        return with_missing(results.load(workdir), run_dirs)

    # The bar counts planned training FLOPs, not runs: the runs of a sweep differ in cost by
    # orders of magnitude (and with --parallel the largest start first), so the ETA is the
    # FLOPs left over the FLOP rate measured so far, not the runs left times an average run.
    cost = {run_dir: run.trained_flops() for run, run_dir in zip(runs, run_dirs, strict=True)}
    bar = tqdm(total=sum(cost[d] for d in todo), unit="FLOP", unit_scale=True, desc=spec.name,
               disable=not progress, dynamic_ncols=True)
    outcomes: collections.Counter = collections.Counter()

    waiting = set(todo)

    def on_result(run_dir: Path, result: dict) -> None:
        if run_dir not in waiting:  # a finished run that kept its place in an ensemble
            return
        waiting.discard(run_dir)
        if result.get(STOP_ON):  # a full disk: the other workers finish their runs, then stop
            raise WriteError(result["error"])
        status = result["status"]
        outcomes[status] += 1
        bar.update(cost.get(run_dir, 0))
        bar.set_postfix({"runs": f"{sum(outcomes.values())}/{len(todo)}",
                         **{k: v for k, v in sorted(outcomes.items())}})
        summary = rundir.read_json_or_none(run_dir / rundir.SUMMARY_FILE) or {}
        detail = (f"val loss {summary['final_val_loss']:.4f}"
                  if status == rundir.COMPLETED and summary.get("final_val_loss") is not None
                  else result.get("error") or "")
        seconds = f" ({result['seconds']:.1f} s)" if result.get("seconds") else ""
        say(f"{run_dir.name}: {status}{seconds} {detail}".rstrip())
        results.write_table(workdir)

    try:
        for phase in phases(units, runs, run_dirs):
            launcher.run(phase, on_result, cache_dir=str(cache_dir),
                         logs_dir=workdir / rundir.LOGS_DIR, resources=spec.resources)
    finally:
        bar.close()
        try:
            results.write_table(workdir)
        except OSError as e:  # the disk is full: the error being raised says so
            if rundir.write_failure(e) is None:
                raise
    return with_missing(results.load(workdir), run_dirs)


def with_missing(table: pd.DataFrame, run_dirs: list[Path]) -> pd.DataFrame:
    """``table`` with a row of status 'missing' for each planned run it lacks: a run whose
    directory was deleted while the sweep ran is counted, not silently dropped (rerunning the
    sweep plans it again)."""
    listed = set(table["run_id"]) if "run_id" in table else set()
    missing = [d.name for d in run_dirs if d.name not in listed]
    if not missing:
        return table
    rows = pd.DataFrame({"run_id": missing, "status": rundir.MISSING,
                         "error": "its run.json vanished while the sweep ran (the directory "
                                  "was deleted?); rerun the sweep to plan it again"})
    return pd.concat([table, rows], ignore_index=True)
