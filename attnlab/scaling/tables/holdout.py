"""Held-out prediction: fit on some runs, predict the loss of the others.

A fit is worth what it predicts for runs it has not seen. Gadre et al. 2024 (arXiv 2403.08540)
fit small runs and predict 1.4B-6.9B models within ~1-3% relative error; the OLMo ladder
(Bhagia et al. 2024, arXiv 2412.04403) does the same from 190M-1.3B to 7B/13B.

    held = holdout_prediction(table, law="chinchilla", approach=3, holdout="largest-budget")
    held.frame       # one row per held-out run: N, D, observed, predicted, relative error, interval
    held.summary()   # mean / max |relative error|, how many observed losses fall in their interval

Which runs are held out (``holdout``):

  largest-budget        the runs of the largest budget (the ``budget`` column; else the cluster
                        of the largest FLOPs, as approach 2 groups runs)
  budget:C[,C...]       the runs of these budgets
  flops>X, params>X,    runs above (or at, with >=) a threshold of the table's FLOPs, parameter
  tokens>X              or token column
  tokens_per_param>X    runs trained on more than X tokens per parameter (D / N): e.g. a
                        ladder's over-trained branches

A naive baseline stands beside the law (a forecast means little without one): each held-out
run's loss predicted by the nearest kept run, in this order of rules:

  smaller size, same D  the kept run of the largest N below the held-out N trained on the same
                        tokens (within 5%; several such runs, e.g. seeds: their mean loss)
  same N, fewer tokens  else the kept run of the same size with the most tokens below the
                        held-out D (the last observed point of that size)

The law's skill is the ratio of its mean |relative error| to the baseline's over the runs both
predict (< 1: the law beats the baseline). ``floor`` (e.g. a corpus's entropy rate, below which
no model's loss can go) flags every prediction under it.

A predicted compute-optimal loss at a budget C (``attnlab fit --budget``) has its own naive
baseline, :func:`frontier_baseline`: the best run that spent at most C, the observed compute
frontier's last point.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pandas as pd

from attnlab.scaling.bootstrap import percentile_interval
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.law import Law
from attnlab.scaling.points import ScalingTable, budget_labels
from attnlab.scaling.result import ScalingFit
from attnlab.scaling.tables.baselines import BASELINE_RULES, naive_baseline
from attnlab.scaling.tables.fitting import fit_table

_THRESHOLD = re.compile(r"^(flops|params|tokens_per_param|tokens)\s*(>=|>)\s*([0-9.eE+-]+)$")


def holdout_mask(table: ScalingTable, spec: str) -> np.ndarray:
    """[rows] True for the runs ``spec`` holds out (see the module docstring)."""
    frame = table.frame
    spec = spec.strip()
    if spec == "largest-budget" or spec.startswith("budget:"):
        labels = budget_labels(table.array("flops"), table.budget)
        if spec == "largest-budget":
            return labels == labels.max()
        try:
            wanted = [float(v) for v in spec.removeprefix("budget:").split(",") if v.strip()]
        except ValueError:
            raise FitInputError(f"--holdout: {spec!r} is not budget:C[,C...] with numbers") \
                from None
        mask = np.zeros(len(frame), bool)
        for value in wanted:
            match = np.isclose(labels, value, rtol=0.05)
            if not match.any():
                known = ", ".join(f"{c:.3g}" for c in np.unique(labels))
                raise FitInputError(f"--holdout: no runs at budget {value:.3g}; the budgets are "
                                    f"{known}")
            mask |= match
        return mask
    threshold = _THRESHOLD.match(spec)
    if threshold is None:
        raise FitInputError(f"--holdout: {spec!r} is not one of largest-budget, budget:C[,C...], "
                            f"flops>X, params>X, tokens>X, tokens_per_param>X (or >=)")
    column, operator, value = threshold.groups()
    try:
        value = float(value)
    except ValueError:
        raise FitInputError(f"--holdout: {value!r} in {spec!r} is not a number") from None
    values = (table.array("tokens") / table.array("params") if column == "tokens_per_param"
              else table.array(column))
    return values >= value if operator == ">=" else values > value


@dataclasses.dataclass(frozen=True)
class HoldoutResult:
    """A fit on the kept runs and its predictions for the held-out ones.

    fit: the ScalingFit of the kept runs; spec: the holdout rule; frame: one row per held-out
    run: params, tokens, flops, observed, predicted, relative_error = (predicted - observed) /
    observed, low / high (the prediction's bootstrap interval, NaN without a bootstrap) and
    inside (observed within [low, high]); baseline, baseline_rule, baseline_error (the naive
    baseline's prediction, its rule and relative error; NaN / None without one); below_floor
    (predicted < ``floor``, False without a floor).
    """

    fit: ScalingFit
    spec: str
    n_kept: int
    frame: pd.DataFrame
    floor: float | None = None
    kept: ScalingTable | None = None  # the runs the fit saw (their naive baselines)

    def summary(self) -> dict:
        errors = np.abs(self.frame["relative_error"].to_numpy())
        with_interval = self.frame["low"].notna()
        both = self.frame["baseline"].notna().to_numpy()
        law_mae = float(errors[both].mean()) if both.any() else None
        base_mae = (float(np.abs(self.frame["baseline_error"].to_numpy()[both]).mean())
                    if both.any() else None)
        return {"holdout": self.spec, "kept_runs": self.n_kept, "held_out_runs": len(self.frame),
                "mean_abs_relative_error": float(errors.mean()),
                "max_abs_relative_error": float(errors.max()),
                "inside_interval": int(self.frame.loc[with_interval, "inside"].sum()),
                "with_interval": int(with_interval.sum()),
                "baseline": {"rules": list(BASELINE_RULES),
                             "runs": int(both.sum()),
                             "rule_counts": {rule: int((self.frame["baseline_rule"] == rule).sum())
                                             for rule in BASELINE_RULES},
                             "law_mean_abs_relative_error": law_mae,
                             "mean_abs_relative_error": base_mae,
                             "skill": (law_mae / base_mae if both.any() and base_mae > 0
                                       else None)},
                "floor": self.floor,
                "below_floor": int(self.frame["below_floor"].sum())}

    def to_dict(self) -> dict:
        runs = self.frame.replace({np.nan: None}).to_dict(orient="records")
        return {**self.summary(), "runs": runs, "fit": self.fit.to_dict()}





def holdout_prediction(table: ScalingTable, *, law: Law, holdout: str,
                       floor: float | None = None, **fit_kwargs) -> HoldoutResult:
    """Fits ``law`` to the runs ``holdout`` keeps and predicts the loss of the others.

    Raises FitInputError when the law predicts no loss (Chinchilla approaches 1-2), when the
    rule holds out nothing or everything, or when fewer runs are kept than the law has
    parameters."""
    part = law
    if not part.can("run-loss"):
        raise FitInputError(f"--holdout predicts losses: use --law=kaplan or --law=chinchilla "
                            f"--approach=3 (approach {part.approach} models no loss)")
    held = holdout_mask(table, holdout)
    kept_rows = int((~held).sum())
    if not held.any():
        raise FitInputError(f"--holdout={holdout} holds out no run")
    if kept_rows < part.n_parameters:
        raise FitInputError(f"--holdout={holdout} keeps {kept_rows} of {len(held)} runs, fewer "
                            f"than the {part.n_parameters} parameters the law fits")
    kept = dataclasses.replace(table, frame=table.frame[~held].reset_index(drop=True),
                               notes=table.notes + (f"held out by --holdout={holdout}: "
                                                    f"{int(held.sum())} run(s)",))
    fit = fit_table(kept, law=part, **fit_kwargs)
    test = table.frame[held].reset_index(drop=True)
    n, d, observed = (test[c].to_numpy(np.float64) for c in ("params", "tokens", "loss"))
    columns = {c: test[c].to_numpy(np.float64) for c in part.run_columns}
    with np.errstate(all="ignore"):
        predicted = np.asarray(fit.run_loss(n, d, **columns), np.float64)
        if fit.interval_samples:
            replicated = fit.run_loss(n[:, None], d[:, None],
                                      {k: v[None, :] for k, v in fit.interval_samples.items()},
                                      **{c: v[:, None] for c, v in columns.items()})
            bounds = np.array([percentile_interval(row, fit.ci_level) for row in replicated])
        else:
            bounds = np.full((len(test), 2), np.nan)
    frame = pd.DataFrame({"params": n, "tokens": d, "flops": test["flops"].to_numpy(),
                          "observed": observed, "predicted": predicted,
                          "relative_error": (predicted - observed) / observed,
                          "low": bounds[:, 0], "high": bounds[:, 1]})
    frame["inside"] = (frame["low"] <= frame["observed"]) & (frame["observed"] <= frame["high"])
    baseline = [naive_baseline(kept.frame, a, b) for a, b in zip(n, d)]
    frame["baseline"] = [loss for loss, _ in baseline]
    frame["baseline_rule"] = [rule for _, rule in baseline]
    frame["baseline_error"] = (frame["baseline"] - frame["observed"]) / frame["observed"]
    frame["below_floor"] = (frame["predicted"] < floor) if floor is not None else False
    if "run_id" in test:
        frame.insert(0, "run_id", test["run_id"].to_numpy())
    return HoldoutResult(fit=fit, spec=holdout, n_kept=kept_rows, frame=frame, floor=floor,
                         kept=kept)


def format_holdout(result: HoldoutResult) -> str:
    """The table ``attnlab fit --holdout`` prints under the fit's own report."""
    summary = result.summary()
    level = f"{100 * result.fit.ci_level:g}%"
    lines = [f"held-out prediction (--holdout={result.spec}): fitted on {summary['kept_runs']} "
             f"runs, predicting {summary['held_out_runs']}",
             f"  {'N':>11}{'D':>11}{'observed':>10}{'predicted':>11}{'error':>9}"
             f"{level + ' interval':>22}{'baseline':>10}{'error':>9}"]
    for row in result.frame.itertuples():
        interval = (f"[{row.low:.4g}, {row.high:.4g}]" if np.isfinite(row.low) else "n/a")
        mark = "" if not np.isfinite(row.low) else ("" if row.inside else "  outside")
        base = (f"{row.baseline:>10.4f}{100 * row.baseline_error:>8.2f}%"
                if np.isfinite(row.baseline) else f"{'n/a':>10}{'':>9}")
        floor = "  below the floor" if row.below_floor else ""
        lines.append(f"  {row.params:>11.4g}{row.tokens:>11.4g}{row.observed:>10.4f}"
                     f"{row.predicted:>11.4f}{100 * row.relative_error:>8.2f}%"
                     f"{interval:>22}{base}{mark}{floor}")
    lines.append(f"  mean |error| {100 * summary['mean_abs_relative_error']:.2f}%, max "
                 f"{100 * summary['max_abs_relative_error']:.2f}%"
                 + (f"; {summary['inside_interval']} of {summary['with_interval']} observed "
                    f"losses inside their {level} interval" if summary["with_interval"] else ""))
    lines.append(_baseline_line(summary["baseline"]))
    if result.floor is not None:
        lines.append(f"  floor {result.floor:.6g}: {summary['below_floor']} of "
                     f"{summary['held_out_runs']} predictions below it")
    return "\n".join(lines) + "\n"


def _baseline_line(baseline: dict) -> str:
    if not baseline["runs"]:
        return ("  naive baseline: no kept run of a smaller size at the same D or of the same "
                "size with fewer tokens, so no skill")
    rules = ", ".join(f"{rule}: {count}" for rule, count in baseline["rule_counts"].items()
                      if count)
    law, naive, skill = (baseline[k] for k in ("law_mean_abs_relative_error",
                                               "mean_abs_relative_error", "skill"))
    verdict = ("the law beats the baseline" if skill is not None and skill < 1
               else "the baseline does at least as well as the law")
    return (f"  naive baseline ({rules}): mean |error| {100 * naive:.2f}% against the law's "
            f"{100 * law:.2f}% on the {baseline['runs']} runs both predict; skill (law / "
            f"baseline mean |error|) " + (f"{skill:.2f}" if skill is not None else "n/a")
            + f": {verdict}")
