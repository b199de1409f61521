"""A sweep's learning-rate and warmup rules: the sections' fields (``LearningRateRule``,
``WarmupRule``), each rule one class that checks its fields and its needs of the spec and gives a
run its value, and the registries that ``rule`` names select from; the readers of the files a
rule may name (a fitted hyperparameter law, a transfer report). Adding a rule is one class and
one registry line; the spec, the planner and the tuning stage ask the rule, never compare its
name."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from attnlab.model.architecture import PARAMETERIZATIONS
from attnlab.model.counting import param_counts
from attnlab.sweep.sections import (Shape, SweepSpecError, number_at_least_zero,
                                    positive_number)


class _Rule:
    """A learning-rate or warmup rule's fields: ``rule`` one of ``registry()``'s names, every
    number >= 0; then the rule's own checks of its fields (``kind.check``)."""

    def checked(self, field: str):
        rules = self.registry()
        if self.rule not in rules:
            raise SweepSpecError(f"{field}.rule", f"unknown rule {self.rule!r}; valid rules are "
                                                  f"{', '.join(rules)}")
        for f in dataclasses.fields(self)[1:]:
            if not isinstance(getattr(self, f.name), (str, tuple)):
                number_at_least_zero(getattr(self, f.name), f"{field}.{f.name}")
        self.kind.check(self, field)
        return self

    @property
    def kind(self):
        """The rule's class in its registry."""
        return self.registry()[self.rule]()


# --- learning-rate rules ----------------------------------------------------------------------

class LearningRate:
    """A learning-rate rule: how a run's peak learning rate follows from its shape.

    reads: the fields of ``LearningRateRule`` besides ``base`` that only this rule reads;
    needs_shapes: the rule reads each run's shape (sweep.shapes or sweep.ladder)."""

    name = ""
    reads: tuple[str, ...] = ()
    needs_shapes = False
    from_shapes = False         # each shape carries its rate
    sets_learning_rate = True   # the run's train.learning_rate comes from the rule
    from_tuning_stage = False   # sweep.tune sets the rule's fields (attnlab.sweep.tuning)
    transfers = False           # one rate tuned at the base width, for every width (muP)
    reads_law = False           # ``report`` is a fitted hyperparameter law (read_lr_law)

    def check(self, rule: LearningRateRule, field: str) -> None:
        for factor in rule.factors:
            positive_number(factor, f"{field}.factors")
        if len(set(rule.factors)) != len(rule.factors):
            raise SweepSpecError(f"{field}.factors", f"repeats a factor: {rule.factors}")
        if rule.refine and len(rule.factors) < 2:
            raise SweepSpecError(f"{field}.refine", "extends a grid of learning-rate factors "
                                 f"past its edge: give {field}.factors at least two")
        for name in ("base_lr", "report", "tuned_d_model"):
            if name not in self.reads and getattr(rule, name):
                readers = [repr(n) for n, c in LR_RULES.items() if name in c.reads]
                who = (f"rule {readers[0]} reads" if len(readers) == 1 else
                       f"rules {' and '.join(readers)} read")
                raise SweepSpecError(f"{field}.{name}", f"only {who} it; the rule is "
                                                        f"{rule.rule!r}")

    def check_spec(self, rule: LearningRateRule, spec) -> None:
        """The rule's needs of the rest of the spec (``spec.SweepSpec``)."""
        if self.needs_shapes and not (spec.shapes or spec.ladder):
            raise SweepSpecError("sweep.learning_rate.rule", f"rule {rule.rule!r} needs "
                                                             "sweep.shapes or sweep.ladder")
        if rule.refine and spec.kind.uses_branches:
            raise SweepSpecError("sweep.learning_rate.refine", "a ladder's branches continue "
                                 "their trunk's rate; refine the grid of a grid or IsoFLOP sweep")
        if rule.refine and spec.tune is not None:
            raise SweepSpecError("sweep.learning_rate.refine", "the tuning stage (sweep.tune) "
                                 "picks the study's rates; refine a sweep without one")

    def value(self, rule: LearningRateRule, spec, shape: Shape | None, cfg,
              non_embedding: int) -> float | None:
        """The run's learning rate before rounding (None: the base config's)."""
        raise NotImplementedError

    # The rules a tuning stage picks (``tuning.json``'s arms name them) read their pick:
    def from_pick(self, pick: dict) -> dict:
        """The ``LearningRateRule`` fields of a tuning stage's pick of this rule."""
        raise NotImplementedError(f"rule {self.name!r} is not picked by a tuning stage")

    def describe_pick(self, pick: dict) -> str:
        """The pick in words, for the sweep's report."""
        raise NotImplementedError(f"rule {self.name!r} is not picked by a tuning stage")


class Fixed(LearningRate):
    """The base config's train.learning_rate for every shape."""

    name = "fixed"
    sets_learning_rate = False

    def value(self, rule, spec, shape, cfg, non_embedding):
        return None


class PerShape(LearningRate):
    """The explicit value given with each shape (4th entry of a shape tuple, or
    ladder.learning_rates)."""

    name = "per_shape"
    needs_shapes = from_shapes = True

    def check_spec(self, rule, spec):
        has_values = (spec.shapes and spec.shapes[0].learning_rate) or (
            spec.ladder and spec.ladder.learning_rates)
        if not has_values:
            raise SweepSpecError("sweep.learning_rate.rule", "per_shape needs a learning rate "
                                 "with every shape: (d_model, n_layers, n_heads, lr) or "
                                 "sweep.ladder.learning_rates")
        super().check_spec(rule, spec)

    def value(self, rule, spec, shape, cfg, non_embedding):
        return shape.learning_rate


class PowerLaw(LearningRate):
    """lr = base * (N / ref_params) ** -exponent, N = non-embedding parameters."""

    name = "power_law"
    needs_shapes = True

    def check_spec(self, rule, spec):
        super().check_spec(rule, spec)
        # Explicit reference points keep run ids stable when shapes are added to a sweep later.
        if rule.ref_params <= 0 or rule.exponent <= 0:
            raise SweepSpecError("sweep.learning_rate.ref_params", "power_law needs ref_params > "
                                 "0 and exponent > 0 (lr = base * (N / ref_params) ** -exponent)")

    def value(self, rule, spec, shape, cfg, non_embedding):
        base = rule.base or cfg.train.learning_rate
        try:
            return base * (non_embedding / rule.ref_params) ** -rule.exponent
        except OverflowError:  # a float power past 1.8e308 raises rather than give inf
            return math.inf


class InverseWidth(LearningRate):
    """lr = base * ref_d_model / d_model ("muP-lite": under muP the Adam learning rate of hidden
    matrices scales as 1/width, Yang et al. 2022; here on every parameter: the full muP is
    model.parameterization=mup, docs/mup.md)."""

    name = "inverse_width"
    needs_shapes = True

    def check_spec(self, rule, spec):
        super().check_spec(rule, spec)
        if rule.ref_d_model <= 0:
            raise SweepSpecError("sweep.learning_rate.ref_d_model", "inverse_width needs "
                                 "ref_d_model > 0 (lr = base * ref_d_model / d_model)")

    def value(self, rule, spec, shape, cfg, non_embedding):
        return (rule.base or cfg.train.learning_rate) * rule.ref_d_model / cfg.model.d_model


class Transfer(LearningRate):
    """lr = base_lr for every width (muTransfer, Yang et al. 2022 sec. 5: under
    model.parameterization=mup the optimum tuned at the base width holds at every width);
    base_lr given, or read from ``report``, the JSON that experiments/mup_transfer.py writes
    (its mup row at width ``tuned_d_model``, 0 -> the study's model.mup_base_d_model)."""

    name = "transfer"
    reads = ("base_lr", "report", "tuned_d_model")
    transfers = True

    def check(self, rule, field):
        if rule.base_lr and rule.report:
            raise SweepSpecError(f"{field}.report", "give the tuned learning rate as base_lr or "
                                                    "as a report, not both")
        if not (rule.base_lr or rule.report):
            raise SweepSpecError(f"{field}.base_lr", "missing: rule 'transfer' needs the learning "
                                 "rate tuned at the base width: base_lr, or report (the JSON of "
                                 "experiments/mup_transfer.py --json)")
        if rule.tuned_d_model and not rule.report:
            raise SweepSpecError(f"{field}.tuned_d_model", "picks a row of the report; without "
                                                           "a report base_lr is the rate")

    def value(self, rule, spec, shape, cfg, non_embedding):
        # The tuned value itself (no arithmetic to round): under muP it is the base model's
        # learning rate, so every run must be muP at the base width it was tuned at.
        tuned_at = spec.base.model.mup_base_d_model
        transfers = PARAMETERIZATIONS[cfg.model.parameterization].transfers_learning_rate
        if not transfers or cfg.model.mup_base_d_model != tuned_at:
            raise SweepSpecError("sweep.learning_rate.rule", f"'transfer' applies a learning "
                                 f"rate tuned under muP at base width {tuned_at}, but a run has "
                                 f"model.parameterization = {cfg.model.parameterization!r}, "
                                 f"model.mup_base_d_model = {cfg.model.mup_base_d_model} (set "
                                 f"by an axis?)")
        return rule.base_lr

    def from_pick(self, pick):
        return {"base_lr": pick["learning_rate"]}

    def describe_pick(self, pick):
        lo, hi = pick["interval"]
        return (f"lr {pick['learning_rate']:.3g} at every width (transfer, from d_model "
                f"{pick['tuned_d_model']}; 90% interval [{lo:.3g}, {hi:.3g}])")


class Tuned(LearningRate):
    """From the sweep's own tuning stage (``sweep.tune``, attnlab.sweep.tuning): a muP arm gets
    ``transfer`` at its best rate; any other arm lr = base * (d_model / ref_d_model) **
    -exponent, a power law fitted to its best rates at the tuning widths. Given with no
    fields: the stage sets them."""

    name = "tuned"
    from_tuning_stage = True

    def check(self, rule, field):
        super().check(rule, field)
        for f in dataclasses.fields(rule)[1:]:
            if f.name not in ("factors", "refine") and getattr(rule, f.name):
                raise SweepSpecError(f"{field}.{f.name}", "rule 'tuned' takes no fields: the "
                                     "tuning stage (sweep.tune) picks the learning rates")

    def value(self, rule, spec, shape, cfg, non_embedding):
        if not rule.base:
            raise SweepSpecError("sweep.learning_rate.rule", "'tuned' learning rates come from "
                                 "the sweep's tuning stage (sweep.tune): attnlab sweep runs it "
                                 "before it plans the study (in Python: "
                                 "attnlab.sweep.tuning.with_picks(spec, picks))")
        return rule.base * (cfg.model.d_model / rule.ref_d_model) ** -rule.exponent

    def from_pick(self, pick):
        return {"base": pick["base"], "ref_d_model": pick["ref_d_model"],
                "exponent": pick["exponent"]}

    def describe_pick(self, pick):
        lo, hi = pick["exponent_interval"]
        return (f"lr = {pick['base']:.3g} (d_model / {pick['ref_d_model']})^-"
                f"{pick['exponent']:.3g} (90% interval of the exponent [{lo:.2f}, {hi:.2f}])")


class FromLaw(LearningRate):
    """lr = c N^a D^b: the learning-rate law in ``report``, the JSON of ``attnlab fit
    --law=hparams --json=FILE`` (docs/scaling.md), at each run's N (its active parameters, or
    its active non-embedding ones, as the law's ``size`` says) and D (its tokens); a law in
    compute (``size`` compute) at C = 6 N D in non-embedding N, the results' ``flops``. An
    exponent the fit left undetermined (null: its runs had one N or one D) counts as 0."""

    name = "law"
    reads = ("report",)
    reads_law = True

    def check(self, rule, field):
        super().check(rule, field)
        if not rule.report:
            raise SweepSpecError(f"{field}.report", f"missing: rule {self.name!r} needs a "
                                 "fitted hyperparameter law (attnlab fit --law=hparams "
                                 "--json=FILE)")

    def check_spec(self, rule, spec):
        super().check_spec(rule, spec)
        if spec.kind.uses_branches:  # a branch trains on at the rate of the trunk it leaves
            raise SweepSpecError("sweep.learning_rate.rule", f"{self.name!r} sets each run's "
                                 "rate from its tokens, but a ladder's branches share their "
                                 "trunk's rate; give each shape its rate (rule 'per_shape')")

    def value(self, rule, spec, shape, cfg, non_embedding):
        coef, exponents, size = read_lr_law(rule.report, "sweep.learning_rate.report")
        counts = param_counts(cfg.model)
        d = cfg.total_steps * cfg.data.batch_size * cfg.data.seq_len
        if size == "compute":
            return coef * (6.0 * counts["active_non_embedding"] * d) ** exponents["params"]
        n = counts["active_non_embedding" if size == "non_embedding" else "active"]
        return coef * n ** exponents["params"] * d ** exponents["tokens"]


def read_lr_law(path: str, field: str) -> tuple[float, dict[str, float], str]:
    """(c, {"params": a, "tokens": b}, size) of the learning-rate law in an ``attnlab fit
    --law=hparams`` JSON (a null exponent: 0; size total where the JSON predates it); anything
    else is one error naming ``field``."""
    try:
        with open(path) as f:
            fit = json.load(f)
        law, size = fit["lr"], fit.get("size", "total")
        if size not in ("total", "non_embedding", "compute"):
            raise ValueError(f"size {size!r}")
        coef = float(law["coef"])
        exponents = {k: float(law["exponents"][k] or 0.0) for k in ("params", "tokens")}
        if not (coef > 0 and all(map(math.isfinite, (coef, *exponents.values())))):
            raise ValueError(f"coef {coef}, exponents {exponents}")
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise SweepSpecError(field, f"{path!r} is not a fitted hyperparameter law (the JSON of "
                                    f"attnlab fit --law=hparams --json=FILE: lr.coef > 0 and "
                                    f"lr.exponents.params, .tokens): {type(e).__name__} {e}"
                             ) from None
    return coef, exponents, size


# The rows of a learning-rate transfer report (experiments/mup_transfer.py --json): each
# (parameterization, width) with the best learning rate of its grid.
_REPORT_KEYS = {"parameterization": str, "d_model": int, "mup_base_d_model": int,
                "learning_rate": float}


def read_transfer_report(path: str, field: str) -> list[dict[str, Any]]:
    """The ``best_learning_rates`` rows of a transfer report, each checked for
    :data:`_REPORT_KEYS`; anything else is a SweepSpecError naming ``field``."""
    try:
        with open(path) as f:
            rows = json.load(f)["best_learning_rates"]
        checked = []
        for row in rows:
            checked.append({key: kind(row[key]) for key, kind in _REPORT_KEYS.items()})
            if isinstance(row["learning_rate"], bool) or not row["learning_rate"] > 0:
                raise ValueError(f"learning rate {row['learning_rate']!r}")
        return checked
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise SweepSpecError(field, f"{path!r} is not a transfer report (the JSON of "
                                    f"experiments/mup_transfer.py --json: best_learning_rates "
                                    f"rows with {', '.join(_REPORT_KEYS)}): "
                                    f"{type(e).__name__} {e}") from None


LR_RULES = {c.name: c for c in (Fixed, PerShape, PowerLaw, InverseWidth, Transfer, Tuned,
                                FromLaw)}


@dataclasses.dataclass(frozen=True)
class LearningRateRule(_Rule):
    """How each run's peak learning rate follows from its shape: ``rule`` names one of
    :data:`LR_RULES` (each class says what it computes and which fields it reads)."""

    rule: str = "fixed"
    base: float = 0.0  # 0 -> the base config's train.learning_rate
    ref_params: float = 0.0
    exponent: float = 0.0
    ref_d_model: int = 0
    base_lr: float = 0.0
    report: str = ""
    tuned_d_model: int = 0
    # Each shape trains at the rule's rate times each factor (a grid around it, for the
    # hyperparameter law); empty: the rule's rate alone.
    factors: tuple[float, ...] = ()
    # Up to this many factors more on each side of a point whose best rate is at the grid's
    # edge, added once its runs finish (attnlab.sweep.refine).
    refine: int = 0

    @staticmethod
    def registry():
        return LR_RULES


# --- warmup rules -----------------------------------------------------------------------------

class Warmup:
    """A warmup rule. Porian et al. 2024: a warmup too long for small models is one of the
    causes of Kaplan's exponent, so scale it with the run or the model."""

    name = ""
    sets_warmup = True     # the run's train.warmup_steps comes from the rule
    per_run_length = False  # the warmup follows each run's own length

    def check(self, rule: WarmupRule, field: str) -> None:
        pass

    def check_spec(self, rule: WarmupRule) -> None:
        """The rule's numbers, as the sweep's warmup (``sweep.warmup``)."""

    def steps(self, rule: WarmupRule, cfg, total_params: int) -> int | None:
        raise NotImplementedError


class FixedWarmup(Warmup):
    """The base config's train.warmup_steps."""

    name = "fixed"
    sets_warmup = False

    def steps(self, rule, cfg, total_params):
        return None


class Fraction(Warmup):
    """ceil(fraction * total_steps) (at least 1)."""

    name = "fraction"
    per_run_length = True

    def check_spec(self, rule):
        if not 0 < rule.fraction < 1:
            raise SweepSpecError("sweep.warmup.fraction", f"must be in (0, 1), got "
                                                          f"{rule.fraction}")

    def steps(self, rule, cfg, total_params):
        return max(1, math.ceil(rule.fraction * cfg.total_steps))


class TokensPerParam(Warmup):
    """ceil(tokens_per_param * N_total / (batch_size * seq_len)) steps (at least 1): warmup
    proportional to model size."""

    name = "tokens_per_param"

    def check_spec(self, rule):
        if rule.tokens_per_param <= 0:
            raise SweepSpecError("sweep.warmup.tokens_per_param", "must be > 0")

    def steps(self, rule, cfg, total_params):
        batch_tokens = cfg.data.batch_size * cfg.data.seq_len
        return max(1, math.ceil(rule.tokens_per_param * total_params / batch_tokens))


WARMUP_RULES = {c.name: c for c in (FixedWarmup, Fraction, TokensPerParam)}


@dataclasses.dataclass(frozen=True)
class WarmupRule(_Rule):
    """Warmup length per run: ``rule`` names one of :data:`WARMUP_RULES`."""

    rule: str = "fixed"
    fraction: float = 0.0
    tokens_per_param: float = 0.0

    @staticmethod
    def registry():
        return WARMUP_RULES
