"""Scaling-law figures, each returning a ``matplotlib.figure.Figure`` (no pyplot state).

    fig = plot_isoflops(fit)                 # fit: ScalingFit of Chinchilla approach 2
    save_figure(fig, "isoflop.png")          # PNG or PDF by extension

``frame`` arguments are canonical tables (``ScalingTable.frame``): columns params, tokens,
loss, flops (and budget / run_id for IsoFLOP sweeps and curves).

A figure never fails because of its fit: a degenerate fit (``ScalingFit.unpinned``) or one with
NaN/inf parameters still gives a figure with the data, and a note on it says what was not drawn
(curves are drawn only where they are finite and positive on the log axes).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, LogLocator, NullFormatter, ScalarFormatter

from attnlab import outputs
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.laws.approach1 import lower_envelope
from attnlab.scaling.result import ScalingFit

FORMATS = (".png", ".pdf")
N_LABEL = "parameters N"
D_LABEL = "training tokens D"
C_LABEL = "training compute C (FLOPs)"
LOSS_LABEL = "loss (nats/token)"


def save_figure(figure: Figure, path: str | Path) -> Path:
    """Writes PNG or PDF, chosen by the extension of ``path``."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise FitInputError(f"{path}: figures are written as .png or .pdf")
    path.parent.mkdir(parents=True, exist_ok=True)
    return outputs.save_figure(figure, path, dpi=150, bbox_inches="tight")


def _positive(values) -> np.ndarray:
    """float64 copy with every value that a log axis cannot show (NaN, inf, <= 0) as NaN."""
    values = np.array(values, np.float64)
    with np.errstate(invalid="ignore"):
        values[~(np.isfinite(values) & (values > 0))] = np.nan
    return values


def _line(ax, x, y, **style) -> bool:
    """Plots the finite, positive part of y(x); returns False (drawing nothing) if none is."""
    x, y = np.broadcast_arrays(_positive(x), _positive(y))
    if not np.any(np.isfinite(x) & np.isfinite(y)):
        return False
    ax.plot(x, y, **style)
    return True


def _note(ax, text: str, width: int = 60, top: bool = False) -> None:
    """A visible note in the axes' lower left corner, or upper right (what this figure could not
    draw)."""
    ax.text(0.98 if top else 0.02, 0.98 if top else 0.02,
            textwrap.fill(text, width, break_on_hyphens=False), transform=ax.transAxes,
            fontsize=7, color="darkred", ha="right" if top else "left",
            va="top" if top else "bottom", zorder=5,
            bbox={"facecolor": "white", "edgecolor": "darkred", "alpha": 0.85})


def _legend(ax) -> None:
    """A legend, when something drawn has a label (a figure of a broken fit may have none)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _fit_problems(fit: ScalingFit) -> list[str]:
    """Why the fit's own curves may mislead (empty if nothing): unpinned or non-finite
    parameters."""
    problems = []
    if fit.unpinned:
        problems.append(f"degenerate fit: the data do not pin {', '.join(fit.unpinned)}")
    bad = [name for name, value in fit.params.items() if not np.isfinite(value)]
    if bad:
        problems.append(f"non-finite fitted parameters: {', '.join(bad)}")
    return problems


def _figure(width: float = 6.4, height: float = 4.6, ncols: int = 1, into=None):
    """A new figure with ``ncols`` axes, or those axes in ``into`` (one row of a figure drawn
    per group, :func:`plot_by_group`)."""
    figure = into if into is not None else Figure(figsize=(width, height), layout="constrained")
    return figure, figure.subplots(1, ncols)


def plot_by_group(by: str, panels: dict, size: tuple[float, float],
                  notes: list[str] = ()) -> Figure:
    """One row per group: ``panels`` maps each value of column ``by`` to a function that draws
    that group's figure into the row it is given; ``size``: one row's (width, height)."""
    width, height = size
    figure = Figure(figsize=(width, height * len(panels)), layout="constrained")
    rows = figure.subfigures(len(panels), 1, squeeze=False)[:, 0]
    for row, (group, draw) in zip(rows, panels.items()):
        draw(row)
        row.suptitle(f"{by} = {group}", fontsize=11, fontweight="bold")
    if notes:
        figure.supxlabel("; ".join(notes), fontsize=8)
    return figure


def _colours(values, cmap: str = "viridis"):
    """A colour per distinct value, ordered on a log scale."""
    values = np.asarray(sorted(set(values)), np.float64)
    norm = LogNorm(values.min(), values.max()) if len(values) > 1 else None
    palette = colormaps[cmap]
    return {v: palette(0.1 + 0.8 * (norm(v) if norm else 0.5)) for v in values}


def _token_groups(tokens: np.ndarray, max_groups: int = 8) -> np.ndarray:
    """A representative D per run: the token count itself (to 3 significant figures) when the
    sweep has at most ``max_groups`` of them, else the geometric centre of its log-spaced bin, so
    that a sweep where every run has its own D (an IsoFLOP sweep) still gets a readable legend."""
    rounded = np.array([float(f"{v:.3g}") for v in tokens])
    if len(np.unique(rounded)) <= max_groups:
        return rounded
    edges = np.geomspace(tokens.min(), tokens.max() * (1 + 1e-9), max_groups + 1)
    index = np.clip(np.searchsorted(edges, tokens, side="right") - 1, 0, max_groups - 1)
    centres = np.sqrt(edges[:-1] * edges[1:])
    return np.array([float(f"{v:.2g}") for v in centres[index]])


def _log_axes(ax) -> None:
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(ScalarFormatter())


def _size_axis(axis) -> None:
    """Parameter counts as 5k, 10k, 20k: over one or two decades the default labels of a log
    axis (3×10⁴ beside 4×10⁴) run into each other."""
    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(EngFormatter(sep=""))
    axis.set_minor_formatter(NullFormatter())


def plot_loss_vs_params(frame: pd.DataFrame, fit: ScalingFit | None = None, into=None,
                        missing: str | None = None) -> Figure:
    """Kaplan et al. 2020 Fig. 4 (left) style: loss against N (log-log), one colour per token
    count D (log-spaced bins of D when the sweep has many), with the fitted law's line at each D
    (Kaplan L(N, D) or Chinchilla approach 3); ``missing``: why there is no fit, noted."""
    figure, ax = _figure(7.4, 4.6, into=into)
    token_groups = _token_groups(frame["tokens"].to_numpy())
    binned = not np.allclose(token_groups, frame["tokens"].to_numpy(), rtol=1e-3)
    colours = _colours(token_groups)
    n_line = np.geomspace(frame["params"].min() / 1.5, frame["params"].max() * 1.5, 200)
    drawn = []  # whether each fitted curve could be drawn
    for tokens in sorted(set(token_groups)):
        at = token_groups == tokens
        label = f"D {'≈' if binned else '='} {tokens:.3g}"
        ax.scatter(frame["params"][at], frame["loss"][at], color=colours[tokens], s=22,
                   label=label, zorder=3)
        if fit is not None and fit.has_loss_model:
            with np.errstate(all="ignore"):
                predicted = fit.loss(n_line, tokens)
            drawn.append(_line(ax, n_line, predicted, color=colours[tokens], lw=1.2))
    with np.errstate(all="ignore"):
        size_curve = fit.part.size_curve(fit.params, n_line) if fit is not None else None
    if size_curve is not None:
        drawn.append(_line(ax, n_line, size_curve, color="black", lw=1.2, label="L(N) fit"))
    if fit is not None:
        problems = _fit_problems(fit)
        if not all(drawn):
            problems.append("the fitted law is not finite here: some curves not drawn")
        if problems:
            _note(ax, "; ".join(problems))
    if missing:  # a loss falls with N: the upper right is where no run is
        _note(ax, missing, top=True)
    _log_axes(ax)
    _size_axis(ax.xaxis)
    ax.set_xlabel(N_LABEL)
    ax.set_ylabel(LOSS_LABEL)
    title = "loss vs model size"
    if fit is not None:
        title += f" — {fit.name.split(':')[0]} fit"
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, title="training tokens", title_fontsize=7, loc="center left",
              bbox_to_anchor=(1.02, 0.5))
    return figure


def plot_loss_vs_compute(frame: pd.DataFrame, fit: ScalingFit | None = None,
                         into=None) -> Figure:
    """Loss against FLOPs, one colour per model size, with the compute frontier (the lowest loss
    reached at each C). For curves (a ``run_id`` column, one row per step) the runs are lines and
    the frontier is approach 1's lower envelope (from ``fit`` when given); for run results the
    frontier is the running minimum over C."""
    figure, ax = _figure(into=into)
    colours = _colours(frame["params"].to_numpy(), "plasma")
    curves = "run_id" in frame and frame["run_id"].duplicated().any()
    if curves:
        for run, group in frame.sort_values("flops").groupby("run_id"):
            size = group["params"].iloc[0]
            ax.plot(group["flops"], group["loss"], color=colours[size], lw=0.9, alpha=0.8)
        if fit is not None and "envelope" in fit.details:
            envelope = fit.details["envelope"]
        else:
            envelope = lower_envelope(frame["run_id"], frame["params"], frame["tokens"],
                                      frame["loss"], frame["flops"])
        ax.plot(envelope["flops"], envelope["loss"], color="black", lw=2, label="frontier")
    else:
        ax.scatter(frame["flops"], frame["loss"], c=[colours[v] for v in frame["params"]], s=22,
                   zorder=3)
        ordered = frame.sort_values("flops")
        ax.step(ordered["flops"], ordered["loss"].cummin(), where="post", color="black", lw=2,
                label="frontier")
    for size in list(colours)[:: max(1, len(colours) // 8)]:
        ax.plot([], [], color=colours[size], label=f"N = {size:.3g}")
    _log_axes(ax)
    ax.set_xlabel(C_LABEL)
    ax.set_ylabel(LOSS_LABEL)
    ax.set_title("loss vs compute with the compute frontier", fontsize=10)
    ax.legend(fontsize=7)
    return figure


def plot_isoflops(fit: ScalingFit, into=None) -> Figure:
    """Chinchilla Fig. 3 (left): per budget, loss against N with the fitted parabola in log N and
    its minimum; (right) the minima N_opt against C with the fitted power law."""
    if fit.approach != 2:
        raise FitInputError("plot_isoflops needs a Chinchilla approach 2 fit")
    figure, (left, right) = _figure(11, 4.4, ncols=2, into=into)
    profiles = fit.details["profiles"]
    colours = _colours([p["budget"] for p in profiles], "viridis")
    for profile in profiles:
        colour = colours[profile["budget"]]
        fitted = profile.get("fitted", np.ones(len(profile["loss"]), bool))
        sizes = np.exp(profile["log_n"])
        left.scatter(sizes[fitted], profile["loss"][fitted], color=colour, s=18, zorder=3,
                     label=f"C = {profile['budget']:.2g}")
        # Runs outside the window around the minimum: shown, not fitted.
        left.scatter(sizes[~fitted], profile["loss"][~fitted], facecolor="none",
                     edgecolor=colour, s=18, zorder=3)
        if profile.get("coefficients") is not None:
            low, high = np.log(profile.get("N_fit_min", sizes.min())), np.log(
                profile.get("N_fit_max", sizes.max()))
            x = np.linspace(low - 0.2, high + 0.2, 100)
            left.plot(np.exp(x), np.polyval(profile["coefficients"], x), color=colour, lw=1.2)
        left.scatter([profile["N_opt"]], [profile["loss_opt"]], color=colour, marker="v",
                     edgecolor="black", s=60, zorder=4)
    left.set_xscale("log")
    _size_axis(left.xaxis)
    left.set_xlabel(N_LABEL)
    left.set_ylabel(LOSS_LABEL)
    left.set_title("IsoFLOP profiles (▼ minimum; hollow: outside the fitted window)",
                   fontsize=10)
    left.legend(fontsize=7, title="budget (FLOPs)", title_fontsize=7)
    budgets = np.array([p["budget"] for p in profiles])
    right.scatter(budgets, _positive([p["N_opt"] for p in profiles]),
                  c=[colours[b] for b in budgets], edgecolor="black", zorder=3)
    for p in profiles:  # each budget's own bootstrap interval on N_opt
        if "N_opt_ci" in p and np.all(np.isfinite(_positive(p["N_opt_ci"]))):
            right.plot([p["budget"]] * 2, p["N_opt_ci"], color=colours[p["budget"]], lw=1.5)
    missing = _allocation_line(right, fit, "N_opt",
                               np.geomspace(budgets.min() / 3, budgets.max() * 3, 100))
    if missing:
        _note(right, "; ".join(_fit_problems(fit) + [missing]))
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel(C_LABEL)
    right.set_ylabel(f"optimal {N_LABEL}")
    right.set_title(f"N_opt ∝ C^{fit.params['a']:.3f}", fontsize=10)
    _legend(right)
    return figure


def plot_loss_contours(fit: ScalingFit, frame: pd.DataFrame | None = None,
                       into=None) -> Figure:
    """Chinchilla Fig. 4 (left): contours of the fitted L(N, D) over compute C and model size N
    (D = C / (k·N)), the efficient frontier N_opt(C), and the sweep's points."""
    if not fit.has_loss_model:
        raise FitInputError("plot_loss_contours needs a fit with L(N, D): Chinchilla approach 3 "
                            "or Kaplan form nd")
    figure, ax = _figure(6.8, 5.0, into=into)
    k = fit.flops_per_param_token
    if frame is not None and len(frame):
        c_low, c_high = frame["flops"].min() / 10, frame["flops"].max() * 100
        n_low, n_high = frame["params"].min() / 10, frame["params"].max() * 30
    else:
        c_low, c_high, n_low, n_high = 1e15, 1e24, 1e6, 1e12
    c_grid = np.geomspace(c_low, c_high, 200)
    n_grid = np.geomspace(n_low, n_high, 200)
    cc, nn = np.meshgrid(c_grid, n_grid)
    with np.errstate(all="ignore"):
        loss = _positive(fit.loss(nn, cc / (k * nn)))
    missing = []
    if np.sum(np.isfinite(loss)) >= 2 and np.nanmin(loss) < np.nanpercentile(loss, 90):
        levels = np.geomspace(np.nanmin(loss), np.nanpercentile(loss, 90), 14)
        contours = ax.contourf(cc, nn, loss, levels=levels, cmap="viridis_r", norm=LogNorm(),
                               extend="max")
        colorbar = figure.colorbar(contours, ax=ax, label=f"predicted {LOSS_LABEL}")
        colorbar.set_ticks(levels[::2])
        colorbar.set_ticklabels([f"{v:.3g}" for v in levels[::2]])
    else:
        missing.append("contours not drawn: the fitted L(N, D) is not finite and varying here")
    if not fit.allocation_determined:
        missing.append("frontier not drawn: the fit does not determine N_opt(C)")
    elif not _line(ax, c_grid, fit.optimal(c_grid)["N_opt"], color="tab:blue", lw=2.2,
                   label="efficient frontier N_opt(C)"):
        missing.append("frontier not drawn: N_opt(C) is not finite here")
    if missing:
        _note(ax, "; ".join(_fit_problems(fit) + missing))
    if frame is not None and len(frame):
        ax.scatter(frame["flops"], frame["params"], s=14, color="white", edgecolor="black",
                   label="sweep runs", zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(c_low, c_high)
    ax.set_ylim(n_low, n_high)
    ax.set_xlabel(C_LABEL)
    ax.set_ylabel(N_LABEL)
    ax.set_title("IsoLoss contours of the fitted L(N, D)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    return figure


def _allocation_line(ax, fit: ScalingFit, name: str, budgets: np.ndarray,
                     colour="tab:blue") -> str | None:
    """The fit's N_opt(C) or D_opt(C) with its bootstrap band; returns why it was not drawn, or
    None."""
    if not fit.allocation_determined:
        return f"{name}(C) not drawn: the fit does not determine it"
    with np.errstate(all="ignore"):
        drawn = _line(ax, budgets, fit.optimal(budgets)[name], color=colour, lw=1.8, label="fit")
        if drawn and fit.interval_samples:
            replicated = fit.optimal(budgets[:, None],
                                     {k: v[None, :] for k, v in fit.interval_samples.items()})
            tail = 50 * (1 - fit.ci_level)
            low, high = _positive(np.nanpercentile(_positive(replicated[name]),
                                                   [tail, 100 - tail], axis=1))
            if np.any(np.isfinite(low) & np.isfinite(high)):
                ax.fill_between(budgets, low, high, color=colour, alpha=0.25,
                                label=f"{100 * fit.ci_level:g}% bootstrap interval")
    return None if drawn else f"{name}(C) not drawn: it is not finite here"


def plot_optimal_allocation(fit: ScalingFit, frame: pd.DataFrame | None = None,
                            budgets: np.ndarray | None = None, into=None) -> Figure:
    """N_opt(C) and D_opt(C) with bootstrap interval bands (from the fit's replicates), plus the
    points each approach measured (IsoFLOP minima, envelope points) when it has them."""
    if not fit.has_allocation:
        raise FitInputError(f"{fit.title} has no compute-optimal allocation to draw")
    if budgets is None:
        if frame is not None and len(frame):
            budgets = np.geomspace(frame["flops"].min() / 3, frame["flops"].max() * 100, 120)
        else:
            budgets = np.geomspace(1e15, 1e24, 120)
    figure, (left, right) = _figure(11, 4.4, ncols=2, into=into)
    for ax, name, label in ((left, "N_opt", N_LABEL), (right, "D_opt", D_LABEL)):
        missing = _allocation_line(ax, fit, name, budgets,
                                   "tab:blue" if name == "N_opt" else "tab:green")
        if fit.approach == 2:
            profiles = fit.details["profiles"]
            ax.scatter([p["budget"] for p in profiles], _positive([p[name] for p in profiles]),
                       color="black", s=20, zorder=3, label="IsoFLOP minima")
        elif fit.approach == 1:
            envelope = fit.details["envelope"]
            inner = envelope[~envelope["boundary"]]
            column = "params" if name == "N_opt" else "tokens"
            ax.scatter(inner["flops"], inner[column], color="black", s=6, zorder=3,
                       label="envelope")
        if missing:
            if frame is not None and len(frame):  # at least the runs themselves
                column = "params" if name == "N_opt" else "tokens"
                ax.scatter(frame["flops"], frame[column], color="grey", s=14, zorder=3,
                           label="runs")
            _note(ax, "; ".join(_fit_problems(fit) + [missing]))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(C_LABEL)
        ax.set_ylabel(f"optimal {label}")
        _legend(ax)
    exponent_a = fit.params.get("a")
    exponent_b = fit.params.get("b")
    if not fit.allocation_determined:
        left.set_title("N_opt(C): not determined by this fit", fontsize=10)
        right.set_title("D_opt(C): not determined by this fit", fontsize=10)
    elif exponent_a is not None:
        left.set_title(f"N_opt ∝ C^{exponent_a:.3f}", fontsize=10)
        right.set_title(f"D_opt ∝ C^{exponent_b:.3f}", fontsize=10)
    figure.suptitle(fit.name.split(":")[0], fontsize=10)
    return figure


def plot_group_frontiers(grouped, budgets: np.ndarray | None = None) -> Figure:
    """One fit per group (``attnlab.scaling.tables.grouped.GroupedFits``) in one figure: (left)
    each group's compute-optimal N_opt(C) with its bootstrap band, (right) each group's runs, loss
    against compute, with the loss along its compute-optimal frontier when the law models one
    (approach 3, Kaplan L(N, D))."""
    frames = {g: t.frame for g, t in grouped.tables.items()}
    if budgets is None:
        flops = np.concatenate([f["flops"].to_numpy() for f in frames.values()])
        budgets = np.geomspace(flops.min() / 3, flops.max() * 30, 120)
    figure, (left, right) = _figure(11.5, 4.6, ncols=2)
    palette = colormaps["tab10"]
    notes = []
    for i, (group, fit) in enumerate(grouped.fits.items()):
        colour = palette(i % 10)
        missing = (_allocation_line(left, fit, "N_opt", budgets, colour)
                   if fit.has_allocation else f"{group}: no allocation")
        if missing:
            notes.append(f"{group}: {missing}")
        for line in left.get_lines()[-1:]:
            if line.get_label() == "fit":
                line.set_label(group)
        frame = frames[group]
        right.scatter(frame["flops"], frame["loss"], color=colour, s=14, label=group, zorder=3)
        if fit.has_loss_model and fit.allocation_determined:
            with np.errstate(all="ignore"):
                _line(right, budgets, fit.optimal(budgets)["loss"], color=colour, lw=1.5)
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(C_LABEL)
    right.yaxis.set_major_formatter(ScalarFormatter())
    right.yaxis.set_minor_formatter(ScalarFormatter())
    left.set_ylabel(f"optimal {N_LABEL}")
    right.set_ylabel(LOSS_LABEL)
    left.set_title(f"compute-optimal N_opt(C) per {grouped.by}", fontsize=10)
    right.set_title("runs and loss along each frontier", fontsize=10)
    if notes:
        _note(left, "; ".join(notes))
    # The bands' labels repeat per group: keep one legend entry per group name.
    handles, labels = left.get_legend_handles_labels()
    keep = [(h, lab) for h, lab in zip(handles, labels) if lab in grouped.fits]
    if keep:
        left.legend(*zip(*keep), fontsize=7, title=grouped.by, title_fontsize=7)
    _legend(right)
    return figure


def plot_holdout(result) -> Figure:
    """Predicted against observed loss for the runs a fit did not see
    (``attnlab.scaling.tables.holdout.HoldoutResult``), with each prediction's bootstrap interval,
    the naive baseline's prediction (open markers) and the identity line; the title gives the mean
    |relative error| and the law's skill against the baseline."""
    frame = result.frame
    figure, ax = _figure(5.6, 5.0)
    shown = np.concatenate([frame["observed"], frame["predicted"], frame["baseline"]])
    low, high = np.nanmin(shown), np.nanmax(shown)
    pad = 0.05 * (high - low if high > low else max(abs(high), 1.0))
    ax.plot([low - pad, high + pad], [low - pad, high + pad], color="grey", lw=1,
            label="predicted = observed")
    has_interval = frame["low"].notna()
    if has_interval.any():
        ax.errorbar(frame["observed"][has_interval], frame["predicted"][has_interval],
                    yerr=[frame["predicted"][has_interval] - frame["low"][has_interval],
                          frame["high"][has_interval] - frame["predicted"][has_interval]],
                    fmt="none", ecolor="tab:blue", alpha=0.6, label="bootstrap interval")
    if frame["baseline"].notna().any():
        ax.scatter(frame["observed"], frame["baseline"], facecolors="none", edgecolors="grey",
                   zorder=2, label="naive baseline")
    points = ax.scatter(frame["observed"], frame["predicted"], c=np.log10(frame["params"]),
                        cmap="viridis", zorder=3)
    figure.colorbar(points, ax=ax, label="log10 parameters N")
    name = result.fit.part.loss_name  # what the law predicts: a loss, a target, an accuracy
    label = LOSS_LABEL if name == "loss" else name.replace("_", " ")
    ax.set_xlabel(f"observed {label}")
    ax.set_ylabel(f"predicted {label}")
    summary = result.summary()
    skill = summary["baseline"]["skill"]
    ax.set_title(f"held out ({result.spec}): {summary['held_out_runs']} runs, mean |error| "
                 f"{100 * summary['mean_abs_relative_error']:.2f}%"
                 + (f", skill {skill:.2f} against the baseline" if skill is not None else ""),
                 fontsize=10)
    problems = _fit_problems(result.fit)
    if problems:
        _note(ax, "; ".join(problems))
    _legend(ax)
    return figure
