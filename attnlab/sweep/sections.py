"""The sections of a sweep spec besides the base config: shapes, a size ladder, the branches of a
ladder, a tuning stage, an IsoFLOP centre, a run's resources (the learning-rate and warmup rules
are in rules.py). Each is a frozen dataclass built from its mapping by the config's generic
builder (:func:`attnlab.dataclass_io.build_dataclass`) and then checked by its own
``checked(field)``, which raises :class:`SweepSpecError` naming the field."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from attnlab.schedules import COOLDOWN_SHAPES
from attnlab.errors import ConfigError


class SweepSpecError(ConfigError):
    """A sweep spec is malformed. ``field`` is its dotted path, e.g. ``sweep.axes.train.seed``."""


@dataclasses.dataclass(frozen=True)
class Shape:
    """One model shape of a sweep. ``learning_rate`` is set only by explicit per-shape values;
    ``target_params`` only by a ladder (the non-embedding count it was generated for)."""

    d_model: int
    n_layers: int
    n_heads: int
    learning_rate: float | None = None
    target_params: float | None = None

    @property
    def label(self) -> str:
        return f"d{self.d_model}-l{self.n_layers}-h{self.n_heads}"


@dataclasses.dataclass(frozen=True)
class Ladder:
    """Shapes generated from target non-embedding parameter counts at a fixed aspect ratio.

    For each target N the planner picks the integer depth L (with d_model = aspect_ratio * L
    rounded to a multiple of head_dim, n_heads = d_model / head_dim) whose exact count from
    :func:`attnlab.model.param_counts` is closest to N in log space.
    """

    non_embedding_params: tuple[float, ...] = ()
    aspect_ratio: float = 0.0  # d_model / n_layers (Kaplan et al. 2020 Fig. 5: flat in it)
    head_dim: int = 0
    learning_rates: tuple[float, ...] = ()  # optional per-target values (rule per_shape)

    def checked(self, field: str) -> Ladder:
        targets = self.non_embedding_params
        if not targets:
            raise SweepSpecError(f"{field}.non_embedding_params",
                                 "empty: give a tuple of target non-embedding parameter counts")
        targets = tuple(positive_number(t, f"{field}.non_embedding_params") for t in targets)
        if len(set(targets)) != len(targets):
            raise SweepSpecError(f"{field}.non_embedding_params", "the same target appears twice")
        positive_number(self.aspect_ratio, f"{field}.aspect_ratio")
        int_at_least(self.head_dim, 1, f"{field}.head_dim")
        lrs = self.learning_rates
        if lrs and len(lrs) != len(targets):
            raise SweepSpecError(f"{field}.learning_rates",
                                 f"has {len(lrs)} values for {len(targets)} targets")
        lrs = tuple(positive_number(v, f"{field}.learning_rates") for v in lrs)
        return dataclasses.replace(self, non_embedding_params=targets, learning_rates=lrs)


@dataclasses.dataclass(frozen=True)
class Branches:
    """The token counts of a ladder sweep (mode ``ladder``): for every shape one constant-LR
    trunk and, for each count D, a cooldown branch trained from the trunk's checkpoint at the
    step its cooldown starts (the last ``fraction`` of D decays with shape ``cooldown``;
    Hägele et al. 2024: a 1-sqrt cooldown over ~20% of the steps matches a tuned cosine).

    Give D as ``tokens`` (the same for every shape) or as ``tokens_per_param`` (D / N, N the
    ``params`` count: total or non_embedding).
    """

    tokens_per_param: tuple[float, ...] = ()
    tokens: tuple[float, ...] = ()
    params: str = "total"
    cooldown: str = "1-sqrt"
    fraction: float = 0.2

    def checked(self, field: str) -> Branches:
        if bool(self.tokens) == bool(self.tokens_per_param):
            raise SweepSpecError(f"{field}.tokens_per_param", "give the branches' token counts "
                                 "as tokens_per_param or as tokens (one of the two)")
        name = "tokens" if self.tokens else "tokens_per_param"
        values = tuple(positive_number(v, f"{field}.{name}") for v in getattr(self, name))
        if len(set(values)) != len(values):
            raise SweepSpecError(f"{field}.{name}", "the same token count appears twice")
        if self.params not in ("total", "non_embedding"):
            raise SweepSpecError(f"{field}.params", f"unknown count {self.params!r}; valid "
                                                    f"counts are total, non_embedding")
        if self.cooldown not in COOLDOWN_SHAPES:
            raise SweepSpecError(f"{field}.cooldown", f"unknown shape {self.cooldown!r}; valid "
                                                      f"shapes are {', '.join(COOLDOWN_SHAPES)}")
        if not 0 < self.fraction < 1:
            raise SweepSpecError(f"{field}.fraction", f"must be in (0, 1), got {self.fraction}")
        return dataclasses.replace(self, **{name: tuple(sorted(values))})


@dataclasses.dataclass(frozen=True)
class Tune:
    """A sweep's tuning stage (``sweep.tune``): before the study, every arm whose learning-rate
    rule is ``tuned`` trains small proxies of itself at each shape of ``shapes`` and each rate
    of ``learning_rates`` (a factor-2 grid), for ``steps`` steps, once per seed of ``seeds``
    (attnlab.sweep.tuning picks each arm's rate from their final validation losses).

    shapes: ``((d_model, n_layers, n_heads), ...)``, the proxies, one per width; an arm that is
      not muP needs at least two (its rate is extrapolated in width by a fitted power law)
    learning_rates: at least three, increasing
    """

    shapes: tuple = ()
    learning_rates: tuple[float, ...] = ()
    seeds: tuple[int, ...] = (0,)
    steps: int = 0

    def checked(self, field: str) -> Tune:
        shapes = []
        for i, entry in enumerate(self.shapes):
            if (not isinstance(entry, (tuple, list)) or len(entry) != 3
                    or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                               for v in entry)):
                raise SweepSpecError(f"{field}.shapes", f"entry {i}: expected (d_model, "
                                                        f"n_layers, n_heads), positive integers, "
                                                        f"got {entry!r}")
            shapes.append(Shape(*entry))
        if not shapes:
            raise SweepSpecError(f"{field}.shapes", "empty: give the proxies' shapes, e.g. "
                                                    "((32, 2, 2), (64, 2, 2))")
        if len({s.d_model for s in shapes}) != len(shapes):
            raise SweepSpecError(f"{field}.shapes", "two shapes of the same width: the proxies "
                                                    "are a series in width, one shape each")
        lrs = tuple(positive_number(v, f"{field}.learning_rates") for v in self.learning_rates)
        if len(lrs) < 3 or any(b <= a for a, b in zip(lrs, lrs[1:])):
            raise SweepSpecError(f"{field}.learning_rates", f"expected at least three increasing "
                                 f"learning rates (a factor-2 grid), got {self.learning_rates!r}")
        seeds = tuple(self.seeds)
        if not seeds or any(isinstance(v, bool) or not isinstance(v, int) or v < 0
                            for v in seeds) or len(set(seeds)) != len(seeds):
            raise SweepSpecError(f"{field}.seeds", f"expected distinct integers >= 0, got "
                                                   f"{self.seeds!r}")
        int_at_least(self.steps, 1, f"{field}.steps")
        return dataclasses.replace(self, shapes=tuple(shapes), learning_rates=lrs, seeds=seeds)


@dataclasses.dataclass(frozen=True)
class Resources:
    """What one run asks for: Ray's task request; the local launcher pins threads instead."""

    cpus: float = 1.0
    gpus: float = 0.0
    minutes: float = 1440.0  # Slurm: each job's time limit (one nearing it is requeued)

    def checked(self, field: str) -> Resources:
        positive_number(self.cpus, f"{field}.cpus")
        number_at_least_zero(self.gpus, f"{field}.gpus")
        positive_number(self.minutes, f"{field}.minutes")
        return self


@dataclasses.dataclass(frozen=True)
class CentreRule:
    """IsoFLOP ladders placed around a prior optimum (``sweep.centre``): at budget C a shape is
    planned only if its parameter count (all parameters, Chinchilla's N) lies within a factor
    ``span`` of N*(C) = n_opt · (C / budget)^exponent. From one long list of shapes each budget
    then trains the sizes around its own optimum, so its minimum lies inside its ladder (and no
    compute goes to sizes far from it). The prior comes from an earlier sweep's fit: Chinchilla's
    a ~ 0.5, or one's own approach-2 minima."""

    n_opt: float
    budget: float
    exponent: float = 0.5
    span: float = 3.0

    def checked(self, field: str) -> CentreRule:
        for f in dataclasses.fields(self):
            positive_number(getattr(self, f.name), f"{field}.{f.name}")
        if self.span <= 1.0:
            raise SweepSpecError(f"{field}.span", f"must be > 1 (a factor either side of N*), "
                                                  f"got {self.span}")
        return self

    def target(self, budget: float) -> float:
        """N*(C) at one budget."""
        return self.n_opt * (budget / self.budget) ** self.exponent

    def keeps(self, params: float, budget: float) -> bool:
        target = self.target(budget)
        return target / self.span <= params <= target * self.span


# What a variant (sweep.variants.<name>) may set besides config keys: its own rules.


def positive_number(value: Any, field: str) -> float:
    # finite too: an infinite budget or token count has no whole number of steps
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
            or not math.isfinite(value)):
        raise SweepSpecError(field, f"must be a positive finite number, got {value!r}")
    return float(value)


def number_at_least_zero(value: Any, field: str) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0
            or not math.isfinite(value)):
        raise SweepSpecError(field, f"must be a finite number >= 0, got {value!r}")
    return float(value)


def int_at_least(value: Any, low: int, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SweepSpecError(field, f"must be an integer >= {low}, got {value!r}")
    return value
