"""Held-out prediction (attnlab.scaling.tables.holdout): fit on the smaller budgets, predict the
largest, on synthetic suites whose true law is known."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnlab.scaling import FitInputError, InitGrid, equations, prepare_points
from attnlab.scaling.laws.registry import law_named
from attnlab.scaling.synthetic import (CHINCHILLA_PUBLISHED, KAPLAN_PUBLISHED, grid_points,
                                       isoflop_points)
from attnlab.scaling.tables.holdout import format_holdout, holdout_mask, holdout_prediction

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized

SMALL_GRID = InitGrid(a=(0.0, 10.0, 20.0), b=(0.0, 10.0, 20.0), e=(-1.0, 0.0, 1.0),
                      alpha=(0.0, 1.0, 2.0), beta=(0.0, 1.0, 2.0))
BUDGETS = np.geomspace(1e18, 1e21, 4)


def _table(noise=0.005, seed=0):
    frame = isoflop_points(CHINCHILLA_PUBLISHED, BUDGETS, sizes_per_budget=7, noise=noise,
                           rng=np.random.default_rng(seed))
    return prepare_points(frame, law=law_named("chinchilla"), source="synthetic")


def test_largest_budget_is_predicted_from_the_smaller_ones():
    table = _table()
    held = holdout_prediction(table, law=law_named("chinchilla", 3), holdout="largest-budget",
                              grid=SMALL_GRID, n_bootstrap=40)
    assert len(held.frame) == 7 and held.n_kept == 21
    assert np.allclose(held.frame["flops"], BUDGETS[-1])
    # The fit never saw these runs, yet predicts them within the 0.5% noise (plus extrapolation).
    truth = equations.chinchilla_loss(CHINCHILLA_PUBLISHED, held.frame["params"],
                                 held.frame["tokens"])
    assert np.max(np.abs(held.frame["predicted"] / truth - 1)) < 0.01
    summary = held.summary()
    assert summary["mean_abs_relative_error"] < 0.01
    assert summary["mean_abs_relative_error"] == pytest.approx(
        np.mean(np.abs(held.frame["predicted"] / held.frame["observed"] - 1)))
    assert summary["with_interval"] == 7
    assert (held.frame["low"] < held.frame["predicted"]).all()
    assert (held.frame["predicted"] < held.frame["high"]).all()
    text = format_holdout(held)
    assert "fitted on 21 runs, predicting 7" in text and "mean |error|" in text
    json.dumps(held.to_dict(), allow_nan=False)


def test_a_wrong_law_predicts_worse():
    """The check can fail: losses with an extra term the law lacks (a loss that bends up for the
    largest models) are mispredicted by several percent."""
    table = _table(noise=0.002)
    bent = table.frame.copy()
    bent["loss"] = bent["loss"] * (1 + 0.05 * (bent["flops"] / BUDGETS[-1]) ** 2)
    held_true = holdout_prediction(table, law=law_named("chinchilla", 3),
                                   holdout="largest-budget", grid=SMALL_GRID)
    held_bent = holdout_prediction(table.__class__(bent, "bent", table.columns),
                                   law=law_named("chinchilla", 3), holdout="largest-budget",
                                   grid=SMALL_GRID)
    assert held_true.summary()["mean_abs_relative_error"] < 0.01
    assert held_bent.summary()["mean_abs_relative_error"] > 0.02


def test_kaplan_forms_and_thresholds():
    frame = grid_points(KAPLAN_PUBLISHED, law="kaplan", n_range=(1e6, 1e9), d_range=(1e7, 1e10),
                        n_points=60, noise=0.005, rng=np.random.default_rng(1))
    table = prepare_points(frame, law=law_named("kaplan"), source="synthetic")
    held = holdout_prediction(table, law=law_named("kaplan", form="nd"), holdout="params>=3e8")
    assert (held.frame["params"] >= 3e8).all()
    assert held.n_kept == int((frame["params"] < 3e8).sum())
    assert held.summary()["mean_abs_relative_error"] < 0.02
    assert held.summary()["with_interval"] == 0  # no bootstrap asked


@pytest.mark.parametrize("spec, message", [
    ("largest", "is not one of largest-budget"),
    ("budget:5e30", r"no runs at budget 5e\+30"),
    ("budget:x", "is not budget:C"),
    ("params>1e30", "holds out no run"),
    ("flops>1e17", "keeps 0 of 28 runs, fewer than the 5 parameters"),
])
def test_bad_holdout_is_one_clear_error(spec, message):
    with pytest.raises(FitInputError, match=message):
        holdout_prediction(_table(), law=law_named("chinchilla", 3), holdout=spec, grid=SMALL_GRID)


def test_holdout_needs_a_law_that_predicts_a_loss():
    with pytest.raises(FitInputError, match="approach 2 models no loss"):
        holdout_prediction(_table(), law=law_named("chinchilla", 2), holdout="largest-budget")


def test_budget_rule_selects_by_label():
    table = _table()
    mask = holdout_mask(table, f"budget:{BUDGETS[0]:.3g},{BUDGETS[2]:.3g}")
    assert mask.sum() == 14
    assert set(np.round(np.log10(table.frame["flops"][mask]), 3)) == {18.0, 20.0}
