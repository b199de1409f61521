"""Effective compute multipliers of grouped fits against a baseline (``attnlab fit --by=COLUMN
--multiplier-against=BASE``), and the loss difference at the largest observed budget.

The multiplier of group X against baseline B at a reference compute C_ref is the compute B's
fitted law needs to reach X's compute-optimal loss at C_ref, divided by C_ref (> 1: X is better).
Along Chinchilla's compute-optimal frontier (Hoffmann et al. 2022 Eq. 4, N_opt = G (C/k)^a,
D_opt = (C/k)^b / G) both reducible terms fall as (C/k)^-gamma with gamma = alpha·beta/(alpha+beta)
(alpha·a = beta·b = gamma), so

    L*_B(C) = E + K (C/k)^-gamma,   K = A G^-alpha + B G^beta
    C_B(L)  = k ((L - E) / K)^(-1/gamma)              for L > E, infinite otherwise
    multiplier = C_B(L*_X(C_ref)) / C_ref = ((L*_X(C_ref) - E) / (L*_B(C_ref) - E))^(-1/gamma)

The interval pairs each bootstrap replicate of X's fit with a replicate of B's drawn at random
(without replacement): each group's runs are resampled on their own, so the pairs are draws of
the bootstrap over both groups' runs (and seeds, which are runs).

The loss difference needs no law: at the largest budget both groups ran, each group's best size
(the lowest mean final loss over that size's seeds) minus the baseline's, with an interval from
resampling the seeds of each size (``bootstrap.resample_within_groups``); with one seed per size
there is no spread to resample, and no interval is given.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from attnlab.scaling import equations
from attnlab.scaling.bootstrap import percentile_interval, resample_within_groups
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.result import ScalingFit

COLUMNS = ("C_ref", "multiplier", "multiplier_low", "multiplier_high", "loss", "loss_base",
           "budget", "loss_diff", "loss_diff_low", "loss_diff_high", "note")


def compute_to_reach(params, loss, flops_per_param_token: float = equations.FLOPS_PER_PARAM_TOKEN):
    """The compute at which the law ``params`` (Chinchilla, floats or [replicates]) reaches
    ``loss`` on its compute-optimal frontier (the module docstring's C_B(L)); inf where
    loss <= E (the law never gets there), NaN for a replicate that is no law."""
    with np.errstate(all="ignore"):
        alpha, beta = params["alpha"], params["beta"]
        gamma = alpha * beta / (alpha + beta)
        g = equations.allocation_coefficient(params["A"], params["B"], alpha, beta)
        k = params["A"] * np.power(g, -alpha) + params["B"] * np.power(g, beta)
        excess = np.asarray(loss, np.float64) - params["E"]
        reach = flops_per_param_token * np.power(excess / k, -1.0 / gamma)
        return np.where(excess > 0, reach, np.where(np.isnan(excess), np.nan, np.inf))


def _multiplier_interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    """The percentile interval of replicates that may be +inf (the baseline never reaches the
    loss): an inverted-CDF percentile ranks them last instead of dropping them."""
    samples = samples[~np.isnan(samples)]
    if samples.size == 0:
        return (math.nan, math.nan)
    if np.isfinite(samples).all():
        return percentile_interval(samples, level)
    tail = 50.0 * (1.0 - level)
    low, high = np.percentile(samples, [tail, 100.0 - tail], method="inverted_cdf")
    return (float(low), float(high))


def effective_multiplier(base: ScalingFit, other: ScalingFit, reference: float, *,
                         seed: int = 0) -> dict:
    """{"multiplier", "ci": (low, high) or NaNs, "loss", "loss_base", "note"} of ``other``
    against ``base`` at ``reference`` FLOPs. Both must be approach-3 fits that determine the
    allocation; otherwise the multiplier is NaN and ``note`` says why in one line."""
    nan = math.nan
    out = {"multiplier": nan, "ci": (nan, nan), "loss": nan, "loss_base": nan, "note": ""}
    for role, fit in (("baseline", base), ("group", other)):
        if not fit.part.can("closed-frontier"):
            out["note"] = f"the {role}'s fit is {fit.name}: the multiplier needs approach 3's law"
            return out
        if not fit.allocation_determined:
            unpinned = ", ".join(fit.unpinned) or "a non-finite estimate"
            out["note"] = f"the {role}'s law is not pinned ({unpinned}): no multiplier"
            return out
    k = base.flops_per_param_token
    loss = float(other.optimal(reference)["loss"])
    loss_base = float(base.optimal(reference)["loss"])
    out.update(loss=loss, loss_base=loss_base,
               multiplier=float(compute_to_reach(base.params, loss, k)) / reference)
    if not math.isfinite(out["multiplier"]):
        out["note"] = (f"its loss {loss:.4g} is at or below the baseline's fitted floor "
                       f"E = {base.params['E']:.4g}: the baseline never reaches it")
    replicates = min(base.n_bootstrap, other.n_bootstrap)
    if base.intervals_refused or other.intervals_refused:
        replicates = 0  # too many failed refits: no interval conditioned on the survivors
        out["ci_note"] = "not computed: more than 10% of a fit's bootstrap refits failed"
    if replicates:
        # fit_by seeds every group's bootstrap alike, so replicate i of two groups resampled the
        # same row positions; a random pairing makes the pairs independent draws.
        order = np.random.default_rng(seed).permutation(replicates)
        base_samples = {n: np.asarray(v)[:replicates][order] for n, v in base.samples.items()}
        other_samples = {n: np.asarray(v)[:replicates] for n, v in other.samples.items()}
        losses = other.optimal(reference, other_samples)["loss"]
        samples = compute_to_reach(base_samples, losses, k) / reference
        out["ci"] = _multiplier_interval(np.asarray(samples, np.float64), base.ci_level)
    return out


def _best_size_loss(frame: pd.DataFrame, rows: np.ndarray) -> float:
    """The lowest mean loss over the sizes (``params``) of ``frame.iloc[rows]``."""
    picked = frame.iloc[rows]
    return float(picked.groupby("params")["loss"].mean().min())


def loss_difference(base: pd.DataFrame, other: pd.DataFrame, *, n_bootstrap: int,
                    level: float, seed: int = 0) -> dict:
    """{"budget", "loss_diff", "ci", "note"}: at the largest ``budget`` both tables (canonical
    columns params, loss, budget) hold, ``other``'s best size's mean loss minus ``base``'s
    (< 0: other is better), with a percentile interval from resampling the seeds of each size."""
    nan = math.nan
    out = {"budget": nan, "loss_diff": nan, "ci": (nan, nan), "note": ""}
    if "budget" not in base.columns or "budget" not in other.columns:
        out["note"] = "no budget column: no loss difference at the largest budget"
        return out
    shared = set(base["budget"].dropna()) & set(other["budget"].dropna())
    if not shared:
        out["note"] = "no budget run by both: no loss difference"
        return out
    budget = max(shared)
    cells = [f[f["budget"] == budget].reset_index(drop=True) for f in (base, other)]
    everything = [np.arange(len(c)) for c in cells]
    out.update(budget=float(budget), loss_diff=_best_size_loss(cells[1], everything[1])
               - _best_size_loss(cells[0], everything[0]))
    seeded = all(c.groupby("params").size().max() > 1 for c in cells)
    if not seeded:
        out["note"] = (f"one run per size at budget {budget:.3g} in at least one group: no "
                       f"interval for the loss difference (add seeds)")
        return out
    if n_bootstrap:
        rng = np.random.default_rng(seed)
        labels = [c["params"].to_numpy() for c in cells]
        diffs = [_best_size_loss(cells[1], resample_within_groups(labels[1], rng))
                 - _best_size_loss(cells[0], resample_within_groups(labels[0], rng))
                 for _ in range(n_bootstrap)]
        out["ci"] = percentile_interval(np.asarray(diffs), level)
    return out


def multipliers_against(grouped, base: str, reference: float, *, n_bootstrap: int | None = None,
                        seed: int = 0) -> pd.DataFrame:
    """One row per group other than ``base`` of a ``GroupedFits`` (approach 3): the columns of
    :data:`COLUMNS`, led by the group column (named ``grouped.by``). A group that was skipped or
    whose law is not pinned gets NaNs and a one-line ``note``. FitInputError when ``base`` is no
    group or could not be fitted."""
    groups = [*grouped.fits, *grouped.skipped]
    if base not in groups:
        raise FitInputError(f"--multiplier-against: {base!r} is not a value of {grouped.by} "
                            f"(its values: {', '.join(map(str, groups))})")
    if base not in grouped.fits:
        raise FitInputError(f"--multiplier-against: the baseline {grouped.by}={base} could not "
                            f"be fitted: {grouped.skipped[base]}")
    base_fit = grouped.fits[base]
    level = base_fit.ci_level
    n_bootstrap = base_fit.n_bootstrap_requested if n_bootstrap is None else n_bootstrap
    rows = []
    for group in groups:
        if group == base:
            continue
        row = {grouped.by: group, "C_ref": float(reference)}
        if group in grouped.skipped:
            row.update(multiplier=math.nan, note=f"not fitted: {grouped.skipped[group]}")
            rows.append(row)
            continue
        m = effective_multiplier(base_fit, grouped.fits[group], reference, seed=seed)
        d = loss_difference(grouped.tables[base].frame, grouped.tables[group].frame,
                            n_bootstrap=n_bootstrap, level=level, seed=seed)
        row.update(multiplier=m["multiplier"], multiplier_low=m["ci"][0],
                   multiplier_high=m["ci"][1], loss=m["loss"], loss_base=m["loss_base"],
                   budget=d["budget"], loss_diff=d["loss_diff"], loss_diff_low=d["ci"][0],
                   loss_diff_high=d["ci"][1], note="; ".join(n for n in (m["note"], d["note"])
                                                          if n))
        rows.append(row)
    frame = pd.DataFrame(rows, columns=[grouped.by, *COLUMNS])
    for column in COLUMNS[:-1]:
        frame[column] = pd.to_numeric(frame[column])
    frame["note"] = frame["note"].fillna("")
    frame.attrs.update(by=grouped.by, base=base, level=level)
    return frame


def grouped_multipliers(grouped, base: str, budgets: list[float]):
    """The multipliers of every group of a ``GroupedFits`` against ``base`` at each budget
    (default: the largest fitted run's compute, to 3 digits: inside every group's data), one
    table."""
    if not budgets:
        largest = max(t.frame["flops"].max() for t in grouped.tables.values())
        budgets = [float(f"{largest:.3g}")]
    frames = [multipliers_against(grouped, base, c) for c in budgets]
    frame = pd.concat(frames, ignore_index=True)
    frame.attrs.update(frames[0].attrs)
    return frame


def format_multipliers(frame: pd.DataFrame) -> str:
    """The multipliers as a fixed-width table: ``estimate [low, high]`` cells, then the notes."""
    by, base = frame.attrs["by"], frame.attrs["base"]
    level = f"{100 * frame.attrs.get('level', 0.95):g}%"

    def cell(row, name, spec):
        value = row[name]
        if not np.isfinite(value):
            return "inf" if value == np.inf else "-"
        low, high = row[f"{name}_low"], row[f"{name}_high"]
        text = format(value, spec)
        if not (np.isnan(low) or np.isnan(high)):
            text += f" [{format(low, spec)}, {format(high, spec)}]"
        return text

    header = [by, "C_ref", f"multiplier [{level}]", "budget", f"loss diff [{level}]"]
    body = [[str(row[by]), f"{row['C_ref']:.3g}", cell(row, "multiplier", ".3g"),
             "-" if not np.isfinite(row["budget"]) else f"{row['budget']:.3g}",
             cell(row, "loss_diff", "+.4f")] for _, row in frame.iterrows()]
    widths = [max(len(h), *(len(line[i]) for line in body)) if body else len(h)
              for i, h in enumerate(header)]
    lines = [f"effective compute multiplier against {by}={base}: the compute {base}'s law needs "
             f"to reach each {by}'s compute-optimal loss at C_ref, / C_ref (> 1: better); loss "
             f"diff: best size's loss minus {base}'s at the largest budget both ran (< 0: "
             f"better, no law)",
             "  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in body]
    lines += [f"note [{row[by]}]: {row['note']}" for _, row in frame.iterrows() if row["note"]]
    return "\n".join(lines) + "\n"
