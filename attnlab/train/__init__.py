"""Training: optax AdamW + schedules, a jitted pure step, orbax checkpoints, metrics, MFU.

Library API (used by the CLI, sweeps and the extrapolation evaluation)::

    summary = attnlab.train.run(cfg, workdir)          # trains or resumes; returns summary.json
    cfg, graphdef, params = attnlab.train.load_params(workdir)
    cache = attnlab.train.ProgramCache()     # a sweep worker's: runs of one shape share programs
    cache.precompile(cfg)                    # compiles run(cfg)'s programs ahead (the next run)
    summary = attnlab.train.run(cfg, workdir, programs=cache)

``run`` raises :class:`attnlab.errors.AttnlabError` subclasses for bad input (before compiling
or writing anything) and returns ``status: 'diverged'`` instead of raising when the loss blows
up. The command line maps these to exit codes 0 (completed), 2 (bad input), 3 (diverged).
"""

from attnlab.train.checkpoint import CheckpointError
from attnlab.train.load import load_config, load_params
from attnlab.train.loop import EXIT_BAD_INPUT, EXIT_COMPLETED, EXIT_DIVERGED, run
from attnlab.train.programs import ProgramCache
from attnlab.train.workdir import WorkdirError

__all__ = [
    "CheckpointError",
    "EXIT_BAD_INPUT",
    "EXIT_COMPLETED",
    "EXIT_DIVERGED",
    "ProgramCache",
    "WorkdirError",
    "load_config",
    "load_params",
    "run",
]
