"""Bootstrap resampling (Efron 1979) and percentile intervals.

Resampling draws the unit of independence, not rows: a ladder's branches share their trunk
(initialisation, data order, the stable phase), so a trunk with its branches is one *cluster*,
drawn whole (the cluster bootstrap; Davison & Hinkley 1997 Sec. 3.8). ``clusters`` below is a
[points] array of cluster indices 0..G-1; with every row its own cluster the draws are exactly
the row bootstrap's (same random numbers, same multiplicities).

A percentile interval over the replicates whose refit happened to succeed is conditional on
success: when more than ``MAX_FAILED_SHARE`` of the refits fail, fits report the interval as not
computed (``ScalingFit.intervals_refused``) instead.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


# Refits that may fail before an interval is refused rather than read off the survivors.
MAX_FAILED_SHARE = 0.10
# Fewer usable refits than this give no interval: one or two refits make a zero-width "95%"
# interval that need not even hold the estimate.
MIN_REFITS = 10
# Fewer clusters than this draw intervals whose coverage was not checked (docs/scaling.md's
# simulation drew 48): a bootstrap over few units tends to give intervals too narrow.
MIN_CLUSTERS = 30


def cluster_index(labels) -> np.ndarray:
    """[points] cluster indices 0..G-1 of arbitrary labels (None: every point its own)."""
    return np.unique(np.asarray(labels, dtype=object).astype(str), return_inverse=True)[1]


def _clusters(n_points: int, clusters) -> np.ndarray:
    return np.arange(n_points) if clusters is None else np.asarray(clusters, np.int64)


def resample_weights(n_points: int, n_replicates: int, rng: np.random.Generator,
                     clusters=None) -> np.ndarray:
    """[replicates, points]: how many times each point is drawn when the G clusters (default:
    the points themselves) are drawn G times with replacement, per replicate; a point counts
    as often as its cluster is drawn. A weighted refit with these multiplicities equals a refit
    on the resampled table, and keeps array shapes fixed for vectorised solvers."""
    clusters = _clusters(n_points, clusters)
    n_clusters = int(clusters.max()) + 1
    draws = rng.integers(0, n_clusters, size=(n_replicates, n_clusters))
    counts = np.stack([np.bincount(row, minlength=n_clusters) for row in draws])
    return counts[:, clusters].astype(np.float64)


def resample_rows(n_points: int, rng: np.random.Generator, clusters=None) -> np.ndarray:
    """Row indices of one cluster-bootstrap draw: G clusters drawn with replacement, each with
    all its rows (with singleton clusters: ``rng.integers(0, n, n)``)."""
    clusters = _clusters(n_points, clusters)
    n_clusters = int(clusters.max()) + 1
    drawn = rng.integers(0, n_clusters, n_clusters)
    if n_clusters == n_points:  # singletons: the row bootstrap itself
        return np.argsort(clusters)[drawn]
    members = [np.flatnonzero(clusters == c) for c in range(n_clusters)]
    return np.concatenate([members[c] for c in drawn])


def resample_within_groups(groups: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices of a stratified bootstrap draw: within each group (e.g. an IsoFLOP budget), as
    many points as it has, drawn with replacement. groups: [points] labels."""
    indices = []
    for label in np.unique(groups):
        members = np.flatnonzero(groups == label)
        indices.append(rng.choice(members, size=len(members), replace=True))
    return np.concatenate(indices)


def identified(weights: np.ndarray, design: Mapping | None) -> np.ndarray:
    """[replicates] whether each draw (weights: [replicates, points] multiplicities) holds, along
    every axis of ``design`` (axis -> ([points] level index, levels needed)), as many distinct
    levels as the law needs there. A draw with fewer cannot determine the law (its refit would
    pick one point of a flat valley): it counts as a failed refit, not as a draw."""
    ok = np.ones(len(weights), bool)
    for levels, needed in (design or {}).values():
        drawn = np.zeros((len(weights), int(levels.max()) + 1))
        np.add.at(drawn.T, levels, (weights > 0).T.astype(float))
        ok &= (drawn > 0).sum(axis=1) >= needed
    return ok


def percentile_interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    """The central ``level`` percentile interval of the finite samples (NaNs if none)."""
    samples = np.asarray(samples, np.float64)
    samples = samples[np.isfinite(samples)]
    if samples.size == 0:
        return (float("nan"), float("nan"))
    tail = 50.0 * (1.0 - level)
    low, high = np.percentile(samples, [tail, 100.0 - tail])
    return (float(low), float(high))


def intervals(samples: Mapping[str, np.ndarray], level: float) -> dict[str, tuple[float, float]]:
    """name -> percentile interval, for every name with replicates."""
    return {name: percentile_interval(values, level) for name, values in samples.items()
            if np.size(values)}
