"""Sweeps: many training runs from one spec, idempotent and resumable, on local workers or Ray.

    spec = attnlab.sweep.load_spec("experiments/tiny_grid.py")
    runs = attnlab.sweep.plan(spec)                 # [PlannedRun(run_id, cfg, axes, ...)]
    table = attnlab.sweep.run_sweep(spec, "sweeps/tiny_grid")   # pandas DataFrame

The spec format is documented in docs/sweeps.md; the results table in attnlab/results.py.
"""

from attnlab.sweep.launchers import LauncherError, SweepInterrupted
from attnlab.sweep.planner import PlannedRun, expand, ladder_shapes, plan, run_id
from attnlab.sweep.probe import dry_run, format_table
from attnlab.sweep.stages import run_sweep
from attnlab.sweep.spec import (
    Ladder,
    LearningRateRule,
    Resources,
    Shape,
    SweepSpec,
    SweepSpecError,
    WarmupRule,
    load_spec,
    spec_from_config_dict,
)

__all__ = [
    "Ladder",
    "LauncherError",
    "LearningRateRule",
    "PlannedRun",
    "Resources",
    "Shape",
    "SweepInterrupted",
    "SweepSpec",
    "SweepSpecError",
    "WarmupRule",
    "dry_run",
    "expand",
    "format_table",
    "ladder_shapes",
    "load_spec",
    "plan",
    "run_id",
    "run_sweep",
    "spec_from_config_dict",
]
