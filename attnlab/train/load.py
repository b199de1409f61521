"""Restoring a finished (or running) run's parameters for evaluation and generation."""

from __future__ import annotations

from pathlib import Path

import jax
from flax import nnx

from attnlab.config import Config, check_warmup, from_config_dict
from attnlab.checks import check
from attnlab.data import prepare
from attnlab.data.tokenizer import HubTokenizer
from attnlab.errors import AttnlabError
from attnlab.rundir import TOKENIZER_FILE
from attnlab.train import workdir as wd
from attnlab.train.checkpoint import (Checkpoints, CheckpointError, DamagedCheckpointError,
                                     check_compatible, param_shapes)
from attnlab.train.state import abstract_model


def command_config(values, *, experiment_base: bool = False) -> Config:
    """The command line's config, every rule between its parts checked (before compiling); an
    experiment file (a sweep: ``base`` and ``sweep``) is refused in one line, or with
    ``experiment_base`` read as its base config."""
    raw = values.config
    if "sweep" in raw and "base" in raw:
        if not experiment_base:
            raise AttnlabError("--config names an experiment (its sweep and base sections): "
                               "this command takes one run's config (configs/*.py); attnlab "
                               "sweep --config=... --dry-run plans the experiment's runs")
        raw = raw.base
    cfg = from_config_dict(raw)
    check(cfg)
    check_warmup(cfg.train, cfg.total_steps)
    return cfg


def load_config(workdir: str | Path) -> Config:
    """The checked Config a run was started with (``<workdir>/config.json``)."""
    path = Path(workdir) / wd.CONFIG_FILE
    if not path.exists():
        raise wd.WorkdirError(f"{workdir} is not a run directory: {path} does not exist")
    cfg = from_config_dict(wd.read_json(path))
    check(cfg)
    return cfg


def load_params(workdir: str | Path, step: int | None = None
                ) -> tuple[Config, nnx.GraphDef, nnx.State]:
    """``(cfg, graphdef, params)`` from the latest (or the given) checkpoint of a run.

    The parameters land on the first local device; use them with ``attnlab.model.apply``.
    Raises WorkdirError / CheckpointError naming the directory when there is nothing to load.
    """
    cfg = load_config(workdir)
    graphdef, abstract_params = abstract_model(cfg)
    directory = Path(workdir) / wd.CHECKPOINT_DIR
    if not directory.exists():
        raise CheckpointError(f"{workdir} has no checkpoints/ yet")
    with Checkpoints(directory, keep=cfg.train.keep_checkpoints, read_only=True) as checkpoints:
        if not checkpoints.all_steps():
            raise CheckpointError(f"{workdir} has no checkpoint yet (nothing finished in "
                                  f"{directory})")
        step = checkpoints.latest_step() if step is None else step
        if step is None or step not in checkpoints.all_steps():
            raise CheckpointError(f"no checkpoint {'' if step is None else step} in {directory}; "
                                  f"available: {checkpoints.all_steps()}")
        steps = checkpoints.all_steps()
        try:
            check_compatible(checkpoints.read_meta(step), cfg.model,
                             param_shapes(abstract_params), f"checkpoint {directory / str(step)}")
            sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
            params = checkpoints.restore_params(
                step, abstract_params, jax.tree.map(lambda _: sharding, abstract_params))
        except DamagedCheckpointError as e:
            older = sorted((s for s in steps if s < step), reverse=True)
            hint = (f"; --step={older[0]} loads an older one (steps: {sorted(steps)}), and "
                    f"rerunning training moves the damaged step aside" if older else
                    "; no older checkpoint is left: retrain the run")
            raise DamagedCheckpointError(f"{e} (damaged checkpoint){hint}") from None
    return cfg, graphdef, params


def run_tokenizer(workdir: str | Path, cfg: Config):
    """The tokenizer a run was trained with: an imported run's (attnlab import-hf brings its
    model's), else its corpus's."""
    hub = Path(workdir) / TOKENIZER_FILE
    tokenizer = HubTokenizer(hub) if hub.is_file() else prepare(cfg.data).tokenizer
    if tokenizer is None:
        raise AttnlabError(f"--run={workdir} was trained on the token task data.source="
                           f"{cfg.data.source}, which has no text")
    return tokenizer
