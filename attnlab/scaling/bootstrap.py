"""Bootstrap resampling (Efron 1979) and percentile intervals."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def resample_weights(n_points: int, n_replicates: int, rng: np.random.Generator) -> np.ndarray:
    """[replicates, points]: how many times each point is drawn when n_points points are drawn
    with replacement, per replicate. A weighted refit with these multiplicities equals a refit
    on the resampled table, and keeps array shapes fixed for vectorised solvers."""
    draws = rng.integers(0, n_points, size=(n_replicates, n_points))
    return np.stack([np.bincount(row, minlength=n_points) for row in draws]).astype(np.float64)


def resample_within_groups(groups: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices of a stratified bootstrap draw: within each group (e.g. an IsoFLOP budget), as
    many points as it has, drawn with replacement. groups: [points] labels."""
    indices = []
    for label in np.unique(groups):
        members = np.flatnonzero(groups == label)
        indices.append(rng.choice(members, size=len(members), replace=True))
    return np.concatenate(indices)


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
