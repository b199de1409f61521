"""The learning-rate schedules: each one class, registered in :data:`SCHEDULES` by its name.

Every schedule maps the number of updates already applied, ``t = 0, 1, ...`` (optax's ``count``),
to the learning rate of update ``t``. Warmups count the update being made, ``(t + 1) / warmup``,
so the first update is not wasted at lr = 0, and decays reach their floor one update after the
last, ``t = total_steps``: with a floor of zero the last update is not wasted either.

The maths is written against an array namespace ``xp`` (``jax.numpy`` when training, ``numpy``
for float64 references), so this module needs no jax and the config can check settings with it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

from attnlab.errors import ConfigError

# The cooldown's shape g(p): the fraction of the way from the floor to the peak left after a
# fraction p of the decay (Hägele et al. 2024, sec. 3 and eq. 1: 1 - sqrt(p) is their best).
COOLDOWN_SHAPES: dict[str, Callable[[Any, Any], Any]] = {
    "linear": lambda p, xp: 1.0 - p,
    "1-sqrt": lambda p, xp: 1.0 - xp.sqrt(p),
    "cosine": lambda p, xp: 0.5 * (1.0 + xp.cos(xp.pi * p)),
}

# The values of the decay settings a config leaves unset (None) for the schedules that do not
# read them: cosine's, so the run ids of configs that never set them are unchanged.
COSINE_DECAY = {"min_lr_ratio": 0.1, "decay_fraction": 0.2, "cooldown": "linear"}


def wsd_decay_start(total_steps: int, warmup_steps: int, decay_fraction: float) -> int:
    """The number of updates of a wsd schedule before its decay: the last
    ``round(decay_fraction * total_steps)`` updates decay (at least one), never the warmup's."""
    decay_steps = max(1, round(decay_fraction * total_steps))
    return max(warmup_steps, total_steps - decay_steps)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A schedule with its run's resolved settings; ``lr(count, xp, dtype)`` is the learning rate
    of update ``count``, computed in ``dtype`` (float32 in training). A subclass names itself,
    its values of unset decay settings and the rules it keeps."""

    name: ClassVar[str]
    decay_defaults: ClassVar[dict[str, Any]] = COSINE_DECAY
    # A warmup longer than the run never reaches the peak (noam's warmup is its shape instead).
    warmup_within_run: ClassVar[bool] = True
    # A cooldown branch may start from a checkpoint of its stable (constant-LR) phase.
    branches: ClassVar[bool] = False

    peak: float
    warmup_steps: int
    total_steps: int
    min_lr_ratio: float
    decay_fraction: float
    cooldown: str
    d_model: int

    def __post_init__(self):
        """Refuses settings this schedule cannot run with (ConfigError naming the field)."""

    def lr(self, count, xp, dtype="float32"):
        raise NotImplementedError

    def warmup(self, t, xp):
        """Linear ramp ``peak * (t + 1) / warmup_steps`` for ``t < warmup_steps``, ``peak``
        after."""
        if self.warmup_steps == 0:
            return xp.full_like(t, self.peak)
        return self.peak * xp.minimum(1.0, (t + 1.0) / self.warmup_steps)

    def progress(self, t, start: int, xp):
        """Fraction of a decay phase done after update ``t``: 0 before ``start``,
        ``L / (L + 1)`` at the last update ``total_steps - 1`` of a decay of ``L`` updates (1
        one update later)."""
        length = max(1, self.total_steps - start)
        return xp.clip((t - start + 1.0) / (length + 1.0), 0.0, 1.0)

    @property
    def floor(self) -> float:
        return self.peak * self.min_lr_ratio


class Cosine(Schedule):
    """Linear warmup, then cosine decay from the peak to ``min_lr_ratio * peak`` over the rest:
    one cycle matched to the run's length (Hoffmann et al. 2022, sec. 3.1: a cycle longer than
    the run overestimates the loss of short runs)."""

    name = "cosine"

    def lr(self, count, xp, dtype="float32"):
        t = xp.asarray(count, dtype)
        p = self.progress(t, self.warmup_steps, xp)
        decayed = self.floor + (self.peak - self.floor) * 0.5 * (1.0 + xp.cos(xp.pi * p))
        return xp.where(t < self.warmup_steps, self.warmup(t, xp), decayed)


class Noam(Schedule):
    """The original Transformer schedule (Vaswani et al. 2017, eq. 3), scaled by the learning
    rate: ``lr(s) = learning_rate * d_model^-0.5 * min(s^-0.5, s * warmup^-1.5)``, ``s = t + 1``.

    ``learning_rate`` is a dimensionless multiplier: 1.0 reproduces the paper exactly, and the
    peak, reached at ``s = warmup``, is ``learning_rate / sqrt(d_model * warmup)`` (e.g. 1.0 with
    d_model=512, warmup=4000 peaks at 7.0e-4). ``min_lr_ratio`` is not used: the decay is s^-0.5.
    """

    name = "noam"
    warmup_within_run = False

    def __post_init__(self):
        if self.warmup_steps <= 0:
            raise ConfigError("train.warmup_steps", "the noam schedule needs warmup_steps > 0")

    def lr(self, count, xp, dtype="float32"):
        s = xp.asarray(count, dtype) + 1.0
        scale = self.peak * self.d_model**-0.5
        return scale * xp.minimum(s**-0.5, s * self.warmup_steps**-1.5)


class Wsd(Schedule):
    """Warmup-stable-decay (Hu et al. 2024, MiniCPM; Hägele et al. 2024): linear warmup, the
    constant peak, then a cooldown to ``min_lr_ratio * peak`` over the last ``decay_fraction``
    of the steps, ``lr = floor + (peak - floor) * g(p)`` with ``g`` the ``cooldown`` shape
    (:data:`COOLDOWN_SHAPES`) and ``p`` the fraction of the cooldown done. Unset, it cools down
    with 1 - sqrt over the last 20% to zero (Hägele et al. 2024, sec. 3 and fig. 4). A run's
    stable-phase checkpoints can be cooled down separately to get several budgets (cooldown
    branches)."""

    name = "wsd"
    decay_defaults = {"min_lr_ratio": 0.0, "decay_fraction": 0.2, "cooldown": "1-sqrt"}
    branches = True

    def lr(self, count, xp, dtype="float32"):
        t = xp.asarray(count, dtype)
        start = wsd_decay_start(self.total_steps, self.warmup_steps, self.decay_fraction)
        p = self.progress(t, start, xp)
        shape = COOLDOWN_SHAPES[self.cooldown](p, xp)
        decayed = xp.where(p > 0, self.floor + (self.peak - self.floor) * shape, self.peak)
        return xp.where(t < self.warmup_steps, self.warmup(t, xp), decayed)


class Constant(Schedule):
    """Linear warmup (if any), then the peak for ever."""

    name = "constant"

    def lr(self, count, xp, dtype="float32"):
        return self.warmup(xp.asarray(count, dtype), xp)


SCHEDULES: dict[str, type[Schedule]] = {s.name: s for s in (Cosine, Noam, Wsd, Constant)}
