"""A run's extrapolation report on disk: its files, whether it is current (made from the latest
checkpoint, unchanged since, with the same settings), and writing it atomically."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd

from attnlab import rundir
from attnlab.extrapolation.protocol import EvaluationError

REPORT_FILE = "extrapolation"  # <run_dir>/extrapolation[<tag>].json / .csv / _positions.csv
FORMAT_VERSION = 1


def report_paths(run_dir: Path, tag: str = "") -> dict[str, Path]:
    stem = f"{REPORT_FILE}{tag}"
    return {"json": run_dir / f"{stem}.json", "csv": run_dir / f"{stem}.csv",
            "positions": run_dir / f"{stem}_positions.csv"}


def latest_checkpoint_step(run_dir: Path) -> int:
    """Step of the run's latest finished checkpoint; raises EvaluationError if there is none."""
    # Deferred here and below: the trainer and the data pipeline (orbax, TFDS) take seconds to
    # import, which protocol and checks users (pure NumPy) never need.
    from attnlab.train.checkpoint import Checkpoints
    from attnlab.train.workdir import CHECKPOINT_DIR, CONFIG_FILE

    if not run_dir.is_dir():
        raise EvaluationError(f"--run: {run_dir} is not a directory")
    if not (run_dir / CONFIG_FILE).exists():
        raise EvaluationError(f"--run: {run_dir} is not a run directory (no {CONFIG_FILE})")
    directory = run_dir / CHECKPOINT_DIR
    step = None
    if directory.is_dir():
        with Checkpoints(directory, keep=1, read_only=True) as checkpoints:
            step = checkpoints.latest_step()
    if step is None:
        raise EvaluationError(f"--run: {run_dir} has no finished checkpoint to evaluate "
                              f"(nothing in {directory}); train it first")
    return int(step)


def settings_record(settings) -> dict:
    """The evaluation's settings (an ``EvalSettings``) as the report records them."""
    return dataclasses.asdict(settings)


def checkpoint_fingerprint(run_dir: Path, step: int) -> str:
    """A digest of the names, sizes and modification times of the files of checkpoint ``step``:
    it changes whenever the checkpoint is rewritten, replaced or damaged, even at the same step
    (a resumed run that redid the step, a file cut short), without reading the arrays."""
    from attnlab.train.workdir import CHECKPOINT_DIR

    directory = run_dir / CHECKPOINT_DIR / str(step)
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            info = path.stat()
            digest.update(f"{path.relative_to(directory)}\0{info.st_size}\0"
                          f"{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def is_current(run_dir: str | Path, settings, tag: str = "") -> bool:
    """True if the run's report was made from its latest checkpoint, unchanged since (same
    step and the same :func:`checkpoint_fingerprint`), with these settings. A report without a
    fingerprint (written before it was recorded) is not current: it is evaluated again."""
    run_dir = Path(run_dir)
    path = report_paths(run_dir, tag)["json"]
    try:
        saved = json.loads(path.read_text())
        step = latest_checkpoint_step(run_dir)
        fingerprint = checkpoint_fingerprint(run_dir, step)
    except (OSError, ValueError):  # missing or unreadable report, or no checkpoint
        return False
    return (saved.get("format_version") == FORMAT_VERSION
            and saved.get("checkpoint_step") == step
            and saved.get("checkpoint_fingerprint") == fingerprint
            and saved.get("settings") == json.loads(json.dumps(settings_record(settings))))


def write_report(report: dict, paths: dict[str, Path]) -> None:
    """Writes the JSON report and its two CSV tables atomically."""
    _write_atomic(paths["json"], json.dumps(report, indent=2) + "\n")
    _write_atomic(paths["csv"], results_frame(report).to_csv(index=False))
    curve = report["per_position"]
    positions = pd.DataFrame({"position": np.arange(len(curve["loss"])), "loss": curve["loss"]})
    _write_atomic(paths["positions"], positions.to_csv(index=False))


def results_frame(report: dict) -> pd.DataFrame:
    """The report's rows as a table, with the run's identity in leading columns."""
    frame = pd.DataFrame(report["results"])
    for key in ("seed", "pos_encoding", "name"):
        if key in report:
            frame.insert(0, key, report[key])
    return frame


def _write_atomic(path: Path, text: str) -> None:
    """Atomic, with a temporary unique to this writer: two evaluations never share one."""
    rundir.write_text_atomic(path, text)
