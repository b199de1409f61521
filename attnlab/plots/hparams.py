"""The hyperparameter law's figure (``attnlab plot --kind=hparams``): per (N, D) group the loss
against the learning rate, a line per batch size, with the group's optimum and the law's.

Each group's panel shows the mean loss at each (lr, batch) grid point (seeds averaged, the
points the fit uses) and, faintly, every run. The group's optimum (``--optimum``) is a dashed
line, the law's lr*(N, D) a solid one. The loss axis stops a little above the group's upper
quartile: past a critical rate runs diverge to the unigram loss, and drawn to scale they would
flatten everything near the optimum; such points sit on the top edge as triangles.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import EngFormatter, FuncFormatter, LogLocator, NullFormatter

from attnlab.plots.scaling import _colours, _note
from attnlab.scaling.laws.hparams import Optimum, grid_means

SIZE = EngFormatter(sep="", places=1)  # 33.1k parameters, 249.9k tokens
LEGEND_BATCHES = 8  # more batch sizes than this: the legend shows the smallest and largest


def plot_hparams(runs: pd.DataFrame, optima: dict[tuple, Optimum], laws: dict | None = None,
                 missing: str | None = None) -> Figure:
    """``runs``: read_runs's table; ``optima``: (N, D) -> Optimum; ``laws``: target ->
    FittedPowerLaw (None: no law, ``missing`` says why, in the figure)."""
    groups = sorted(runs.groupby(["params", "tokens"]).groups)
    sizes, tokens = sorted({n for n, _ in groups}), sorted({d for _, d in groups})
    figure = Figure(figsize=(3.4 * len(tokens) + 1.4, 2.8 * len(sizes)), layout="constrained")
    axes = figure.subplots(len(sizes), len(tokens), squeeze=False, sharex=True)
    colours = _colours(runs["batch"].to_numpy())
    means = grid_means(runs)
    for n, d in groups:
        ax = axes[sizes.index(n), tokens.index(d)]
        at = (runs["params"] == n) & (runs["tokens"] == d)
        _group_panel(ax, runs[at], means[(means["params"] == n) & (means["tokens"] == d)],
                     colours)
        _optimum_lines(ax, optima.get((n, d)), laws, n, d)
        ax.set_title(f"N = {SIZE(n)}, D = {SIZE(d)}", fontsize=8)
    for ax in axes.flat:
        if not ax.has_data():
            ax.set_axis_off()
    for ax in axes[-1]:
        ax.set_xlabel("peak learning rate")
    for ax in axes[:, 0]:
        ax.set_ylabel("loss")
    batches = sorted(colours)
    if len(batches) > LEGEND_BATCHES:  # groups with grids of their own: the ends of the scale
        batches = [batches[0], batches[-1]]
    handles = [Line2D([], [], color=colours[b], marker="o", label=f"{b:.4g}") for b in batches]
    handles += [Line2D([], [], color="grey", ls="--", label="group optimum"),
                Line2D([], [], color="black", label="law's lr*(N, D)")]
    figure.legend(handles=handles, title="tokens per step", fontsize=7, title_fontsize=7,
                  loc="outside right center")
    if missing:
        _note(axes.flat[0], missing, top=True)
    return figure


def _group_panel(ax, runs: pd.DataFrame, means: pd.DataFrame, colours: dict) -> None:
    """One group: its runs faintly, its grid points' means as lines per batch size."""
    best, top = means["loss"].min(), means["loss"].quantile(0.75)
    top = top + 0.25 * max(top - best, 1e-3)
    for batch, line in means.groupby("batch"):
        line = line.sort_values("lr")
        shown = np.minimum(line["loss"], top)
        ax.plot(line["lr"], shown, color=colours[batch], marker="o", ms=3, lw=1)
        over = line["loss"] > top
        ax.scatter(line["lr"][over], shown[over], color=colours[batch], marker="^", s=24,
                   zorder=3)
    if len(runs) > len(means):  # repeated runs (seeds): each one faintly
        ax.scatter(runs["lr"], np.minimum(runs["loss"], top), s=6, alpha=0.3,
                   color=[colours[b] for b in runs["batch"]], zorder=2)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))  # 0.005, 0.01, 0.02
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(best - 0.1 * (top - best), top + 0.05 * (top - best))


def _optimum_lines(ax, optimum: Optimum | None, laws: dict | None, n: float, d: float) -> None:
    """The group's optimum (dashed) and the law's lr at (N, D) (solid), with their batches."""
    text = []
    if optimum is not None:
        ax.axvline(optimum.lr, color="grey", ls="--", lw=1)
        text.append(f"optimum {optimum.lr:.3g}, batch {optimum.batch:.3g}"
                    + (f" (at the grid's {optimum.edge} edge)" if optimum.edge else ""))
    if laws is not None:
        lr, batch = (float(laws[t](n, d)) for t in ("lr", "batch"))
        ax.axvline(lr, color="black", lw=1)
        text.append(f"law {lr:.3g}, batch {batch:.3g}")
    if text:
        ax.text(0.02, 0.97, "\n".join(text), transform=ax.transAxes, fontsize=6, va="top")
