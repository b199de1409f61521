"""What a launcher reports for a unit of runs whose process died without answering, and the
errors every launcher raises, its refusal of the local launcher's settings among them
(attnlab.sweep.launchers, attnlab.sweep.slurm)."""

from __future__ import annotations

from pathlib import Path

from attnlab.errors import AttnlabError
from attnlab.rundir import FAILED, LOG_FILE
from attnlab.worker import write_failure


class LauncherError(AttnlabError):
    """A launcher cannot start (e.g. Ray is not installed or the cluster is unreachable)."""


class SweepInterrupted(Exception):
    """A worker stopped because the sweep is being interrupted (Ctrl-C / SIGTERM)."""


def refuse_local_settings(parallel: int, compile_ahead: bool, at_once: str) -> None:
    """Refuses the local launcher's own settings given to a cluster launcher; ``at_once`` says
    how that launcher decides how many runs go at once."""
    if parallel > 1:
        raise LauncherError(f"--parallel={parallel} applies to --launcher=local; {at_once}")
    if compile_ahead:
        raise LauncherError("--compile-ahead applies to --launcher=local")


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def record_crash(run_dir: Path, how: str) -> dict:
    """Writes failure.json for a run whose process died without reporting, and returns the
    result the launcher passes on."""
    error = f"worker process died ({how}) while training; see {run_dir / LOG_FILE}"
    write_failure(run_dir, error, _log_tail(run_dir / LOG_FILE))
    return {"run_id": run_dir.name, "status": FAILED, "error": error, "seconds": None}
