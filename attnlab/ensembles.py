"""Which runs can train together in one compiled program (an ensemble,
:mod:`attnlab.train.ensemble`), decided from their configs alone, so that a sweep groups its runs
without importing the trainer."""

from __future__ import annotations

import dataclasses
import json
from typing import Hashable, Iterable, TypeVar

from attnlab.config import Config
from attnlab.errors import AttnlabError, ConfigError

T = TypeVar("T", bound=Hashable)

# Config fields in which the members of one ensemble may differ (section.field). Cooldown
# branches of different trunks (seeds) may train together when they start at the same step;
# branches of one trunk start at different steps, and a member waiting for its step would
# still be computed in every round, so train.branch_step is not among these.
MAY_DIFFER = frozenset({
    "name", "data.seed", "train.seed", "train.learning_rate", "train.steps", "train.tokens",
    "train.schedule", "train.warmup_steps", "train.min_lr_ratio", "train.decay_fraction",
    "train.cooldown", "train.keep_steps", "train.weight_decay", "train.b1", "train.b2",
    "train.eps", "train.log_every", "train.branch_from",
    "train.eval_every", "train.checkpoint_every", "train.keep_checkpoints",
})
# Of those, the ones that leave the optimizer unchanged (members equal in the rest share a
# vmapped update).
OPTIMIZER_NEUTRAL = frozenset({"name", "data.seed", "train.seed", "train.log_every",
                               "train.eval_every", "train.checkpoint_every",
                               "train.keep_checkpoints", "train.keep_steps"})


# ``--ensemble``: whether runs of one shape share a compiled program.
CHOICES = ("auto", "on", "off")
ENSEMBLE_MAX = 8  # members per ensemble: the speed-up flattens past it (docs/benchmarks.md)


def check_choice(choice: str) -> None:
    if choice not in CHOICES:
        raise AttnlabError(f"--ensemble must be one of {', '.join(CHOICES)}, not {choice!r}")


def members_per_program(choice: str, most: int, platform: str) -> int:
    """How many runs one compiled program may train: ``off`` 1, ``on`` up to ``most``, ``auto``
    up to ``most`` on an accelerator and 1 on a CPU. On one H200, 16 vmapped members train 22-25x
    a lone run's tokens/s; on a 2-core CPU an ensemble costs its members' CPU time (a step is
    bound by its own arithmetic, not by dispatch) and a 32-run sweep through ensembles took
    1.15-1.29x the time of lone runs (docs/benchmarks.md, "Ensembles")."""
    check_choice(choice)
    if choice == "off" or (choice == "auto" and platform == "cpu"):
        return 1
    return most


def _flat(cfg: Config, leave_out: frozenset) -> dict:
    flat = {"name": cfg.name}
    for section in ("model", "data", "train"):
        for key, value in dataclasses.asdict(getattr(cfg, section)).items():
            flat[f"{section}.{key}"] = value
    return {k: v for k, v in flat.items() if k not in leave_out}


def ensemble_key(cfg: Config) -> str:
    """What members of one ensemble share: ``cfg`` without :data:`MAY_DIFFER`, as JSON."""
    return json.dumps(_flat(cfg, MAY_DIFFER), sort_keys=True, default=str)


def optimizer_key(cfg: Config) -> str:
    return json.dumps({**_flat(cfg, OPTIMIZER_NEUTRAL), "steps": cfg.total_steps},
                      sort_keys=True, default=str)


def check_members(cfgs: list[Config]) -> None:
    """Raises ConfigError naming the first field in which a member differs from the first
    member although it shapes the program, or a setting an ensemble cannot train."""
    if not cfgs:
        raise ConfigError("ensemble", "an ensemble needs at least one run")
    first = _flat(cfgs[0], MAY_DIFFER)
    for i, cfg in enumerate(cfgs[1:], start=1):
        for key, value in _flat(cfg, MAY_DIFFER).items():
            if value != first[key]:
                raise ConfigError(key, f"ensemble member {i} ({cfg.name}) has {value!r}, member "
                                       f"0 ({cfgs[0].name}) {first[key]!r}: members may differ "
                                       f"only in {', '.join(sorted(MAY_DIFFER))}")
    if cfgs[0].train.distributed:
        raise ConfigError("train.distributed", "ensembles train in one process")


def groups(items: Iterable[T], config_of, max_size: int) -> list[list[T]]:
    """``items`` (e.g. run directories) in groups of at most ``max_size`` that share an
    :func:`ensemble_key` (``config_of(item)``), in the order each group's first item comes;
    a group's members are in their given order."""
    if max_size < 1:
        raise ValueError(f"max_size must be >= 1, got {max_size}")
    by_key: dict[str, list[list[T]]] = {}
    ordered: list[list[T]] = []
    for item in items:
        chunks = by_key.setdefault(ensemble_key(config_of(item)), [])
        if not chunks or len(chunks[-1]) == max_size:
            chunks.append([])
            ordered.append(chunks[-1])
        chunks[-1].append(item)
    return ordered
