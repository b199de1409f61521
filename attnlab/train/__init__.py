"""Training: optax AdamW + schedules, a jitted pure step, orbax checkpoints, metrics, MFU.

Library API (used by the CLI, sweeps and the extrapolation evaluation)::

    summary = attnlab.train.run(cfg, workdir)          # trains or resumes; returns summary.json
    cfg, graphdef, params = attnlab.train.load_params(workdir)
    attnlab.train.precompile(cfg)  # compiles run(cfg)'s programs ahead (a sweep's next run)

``run`` raises :class:`attnlab.errors.AttnlabError` subclasses for bad input (before compiling
or writing anything) and returns ``status: 'diverged'`` instead of raising when the loss blows
up. The command line maps these to exit codes 0 (completed), 2 (bad input), 3 (diverged).
"""

from attnlab.train.checkpoint import CheckpointError
from attnlab.train.load import load_config, load_params
from attnlab.train.loop import EXIT_BAD_INPUT, EXIT_COMPLETED, EXIT_DIVERGED, precompile, run
from attnlab.train.workdir import WorkdirError

__all__ = [
    "CheckpointError",
    "EXIT_BAD_INPUT",
    "EXIT_COMPLETED",
    "EXIT_DIVERGED",
    "WorkdirError",
    "load_config",
    "load_params",
    "precompile",
    "run",
]
