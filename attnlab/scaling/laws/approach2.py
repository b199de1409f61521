"""Chinchilla approach 2: IsoFLOP profiles (Hoffmann et al. 2022 Sec. 3.2, Fig. 3).

For each compute budget C, find the model size N_opt(C) that minimises the final loss over the
runs of that budget; D_opt(C) is read off the budget's own log D-log N line (log(C/6) - log N
when C = 6ND). Then fit N_opt = k_N·C^a and D_opt = k_D·C^b in log-log space.

How each budget's minimum is found (``profile``):

- ``"window"`` (default): a parabola in log N over the sizes near the empirical minimum, those
  within a factor 10^``window`` (default 10^0.5, so one decade in all) of the best run's N,
  widened to the five sizes nearest it when fewer fall inside (three points would fit a
  parabola exactly, and its vertex would follow every run's noise). A single parabola is a good
  model of an IsoFLOP profile only near its minimum: published suites span two to three decades
  of N per budget (Porian et al. 2024: 5M-900M at every budget), where a whole-ladder parabola
  puts its vertex off the minimum and biases a.
- ``"akima"``: Porian et al. 2024's rule: an Akima spline through the profile in log N, its
  argmin on a fine grid.
- ``"whole"``: one parabola over the whole ladder (Chinchilla's own narrow ladders; the old
  default).

Edge check: a budget whose best run is the smallest or the largest size at that budget (its
profile's, or its slice's on a ladder, not the whole ladder's) has its minimum outside the sizes
trained; it is excluded from the fit, loudly (a warning naming it).

Intervals and weights: bootstrap replicates resample the runs within each budget (a stratified
bootstrap keeps every profile), or, when the table has clusters (a ladder's trunks), whole
clusters across budgets, and redo both stages. A replicate with fewer than two usable profiles
fails; past ``bootstrap.MAX_FAILED_SHARE`` of failures the fit reports no interval. The
spread of each budget's log N_opt over the replicates is its standard error (reported per
budget, with a percentile interval); the power law log N_opt = a log C + log k_N is then fit by
weighted least squares with weights 1/se^2 (Porian et al. 2024), so a budget whose minimum is
poorly determined counts less. Without a bootstrap the weights are equal.
"""

from __future__ import annotations

import numpy as np
from scipy.interpolate import Akima1DInterpolator

from attnlab.cli_vocab import Flag
from attnlab.scaling.bootstrap import (cluster_index, percentile_interval, resample_rows,
                                       resample_within_groups)
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.laws.chinchilla import ChinchillaLaw
from attnlab.scaling.points import budget_labels
from attnlab.scaling.result import ScalingFit

MIN_SIZES_PER_BUDGET = 3  # a parabola has 3 coefficients
# A windowed parabola takes at least this many sizes (when the ladder has them): three points
# fit a parabola exactly, so its vertex would follow every run's noise.
MIN_WINDOW_SIZES = 5
PROFILES = ("window", "akima", "whole")
DEFAULT_WINDOW = 0.5  # decades of N either side of the best run
# The smallest standard error of log N_opt used as a weight (a budget whose bootstrap replicates
# all agree would otherwise take every weight).
MIN_LOG_N_SE = 0.01
AKIMA_GRID = 512  # points of the fine log N grid the spline is minimised on



def parabola_vertex(log_n: np.ndarray, loss: np.ndarray):
    """Least-squares parabola loss = c2·x^2 + c1·x + c0 in x = log N; returns
    (coefficients [c2, c1, c0], vertex x* = -c1/(2·c2), loss at x*) or None when it opens
    downward (no minimum)."""
    coefficients = np.polyfit(log_n, loss, 2)
    c2, c1, _ = coefficients
    if not c2 > 0:
        return None
    x_star = -c1 / (2.0 * c2)
    return coefficients, float(x_star), float(np.polyval(coefficients, x_star))


def profile_window(sizes: np.ndarray, best: float, window: float) -> np.ndarray:
    """The sizes (sorted log N, [sizes]) a windowed profile fits: within ``window`` decades of
    ``best`` (the best run's log N), widened to the MIN_WINDOW_SIZES nearest to it."""
    distance = np.abs(sizes - best)
    inside = distance <= window * np.log(10.0) + 1e-12
    if inside.sum() < MIN_WINDOW_SIZES:
        inside = np.zeros_like(inside)
        inside[np.argsort(distance, kind="stable")[:MIN_WINDOW_SIZES]] = True
    return sizes[inside]


def _akima_minimum(sizes: np.ndarray, mean_loss: np.ndarray):
    """(x*, loss at x*) of the Akima spline through (log N, mean loss) on a fine grid."""
    spline = Akima1DInterpolator(sizes, mean_loss)
    grid = np.linspace(sizes[0], sizes[-1], AKIMA_GRID)
    values = spline(grid)
    best = int(np.argmin(values))
    return float(grid[best]), float(values[best])


def isoflop_profiles(log_n, log_d, loss, labels, *, profile: str = "window",
                     window: float = DEFAULT_WINDOW):
    """Per budget: the minimum of its profile (see the module docstring for ``profile``).
    Returns (profiles, skipped, edges): profiles a list of dicts (budget, N_opt, D_opt,
    loss_opt, the points used, ...); skipped and edges lists of (budget, reason), edges for the
    budgets whose best run lies at an end of the ladder."""
    profiles, skipped, edges = [], [], []
    for budget in np.unique(labels):
        at = labels == budget
        sizes = np.unique(log_n[at])
        if len(sizes) < MIN_SIZES_PER_BUDGET:
            skipped.append((float(budget), f"{len(sizes)} distinct model size(s), a profile "
                                            f"needs {MIN_SIZES_PER_BUDGET}"))
            continue
        mean_loss = np.array([loss[at][log_n[at] == x].mean() for x in sizes])
        best = sizes[int(np.argmin(mean_loss))]
        if profile != "whole" and best in (sizes[0], sizes[-1]):
            end = "smallest" if best == sizes[0] else "largest"
            edges.append((float(budget), f"its best run is the {end} size at this budget "
                                         f"(N = {np.exp(best):.3g}), so its minimum lies outside "
                                         f"the sizes trained"))
            continue
        used = sizes if profile == "whole" else profile_window(sizes, best, window)
        chosen = at & np.isin(log_n, used)
        coefficients = None
        if profile == "akima":
            x_star, loss_star = _akima_minimum(sizes, mean_loss)
        else:
            vertex = parabola_vertex(log_n[chosen], loss[chosen])
            if vertex is None:
                skipped.append((float(budget), "the parabola opens downward (no minimum)"))
                continue
            coefficients, x_star, loss_star = vertex
            width = used[-1] - used[0]
            if not used[0] - width <= x_star <= used[-1] + width:
                # A nearly flat parabola puts its vertex anywhere; one that far out is no
                # estimate.
                skipped.append((float(budget), f"the parabola's minimum (N = e^{x_star:.3g}) is "
                                                f"more than the sampled range away from the "
                                                f"sizes it was fitted to"))
                continue
        # log D is (close to) linear in log N along an IsoFLOP curve: read D_opt off that line.
        log_d_star = np.polyval(np.polyfit(log_n[at], log_d[at], 1), x_star)
        profiles.append({"budget": float(budget), "N_opt": float(np.exp(x_star)),
                         "D_opt": float(np.exp(log_d_star)), "loss_opt": loss_star,
                         "n_points": int(at.sum()), "n_fitted": int(chosen.sum()),
                         "N_min": float(np.exp(sizes[0])), "N_max": float(np.exp(sizes[-1])),
                         "N_fit_min": float(np.exp(used[0])), "N_fit_max": float(np.exp(used[-1])),
                         "coefficients": (None if coefficients is None
                                          else [float(c) for c in coefficients]),
                         "inside_range": bool(used[0] <= x_star <= used[-1]),
                         "log_n": log_n[at], "loss": loss[at], "fitted": chosen[at]})
    return profiles, skipped, edges


def _power_laws(budgets, log_n_opt, log_d_opt, weights):
    """Weighted least squares of log N_opt and log D_opt on log C ([budgets] each; NaN entries
    are left out). Returns (params a, b, k_N, k_D; weighted RSS of log N_opt), or None when
    fewer than two budgets are finite."""
    log_c = np.log(budgets)
    finite = np.isfinite(log_n_opt) & np.isfinite(log_d_opt)
    if finite.sum() < 2:
        return None
    log_c, log_n, log_d, w = log_c[finite], log_n_opt[finite], log_d_opt[finite], weights[finite]
    # np.polyfit's w multiplies the residuals, so it takes 1/se, not 1/se^2.
    a, log_kn = np.polyfit(log_c, log_n, 1, w=np.sqrt(w))
    b, log_kd = np.polyfit(log_c, log_d, 1, w=np.sqrt(w))
    residual = log_n - (a * log_c + log_kn)
    params = {"a": float(a), "b": float(b), "k_N": float(np.exp(log_kn)),
              "k_D": float(np.exp(log_kd))}
    return params, float(np.sum(w * residual**2))


def _optima(profiles, budgets):
    """[budgets] log N_opt and log D_opt of ``profiles`` at ``budgets`` (NaN where missing)."""
    found = {p["budget"]: p for p in profiles}
    log_n = np.array([np.log(found[c]["N_opt"]) if c in found else np.nan for c in budgets])
    log_d = np.array([np.log(found[c]["D_opt"]) if c in found else np.nan for c in budgets])
    return log_n, log_d


def _replicate_rows(used, labels, clusters, n_bootstrap: int, seed: int):
    """Yields each bootstrap replicate's row indices (into the table) drawn from ``used``: runs
    redrawn within their budget, or whole clusters when the table names them."""
    rng = np.random.default_rng(seed)
    groups = None if clusters is None else cluster_index(np.asarray(clusters)[used])
    for _ in range(n_bootstrap):
        yield used[resample_within_groups(labels[used], rng) if groups is None
                   else resample_rows(len(used), rng, groups)]


def _profile_weights(profiles: list[dict], replicates: list, ci_level: float,
                     notes: list[str]) -> np.ndarray:
    """1/se^2 of each budget's bootstrap log N_opt (equal weights without a bootstrap, or when
    fewer than two budgets have one); records each profile's N_opt interval and se."""
    weights = np.ones(len(profiles))
    if not replicates:
        return weights
    rep_n = np.array([r[0] for r in replicates])  # [replicates, budgets]
    for column, p in enumerate(profiles):
        values = rep_n[:, column][np.isfinite(rep_n[:, column])]
        se = float(np.std(values, ddof=1)) if len(values) > 1 else np.nan
        low, high = percentile_interval(np.exp(values), ci_level)
        p.update({"log_N_opt_se": se, "N_opt_ci": [low, high],
                  "replicates_with_minimum": int(len(values))})
    se = np.array([p["log_N_opt_se"] for p in profiles])
    weights = 1.0 / np.maximum(np.nan_to_num(se, nan=np.inf), MIN_LOG_N_SE) ** 2
    weights = np.where(np.isfinite(se), weights, 0.0)
    if np.count_nonzero(weights) < 2:
        notes.append("too few bootstrap replicates per budget for weights: equal weights")
        return np.ones(len(profiles))
    return weights


def _refit_replicates(fitted, replicates: list, weights, notes: list[str]) -> dict:
    """Stage 2 of the bootstrap: the weighted power laws refitted to each replicate's minima;
    {parameter: [refits]}. A replicate with fewer than two usable profiles is counted, noted and
    left out (ScalingFit refuses the interval when too many are)."""
    samples: dict[str, list] = {}
    failed = 0
    for rep_n_opt, rep_d_opt in replicates:
        refit = _power_laws(fitted, rep_n_opt, rep_d_opt, weights)
        if refit is None:
            failed += 1
            continue
        for name, value in refit[0].items():
            samples.setdefault(name, []).append(value)
    if failed:
        notes.append(f"{failed} of {len(replicates)} bootstrap refits had fewer than two usable "
                     f"profiles and were dropped")
    return {k: np.asarray(v) for k, v in samples.items()}


def fit_approach2(n, d, loss, flops, *, budget=None, n_bootstrap: int = 0,
                  ci_level: float = 0.95, seed: int = 0, source: str = "data",
                  profile: str = "window", window: float = DEFAULT_WINDOW,
                  clusters=None) -> ScalingFit:
    """Fits N_opt ~ C^a, D_opt ~ C^b from IsoFLOP profiles. n, d, loss, flops: [points];
    budget: optional [points] budget labels (else FLOPs are clustered); profile, window: how
    each budget's minimum is found (module docstring); clusters: [points] labels a replicate
    draws whole, across budgets (None: runs resampled within each budget). Each profile in
    ``details["profiles"]``
    carries its N_opt interval and standard error from the bootstrap."""
    if profile not in PROFILES:
        raise FitInputError(f"--profile must be one of {', '.join(PROFILES)}, not {profile!r}")
    if not window > 0:
        raise FitInputError(f"--window must be > 0 decades, not {window}")
    n, d, loss, flops = (np.asarray(x, np.float64) for x in (n, d, loss, flops))
    labels = budget_labels(flops, budget)
    budgets = np.unique(labels)
    if len(budgets) < 2:
        raise FitInputError(f"{source}: approach 2 needs IsoFLOP profiles at two or more compute "
                            f"budgets, but all {len(loss)} runs share one (C = {budgets[0]:.3g})")
    log_n, log_d = np.log(n), np.log(d)
    profiles, skipped, edges = isoflop_profiles(log_n, log_d, loss, labels, profile=profile,
                                                window=window)
    notes = [f"budget C = {c:.3g} skipped: {why}" for c, why in skipped]
    warn = [f"budget C = {c:.3g} excluded: {why}; add sizes beyond it to use it"
            for c, why in edges]
    if len(profiles) < 2:
        raise FitInputError(f"{source}: approach 2 needs at least two budgets with a usable "
                            f"IsoFLOP profile (>= {MIN_SIZES_PER_BUDGET} model sizes, minimum "
                            f"inside the ladder); found {len(profiles)}. "
                            + "; ".join(notes + warn))
    warn += [f"budget C = {p['budget']:.3g}: the parabola's minimum N = {p['N_opt']:.3g} lies "
             f"outside the sizes it was fitted to [{p['N_fit_min']:.3g}, {p['N_fit_max']:.3g}] "
             f"(extrapolated)" for p in profiles if not p["inside_range"]]
    fitted = np.array([p["budget"] for p in profiles])
    point_n, point_d = _optima(profiles, fitted)

    # Stage 1 of the bootstrap: each budget's N_opt over replicates that resample its runs.
    replicates = []
    if n_bootstrap > 0:
        used = np.flatnonzero(np.isin(labels, fitted))
        for index in _replicate_rows(used, labels, clusters, n_bootstrap, seed):
            replicate, _, _ = isoflop_profiles(log_n[index], log_d[index], loss[index],
                                               labels[index], profile=profile, window=window)
            replicates.append(_optima(replicate, fitted))
    weights = _profile_weights(profiles, replicates, ci_level, notes)
    point = _power_laws(fitted, point_n, point_d, weights)
    if point is None:
        raise FitInputError(f"{source}: approach 2 has fewer than two budgets with a finite "
                            f"minimum")
    params, rss = point

    samples = _refit_replicates(fitted, replicates, weights, notes)
    rule = {"window": f"a parabola over the sizes within 10^{window:g} of each budget's best run",
            "akima": "the minimum of an Akima spline through each profile",
            "whole": "a parabola over each budget's whole ladder"}[profile]
    notes.append(f"profiles: {rule}; log N_opt on log C by "
                 + ("least squares weighted by 1/se^2 of each budget's bootstrap log N_opt"
                    if replicates else "unweighted least squares (no bootstrap)"))
    return ScalingFit(part=IsoFLOP(), params=params, samples=samples,
                      ci_level=ci_level, n_points=int(sum(p["n_points"] for p in profiles)),
                      objective=rss,
                      objective_name="weighted sum of squared residuals of log N_opt against "
                                     "log C",
                      n_bootstrap_requested=n_bootstrap, warnings=tuple(warn),
                      notes=tuple(notes),
                      # Without clusters a replicate redraws each budget's runs from that
                      # budget alone (stratified); with them, the table's clusters say it.
                      resampling={} if clusters is not None else {
                          "unit": "run", "column": "run_id", "within": "budget",
                          "clusters": int(sum(p["n_points"] for p in profiles))},
                      details={"profiles": profiles, "profile": profile, "window": window,
                               "excluded_budgets": [{"budget": c, "reason": why}
                                                    for c, why in edges]})


class IsoFLOP(ChinchillaLaw):
    """Approach 2: each FLOP budget's minimum along its IsoFLOP profile, then power laws."""

    variant = 2
    title = "Chinchilla approach 2: IsoFLOP parabolas, N_opt = k_N C^a, D_opt = k_D C^b"
    n_parameters = 4
    capabilities = ChinchillaLaw.capabilities | {"isoflop"}
    flags = (
        Flag("profile", "enum", "window", "Approach 2: how each budget's minimum is found: a "
             "parabola over the sizes near the best run (window), an Akima spline (akima), or "
             "one parabola over the whole ladder (whole).", enum_values=PROFILES),
        Flag("window", "float", DEFAULT_WINDOW, "Approach 2, --profile=window: decades of N "
             "either side of each budget's best run."))

    def options(self, given):
        return {"profile": given.get("profile") or "window",
                "window": DEFAULT_WINDOW if given.get("window") is None else given["window"]}

    def fit(self, table, *, n_bootstrap, ci_level, seed, profile="window",
            window=DEFAULT_WINDOW, clusters=None, **_):
        return fit_approach2(table.array("params"), table.array("tokens"), table.array("loss"),
                             table.array("flops"), budget=table.budget, profile=profile,
                             window=window, n_bootstrap=n_bootstrap, ci_level=ci_level,
                             seed=seed, source=table.source, clusters=clusters)
