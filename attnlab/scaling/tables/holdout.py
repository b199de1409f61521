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
import functools
import re

import numpy as np
import pandas as pd

from attnlab.scaling.bootstrap import percentile_interval
from attnlab.scaling.errors import FitError, FitInputError
from attnlab.scaling.law import Law
from attnlab.scaling.points import ScalingTable, budget_labels
from attnlab.scaling.result import ScalingFit
from attnlab.scaling.tables.baselines import BASELINE_RULES
from attnlab.scaling.tables.fitting import fit_table
from attnlab.scaling.tables.forecasters import forecasters_of, skill
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
                            f"flops>X, params>X, tokens>X, tokens_per_param>X (or >=), "
                            f"leave-future-out")
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
    inside (observed within [low, high]); baseline, baseline_rule, baseline_error (persistence,
    the naive baseline: its prediction, rule and relative error; NaN / None without one);
    trend, trend_error and frontier, frontier_error (the other forecasters of
    the law's ``forecasters``); below_floor (predicted < ``floor``, False without a floor).
    clusters: the held-out runs' bootstrap clusters (None: each run its own), which the skill's
    intervals resample.
    """

    fit: ScalingFit
    spec: str
    n_kept: int
    frame: pd.DataFrame
    floor: float | None = None
    kept: ScalingTable | None = None  # the runs the fit saw (their naive baselines)
    clusters: np.ndarray | None = None
    replicates: np.ndarray | None = None  # [held-out runs, refits] the law's predicted loss

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
                "forecasters": self.skills,
                "floor": self.floor,
                "below_floor": int(self.frame["below_floor"].sum())}

    @functools.cached_property
    def skills(self) -> dict:
        """Each forecaster's mean |error| against the law's on the runs both predict, and the
        law's skill with its interval (``forecasters.skill``); computed once, as the report,
        its JSON and the figure all ask."""
        law = self.frame["relative_error"].to_numpy(np.float64)
        replicates = None
        if self.replicates is not None:
            observed = self.frame["observed"].to_numpy(np.float64)[:, None]
            replicates = (self.replicates - observed) / observed
        return {cls.name: skill(law, self.frame[f"{cls.column}_error"].to_numpy(np.float64),
                                clusters=self.clusters, level=self.fit.ci_level,
                                replicates=replicates)
                for cls in forecasters_of(self.fit.part)}

    def to_dict(self) -> dict:
        runs = self.frame.replace({np.nan: None}).to_dict(orient="records")
        return {**self.summary(), "runs": runs, "fit": self.fit.to_dict()}





def holdout_prediction(table: ScalingTable, *, law: Law, holdout: str,
                       floor: float | None = None, **fit_kwargs) -> HoldoutResult:
    """Fits ``law`` to the runs ``holdout`` keeps and predicts the loss of the others.

    Raises FitInputError when the law predicts no loss (Chinchilla approaches 1-2), when the
    rule holds out nothing or everything, or when fewer runs are kept than the law has
    parameters."""
    if not law.can("run-loss"):
        raise FitInputError(f"--holdout predicts losses: use --law=kaplan or --law=chinchilla "
                            f"--approach=3 (approach {law.approach} models no loss)")
    held = holdout_mask(table, holdout)
    kept_rows = int((~held).sum())
    if not held.any():
        raise FitInputError(f"--holdout={holdout} holds out no run")
    if kept_rows < law.n_parameters:
        raise FitInputError(f"--holdout={holdout} keeps {kept_rows} of {len(held)} runs, fewer "
                            f"than the {law.n_parameters} parameters the law fits")
    kept = dataclasses.replace(table, frame=table.frame[~held].reset_index(drop=True),
                               notes=table.notes + (f"held out by --holdout={holdout}: "
                                                    f"{int(held.sum())} run(s)",))
    fit = fit_table(kept, law=law, **fit_kwargs)
    test = table.frame[held].reset_index(drop=True)
    n, d, observed = (test[c].to_numpy(np.float64) for c in ("params", "tokens", "loss"))
    columns = {c: test[c].to_numpy(np.float64) for c in law.run_columns}
    with np.errstate(all="ignore"):
        predicted = np.asarray(fit.run_loss(n, d, **columns), np.float64)
        if fit.interval_samples:
            replicated = fit.run_loss(n[:, None], d[:, None],
                                      {k: v[None, :] for k, v in fit.interval_samples.items()},
                                      **{c: v[:, None] for c, v in columns.items()})
            bounds = np.array([percentile_interval(row, fit.ci_level) for row in replicated])
        else:
            replicated, bounds = None, np.full((len(test), 2), np.nan)
    frame = pd.DataFrame({"params": n, "tokens": d, "flops": test["flops"].to_numpy(),
                          "observed": observed, "predicted": predicted,
                          "relative_error": (predicted - observed) / observed,
                          "low": bounds[:, 0], "high": bounds[:, 1]})
    frame["inside"] = (frame["low"] <= frame["observed"]) & (frame["observed"] <= frame["high"])
    for cls in forecasters_of(law):
        values, rules = cls().predict(kept.frame, test)
        frame[cls.column] = values
        if cls.rule_column:
            frame[cls.rule_column] = rules
        frame[f"{cls.column}_error"] = (frame[cls.column] - frame["observed"]) / frame["observed"]
    frame["below_floor"] = (frame["predicted"] < floor) if floor is not None else False
    if "run_id" in test:
        frame.insert(0, "run_id", test["run_id"].to_numpy())
    clusters = test["cluster"].to_numpy() if "cluster" in test else None
    return HoldoutResult(fit=fit, spec=holdout, n_kept=kept_rows, frame=frame, floor=floor,
                         kept=kept, clusters=clusters,
                         replicates=None if replicated is None else np.asarray(replicated))


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
    needs = {cls.name: cls.needs for cls in forecasters_of(result.fit.part)}
    lines += _forecaster_lines(summary["forecasters"], level, needs)
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


def _forecaster_lines(skills: dict, level: str, needs: dict) -> list[str]:
    """Each forecaster beside the law, and which wins: skill = the law's mean |error| / the
    forecaster's on the runs both predict (< 1: the law wins), with its interval over the
    held-out runs."""
    lines = [f"  forecasters (mean |error| on the runs each predicts; skill = law / forecaster, "
             f"{level} interval over the held-out runs' clusters, or over the law's refits "
             f"where they are one):"]
    for name, found in skills.items():
        if not found["runs"]:
            lines.append(f"    {name:<12} predicts none of these runs (it needs {needs[name]})")
            continue
        interval = (f" [{found['ci'][0]:.2f}, {found['ci'][1]:.2f}]"
                    + (" over the law's refits" if found["clusters"] < 2 else "")
                    if found["ci"] else f" (no interval: the {found['runs']} runs are one "
                                        f"cluster and the fit has no bootstrap)")
        verdict = ("" if found["skill"] is None else "  the law wins" if found["skill"] < 1
                   else "  the forecaster wins")
        if found["ci"] and found["ci"][0] < 1 < found["ci"][1]:
            verdict += " (its interval holds 1: not settled)"
        lines.append(f"    {name:<12}{100 * found['other']:>7.2f}%  (the law "
                     f"{100 * found['law']:.2f}% on {found['runs']} runs): skill "
                     + ("n/a" if found["skill"] is None else f"{found['skill']:.2f}")
                     + interval + verdict)
    winners = [n for n, f in skills.items() if f["skill"] is not None and f["skill"] >= 1]
    named = " and ".join(winners)
    lines.append("  verdict: " + (f"{named} {'predict' if len(winners) > 1 else 'predicts'} these "
                                  f"runs at least as well as the law" if winners
                                  else "the law beats every forecaster"))
    return lines

# --- Leave-future-out -------------------------------------------------------------------------
# Fit on the budgets up to C_k, predict the next budget's runs, roll forward: each step with the
# law's error beside the forecasters', and which won; how a frontier forecast is checked before
# it is trusted at a budget nobody has trained.

LEAVE_FUTURE_OUT = "leave-future-out"


@dataclasses.dataclass(frozen=True)
class RollingForecast:
    """steps: one row per predicted budget: C, kept_runs, held_out_runs, law (mean |relative
    error|), each forecaster's on the runs it predicts, winner; skipped: budget -> why no fit."""

    steps: pd.DataFrame
    skipped: dict

    def to_dict(self) -> dict:
        steps = self.steps.replace({np.nan: None}).to_dict("records")
        return {"holdout": LEAVE_FUTURE_OUT, "steps": steps,
                "skipped": {f"{c:.4g}": why for c, why in self.skipped.items()}}


def leave_future_out(table: ScalingTable, *, law: Law, **fit_kwargs) -> RollingForecast:
    """Each budget after the first predicted from those before it (``holdout_prediction`` of
    the table cut at that budget, with its largest budget held out)."""
    labels = budget_labels(table.array("flops"), table.budget)
    budgets = np.unique(labels)
    if len(budgets) < 2:
        raise FitInputError(f"--holdout={LEAVE_FUTURE_OUT} needs runs at two budgets or more; "
                            f"the table has {len(budgets)}")
    rows, skipped = [], {}
    for budget in budgets[1:]:
        cut = dataclasses.replace(table, frame=table.frame[labels <= budget].reset_index(
            drop=True))
        try:
            held = holdout_prediction(cut, law=law, holdout="largest-budget", **fit_kwargs)
        except (FitInputError, FitError) as error:
            skipped[float(budget)] = str(error)
            continue
        rows.append(_step(float(budget), held))
    if not rows:
        raise FitInputError(f"--holdout={LEAVE_FUTURE_OUT}: no budget could be predicted ("
                            + "; ".join(f"{c:.3g}: {why}" for c, why in skipped.items()) + ")")
    return RollingForecast(steps=pd.DataFrame(rows), skipped=skipped)


def _step(budget: float, held) -> dict:
    skills = held.skills
    row = {"C": budget, "kept_runs": held.n_kept, "held_out_runs": len(held.frame),
           "law": float(np.abs(held.frame["relative_error"]).mean())}
    row |= {name: found["other"] for name, found in skills.items()}
    beaten = {n: f["skill"] for n, f in skills.items() if f["skill"] is not None
              and f["skill"] > 1}  # on the runs both predict, the forecaster erred less
    row["winner"] = max(beaten, key=beaten.get) if beaten else "law"
    return row


def format_rolling(result: RollingForecast) -> str:
    """The table ``attnlab fit --holdout=leave-future-out`` prints."""
    names = [c for c in result.steps.columns
             if c not in ("C", "kept_runs", "held_out_runs", "law", "winner")]
    lines = ["leave-future-out: each budget predicted from the budgets below it (mean |relative "
             "error|; a forecaster's on the runs it predicts)",
             f"  {'C':>10}{'kept':>6}{'held':>6}{'law':>9}"
             + "".join(f"{n:>13}" for n in names) + "  winner"]
    for row in result.steps.to_dict("records"):
        cells = "".join(f"{'-':>13}" if row[n] is None or not np.isfinite(row[n])
                        else f"{100 * row[n]:>12.2f}%" for n in names)
        lines.append(f"  {row['C']:>10.3g}{row['kept_runs']:>6}{row['held_out_runs']:>6}"
                     f"{100 * row['law']:>8.2f}%{cells}  {row['winner']}")
    wins = (result.steps["winner"] == "law").sum()
    lines.append(f"  the law wins {wins} of {len(result.steps)} steps")
    for budget, why in result.skipped.items():
        lines.append(f"  not predicted: {budget:.3g} ({why})")
    return "\n".join(lines) + "\n"
