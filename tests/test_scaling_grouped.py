"""Grouped fits (attnlab fit --by): one law per group, side by side, on synthetic sweeps whose
groups follow different known laws."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnlab.plots import scaling as plots
from attnlab.scaling import FitInputError, equations
from attnlab.scaling.laws.registry import law_named
from attnlab.scaling.synthetic import CHINCHILLA_PUBLISHED, isoflop_points
from attnlab.scaling.tables.grouped import fit_by, format_grouped

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized

# A second law with a clearly different allocation (a = 0.36 / 0.66 = 0.545 against 0.452).
OTHER = {"E": 1.8, "A": 500.0, "B": 300.0, "alpha": 0.30, "beta": 0.36}
BUDGETS = np.geomspace(1e18, 1e20, 3)


def _results() -> pd.DataFrame:
    """Two 'architectures' with different laws, plus one with a single run; sweep-table columns
    (params, tokens, final_val_loss, budget, status) and a config column to group by."""
    rows = []
    for name, law in (("rope", CHINCHILLA_PUBLISHED), ("mamba", OTHER)):
        frame = isoflop_points(law, BUDGETS, sizes_per_budget=7, noise=0.002,
                               rng=np.random.default_rng(len(name)))
        frame["model.mixer"] = name
        rows.append(frame)
    lonely = rows[0].iloc[:1].copy()
    lonely["model.mixer"] = "performer"
    frame = pd.concat(rows + [lonely], ignore_index=True)
    frame = frame.rename(columns={"loss": "final_val_loss"})
    frame["status"] = "completed"
    return frame


def test_one_fit_per_group_recovers_each_law():
    grouped = fit_by(_results(), "model.mixer", law=law_named("chinchilla", 2), n_bootstrap=30)
    assert list(grouped.fits) == ["mamba", "rope"]
    assert "performer" in grouped.skipped and "two or more" in grouped.skipped["performer"]
    # Approach 2 recovers each group's own allocation exponent.
    assert grouped.fits["rope"].params["a"] == pytest.approx(0.28 / 0.62, abs=0.04)
    assert grouped.fits["mamba"].params["a"] == pytest.approx(0.36 / 0.66, abs=0.04)
    text = format_grouped(grouped, budgets=[1e21])
    header = text.splitlines()[2]
    assert "mamba" in header and "rope" in header
    assert "N_opt@1e+21" in text and "skipped model.mixer=performer" in text
    row_a = next(line for line in text.splitlines() if line.strip().startswith("a "))
    assert row_a.count("[") == 2  # an interval in each group's cell


def test_grouped_approach3_and_its_figure(tmp_path):
    grouped = fit_by(_results(), "model.mixer", law=law_named("chinchilla", 3), n_bootstrap=10)
    for name, law in (("rope", CHINCHILLA_PUBLISHED), ("mamba", OTHER)):
        fit = grouped.fits[name]
        truth = equations.chinchilla_loss(law, 1e8, 1e10)
        assert fit.loss(1e8, 1e10) == pytest.approx(truth, rel=0.02)
    figure = plots.plot_group_frontiers(grouped)
    legend = figure.axes[0].get_legend()
    assert {t.get_text() for t in legend.get_texts()} == {"mamba", "rope"}
    path = plots.save_figure(figure, tmp_path / "frontiers.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_missing_column_and_no_fittable_group_are_clear_errors():
    with pytest.raises(FitInputError, match="--by: .* has no column 'model.mixr'"):
        fit_by(_results(), "model.mixr", law=law_named("chinchilla", 2))
    only_lonely = _results()
    only_lonely = only_lonely[only_lonely["model.mixer"] == "performer"]
    with pytest.raises(FitInputError, match="no group could be fitted .*performer"):
        fit_by(only_lonely, "model.mixer", law=law_named("chinchilla", 2))
