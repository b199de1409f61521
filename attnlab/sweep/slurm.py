"""Sweeps on a Slurm cluster (``--launcher=slurm``): each unit of runs (a run, or several trained
as one ensemble) is one Slurm job, submitted with submitit from the sweep's process.

A job asks for ``sweep.resources`` (cpus per task, GPUs per node, minutes: its time limit);
its pickled call and its logs live in ``DIR/logs/slurm/<job id>_*``, so the sweep directory must
be on a file system the compute nodes share. The environment's ``SBATCH_*`` variables
(``SBATCH_PARTITION``, ``SBATCH_ACCOUNT``, ``SBATCH_QOS``) apply as to any sbatch.

A job that Slurm stops (``scancel``, a preemption) gets SIGTERM first: its runs stop as they do
on Ctrl-C, after their pending checkpoint, and stay partial; rerunning the sweep (or
``--retry-failed`` for a job that died outright) resumes them, bitwise. A job nearing its time
limit is requeued by submitit and resumes its runs itself. Ctrl-C or
SIGTERM to the sweep itself cancels the jobs it submitted, which resume the same way.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

from attnlab.interrupts import raise_keyboard_interrupt
from attnlab.rundir import PARTIAL, run_status
from attnlab.sweep.crashes import LauncherError, record_crash, refuse_local_settings
from attnlab.worker import execute_runs

POLL_SECONDS = 1.0  # how often the sweep asks squeue about its jobs
GONE_GRACE_SECONDS = 10.0  # a job out of the queue has this long for its result file to appear


def import_submitit():
    try:
        import submitit
    except ImportError:
        raise LauncherError("--launcher=slurm needs submitit: pip install 'attnlab[slurm]' "
                            "(or pip install submitit)") from None
    return submitit


class SlurmUnit:
    """Body of one job on a compute node. SIGTERM (``scancel``, a preemption, the time limit)
    stops its runs as Ctrl-C does (checkpointed, left partial, resumed by the next invocation)
    and the job answers them as partial; submitit's warning before the time limit
    (``checkpoint``) requeues the job, which resumes them."""

    def __call__(self, unit: list[str], cache_dir: str) -> list[dict]:
        signal.signal(signal.SIGTERM, raise_keyboard_interrupt)
        try:
            return execute_runs(unit, cache_dir)
        except KeyboardInterrupt as stop:
            return [{"run_id": Path(d).name, "status": PARTIAL, "seconds": None,
                     "error": f"stopped by Slurm ({stop or 'SIGTERM'}); rerun the sweep to "
                              f"resume"} for d in unit]

    def checkpoint(self, unit: list[str], cache_dir: str):
        return import_submitit().helpers.DelayedSubmission(self, unit, cache_dir)


def run_slurm(units: list[list[Path]], on_result: Callable[[Path, dict], None], *, resources,
              cache_dir: str, logs_dir: Path) -> None:
    """Submits one job per unit and reports each run as its job ends."""
    submitit = import_submitit()
    # max_num_timeout: how often a job nearing its time limit is requeued to go on
    executor = submitit.AutoExecutor(folder=logs_dir / "slurm", cluster="slurm",
                                     slurm_max_num_timeout=100)
    executor.update_parameters(
        name="attnlab", cpus_per_task=max(1, math.ceil(resources.cpus)), tasks_per_node=1,
        timeout_min=max(1, math.ceil(resources.minutes)),
        nodes=1, **({"gpus_per_node": math.ceil(resources.gpus)} if resources.gpus else {}))
    pending = {}
    try:
        for unit in units:
            pending[executor.submit(SlurmUnit(), [str(d) for d in unit], cache_dir)] = unit
        gone_since: dict = {}
        while pending:
            queued = _queued([job.job_id for job in pending])
            for job in list(pending):
                answers = _answers(job, pending[job], queued, gone_since)
                if answers is None:
                    continue
                for run_dir, answer in zip(pending.pop(job), answers, strict=True):
                    on_result(run_dir, answer)
            if pending:
                time.sleep(POLL_SECONDS)
    except BaseException:
        for job in pending:  # their runs stop at a checkpoint (SIGTERM) and resume next time
            job.cancel(check=False)
        raise


def _answers(job, unit: list[Path], queued: set[str], gone_since: dict) -> list[dict] | None:
    """The job's answers once it has ended, else None. A job gone from the queue without an
    answer (cancelled before it started, or killed) leaves its runs as they are on disk,
    partial or pending, for the next invocation; a job whose call raised is recorded failed.
    Read from squeue and the job's result file: a cluster need not keep accounting (sacct)."""
    if job.paths.result_pickle.exists():
        try:
            return job.result()
        except Exception as e:  # noqa: BLE001 - the call raised on the node: its traceback
            return [record_crash(d, f"Slurm job {job.job_id}: {_message(e)}") for d in unit]
    if job.job_id in queued:
        return None
    # Out of the queue: give its result file a moment to appear on a shared file system.
    first = gone_since.setdefault(job.job_id, time.monotonic())
    if time.monotonic() - first < GONE_GRACE_SECONDS:
        return None
    log = job.paths.stderr
    return [{"run_id": d.name, "status": run_status(d), "seconds": None,
             "error": f"Slurm job {job.job_id} ended without an answer (cancelled, preempted or "
                      f"killed: {log}); rerun the sweep to resume"} for d in unit]


def _queued(job_ids: list[str]) -> set[str]:
    """The ids among ``job_ids`` that Slurm still has pending or running (or requeued)."""
    done = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(job_ids)],
                          capture_output=True, text=True)
    if done.returncode != 0:  # an id Slurm forgot makes squeue fail: ask about all jobs
        done = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True)
    return set(done.stdout.split())


def _message(error: Exception) -> str:
    """The error's own message: the last line of the traceback submitit carries back."""
    lines = str(error).strip().splitlines()
    return lines[-1] if lines else type(error).__name__


@dataclasses.dataclass
class Slurm:
    """One Slurm job per unit, each asking for the spec's resources."""

    name = "slurm"

    @classmethod
    def from_flags(cls, *, parallel: int, compile_ahead: bool, ray_address: str | None) -> Slurm:
        refuse_local_settings(parallel, compile_ahead,
                              "Slurm runs as many jobs at once as the cluster schedules")
        if ray_address:
            raise LauncherError(f"--ray-address={ray_address} applies to --launcher=ray")
        return cls()

    def check(self) -> None:
        import_submitit()
        if shutil.which("sbatch") is None:
            raise LauncherError("--launcher=slurm: no sbatch on this machine's PATH; run the "
                                "sweep from a Slurm login node")
        try:  # before anything is written: a controller must answer
            asked = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True,
                                   timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise LauncherError(f"--launcher=slurm: sinfo did not answer ({e})") from None
        if asked.returncode != 0:
            why = (asked.stderr.strip().splitlines() or ["no reason given"])[-1]
            raise LauncherError(f"--launcher=slurm: no Slurm controller answers here ({why})")

    def start(self, cache_dir: str, logs_dir: Path) -> None:
        pass

    def longest_first(self) -> bool:
        return True

    def run(self, units, on_result, *, cache_dir: str, logs_dir: Path, resources) -> None:
        run_slurm(units, on_result, resources=resources, cache_dir=cache_dir, logs_dir=logs_dir)

    def close(self) -> None:
        pass
