"""The leave-future-out figure (``attnlab plot --kind=leave-future-out``): each budget's error
predicted from the budgets below it, the law against the forecasters it must beat."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from attnlab.plots.scaling import _figure, _legend


def plot_leave_future_out(rolled) -> Figure:
    """The mean |relative error| of each step of a ``tables.holdout.RollingForecast``: the law's
    and each forecaster's (on the runs it predicts), against the budget predicted."""
    steps = rolled.steps
    figure, ax = _figure(6.0, 4.4)
    names = [c for c in steps.columns if c not in ("C", "kept_runs", "held_out_runs", "winner")]
    for name in names:
        values = pd.to_numeric(steps[name], errors="coerce") * 100
        if values.notna().any():
            ax.plot(steps["C"], values, marker="o", lw=2.0 if name == "law" else 1.0,
                    label="the law" if name == "law" else name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("budget predicted, FLOPs (from the budgets below it)")
    ax.set_ylabel("mean |relative error| (%)")
    wins = int((steps["winner"] == "law").sum())
    ax.set_title(f"leave-future-out: the law wins {wins} of {len(steps)} steps", fontsize=10)
    _legend(ax)
    return figure
