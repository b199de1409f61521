"""The figure of a law of whole curves (``attnlab plot --kind=curves``): each run's observed
loss against the law's curve, held-out runs marked, and the curves ``--predict-schedule``
asks for; below, the schedules' rates."""

from __future__ import annotations

import itertools

import matplotlib as mpl
import numpy as np
from matplotlib.figure import Figure

from attnlab.plots.scaling import _legend


def plot_schedule_fits(result) -> Figure:
    """Observed (points) and predicted (lines) loss per step of a
    ``tables.schedule_fits.ScheduleFits``; dashed lines and hollow points: held out."""
    figure = Figure(figsize=(7.2, 6.0))
    loss_ax, lr_ax = figure.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    colours = itertools.cycle(mpl.rcParams["axes.prop_cycle"].by_key()["color"])
    errors = result.errors().set_index("run_id")
    for curve in result.curves:
        colour = next(colours)
        held = curve.run_id in result.held
        shown = curve.fitted()
        label = (f"{curve.run_id} ({'held out' if held else 'fitted'}, "
                 f"{100 * errors.loc[curve.run_id, 'mean_relative_error']:.2f}%)")
        loss_ax.plot(shown.steps, shown.loss, "o", ms=3, color=colour,
                     mfc="none" if held else colour, alpha=0.6)
        loss_ax.plot(shown.steps, result.predicted(shown), "--" if held else "-", color=colour,
                     label=label)
        lr_ax.plot(np.arange(1, len(curve.lr) + 1), curve.lr, color=colour)
    for curve in result.settings.get("predict", ()):
        prediction = result.prediction(curve)
        loss_ax.plot(prediction["step"], prediction["loss"], ":", color="black",
                     label=f"predicted: {curve.run_id}")
        lr_ax.plot(np.arange(1, len(curve.lr) + 1), curve.lr, ":", color="black")
    loss_ax.set_ylabel("loss")
    loss_ax.set_title(f"{result.law.short_title}: points observed, lines the law "
                      f"(mean |relative error|)", fontsize=9)
    lr_ax.set_xlabel("step")
    lr_ax.set_ylabel("learning rate")
    _legend(loss_ax)
    return figure
