"""The naive forecasts a law's predictions stand beside: a forecast means little without one.

For a held-out run, the nearest kept run (``naive_baseline``, its rules in ``BASELINE_RULES``);
for the compute-optimal loss at a budget, the best run that spent at most that much compute, the
observed frontier's last point (``frontier_baseline``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# A run planned at a budget spends it up to the rounding of its steps (a few parts in 1e4 here).
BUDGET_SLACK = 0.01
FRONTIER_RULE = "the best run with at most this compute"
# Two runs' N or D within this relative difference are "the same" for the naive baseline.
SAME = 0.05
BASELINE_RULES = ("smaller size, same D", "same N, fewer tokens")


def frontier_baseline(frame: pd.DataFrame, budget: float) -> dict | None:
    """The naive forecast of the compute-optimal loss at ``budget``: the lowest loss among the
    runs that spent at most that much compute (within the planner's rounding, BUDGET_SLACK),
    i.e. the observed compute frontier's last point: {"loss", "N", "D", "C", "rule"}, or None
    when no run spent so little."""
    within = frame[frame["flops"] <= budget * (1 + BUDGET_SLACK)]
    if within.empty:
        return None
    best = within.loc[within["loss"].idxmin()]
    return {"loss": float(best["loss"]), "N": float(best["params"]), "D": float(best["tokens"]),
            "C": float(best["flops"]), "rule": FRONTIER_RULE}



def naive_baseline(kept: pd.DataFrame, n: float, d: float) -> tuple[float, str | None]:
    """(loss, rule) of the naive prediction for a run of N = n, D = d from the kept runs
    (module docstring), or (NaN, None) when no kept run qualifies."""
    params, tokens = kept["params"].to_numpy(), kept["tokens"].to_numpy()
    same_d = np.isclose(tokens, d, rtol=SAME) & (params < n * (1 - SAME))
    if same_d.any():
        nearest = same_d & np.isclose(params, params[same_d].max(), rtol=SAME)
        return float(kept["loss"].to_numpy()[nearest].mean()), BASELINE_RULES[0]
    same_n = np.isclose(params, n, rtol=SAME) & (tokens < d * (1 - SAME))
    if same_n.any():
        last = same_n & np.isclose(tokens, tokens[same_n].max(), rtol=SAME)
        return float(kept["loss"].to_numpy()[last].mean()), BASELINE_RULES[1]
    return float("nan"), None
