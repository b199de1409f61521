"""The mode of the laws of whole learning curves (``law.can("schedule")``): one fit of a curves
table's runs, or a fit without the runs ``--holdout=run:NAME[,NAME...]`` names, each run's
relative error beside the S1-only power law's (L0 + A S1^-alpha, fitted to the same runs, blind
to the schedule's shape), and the curves of ``--predict-schedule``.

    held = fit_schedules(law, curves, holdout="run:wsd", settings=law.options({}))
    held.errors()   # per run: heldout, mean and max relative error, the baseline's beside
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import pandas as pd

from attnlab.scaling import curvefit
from attnlab.scaling.bootstrap import percentile_interval
from attnlab.scaling.curves import MIN_RUNS, Curve
from attnlab.scaling.errors import FitError, FitInputError
from attnlab.scaling.law import Law
from attnlab.scaling.result import ScalingFit, jsonable
from attnlab.scaling.tables.report import format_report

PREFIX = "run:"
PREDICTED_POINTS = 40  # steps of a predicted curve shown (evenly spaced after the warmup)


def held_runs(holdout: str | None, curves: list[Curve], law: Law) -> tuple[str, ...]:
    """The run ids ``--holdout=run:NAME[,NAME...]`` names; FitInputError naming the flag."""
    if not holdout:
        return ()
    if not holdout.startswith(PREFIX):
        raise FitInputError(f"--holdout={holdout}: --law={law.name} holds out whole curves: "
                            f"--holdout=run:NAME[,NAME...] (a run_id)")
    names = tuple(n.strip() for n in holdout[len(PREFIX):].split(",") if n.strip())
    known = [c.run_id for c in curves]
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        raise FitInputError(f"--holdout: no run {', '.join(unknown) or '(none named)'}; the "
                            f"runs are {', '.join(known)}")
    if len(known) - len(set(names)) < MIN_RUNS:
        raise FitInputError(f"--holdout leaves {len(known) - len(set(names))} run(s) to fit; "
                            f"--law={law.name} needs {MIN_RUNS}")
    return names


def _relative_errors(predicted, observed) -> np.ndarray:
    return np.abs(np.asarray(predicted) / np.asarray(observed) - 1.0)


@dataclasses.dataclass(frozen=True)
class ScheduleFits:
    """A fit of whole curves: the law's ``fit`` and the S1-only ``baseline`` (parameters) on the
    runs not ``held``, every run's curve, the law's ``settings`` (with the curves to predict)."""

    law: Law
    fit: ScalingFit
    baseline: Mapping[str, float]
    curves: tuple[Curve, ...]
    held: tuple[str, ...]
    settings: Mapping

    def predicted(self, curve: Curve, params=None) -> np.ndarray:
        return self.law.predict(self.fit.params if params is None else params, curve,
                                self.settings)

    def errors(self) -> pd.DataFrame:
        """Per run, over its losses after the warmup: held out or fitted, the law's and the
        baseline's mean and largest relative error, and each one's signed error at the last
        step (predicted / observed - 1)."""
        rows = []
        for curve in (c.fitted() for c in self.curves):
            predicted = self.predicted(curve)
            law = _relative_errors(predicted, curve.loss)
            s1_only = curvefit.s1_loss(self.baseline, curve)
            base = _relative_errors(s1_only, curve.loss)
            rows.append({"run_id": curve.run_id, "heldout": curve.run_id in self.held,
                         "points": len(curve.steps), "mean_relative_error": law.mean(),
                         "max_relative_error": law.max(),
                         "final_error": predicted[-1] / curve.loss[-1] - 1.0,
                         "baseline_mean_relative_error": base.mean(),
                         "baseline_max_relative_error": base.max(),
                         "baseline_final_error": s1_only[-1] / curve.loss[-1] - 1.0})
        return pd.DataFrame(rows)

    def prediction(self, curve: Curve) -> dict:
        """A schedule's predicted curve at up to PREDICTED_POINTS steps, with intervals over
        the bootstrap refits where the fit has them."""
        shown = np.unique(np.linspace(curve.peak + 1, len(curve.lr),
                                      PREDICTED_POINTS).round().astype(int))
        at = dataclasses.replace(curve, steps=shown, loss=np.full(len(shown), np.nan))
        out = {"schedule": curve.run_id, "step": shown.tolist(),
               "loss": self.predicted(at).tolist()}
        samples = self.fit.interval_samples
        if samples:
            replicas = np.array([self.predicted(at, {k: v[i] for k, v in samples.items()})
                                 for i in range(self.fit.n_bootstrap)])
            bounds = [percentile_interval(column, self.fit.ci_level) for column in replicas.T]
            out["ci"] = [list(b) for b in bounds]
        return out

    def to_dict(self) -> dict:
        return {**self.fit.to_dict(), "holdout": list(self.held),
                "baseline": {"model": curvefit.S1_TITLE, **self.baseline},
                "runs": jsonable(self.errors().to_dict(orient="records")),
                "predicted_schedules": [jsonable(self.prediction(c))
                                        for c in self.settings.get("predict", ())]}


def fit_schedules(law: Law, curves: list[Curve], *, holdout: str | None = None,
                  settings: Mapping | None = None, n_bootstrap: int = 0,
                  ci_level: float = 0.95, seed: int = 0, source: str = "curves",
                  notes=()) -> ScheduleFits:
    """The law and the S1-only baseline fitted to the curves not held out."""
    settings = dict(settings or {})
    held = held_runs(holdout, curves, law)
    kept = [c for c in curves if c.run_id not in held]
    model = law.model(settings)
    fit = curvefit.fit_curves(model, law, kept, n_bootstrap=n_bootstrap, ci_level=ci_level,
                              seed=seed, source=source, notes=notes)
    fitted = [c.fitted() for c in kept]
    theta = curvefit.best_fit(curvefit.S1_ONLY, fitted, curvefit.S1_ONLY.grid(fitted))[0]
    if theta is None:
        raise FitError(f"{source}: the S1-only baseline did not converge from any start")
    return ScheduleFits(law, fit, curvefit.S1_ONLY.params(theta), tuple(curves), held,
                        settings)


def format_schedule_fits(result: ScheduleFits, source: str) -> str:
    """The report: the fit, the baseline, each run's errors and the predicted schedules."""
    base = ", ".join(f"{k} {v:.5g}" for k, v in result.baseline.items())
    grid, details = result.fit.details["grid"], result.fit.details
    lines = [format_report(result.fit, source, []).rstrip("\n"),
             f"grid: {grid['starts']} starts scored, the best {grid['refined']} refined by "
             f"scipy least_squares (loss=huber), {details['refined_converged']} converged; "
             f"kept the best",
             f"baseline: {curvefit.S1_TITLE}, fitted to the same runs: {base}", "",
             "relative error |predicted / observed - 1| over each run's losses after its "
             "warmup:",
             f"  {'run':<24}{'':>9}{'points':>7}{'mean':>10}{'max':>10}{'last':>10}"
             f"{'S1 mean':>10}{'S1 max':>10}"]
    for row in result.errors().itertuples():
        role = "held out" if row.heldout else "fitted"
        lines.append(f"  {row.run_id:<24}{role:>9}{row.points:>7}"
                     f"{100 * row.mean_relative_error:>9.3f}%{100 * row.max_relative_error:>9.3f}%"
                     f"{100 * row.final_error:>+9.3f}%"
                     f"{100 * row.baseline_mean_relative_error:>9.3f}%"
                     f"{100 * row.baseline_max_relative_error:>9.3f}%")
    for curve in result.settings.get("predict", ()):
        lines += _prediction_lines(result.prediction(curve), result.fit.ci_level)
    return "\n".join(lines) + "\n"


def _prediction_lines(prediction: dict, level: float) -> list[str]:
    bounds = prediction.get("ci") or [(None, None)] * len(prediction["step"])
    lines = ["", f"predicted curve of {prediction['schedule']}"
                 + (f" ({100 * level:g}% intervals)" if "ci" in prediction else "") + ":",
             f"  {'step':>8}{'loss':>10}" + (f"{'low':>10}{'high':>10}"
                                             if "ci" in prediction else "")]
    for step, loss, (low, high) in zip(prediction["step"], prediction["loss"], bounds):
        lines.append(f"  {step:>8}{loss:>10.4f}" + (f"{low:>10.4f}{high:>10.4f}"
                                                    if low is not None else ""))
    return lines


class Schedules:
    """The mode of a law of whole curves (``modes.MODES``): the fit, held out by run."""

    name = "schedule"

    def run(self, request, inputs) -> ScheduleFits:
        source = str(request.curves or request.sweep)
        curves, notes = request.law.curves(inputs.curves, source, request.columns)
        return fit_schedules(request.law, curves, holdout=request.holdout,
                             settings=request.settings, n_bootstrap=request.n_bootstrap,
                             ci_level=request.ci_level, seed=request.seed, source=source,
                             notes=notes)

    def report(self, request, inputs, outcome: ScheduleFits, report) -> tuple[str, dict]:
        return format_schedule_fits(outcome, str(request.curves or request.sweep)), \
            outcome.to_dict()
