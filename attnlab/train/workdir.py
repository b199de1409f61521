"""Whether a directory may hold this run: a new one, or this run to resume (same config).

The file names, atomic writes and reads are :mod:`attnlab.rundir`'s.
"""

from __future__ import annotations

from pathlib import Path

from attnlab.config import Config
from attnlab.identity import config_differences
from attnlab.rundir import (CHECKPOINT_DIR, CONFIG_FILE, RUN_DIR_MARKERS, RUN_DIR_NAMES,
                            RUNS_DIR, SUMMARY_FILE, SWEEP_FILE, WorkdirError,
                            check_can_create_dir, check_not_foreign, read_json)


def check_workdir(workdir: Path, cfg: Config, *, allow_nonempty: bool = False) -> dict | None:
    """Refuses a directory that holds another run; returns its summary if it holds this one.

    Raises:
      WorkdirError: the directory is a file or cannot be created or written, is a sweep
        directory, holds someone else's files and no run (unless ``allow_nonempty``), holds a
        run with another config, or holds checkpoints without a config. Nothing is written.
    """
    check_can_create_dir(workdir, "--run")
    if (workdir / SWEEP_FILE).exists() or (workdir / RUNS_DIR).is_dir():
        raise WorkdirError(f"--run {workdir} is a sweep directory ({SWEEP_FILE}, {RUNS_DIR}/), "
                           f"not a training run: pass another --run")
    check_not_foreign(workdir, RUN_DIR_NAMES, RUN_DIR_MARKERS, "run", "--run",
                      allow_nonempty=allow_nonempty)
    config_path = workdir / CONFIG_FILE
    if not config_path.exists():
        if (workdir / CHECKPOINT_DIR).exists():
            raise WorkdirError(
                f"{workdir} holds checkpoints/ but no {CONFIG_FILE}, so it cannot be resumed "
                "safely; use a fresh --run (or delete the directory to start over)")
        return None
    saved = read_json(config_path)
    diffs = config_differences(saved, cfg.to_dict())
    if diffs:
        shown = "; ".join(diffs[:6]) + ("; ..." if len(diffs) > 6 else "")
        raise WorkdirError(
            f"{workdir} holds a run with a different config ({shown}). To resume it, rerun "
            f"with the config it was started with (its values are in {config_path}); to start "
            f"fresh, pass another --run")
    summary_path = workdir / SUMMARY_FILE
    return read_json(summary_path) if summary_path.exists() else None
