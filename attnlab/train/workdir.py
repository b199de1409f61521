"""What a run keeps in its directory, apart from checkpoints and TensorBoard events.

``config.json`` (the full resolved config), ``metrics.jsonl`` (one JSON object a line) and
``summary.json`` (written atomically: a temporary file renamed over the old one).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from attnlab.config import Config
from attnlab.errors import AttnlabError

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CHECKPOINT_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"

STATUSES = ("running", "completed", "diverged", "failed")

# How a run is launched, not what it computes: may differ when a run is resumed. (Resharding a
# checkpoint onto another mesh is exact for the parameters; later steps then reduce in another
# order, so the continuation matches to float rounding, not bitwise.)
RESUMABLE_DIFFERENCES = frozenset({
    "data.cache_dir", "train.distributed", "train.coordinator_address", "train.num_processes",
    "train.process_id", "train.mesh_data", "train.mesh_fsdp",
})


class WorkdirError(AttnlabError):
    """The work directory holds something that this run must not overwrite."""


def write_json_atomic(path: Path, obj: Any) -> None:
    """Writes ``obj`` as JSON so that readers see the old file or the new one, never a part."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, allow_nan=True) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise WorkdirError(f"cannot read {path}: {e}") from None


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_differences(saved: dict, current: dict) -> list[str]:
    """``['train.steps: saved 20, given 40', ...]`` ignoring :data:`RESUMABLE_DIFFERENCES`."""
    a, b = _flatten(saved), _flatten(current)
    return [f"{k}: saved {a.get(k)!r}, given {b.get(k)!r}"
            for k in sorted(set(a) | set(b))
            if k not in RESUMABLE_DIFFERENCES and a.get(k) != b.get(k)]


def check_workdir(workdir: Path, cfg: Config) -> dict | None:
    """Refuses a directory that holds another run; returns its summary if it holds this one.

    Raises:
      WorkdirError: the directory is a file, holds a run with another config, or holds
        checkpoints without a config. Nothing is written.
    """
    if workdir.exists() and not workdir.is_dir():
        raise WorkdirError(f"--workdir {workdir} exists and is not a directory")
    config_path = workdir / CONFIG_FILE
    if not config_path.exists():
        if (workdir / CHECKPOINT_DIR).exists():
            raise WorkdirError(
                f"{workdir} holds checkpoints/ but no {CONFIG_FILE}, so it cannot be resumed "
                "safely; use a fresh --workdir (or delete the directory to start over)")
        return None
    saved = read_json(config_path)
    diffs = config_differences(saved, cfg.to_dict())
    if diffs:
        shown = "\n  ".join(diffs[:12]) + ("\n  ..." if len(diffs) > 12 else "")
        raise WorkdirError(
            f"{workdir} holds a run with a different config:\n  {shown}\n"
            f"To resume it, rerun with the config it was started with (its resolved values are "
            f"in {config_path}). To start fresh, pass another --workdir, or delete {workdir}.")
    summary_path = workdir / SUMMARY_FILE
    return read_json(summary_path) if summary_path.exists() else None


def rewind_metrics(path: Path, step: int) -> list[dict]:
    """Drops lines logged after ``step`` (work lost when a run was killed after its last
    checkpoint, about to be redone) and returns the lines kept."""
    if not path.exists():
        return []
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        if record.get("step", 0) <= step:
            kept.append(record)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    os.replace(tmp, path)
    return kept
