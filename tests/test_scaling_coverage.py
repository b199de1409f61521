"""Bootstrap percentile intervals cover the true parameters at about their nominal rate over
repeated synthetic sweeps (Besiroglu et al. 2024: the original Chinchilla intervals were far too
narrow). Slow: dozens of full fits with bootstrap each."""

import warnings

import numpy as np
import pytest

from attnlab.scaling import GridEdgeWarning, InitGrid, fit_approach2, fit_approach3, fit_kaplan
from attnlab.scaling.synthetic import (CHINCHILLA_PUBLISHED, KAPLAN_PUBLISHED, grid_points,
                                       isoflop_points)

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized

LEVEL = 0.9
SMALL_GRID = InitGrid(a=(0.0, 10.0, 20.0), b=(0.0, 10.0, 20.0), e=(-1.0, 0.0, 1.0),
                      alpha=(0.0, 1.0, 2.0), beta=(0.0, 1.0, 2.0))


def _coverage(fits, truth):
    hits = [fit.ci[name][0] <= value <= fit.ci[name][1] for fit in fits
            for name, value in truth.items()]
    return float(np.mean(hits))


def _median_width(fits, name):
    """An interval can cover anything by being wide: the widths are bounded too."""
    return float(np.median([fit.ci[name][1] - fit.ci[name][0] for fit in fits]))


@pytest.mark.slow
def test_approach3_intervals_cover_the_truth():
    truth = {"E": 1.69, "alpha": 0.34, "beta": 0.28, "a": 0.28 / 0.62}
    fits = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)
        for seed in range(30):
            frame = grid_points(CHINCHILLA_PUBLISHED, n_points=100, noise=0.02,
                                rng=np.random.default_rng(100 + seed))
            fits.append(fit_approach3(frame["params"], frame["tokens"], frame["loss"],
                                      grid=SMALL_GRID, n_bootstrap=150, bootstrap_grid_starts=1,
                                      ci_level=LEVEL, seed=seed))
    # Measured (30 sweeps x 4 parameters): 0.96 coverage; median 90% widths E 0.20,
    # alpha 0.09, beta 0.045, a 0.08.
    coverage = _coverage(fits, truth)
    assert 0.8 <= coverage <= 0.99, coverage
    for name, (low, high) in {"E": (0.05, 0.5), "alpha": (0.02, 0.25), "beta": (0.01, 0.15),
                              "a": (0.02, 0.2)}.items():
        assert low <= _median_width(fits, name) <= high, name


@pytest.mark.slow
def test_kaplan_and_approach2_intervals_cover_the_truth():
    kaplan_truth = {"alpha_N": 0.076, "alpha_D": 0.095}
    kaplan_fits = []
    for seed in range(30):
        frame = grid_points(KAPLAN_PUBLISHED, law="kaplan", n_range=(1e6, 1e9),
                            d_range=(1e7, 1e10), n_points=60, noise=0.01,
                            rng=np.random.default_rng(200 + seed))
        kaplan_fits.append(fit_kaplan(frame["params"], frame["tokens"], frame["loss"],
                                      n_bootstrap=150, ci_level=LEVEL, seed=seed))
    # Measured: 0.90 coverage; median widths alpha_N 0.0049, alpha_D 0.0056.
    assert 0.75 <= _coverage(kaplan_fits, kaplan_truth) <= 0.99
    for name in kaplan_truth:
        assert 0.001 <= _median_width(kaplan_fits, name) <= 0.02, name

    # Approach 2 fits parabolas to a law that is not exactly parabolic in log N, so its target is
    # the exponent of the true per-budget minima, which a dense, symmetric IsoFLOP grid recovers.
    budgets = np.geomspace(1e18, 1e21, 5)
    a_truth = {"a": 0.28 / 0.62}
    fits = []
    for seed in range(40):
        frame = isoflop_points(CHINCHILLA_PUBLISHED, budgets, sizes_per_budget=9, span=4.0,
                               noise=0.01, rng=np.random.default_rng(300 + seed))
        fits.append(fit_approach2(frame["params"], frame["tokens"], frame["loss"],
                                  frame["flops"], budget=frame["budget"], n_bootstrap=150,
                                  ci_level=LEVEL, seed=seed))
    # Measured: 0.975 coverage (40 sweeps: all 40 covering is likely at that rate, so the
    # upper check is on the widths), median width of a 0.13.
    assert 0.7 <= _coverage(fits, a_truth)
    assert 0.03 <= _median_width(fits, "a") <= 0.3
    # The point estimates centre on the truth: the intervals are not wide around a biased a.
    assert abs(np.median([fit.params["a"] for fit in fits]) - a_truth["a"]) < 0.03
