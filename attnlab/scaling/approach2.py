"""Chinchilla approach 2: IsoFLOP profiles (Hoffmann et al. 2022 Sec. 3.2, Fig. 3).

For each compute budget C, fit a parabola to the final loss against log N over the runs of that
budget; its vertex is N_opt(C) (and D_opt(C), read off the budget's own log D-log N line, which
is log(C/6) - log N when C = 6ND). Then fit N_opt = k_N·C^a and D_opt = k_D·C^b by least squares
in log-log space. Bootstrap replicates resample the runs within each budget (a stratified
bootstrap keeps every budget's profile) and redo both stages.
"""

from __future__ import annotations

import numpy as np

from attnlab.scaling.bootstrap import resample_within_groups
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.result import ScalingFit

MIN_SIZES_PER_BUDGET = 3  # a parabola has 3 coefficients
# Runs whose FLOPs differ by less than this factor belong to one budget when the table has no
# budget column (rounding of steps makes a budget's runs differ by a few percent).
BUDGET_TOLERANCE = 1.25


def budget_labels(flops: np.ndarray, budget: np.ndarray | None = None) -> np.ndarray:
    """[points] the budget of each run: the ``budget`` column when given, else clusters of
    ``flops`` (sorted values split wherever consecutive ones differ by > BUDGET_TOLERANCE),
    each labelled by its geometric mean."""
    if budget is not None:
        return np.asarray(budget, np.float64)
    log_c = np.log(np.asarray(flops, np.float64))
    order = np.argsort(log_c)
    cluster = np.concatenate([[0], np.cumsum(np.diff(log_c[order]) > np.log(BUDGET_TOLERANCE))])
    labels = np.empty_like(log_c)
    for k in np.unique(cluster):
        members = order[cluster == k]
        labels[members] = np.exp(log_c[members].mean())
    return labels


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


def isoflop_profiles(log_n, log_d, loss, labels):
    """Per budget: the parabola and its vertex. Returns (profiles, skipped): profiles is a list of
    dicts (budget, N_opt, D_opt, loss_opt, ...), skipped a list of (budget, reason)."""
    profiles, skipped = [], []
    for budget in np.unique(labels):
        at = labels == budget
        sizes = np.unique(log_n[at])
        if len(sizes) < MIN_SIZES_PER_BUDGET:
            skipped.append((float(budget), f"{len(sizes)} distinct model size(s), a parabola "
                                            f"needs {MIN_SIZES_PER_BUDGET}"))
            continue
        vertex = parabola_vertex(log_n[at], loss[at])
        if vertex is None:
            skipped.append((float(budget), "the parabola opens downward (no minimum)"))
            continue
        coefficients, x_star, loss_star = vertex
        width = sizes[-1] - sizes[0]
        if not sizes[0] - width <= x_star <= sizes[-1] + width:
            # A nearly flat parabola puts its vertex anywhere; one that far out is no estimate.
            skipped.append((float(budget), f"the parabola's minimum (N = e^{x_star:.3g}) is "
                                            f"more than the sampled range away from the sizes "
                                            f"trained"))
            continue
        # log D is (close to) linear in log N along an IsoFLOP curve: read D_opt off that line.
        log_d_star = np.polyval(np.polyfit(log_n[at], log_d[at], 1), x_star)
        profiles.append({"budget": float(budget), "N_opt": float(np.exp(x_star)),
                         "D_opt": float(np.exp(log_d_star)), "loss_opt": loss_star,
                         "n_points": int(at.sum()), "N_min": float(np.exp(sizes[0])),
                         "N_max": float(np.exp(sizes[-1])),
                         "coefficients": [float(c) for c in coefficients],
                         "inside_range": bool(sizes[0] <= x_star <= sizes[-1]),
                         "log_n": log_n[at], "loss": loss[at]})
    return profiles, skipped


def _power_laws(profiles):
    log_c = np.log([p["budget"] for p in profiles])
    log_n = np.log([p["N_opt"] for p in profiles])
    log_d = np.log([p["D_opt"] for p in profiles])
    a, log_kn = np.polyfit(log_c, log_n, 1)
    b, log_kd = np.polyfit(log_c, log_d, 1)
    residual = log_n - (a * log_c + log_kn)
    params = {"a": float(a), "b": float(b), "k_N": float(np.exp(log_kn)),
              "k_D": float(np.exp(log_kd))}
    return params, float(residual @ residual)


def fit_approach2(n, d, loss, flops, *, budget=None, n_bootstrap: int = 0,
                  ci_level: float = 0.95, seed: int = 0, source: str = "data") -> ScalingFit:
    """Fits N_opt ~ C^a, D_opt ~ C^b from IsoFLOP profiles. n, d, loss, flops: [points];
    budget: optional [points] budget labels (else FLOPs are clustered)."""
    n, d, loss, flops = (np.asarray(x, np.float64) for x in (n, d, loss, flops))
    labels = budget_labels(flops, budget)
    budgets = np.unique(labels)
    if len(budgets) < 2:
        raise FitInputError(f"{source}: approach 2 needs IsoFLOP profiles at two or more compute "
                            f"budgets, but all {len(loss)} runs share one (C = {budgets[0]:.3g})")
    log_n, log_d = np.log(n), np.log(d)
    profiles, skipped = isoflop_profiles(log_n, log_d, loss, labels)
    notes = [f"budget C = {c:.3g} skipped: {why}" for c, why in skipped]
    if len(profiles) < 2:
        raise FitInputError(f"{source}: approach 2 needs at least two budgets with a usable "
                            f"IsoFLOP parabola (>= {MIN_SIZES_PER_BUDGET} model sizes, opening "
                            f"upward); found {len(profiles)}. " + "; ".join(notes))
    params, rss = _power_laws(profiles)
    warn = [f"budget C = {p['budget']:.3g}: the parabola's minimum N = {p['N_opt']:.3g} lies "
            f"outside the sampled sizes [{p['N_min']:.3g}, {p['N_max']:.3g}] (extrapolated)"
            for p in profiles if not p["inside_range"]]

    samples: dict[str, list] = {}
    if n_bootstrap > 0:
        rng = np.random.default_rng(seed)
        used = np.flatnonzero(np.isin(labels, [p["budget"] for p in profiles]))
        failed = 0
        for _ in range(n_bootstrap):
            index = used[resample_within_groups(labels[used], rng)]
            replicate, _ = isoflop_profiles(log_n[index], log_d[index], loss[index],
                                            labels[index])
            if len(replicate) < 2:
                failed += 1
                continue
            for name, value in _power_laws(replicate)[0].items():
                samples.setdefault(name, []).append(value)
        if failed:
            notes.append(f"{failed} of {n_bootstrap} bootstrap refits had fewer than two usable "
                         f"parabolas and were dropped")
    return ScalingFit(law="chinchilla", approach=2, form="", params=params,
                      samples={k: np.asarray(v) for k, v in samples.items()},
                      ci_level=ci_level, n_points=int(sum(p["n_points"] for p in profiles)),
                      objective=rss,
                      objective_name="sum of squared residuals of log N_opt against log C",
                      n_bootstrap_requested=n_bootstrap, warnings=tuple(warn),
                      notes=tuple(notes), details={"profiles": profiles})
