"""What a sweep is, once parsed: :class:`SweepSpec` (mode, shapes or a size ladder, axes,
rules, budgets, variants, the tuning stage) and :class:`Variant`, :func:`variant_spec` (one
variant's own sweep) and :func:`arms` (the sweeps a tuning stage tunes). Parsing and validating
a spec file lives in :mod:`attnlab.sweep.spec`; planning, tuning and running read these classes
from here, below all of them."""

from __future__ import annotations

import dataclasses
from typing import Any

from attnlab.config import Config
from attnlab.errors import ConfigError
from attnlab.checks import with_values
from attnlab.model.architecture import PARAMETERIZATIONS
from attnlab.sweep.modes import MODES, Mode
from attnlab.sweep.rules import LearningRateRule, WarmupRule
from attnlab.sweep.sections import (Branches, CentreRule, Ladder, Resources, Shape,
                                    SweepSpecError, Tune)


BATCH_KEY = "data.batch_size"  # the axis sweep.refine_batch widens
ALL = "all"  # the one tuned arm of a sweep without variants


@dataclasses.dataclass(frozen=True)
class Variant:
    """A named variant of the whole sweep (``sweep.variants.<name>``): config overrides (dotted
    keys, e.g. ``model.mixer``) applied to the base config, and optionally its own centre,
    learning-rate and warmup rules. Every variant gets the sweep's full plan (each budget's
    ladder, each axis value), so e.g. one IsoFLOP ladder per architecture, each centred on that
    architecture's prior optimum; the results table names the variant in the column
    ``sweep.variant_column``."""

    name: str
    overrides: tuple[tuple[str, Any], ...] = ()
    centre: CentreRule | None = None
    learning_rate: LearningRateRule | None = None
    warmup: WarmupRule | None = None
    # (point, factors) this variant's points train at beyond its learning-rate factors, set by
    # attnlab.sweep.refine from the results, never in a file.
    extra_factors: tuple[tuple[str, tuple[float, ...]], ...] = ()


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """A validated sweep. ``axes`` keeps the file's order: ((dotted_key, values), ...)."""

    name: str
    mode: str
    scale: str
    base: Config  # the train config every run starts from, validated
    shapes: tuple[Shape, ...] = ()
    ladder: Ladder | None = None
    axes: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    learning_rate: LearningRateRule = LearningRateRule()
    warmup: WarmupRule = WarmupRule()
    budgets: tuple[float, ...] = ()
    centre: CentreRule | None = None
    flops_per_token: str = "chinchilla"
    min_steps: int = 1
    curve_points: int = 0
    max_epochs: float = 0.0  # > 0: no run may read its training split more often than this
    resources: Resources = Resources()
    source: str = ""
    variants: tuple[Variant, ...] = ()
    variant_column: str = "variant"
    baseline: str | None = None  # the variant others' compute multipliers are measured against
    branches: Branches | None = None  # mode ladder: the token counts of each shape's branches
    tune: Tune | None = None  # the tuning stage of learning-rate rule 'tuned' (sweep/tuning.py)
    # (point, factors): the learning-rate factors a point trains at beyond
    # learning_rate.factors, set by attnlab.sweep.refine from the results, never in a file.
    extra_factors: tuple[tuple[str, tuple[float, ...]], ...] = ()
    # > 0: a group of points whose best batch size is its smallest or largest gains the next
    # one beyond it, up to this many a side (sweep.refine_batch; attnlab.sweep.refine).
    refine_batch: int = 0
    # (group, batch sizes) a group trains at beyond the batch-size axis, set likewise.
    extra_batches: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def set_keys(self) -> dict[str, str]:
        """Config keys the sweep sets besides its axes, each mapped to the spec field that sets
        it (used to reject an axis that sets the same key)."""
        keys: dict[str, str] = {}
        if self.shapes or self.ladder:
            origin = "sweep.shapes" if self.shapes else "sweep.ladder"
            for key in ("model.d_model", "model.n_layers", "model.n_heads"):
                keys[key] = origin
        if self.learning_rate.kind.sets_learning_rate or self.learning_rate.factors:
            keys["train.learning_rate"] = "sweep.learning_rate"
        if self.warmup.kind.sets_warmup:
            keys["train.warmup_steps"] = "sweep.warmup"
        keys.update(self.kind.set_keys(self))
        return keys

    @property
    def learning_rate_rules(self) -> list[LearningRateRule]:
        """The sweep's learning-rate rule and those its variants give instead."""
        return [self.learning_rate] + [v.learning_rate for v in self.variants
                                       if v.learning_rate]

    @property
    def tries_rates(self) -> bool:
        """Whether each point trains at several learning rates (``learning_rate.factors``), so
        that a fit reads it at its best one."""
        return any(len(rule.factors) > 1 for rule in self.learning_rate_rules)

    @property
    def refinements(self) -> tuple[tuple[tuple[str | None, str], tuple[float, ...]], ...]:
        """((variant name or None, point), factors added) of the sweep and its variants."""
        own = tuple(((None, point), f) for point, f in self.extra_factors)
        return own + tuple(((v.name, point), f)
                           for v in self.variants for point, f in v.extra_factors)

    @property
    def grown_by(self) -> tuple:
        """Everything attnlab.sweep.refine added: learning-rate factors and batch sizes."""
        return self.refinements, self.extra_batches

    @property
    def kind(self) -> Mode:
        """The mode's class in :data:`modes.MODES`."""
        return MODES[self.mode]()


def variant_point(variant: str, point: str) -> str:
    """A point of a variant's own sweep, named in the whole sweep."""
    return f"{variant}: {point}"


def variant_spec(spec: SweepSpec, variant: Variant) -> SweepSpec:
    """The sweep of one variant: the base config with its overrides (validated), its own rules
    where it gives them, and no variants.

    Raises:
      SweepSpecError: an override is not a valid config value (naming
        ``sweep.variants.<name>.<section>.<key>``).
    """
    base = spec.base
    if variant.overrides:
        try:
            base = with_values(base, dict(variant.overrides))
        except ConfigError as e:
            raise SweepSpecError(f"sweep.variants.{variant.name}.{e.field}", e.reason) from None
    return dataclasses.replace(
        spec, base=base, variants=(), extra_factors=variant.extra_factors,
        centre=variant.centre or spec.centre,
        learning_rate=variant.learning_rate or spec.learning_rate,
        warmup=variant.warmup or spec.warmup)


def check_refine_batch(spec: SweepSpec) -> None:
    """sweep.refine_batch widens a batch-size axis of a grid or IsoFLOP sweep."""
    if not spec.refine_batch:
        return
    batches = dict(spec.axes).get(BATCH_KEY, ())
    for refused, why in (
            (len(batches) < 2, "widens the batch-size axis: give sweep.axes.data.batch_size at "
                               "least two values"),
            (spec.kind.uses_branches, "a ladder's branches continue their trunk; refine a grid "
                                      "or IsoFLOP sweep"),
            (spec.tune is not None, "the tuning stage (sweep.tune) picks the study's rates; "
                                    "refine a sweep without one"),
            (bool(spec.variants), "not with sweep.variants: refine each variant's sweep on its "
                                  "own")):
        if refused:
            raise SweepSpecError("sweep.refine_batch", why)


def tuned(spec: SweepSpec, variant: Variant) -> bool:
    """Whether the tuning stage picks the variant's learning rate (its rule, or the sweep's, is
    ``tuned``)."""
    return (variant.learning_rate or spec.learning_rate).kind.from_tuning_stage


def arms(spec: SweepSpec) -> list[tuple[str, SweepSpec]]:
    """The tuned arms: ``(name, the arm's own sweep)`` for each variant whose learning-rate rule
    is ``tuned`` (its own or the sweep's), or ``[(ALL, spec)]`` for a sweep without variants."""
    if not spec.variants:
        return [(ALL, spec)] if spec.learning_rate.kind.from_tuning_stage else []
    return [(v.name, variant_spec(spec, v)) for v in spec.variants if tuned(spec, v)]


def transfers(arm: SweepSpec) -> bool:
    """Whether the arm's parameterisation makes one rate right at every width (muP)."""
    return PARAMETERIZATIONS[arm.base.model.parameterization].transfers_learning_rate
