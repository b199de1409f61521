"""The forecasters a law must beat, each one class and a line of :data:`FORECASTERS`.

A law is worth its parameters when it predicts runs it has not seen better than simple rules do:

  persistence  the nearest kept run: a smaller size at the same D, else the same size with fewer
               tokens (``baselines.naive_baseline``): a floor, not a competitor
  trend        log L linear in log N through the two largest kept sizes below the run at its D,
               else in log D through the two longest kept runs of its size
  frontier     a power law with a floor over the kept compute frontier, L(C) = E + A C^-a fitted
               to each budget's best run; it forecasts the best loss at a compute, so it predicts
               each held-out budget's best run only

``skill`` sets the law's mean |relative error| against each forecaster's on the runs both
predict, with a bootstrap interval over the held-out runs (their clusters, where the table has
them): skill < 1 the law wins, > 1 the forecaster does.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from attnlab.scaling.bootstrap import cluster_index, percentile_interval, resample_rows
from attnlab.scaling.points import budget_labels
from attnlab.scaling.tables.baselines import SAME, frontier_baseline, naive_baseline

SKILL_RESAMPLES = 1000
TREND_RULES = ("log-log in N through the two largest smaller sizes, same D",
               "log-log in D through the two longest shorter runs, same N")
FRONTIER_RULE = "E + A C^-a over the kept budgets' best runs"


def _levels(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted, counting those within SAME of the one below as one."""
    levels: list[float] = []
    for value in np.sort(values):
        if not levels or value > levels[-1] * (1 + SAME):
            levels.append(float(value))
    return np.array(levels)


def _through_two(x: np.ndarray, loss: np.ndarray, at: float) -> float:
    """log L at log ``at`` on the line through the two largest levels of x (mean log L at each),
    NaN with fewer than two."""
    levels = _levels(x)
    if len(levels) < 2:
        return float("nan")
    (x1, x2), y = levels[-2:], []
    for level in (x1, x2):
        y.append(np.log(loss[np.isclose(x, level, rtol=SAME)]).mean())
    slope = (y[1] - y[0]) / (np.log(x2) - np.log(x1))
    return float(np.exp(y[1] + slope * (np.log(at) - np.log(x2))))


class Forecaster:
    """predict(kept, test) -> ([test runs] predicted loss, NaN where it makes no forecast,
    [test runs] the rule used or None), from frames with params, tokens, flops and loss."""

    name = ""
    needs = ""  # what a run needs for a forecast, said when it makes none
    # Its columns in a hold-out's frame: the prediction (its error in "<column>_error") and,
    # where the rule is kept, the rule each run took.
    column: str = ""
    rule_column: str | None = None

    def predict(self, kept: pd.DataFrame, test: pd.DataFrame):
        raise NotImplementedError


class Persistence(Forecaster):
    name = "persistence"
    needs = "a kept run of a smaller size at its D, or of its size with fewer tokens"
    column, rule_column = "baseline", "baseline_rule"  # the naive baseline's former names

    def predict(self, kept, test):
        made = [naive_baseline(kept, n, d) for n, d in zip(test["params"], test["tokens"])]
        return np.array([loss for loss, _ in made]), [rule for _, rule in made]


class Trend(Forecaster):
    name = column = "trend"
    needs = "two kept sizes below it at its D, or two shorter kept runs of its size"

    def predict(self, kept, test):
        params, tokens, loss = (kept[c].to_numpy(np.float64) for c in ("params", "tokens", "loss"))
        values, rules = [], []
        for n, d in zip(test["params"], test["tokens"]):
            same_d = np.isclose(tokens, d, rtol=SAME) & (params < n * (1 - SAME))
            same_n = np.isclose(params, n, rtol=SAME) & (tokens < d * (1 - SAME))
            value, rule = _through_two(params[same_d], loss[same_d], n), TREND_RULES[0]
            if not np.isfinite(value):
                value, rule = _through_two(tokens[same_n], loss[same_n], d), TREND_RULES[1]
            values.append(value)
            rules.append(rule if np.isfinite(value) else None)
        return np.array(values), rules


def frontier_points(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(C, L) of each budget's best run (budgets as ``points.budget_labels`` groups them)."""
    budget = frame["budget"].to_numpy() if "budget" in frame else None
    labels = budget_labels(frame["flops"].to_numpy(), budget)
    best = frame.groupby(labels)["loss"].idxmin()
    return frame.loc[best, "flops"].to_numpy(np.float64), frame.loc[best, "loss"].to_numpy()


def fit_frontier(c: np.ndarray, loss: np.ndarray) -> dict | None:
    """E, A, a of L(C) = E + A C^-a through the frontier points by least squares on L/L_obs - 1
    (0 <= E < min L, a > 0), None with fewer points than its 3 parameters."""
    if len(c) < 3:
        return None
    log_c = np.log(c) - np.log(c).max()  # C in units of the largest budget: A of order L

    def residual(x):
        return (x[0] + np.exp(x[1] - x[2] * log_c)) / loss - 1

    low = float(loss.min())
    start = [0.5 * low, np.log(0.5 * low), 0.1]
    bounds = ([0, -np.inf, 1e-6], [low * (1 - 1e-9), np.inf, 5])
    x = least_squares(residual, start, bounds=bounds).x
    return {"E": float(x[0]), "A": float(np.exp(x[1])), "a": float(x[2]),
            "C_unit": float(c.max())}


def frontier_loss(params: dict, c) -> np.ndarray:
    return params["E"] + params["A"] * np.power(np.asarray(c, np.float64) / params["C_unit"],
                                                -params["a"])


class Frontier(Forecaster):
    name = column = "frontier"
    needs = "3 kept budgets; it predicts each held-out budget's best run"

    def predict(self, kept, test):
        params = fit_frontier(*frontier_points(kept))
        values = np.full(len(test), np.nan)
        if params is not None:
            budget = test["budget"].to_numpy() if "budget" in test else None
            labels = budget_labels(test["flops"].to_numpy(), budget)
            for label in np.unique(labels):
                rows = np.flatnonzero(labels == label)
                best = rows[np.argmin(test["loss"].to_numpy()[rows])]
                values[best] = frontier_loss(params, test["flops"].to_numpy()[best])
        return values, [FRONTIER_RULE if np.isfinite(v) else None for v in values]


FORECASTERS = (Persistence, Trend, Frontier)


def forecasters_of(law) -> tuple[type, ...]:
    """The forecasters ``law`` sets beside it: the standard ones it names, then its own."""
    named = {cls.name: cls for cls in FORECASTERS}
    return tuple(named[name] for name in law.forecasters) + tuple(law.own_forecasters)


def at_budget(frame: pd.DataFrame, budget: float) -> dict[str, float | None]:
    """The trend's and the frontier's forecast of the best loss at ``budget`` from a table's
    compute frontier (the budgets' best runs that spent at most it): log L linear in log C
    through the two largest, and E + A C^-a through all (None without enough budgets)."""
    c, loss = frontier_points(frame)
    within = c <= budget * (1 + SAME)
    c, loss = c[within], loss[within]
    params = fit_frontier(c, loss)
    trend = _through_two(c, loss, budget)
    return {"trend": trend if np.isfinite(trend) else None,
            "frontier": float(frontier_loss(params, budget)) if params else None}


def skill(law_error: np.ndarray, other_error: np.ndarray, *, clusters=None,
          replicates: np.ndarray | None = None, level: float = 0.95, seed: int = 0) -> dict:
    """The law's mean |relative error| over another forecaster's on the runs both predict, with
    a percentile interval: over SKILL_RESAMPLES resamples of those runs (their clusters), or,
    where they are one cluster (one trunk's branches: their resamples are all the same runs),
    over the law's bootstrap refits (``replicates``: [runs, refits] relative errors).
    {"runs", "clusters", "law", "other", "skill", "ci", "ci_over"}; skill None where it
    predicts none, ci None where neither resampling exists."""
    both = np.isfinite(law_error) & np.isfinite(other_error)
    law, other = np.abs(law_error[both]), np.abs(other_error[both])
    groups = (np.arange(int(both.sum())) if clusters is None
              else cluster_index(np.asarray(clusters)[both]))
    found = {"runs": int(both.sum()), "clusters": len(np.unique(groups)),
             "law": float(law.mean()) if both.any() else None,
             "other": float(other.mean()) if both.any() else None, "skill": None, "ci": None,
             "ci_over": None}
    if not both.any() or not other.mean() > 0:
        return found
    found["skill"] = float(law.mean() / other.mean())
    if found["clusters"] >= 2:
        rng = np.random.default_rng(seed)
        draws = []
        for _ in range(SKILL_RESAMPLES):
            rows = resample_rows(len(law), rng, groups)
            if other[rows].mean() > 0:
                draws.append(law[rows].mean() / other[rows].mean())
        found["ci_over"] = "held-out clusters"
    elif replicates is not None and replicates.size:
        draws = np.nanmean(np.abs(replicates[both]), axis=0) / other.mean()
        found["ci_over"] = "the law's bootstrap refits"
    else:
        return found
    found["ci"] = (list(percentile_interval(np.asarray(draws), level)) if len(draws) > 1
                   else None)
    return found


def with_baselines(payload: dict, frame: pd.DataFrame) -> dict:
    """``payload`` (a fit's JSON) with the forecasts beside each predicted loss: the naive
    baseline (the best run that spent at most C) and the trend's and frontier's (``at_budget``)."""
    for prediction in payload.get("predictions", []):
        if prediction.get("loss") is not None:
            prediction["baseline"] = frontier_baseline(frame, prediction["C"])
            prediction["forecasts"] = at_budget(frame, prediction["C"])
    return payload
