"""The outcome of a scaling-law fit: estimates, bootstrap replicates, intervals, predictions."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pandas as pd

from attnlab.scaling import equations
from attnlab.scaling.bootstrap import MAX_FAILED_SHARE, MIN_REFITS, intervals, percentile_interval
from attnlab.scaling.law import Law

# Intervals too wide to act on: an exponent's wider than this (a spread of 0.25 in N_opt ~ C^a
# moves N_opt by 10x over four decades of compute) ...
MAX_EXPONENT_WIDTH = 0.25
# ... or E's wider than this fraction of E.
MAX_E_RELATIVE_WIDTH = 0.30
# ... or, for a positive constant read on a log scale (a law's ``scales``), high / low above this.
MAX_SCALE_RATIO = 10.0
PIN_RULE = (f"an exponent's interval wider than {MAX_EXPONENT_WIDTH:g}, E's wider than "
            f"{100 * MAX_E_RELATIVE_WIDTH:g}% of E")


def pin_rule(part: Law) -> str:
    """The rule ``too_wide`` applies to ``part``'s parameters, in words."""
    if not part.scales:
        return PIN_RULE
    return (f"{PIN_RULE}, {' or '.join(part.scales)}'s spanning more than a factor "
            f"{MAX_SCALE_RATIO:g}")


@dataclasses.dataclass(frozen=True)
class ScalingFit:
    """A fitted law.

    part: the law (``Law``) that was fitted; it answers what the fit can predict.
    params: name -> estimate from the full data; samples: name -> [replicates] estimates from the
    bootstrap refits (empty without a bootstrap); ci_level: the intervals' nominal coverage.
    objective: the minimised objective at the estimate, described by objective_name.
    flops_per_param_token: k in C = k·N·D, used for the compute-optimal allocation.
    details: approach-specific facts (the initialisation grid, IsoFLOP profiles, the envelope);
    entries that are numpy arrays are for plots and stay out of ``to_dict``.
    unpinned: parameters the data cannot determine (a degenerate fit; ``warnings`` says why):
    their estimates are one of many equally good values, so nothing should be read from them.
    resampling: what the bootstrap drew ({"unit", "column", "clusters"}; ``table.resampling``).
    """

    part: Law
    params: dict[str, float]
    samples: dict[str, np.ndarray]
    ci_level: float
    n_points: int
    objective: float
    objective_name: str
    flops_per_param_token: float = equations.FLOPS_PER_PARAM_TOKEN
    n_bootstrap_requested: int = 0
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    unpinned: tuple[str, ...] = ()
    resampling: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def too_wide(self) -> dict[str, str]:
        """name -> why, for the parameters whose interval is too wide to act on: an exponent's
        wider than MAX_EXPONENT_WIDTH, E's wider than MAX_E_RELATIVE_WIDTH of E, a scale's
        (``part.scales``) spanning more than MAX_SCALE_RATIO. When the intervals are refused,
        every parameter the rule reads: without an interval nothing is shown to be pinned."""
        if self.intervals_refused:
            ruled = set(self.part.exponents) | set(self.part.scales) | {"E"}
            return {name: f"no {100 * self.ci_level:g}% interval: {self.refusal_reason}"
                    for name in self.params if name in ruled}
        found = {}
        for name, (low, high) in self.ci.items():
            width = high - low
            if name in self.part.exponents and not width <= MAX_EXPONENT_WIDTH:
                found[name] = (f"its {100 * self.ci_level:g}% interval [{low:.3g}, {high:.3g}] is "
                               f"wider than {MAX_EXPONENT_WIDTH:g}")
            elif name == "E" and not width <= MAX_E_RELATIVE_WIDTH * abs(self.params["E"]):
                found[name] = (f"its {100 * self.ci_level:g}% interval [{low:.3g}, {high:.3g}] is "
                               f"wider than {100 * MAX_E_RELATIVE_WIDTH:g}% of E")
            elif name in self.part.scales and not (low > 0 and high <= MAX_SCALE_RATIO * low):
                found[name] = (f"its {100 * self.ci_level:g}% interval [{low:.3g}, {high:.3g}] "
                               f"spans more than a factor {MAX_SCALE_RATIO:g}")
        return found

    @property
    def not_pinned(self) -> tuple[str, ...]:
        """``unpinned`` (the data do not determine them) and ``too_wide`` (their intervals are
        too wide to act on): the names a report shows instead of numbers."""
        return tuple(dict.fromkeys(self.unpinned + tuple(self.too_wide)))

    @property
    def degenerate(self) -> bool:
        """True when some parameter is not pinned by the data (see ``unpinned``)."""
        return bool(self.unpinned)

    @property
    def allocation_determined(self) -> bool:
        """Whether N_opt(C), D_opt(C) follow from the fit: none of a, b, G is unpinned and the
        point estimates are finite."""
        return (self.has_allocation and not {"a", "b", "G"} & set(self.unpinned)
                and all(math.isfinite(v) for v in self.params.values()))

    @property
    def law(self) -> str:
        return self.part.name

    @property
    def approach(self) -> int | None:
        return self.part.approach

    @property
    def form(self) -> str:
        return self.part.form

    @property
    def name(self) -> str:
        return self.part.title

    @property
    def ci(self) -> dict[str, tuple[float, float]]:
        """name -> percentile interval over the bootstrap replicates (none when refused)."""
        return intervals(self.interval_samples, self.ci_level)

    @property
    def n_bootstrap(self) -> int:
        """Bootstrap replicates that produced an estimate (failed refits are dropped)."""
        return len(next(iter(self.samples.values()))) if self.samples else 0

    @property
    def n_bootstrap_failed(self) -> int:
        return self.n_bootstrap_requested - self.n_bootstrap if self.n_bootstrap_requested else 0

    @property
    def intervals_refused(self) -> bool:
        """No interval is reported (:attr:`refusal` says why)."""
        return self.refusal is not None

    @property
    def free_parameters(self) -> int:
        """The law's parameters less those held by --fix."""
        return self.part.n_parameters - len(self.details.get("fixed") or {})

    @property
    def refusal(self) -> str | None:
        """Why the intervals are refused, in one phrase for every report (None: they are not)."""
        parts = self._refusal_parts()
        return None if parts is None else f"not computed: {parts[0]}{parts[1]}"

    @property
    def refusal_reason(self) -> str | None:
        """The short cause of :attr:`refusal` (None: the intervals are not refused)."""
        parts = self._refusal_parts()
        return None if parts is None else parts[0]

    def _refusal_parts(self) -> tuple[str, str] | None:
        """(cause, what follows it in :attr:`refusal`): a law of each run's loss has no more
        points than free parameters, more than MAX_FAILED_SHARE of the refits failed, or fewer
        than MIN_REFITS succeeded; None when the intervals are computed."""
        if not self.n_bootstrap_requested:
            return None
        if self.part.can("run-loss") and self.n_points <= self.free_parameters:
            return (f"{self.n_points} points for {self.free_parameters} free parameters leave "
                    f"no residual", " (the law passes through every point, and so does every "
                    "refit)")
        if self.n_bootstrap_failed > MAX_FAILED_SHARE * self.n_bootstrap_requested:
            return (f"{self.n_bootstrap_failed} of {self.n_bootstrap_requested} bootstrap refits "
                    f"failed", f", more than {100 * MAX_FAILED_SHARE:g}% (percentiles over the "
                    f"refits that succeeded would be conditional on success)")
        if self.n_bootstrap < MIN_REFITS:
            return (f"{self.n_bootstrap} bootstrap refits, fewer than {MIN_REFITS}",
                    " (--bootstrap=200 is the default)")
        return None

    @property
    def interval_samples(self) -> dict[str, np.ndarray]:
        """The replicates intervals are read from: ``samples``, or none when refused."""
        return {} if self.intervals_refused else self.samples

    @property
    def has_loss_model(self) -> bool:
        return self.part.can("loss-model")

    @property
    def has_allocation(self) -> bool:
        return self.part.can("allocation")

    @property
    def predicts_loss(self) -> bool:
        """Whether the law gives a loss for a run (every Kaplan form, Chinchilla approach 3)."""
        return self.part.can("run-loss")

    def loss(self, n, d, params=None):
        """Predicted loss at (N, D) (Kaplan L(N, D) or Chinchilla approach 3)."""
        return self.part.loss(self.params if params is None else params, n, d)

    def run_loss(self, n, d, params=None, **columns):
        """The loss the law predicts for a run of N parameters trained on D tokens: L(N, D), or
        Kaplan's L(N) / L(D), which ignore the other argument; ``columns``: the run's values of
        the law's ``run_columns`` (e.g. its unique tokens)."""
        return self.part.run_loss(self.params if params is None else params, n, d, **columns)

    def optimal(self, budget, params=None) -> dict[str, Any]:
        """Compute-optimal N_opt, D_opt (and the loss there, when the law models it) at FLOP
        budget(s) C."""
        return self.part.optimal(self.params if params is None else params, budget,
                                 self.flops_per_param_token)

    def predict_loss(self, n: float, d: float) -> dict[str, Any]:
        """{"N", "D", "loss", "ci": [low, high] or None} at one (N, D)."""
        value = float(self.loss(n, d))
        ci = (percentile_interval(self.loss(n, d, self.interval_samples), self.ci_level)
              if self.interval_samples else None)
        return {"N": float(n), "D": float(d), "loss": value, "ci": ci}

    def predict_optimal(self, budget: float) -> dict[str, Any]:
        """{"C", "N_opt", "D_opt", "loss", "ci": name -> [low, high]} at one FLOP budget.

        A fit that does not determine the allocation (``allocation_determined``) predicts NaN,
        with no interval: its optimum would be one of many equally good answers."""
        out: dict[str, Any] = {"C": float(budget)}
        if not self.allocation_determined:
            loss = math.nan if self.has_loss_model else None
            out.update({"N_opt": math.nan, "D_opt": math.nan, "loss": loss, "ci": {}})
            return out
        point = self.optimal(budget)
        out.update({k: (None if v is None else float(v)) for k, v in point.items()})
        out["ci"] = {}
        if self.interval_samples:
            replicated = self.optimal(budget, self.interval_samples)
            out["ci"] = {k: percentile_interval(v, self.ci_level)
                         for k, v in replicated.items() if v is not None}
        return out

    def predict_trained_longer(self, budget: float, multiplier: float) -> dict[str, Any]:
        """The compute-optimal model at ``budget`` trained on ``multiplier`` times its
        compute-optimal tokens (``multiplier`` x the budget's compute): {"C", "multiplier", "N",
        "D", "loss", "change" (over the compute-optimal loss), "ci": name -> [low, high]}.
        The intervals hold (N, D) at the point estimate and spread the law over the bootstrap
        refits; ``change``'s is of each refit's own difference, so the shared uncertainty of E
        cancels."""
        point = self.optimal(budget)
        n, d = float(point["N_opt"]), float(point["D_opt"]) * multiplier
        loss = float(self.loss(n, d))
        out: dict[str, Any] = {"C": float(budget), "multiplier": float(multiplier), "N": n,
                               "D": d, "loss": loss,
                               "change": loss - float(self.loss(n, point["D_opt"])), "ci": {}}
        if self.interval_samples:
            over = np.asarray(self.loss(n, d, self.interval_samples), np.float64)
            at_opt = np.asarray(self.loss(n, point["D_opt"], self.interval_samples), np.float64)
            out["ci"] = {"loss": percentile_interval(over, self.ci_level),
                         "change": percentile_interval(over - at_opt, self.ci_level)}
        return out

    def to_dict(self, budgets=(), longer=()) -> dict[str, Any]:
        """JSON-ready: the approach, every fitted parameter at top level, ``ci`` (name ->
        [low, high]), ``n_points``, the objective, and predictions at the given budgets."""
        out: dict[str, Any] = {"law": self.law, "approach": self.approach,
                               "form": self.form or None, "model": self.name}
        out.update({k: _json_float(v) for k, v in self.params.items()})
        out["ci"] = {k: [_json_float(lo), _json_float(hi)] for k, (lo, hi) in self.ci.items()}
        out.update({"ci_level": self.ci_level, "n_points": self.n_points,
                    "objective": _json_float(self.objective),
                    "objective_name": self.objective_name,
                    "n_bootstrap": self.n_bootstrap,
                    "n_bootstrap_requested": self.n_bootstrap_requested,
                    "flops_per_param_token": self.flops_per_param_token})
        if self.n_bootstrap_requested:
            out.update({"resampling": jsonable(self.resampling),
                        "n_bootstrap_failed": self.n_bootstrap_failed,
                        "intervals_refused": self.intervals_refused,
                        "max_failed_share": MAX_FAILED_SHARE})
        out["details"] = jsonable(self.details)
        if budgets:
            out["predictions"] = [jsonable(self.predict_optimal(c)) for c in budgets]
        if budgets and longer and self.has_loss_model and self.allocation_determined:
            out["trained_longer"] = [jsonable(self.predict_trained_longer(c, m))
                                     for c in budgets for m in longer]
        out["degenerate"] = self.degenerate
        out["unpinned"] = list(self.not_pinned)
        out["undetermined"] = list(self.unpinned)  # what makes the fit degenerate
        out["too_wide"] = self.too_wide
        out["pin_rule"] = pin_rule(self.part)
        out["warnings"] = list(self.warnings)
        out["notes"] = list(self.notes)
        return out


def _json_float(value):
    value = float(value)
    return value if math.isfinite(value) else None


def jsonable(value):
    """Plain JSON types; numpy arrays and tables (plot data) are dropped."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()
                if not isinstance(v, (np.ndarray, pd.DataFrame))}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return _json_float(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value
