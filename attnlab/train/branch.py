"""Cooldown branches: a run that starts from another run's (the trunk's) checkpoint.

A WSD run's learning rate is constant until its cooldown (Hägele et al. 2024, sec. 3), so the
runs of one model at several token counts D share everything up to their cooldowns. A trunk
trains that shared constant-LR phase once (``train.schedule=constant``, its checkpoints at the
branch points kept by ``train.keep_steps``); each branch (``train.schedule=wsd``) restores the
trunk's state at ``train.branch_step`` (the step its cooldown starts) and trains only its
cooldown. Batch ``i`` depends only on (data, seed, i) and the schedules agree on every update
before the branch point, so a branch computes the run it would be from scratch, at the cost of
its cooldown.

The branch is a run of its own (its directory, config, metrics, summary); its summary's
``branch`` records the trunk, the branch point and the tokens and FLOPs it shared.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from attnlab import rundir
from attnlab.config import Config, from_config_dict
from attnlab.train.checkpoint import Checkpoints, CheckpointError, check_compatible
from attnlab.train.optimizer import make_schedule
from attnlab.identity import config_differences

# Fields in which a branch may differ from its trunk: its length, its schedule past the branch
# point (checked value by value below), and how it logs and keeps checkpoints.
MAY_DIFFER_FROM_TRUNK = frozenset({
    "name", "train.steps", "train.tokens", "train.schedule", "train.decay_fraction",
    "train.cooldown", "train.min_lr_ratio", "train.branch_from", "train.branch_step",
    "train.eval_every", "train.log_every", "train.checkpoint_every", "train.keep_checkpoints",
})
# The running totals of a checkpoint record that belong to the run that spent them: a branch
# counts its own wall time and throughput.
_OWN_TOTALS = ("timed_tokens", "timed_seconds", "paused_seconds", "wall_seconds")


def trunk_directory(cfg: Config, workdir: Path) -> Path:
    """``train.branch_from`` as a directory: absolute, or relative to the branch's parent (a
    sweep's branches and trunks are siblings in ``runs/``)."""
    path = Path(cfg.train.branch_from)
    return path if path.is_absolute() else Path(workdir).absolute().parent / path


def check_trunk(cfg: Config, trunk: Config, where: Path) -> None:
    """Raises CheckpointError unless ``trunk`` trains what ``cfg`` trains up to its branch
    point: the same config but for :data:`MAY_DIFFER_FROM_TRUNK`, and bitwise the same
    learning rate on every update before ``cfg.train.branch_step``."""
    saved, given = trunk.to_dict(), cfg.to_dict()
    diffs = [d for d in config_differences(saved, given)
             if d.split(":")[0] not in MAY_DIFFER_FROM_TRUNK]
    if diffs:
        raise CheckpointError(f"the trunk {where} trains another run than this branch: "
                              + "; ".join(diffs[:4]) + ("; ..." if len(diffs) > 4 else ""))
    step = cfg.train.branch_step
    if step > trunk.total_steps:
        raise CheckpointError(f"the trunk {where} has {trunk.total_steps} steps; this branch "
                              f"starts at step {step}")
    updates = np.arange(step)
    ours = np.asarray(jax.vmap(make_schedule(cfg.train, cfg.total_steps,
                                             cfg.model.d_model))(updates))
    theirs = np.asarray(jax.vmap(make_schedule(trunk.train, trunk.total_steps,
                                               trunk.model.d_model))(updates))
    differ = np.flatnonzero(ours != theirs)
    if differ.size:
        t = int(differ[0])
        raise CheckpointError(f"the trunk {where} ({trunk.train.schedule} schedule) has "
                              f"learning rate {theirs[t]:.6g} at update {t}, this branch "
                              f"{ours[t]:.6g}: a branch must follow its trunk's schedule up to "
                              f"its branch point (step {step})")


def branch_start(cfg: Config, workdir: Path, programs) -> tuple[int, dict, object]:
    """``(step, record, state)``: the trunk's training state at ``cfg.train.branch_step``
    (restored with ``programs``' shapes and shardings) and its checkpoint record less the
    trunk's own running totals.

    Raises:
      CheckpointError naming the trunk: it is missing, trains another run, or has no
        checkpoint at the branch point (not reached yet, or not kept: ``train.keep_steps``).
    """
    trunk_dir = trunk_directory(cfg, workdir)
    config_path = trunk_dir / rundir.CONFIG_FILE
    if not config_path.exists():
        raise CheckpointError(f"the trunk {trunk_dir} (train.branch_from) holds no run yet "
                              f"(no {rundir.CONFIG_FILE}): train it before its branches")
    trunk = from_config_dict(rundir.read_json(config_path))
    check_trunk(cfg, trunk, trunk_dir)
    step = cfg.train.branch_step
    directory = trunk_dir / rundir.CHECKPOINT_DIR
    with Checkpoints(directory, keep=trunk.train.keep_checkpoints, read_only=True) as ckpts:
        steps = sorted(ckpts.all_steps()) if directory.exists() else []
        if step not in steps:
            status = rundir.run_status(trunk_dir)
            raise CheckpointError(
                f"the trunk {trunk_dir} has no checkpoint at step {step} (it has {steps}, "
                f"status {status}): " + ("it has not reached it yet" if status != rundir.COMPLETED
                                         else "it did not keep it (train.keep_steps); delete "
                                              "the trunk's directory to retrain it"))
        meta = ckpts.read_meta(step)
        check_compatible(meta, cfg.model, programs.param_shapes, f"checkpoint {directory}/{step}")
        state = ckpts.restore(step, programs.abstract_state, programs.shardings)
    record = {k: v for k, v in meta.items() if k not in _OWN_TOTALS}
    return step, record, state


def branch_record(cfg: Config, workdir: Path, flops_per_token: dict[str, float]) -> dict:
    """What a branch's summary says of its trunk: the directory, the branch point, and the
    tokens and FLOPs (6ND and Chinchilla counts, as the summary's ``flops``) it shared."""
    tokens = cfg.train.branch_step * cfg.data.batch_size * cfg.data.seq_len
    return {"trunk": str(trunk_directory(cfg, workdir)), "step": cfg.train.branch_step,
            "tokens": tokens, "flops": {"6nd": flops_per_token["6n"] * tokens,
                                        "chinchilla": flops_per_token["chinchilla"] * tokens}}


def is_branch(cfg: Config) -> bool:
    return bool(cfg.train.branch_from)


__all__ = ["MAY_DIFFER_FROM_TRUNK", "branch_record", "branch_start", "check_trunk",
           "is_branch", "trunk_directory"]
