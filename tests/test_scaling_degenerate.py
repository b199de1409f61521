"""Degenerate and broken fits: approach 3 keeps to scaling laws (alpha, beta > 0) and says when
the data cannot pin a parameter; every plot kind still writes a PNG, with a note, for a
degenerate fit and for a fit whose parameters are NaN or inf.

The six points are the tiny IsoFLOP sweep (experiments/tiny_isoflop.py) as trained on an AVX2
CPU: the larger models are undertrained, so at each budget the loss grows with N and the
unconstrained optimum is alpha = -25.7 with A ~ 1e-129 (on the CI machine of issue #21 the same
sweep gave alpha = -65.8 and crashed the quickstart's plots).
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from attnlab.plots import scaling as plots
from attnlab.scaling import (FitError, GridEdgeWarning, InitGrid, fit_approach2, fit_approach3,
                             fit_kaplan)
from attnlab.scaling.huber import with_delta
from attnlab.scaling.laws.approach3 import CHINCHILLA_GRID, huber_objective, unpinned_parameters
from attnlab.scaling.laws.registry import law_named
from attnlab.scaling.multistart import minimise_many
from attnlab.scaling.parametric import admissible
from attnlab.scaling.synthetic import CHINCHILLA_PUBLISHED, grid_points, isoflop_points

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# (parameters N, tokens D, validation loss) of the six runs.
UNDERTRAINED = np.array([
    (7264, 13568, 3.4008963108062744), (33088, 3584, 4.239017486572266),
    (95904, 1536, 4.849584102630615), (7264, 26880, 3.1778404712677),
    (33088, 7424, 3.474605083465576), (95904, 2816, 4.422915458679199)])


def _frame(points: np.ndarray, k: float = 6.0):
    import pandas as pd

    n, d, loss = points.T
    return pd.DataFrame({"params": n, "tokens": d, "loss": loss, "flops": k * n * d})


@pytest.fixture(scope="module")
def degenerate_fit():
    n, d, loss = UNDERTRAINED.T
    with pytest.warns(GridEdgeWarning):
        return fit_approach3(n, d, loss, n_bootstrap=8, bootstrap_grid_starts=2)


def test_the_data_prefer_a_negative_exponent_unconstrained():
    """The premise: without the constraint the best converged start is not a scaling law."""
    n, d, loss = UNDERTRAINED.T
    starts = CHINCHILLA_GRID.points()
    solved = minimise_many(huber_objective, starts,
                           with_delta((np.log(n), np.log(d), np.log(loss))),
                           np.ones((len(starts), len(loss))))
    best = np.argmin(np.where(solved.converged, solved.objective, np.inf))
    assert solved.params[best, 3] < 0  # alpha
    assert not admissible(solved.params[best])


def test_approach3_keeps_positive_exponents_and_flags_what_the_data_cannot_pin(degenerate_fit):
    fit = degenerate_fit
    assert fit.params["alpha"] > 0 and fit.params["beta"] > 0
    assert fit.params["A"] > 0 and fit.params["B"] > 0
    # The N term is invisible at every run, so neither A nor alpha (nor the allocation) is pinned;
    # E, B and beta are.
    assert set(fit.unpinned) == {"A", "alpha", "a", "b", "G"}
    assert fit.degenerate and not fit.allocation_determined
    assert any("unconstrained optimum has alpha=-" in w for w in fit.warnings)
    assert any(w.startswith("degenerate fit: the data do not pin A, alpha") for w in fit.warnings)
    # Every bootstrap replicate is a scaling law too.
    assert np.all(fit.samples["alpha"] > 0) and np.all(fit.samples["beta"] > 0)
    # No headline allocation: predictions are NaN, not numbers that mean nothing.
    prediction = fit.predict_optimal(1e10)
    assert math.isnan(prediction["N_opt"]) and prediction["ci"] == {}
    # fit.json carries the flags (and stays valid JSON: NaN becomes null).
    saved = json.loads(json.dumps(fit.to_dict([1e10]), allow_nan=False))
    assert saved["degenerate"] is True
    assert saved["undetermined"] == list(fit.unpinned)
    # 2 of its 8 refits failed: no interval shows E or beta pinned either.
    assert fit.intervals_refused and saved["unpinned"] == list(fit.unpinned) + ["E", "beta"]
    assert saved["predictions"][0]["N_opt"] is None


def test_a_well_posed_fit_is_not_flagged():
    frame = grid_points(CHINCHILLA_PUBLISHED, n_points=60, noise=0.01,
                        rng=np.random.default_rng(3))
    fit = fit_approach3(frame["params"], frame["tokens"], frame["loss"])
    assert fit.unpinned == () and not fit.degenerate and fit.allocation_determined
    assert not any("unconstrained" in w for w in fit.warnings)
    assert fit.to_dict()["degenerate"] is False


@pytest.mark.parametrize("theta, expected", [
    # alpha ~ 0: A/N^alpha ~ A is a constant that E absorbs.
    ((5.0, 5.0, 0.5, 1e-4, 0.3), {"A", "alpha", "E", "a", "b", "G"}),
    # B/D^beta below 1e-3 of the loss everywhere.
    ((5.0, -40.0, 0.5, 0.3, 0.3), {"B", "beta", "a", "b", "G"}),
    ((5.0, 5.0, 0.5, 0.3, 0.3), set()),
    # docs/results.md's chinchilla_isoflop fit (E 1.031, A 741.9, B 2,438, alpha 0.752, beta
    # 0.595) is well pinned over its ladder: it stays what it was.
    ((np.log(741.9), np.log(2438.0), np.log(1.031), 0.752, 0.595), set()),
])
def test_unpinned_parameters_from_the_terms(theta, expected):
    log_n, log_d = np.log([1.3e4, 1.3e5, 6.9e5]), np.log([8.3e6, 2e6, 1.4e6])
    assert set(unpinned_parameters(theta, (log_n, log_d, np.zeros(3)))) == expected


def test_loss_rising_with_n_and_d_is_degenerate_or_an_error():
    """Loss that grows with both N and D follows no scaling law. From Hoffmann et al.'s grid some
    starts still converge to positive exponents whose terms vanish (both flagged); from starts
    that all stay negative, nothing admissible converges and the fit says so."""
    n = np.array([1e4, 3e4, 1e5, 3e5, 1e6, 1e4, 1e5, 1e6])
    d = np.array([1e6, 1e6, 1e6, 1e6, 1e6, 1e7, 1e7, 1e7])
    loss = 1.0 + 1e-4 * n**0.5 + 1e-3 * d**0.4
    with pytest.warns(GridEdgeWarning):
        fit = fit_approach3(n, d, loss)
    assert {"A", "alpha", "B", "beta"} <= set(fit.unpinned)
    negative = InitGrid(a=(-9.0,), b=(-7.0,), e=(0.0,), alpha=(-0.45,), beta=(-0.45,))
    with pytest.raises(FitError, match="alpha, beta > 0"):
        fit_approach3(n, d, loss, grid=negative)


# --- every plot kind survives a degenerate fit and a NaN/inf fit ---------------------------------

def _broken(fit, value):
    """The same fit with every parameter (and replicate) replaced by ``value``."""
    return dataclasses.replace(
        fit, params={k: value for k in fit.params},
        samples={k: np.full_like(v, value) for k, v in fit.samples.items()})


def _notes(figure) -> str:
    return " ".join(t.get_text() for ax in figure.axes for t in ax.texts).replace("\n", " ")


def _saved(figure, tmp_path, name):
    path = plots.save_figure(figure, tmp_path / f"{name}.png")
    assert path.read_bytes()[:8] == PNG_MAGIC
    return path


@pytest.fixture(scope="module")
def approach2_fit():
    frame = isoflop_points(CHINCHILLA_PUBLISHED, [1e18, 1e19, 1e20], sizes_per_budget=7,
                           rng=np.random.default_rng(0))
    fit = fit_approach2(frame["params"], frame["tokens"], frame["loss"], frame["flops"],
                        budget=frame["budget"], n_bootstrap=8)
    return fit, frame


@pytest.mark.parametrize("value", ["degenerate", math.nan, math.inf, -math.inf])
def test_approach3_plots_write_a_png_with_a_note(degenerate_fit, value, tmp_path):
    fit = degenerate_fit if value == "degenerate" else _broken(degenerate_fit, value)
    frame = _frame(UNDERTRAINED)
    expected = "degenerate fit" if value == "degenerate" else "non-finite fitted parameters"
    for name, make in {
        "contours": lambda: plots.plot_loss_contours(fit, frame),
        "allocation": lambda: plots.plot_optimal_allocation(fit, frame),
        "loss_vs_params": lambda: plots.plot_loss_vs_params(frame, fit),
    }.items():
        with np.errstate(all="raise"):  # no numpy warnings escape the plots
            figure = make()
        assert expected in _notes(figure), name
        _saved(figure, tmp_path, name)
    _saved(plots.plot_loss_vs_compute(frame), tmp_path, "loss_vs_compute")


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_approach2_plots_write_a_png_with_a_note(approach2_fit, value, tmp_path):
    fit, frame = approach2_fit
    broken = _broken(fit, value)
    for name, figure in {"isoflop": plots.plot_isoflops(broken),
                         "allocation": plots.plot_optimal_allocation(broken, frame)}.items():
        assert "non-finite fitted parameters" in _notes(figure), name
        _saved(figure, tmp_path, name)
    # The same fit intact draws its lines and no note.
    assert _notes(plots.plot_optimal_allocation(fit, frame)) == ""


def test_kaplan_plot_with_a_nan_fit_writes_a_png_with_a_note(tmp_path):
    frame = _frame(UNDERTRAINED)
    fit = fit_kaplan(frame["params"], frame["tokens"], frame["loss"], form="n")
    figure = plots.plot_loss_vs_params(frame, _broken(fit, math.nan))
    assert "non-finite fitted parameters" in _notes(figure)
    _saved(figure, tmp_path, "kaplan_n")


# --- the quickstart reports and plots whatever the fit turned out to be ------------------------

def test_study_reports_and_plots_a_degenerate_fit_and_no_fit(degenerate_fit, tmp_path):
    from attnlab import study
    from attnlab.scaling import prepare_points

    table = prepare_points(_frame(UNDERTRAINED), law=law_named("chinchilla"), source="six runs")
    text = study.report(degenerate_fit, None, [], "six runs", (1e10,))
    # Its intervals are refused (2 of 8 refits failed): E and beta are named as well.
    assert "L(N, D) = E + A / N^alpha + 48.93 / D^beta" in text
    assert "N_opt ~ C^a: not determined" in text
    assert "not pinned by the data" in text and "compute-optimal" in text
    written, messages = study.draw_plots(table, degenerate_fit, None, tmp_path / "a")
    assert set(written) == {"loss_vs_compute", "loss_vs_params", "contours", "allocation"}
    assert messages == []
    # Approach 3 failed altogether: the data plots are still drawn, the rest is said.
    text = study.report(None, None, ["approach 3 skipped: no law"], "six runs", (1e10,))
    assert text.strip() == "note: approach 3 skipped: no law"
    written, messages = study.draw_plots(table, None, None, tmp_path / "b")
    assert set(written) == {"loss_vs_compute", "loss_vs_params"} and messages == []
    for path in written.values():
        assert path.read_bytes()[:8] == PNG_MAGIC


def test_repeated_points_and_an_empty_table_are_one_line_errors(tmp_path, capsys):
    """Eight copies of one run used to 'fit' (alpha < 0, G = NaN); a header-only CSV used to be
    reported as a missing column."""
    from attnlab.scaling.cli import fit_main

    same = tmp_path / "same.csv"
    same.write_text("params,tokens,loss\n" + "100000,2000000,3.0\n" * 8)
    empty = tmp_path / "empty.csv"
    empty.write_text("params,tokens,loss\n")
    for path, message in ((same, "only 1 distinct (N, D) pair"), (empty, "has no rows")):
        assert fit_main([f"--sweep={path}", "--law=chinchilla", "--bootstrap=0"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1


def _runs(pairs) -> "pd.DataFrame":
    """Runs at these (N, D) on Chinchilla's published law, without noise."""
    from attnlab.scaling import equations

    n, d = np.array(pairs, np.float64).T
    return _frame(np.stack([n, d, equations.chinchilla_loss(CHINCHILLA_PUBLISHED, n, d)], 1))


@pytest.mark.parametrize("law, table, message", [
    ("--law=chinchilla", "one_size",
     "--law=chinchilla --approach=3: every run has N = 1e+08, which determines neither A nor "
     "alpha; add runs at other model sizes"),
    ("--law=kaplan", "one_length",
     "--law=kaplan --form=nd: every run has D = 2e+09, which determines neither D_c nor "
     "alpha_D; add runs at other token counts"),
    ("--law=overtrain", "one_ratio",
     "--law=overtrain: every run has D/N = 20, which determines neither a, b nor M*"),
])
def test_a_law_refuses_a_table_with_one_value_on_an_axis_it_needs(law, table, message,
                                                                  tmp_path, capsys):
    """Each law declares the axes its parameters are identified along (Law.varies)."""
    from attnlab.scaling.cli import fit_main

    sizes = np.geomspace(1e7, 1e9, 5)
    frame = {"one_size": _runs([(1e8, d) for d in np.geomspace(1e9, 1e11, 6)]),
             "one_length": _runs([(n, 2e9) for n in sizes]),
             "one_ratio": _runs([(n, 20 * n) for n in sizes])}[table]
    path = tmp_path / "runs.csv"
    frame.to_csv(path, index=False)
    assert fit_main([f"--sweep={path}", law, "--bootstrap=0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1


def test_an_axis_whose_parameters_are_held_needs_no_spread():
    """Muennighoff et al.'s frozen fit holds the Chinchilla part: one model size suffices."""
    from attnlab.scaling import FitInputError, prepare_points
    from attnlab.scaling.law import check_axes

    law = law_named("chinchilla", 3)
    table = prepare_points(_runs([(1e8, d) for d in np.geomspace(1e9, 1e11, 8)]), law=law)
    check_axes(law, table, {"A": 406.4, "alpha": 0.34})  # N's parameters are held
    with pytest.raises(FitInputError, match="every run has N = 1e"):
        check_axes(law, table, {"A": 406.4})
