"""The design check of `attnlab sweep --dry-run`: approach 3's expected interval widths at a
prior law over the planned (N, D) points. The Jacobian is checked against finite differences, the
covariance against scipy's curve_fit, and the verdicts against designs whose answer is known (two
sizes cannot pin E; a ladder of token counts per size pins more than an IsoFLOP ladder)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from attnlab import cli
from attnlab.scaling import equations
from attnlab.scaling.design import (DESIGN_PRIOR, check_design, log_loss_jacobian,
                                    parameter_covariance)

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized

PRIOR = DESIGN_PRIOR
THETA = np.array([math.log(PRIOR["A"]), math.log(PRIOR["B"]), math.log(PRIOR["E"]),
                  PRIOR["alpha"], PRIOR["beta"]])
SIZES = np.geomspace(5e3, 1.2e5, 6)


def _log_loss(theta, n, d):
    """log L of approach 3's parametrisation (a, b, e, alpha, beta), from
    equations.chinchilla_loss."""
    a, b, e, alpha, beta = theta
    params = {"A": math.exp(a), "B": math.exp(b), "E": math.exp(e), "alpha": alpha, "beta": beta}
    return np.log(equations.chinchilla_loss(params, n, d))


def _ladder(sizes=SIZES, ratios=(5, 10, 20, 40, 80, 160)):
    """Every size at every tokens-per-parameter ratio."""
    n, r = np.meshgrid(sizes, ratios)
    return n.ravel(), (n * r).ravel()


def test_jacobian_matches_finite_differences():
    n, d = _ladder()
    jacobian = log_loss_jacobian(PRIOR, n, d)
    for i in range(len(n)):
        numeric = optimize.approx_fprime(THETA, lambda t: _log_loss(t, n[i], d[i]), 1e-7)
        np.testing.assert_allclose(jacobian[i], numeric, rtol=1e-5, atol=1e-7)


def test_widths_are_the_least_squares_covariance():
    """curve_fit's covariance of a weighted least-squares fit of exact data (so its optimum is
    the prior itself) with sigma = the seed noise is sigma^2 (J^T J)^-1, from its own Jacobian."""
    n, d = _ladder()
    noise = 0.01
    _, pcov = optimize.curve_fit(lambda x, *t: _log_loss(t, x[0], x[1]), np.stack([n, d]),
                                 _log_loss(THETA, n, d), p0=THETA, sigma=np.full(len(n), noise),
                                 absolute_sigma=True, xtol=1e-14, ftol=1e-14)
    cov, _ = parameter_covariance(log_loss_jacobian(PRIOR, n, d), noise)
    np.testing.assert_allclose(cov, pcov, rtol=1e-3, atol=1e-12)
    check = check_design(n, d, noise=noise)
    z = stats.norm.ppf(0.975)
    alpha, beta = PRIOR["alpha"], PRIOR["beta"]
    grad_a = np.array([0, 0, 0, -beta, alpha]) / (alpha + beta) ** 2
    assert check.widths["a"] == pytest.approx(2 * z * math.sqrt(grad_a @ pcov @ grad_a),
                                              rel=1e-3)
    assert check.widths["E"] == pytest.approx(2 * z * PRIOR["E"] * math.sqrt(pcov[2, 2]),
                                              rel=1e-3)
    assert check.widths["alpha"] == pytest.approx(2 * z * math.sqrt(pcov[3, 3]), rel=1e-3)


def test_two_sizes_cannot_pin_the_law():
    """With two sizes A/N^alpha takes any two values, so it absorbs a shift of E: singular."""
    check = check_design(*_ladder(sizes=SIZES[:2]))
    assert check.condition > 1e10 and math.isinf(check.widths["E"])
    (warning,) = check.warnings()
    assert "cannot separate" in warning and ">= 3 sizes" in warning


def test_fewer_points_than_parameters_cannot_pin_the_law():
    """Three points leave J^T J (5 x 5) singular whatever the condition of J's three nonzero
    singular values: a verdict, not a crash (a one-budget plan's dry run)."""
    n = SIZES[:3]
    check = check_design(n, 20 * n)
    assert math.isinf(check.condition) and math.isinf(check.widths["a"])
    (warning,) = check.warnings()
    assert "cannot separate" in warning and "3 points" in warning


def test_a_decade_of_tokens_per_parameter_pins_more_than_a_narrow_band():
    """Same sizes, same number of points: each size at 5-160 tokens per parameter separates the
    terms far better than each at 18-22 (the spread an IsoFLOP ladder centred on each budget's
    optimum gives a size)."""
    narrow = check_design(*_ladder(ratios=(18, 20, 22)))
    wide = check_design(*_ladder(ratios=(5, 40, 160)))
    assert narrow.points == wide.points
    for name in ("a", "E", "alpha", "beta"):
        assert wide.widths[name] < narrow.widths[name] / 2, name
    assert wide.condition < narrow.condition
    (warning,) = narrow.warnings()
    assert f"a {narrow.widths['a']:.2g} (target <= 0.25)" in warning
    assert check_design(*_ladder()).warnings() == []
    # Twice the noise, twice the width (the covariance is sigma^2 (J^T J)^-1).
    ladder, noisier = check_design(*_ladder()), check_design(*_ladder(), noise=0.02)
    assert noisier.widths["a"] == pytest.approx(2 * ladder.widths["a"], rel=1e-9)


def test_dry_run_prints_the_design_check(capsys, tmp_path):
    for experiment, expected in (("tiny_isoflop", "may not pin"),
                                 ("tiny_ladder", "cannot separate")):
        assert cli.main(["sweep", f"--config=experiments/{experiment}.py",
                         f"--sweep={tmp_path}/{experiment}", "--dry-run",
                         "--probe=none"]) == 0
        out = capsys.readouterr().out
        assert "# design: " in out and "expected 95% widths" in out
        assert "# warning: the plan" in out
        assert expected in out


def test_trunk_shared_noise_gives_the_sandwich_covariance():
    """Branches of one trunk share ``shared`` of the noise: the fit's covariance is
    (J^T J)^-1 J^T Sigma J (J^T J)^-1 sigma^2, Sigma = (1 - s) I + s [same trunk], written here
    in float64 without the unit-norm scaling; each point its own trunk gives sigma^2 (J^T J)^-1."""
    n, d = _ladder()
    trunks = np.searchsorted(np.unique(n), n)  # one trunk per size, its 6 branches
    jacobian = log_loss_jacobian(PRIOR, n, d)
    sigma = 0.7 * np.eye(len(n)) + 0.3 * (trunks[:, None] == trunks[None, :])
    bread = np.linalg.inv(jacobian.T @ jacobian)
    want = 0.01**2 * bread @ jacobian.T @ sigma @ jacobian @ bread
    got, _ = parameter_covariance(jacobian, 0.01, trunks, 0.3)
    np.testing.assert_allclose(got, want, rtol=1e-7)
    alone, _ = parameter_covariance(jacobian, 0.01, np.arange(len(n)), 0.3)
    np.testing.assert_allclose(alone, 0.01**2 * bread, rtol=1e-7)


def test_a_ladders_widths_grow_with_its_trunks_shared_noise():
    """Six sizes, one trunk each: with the default share (96%) every size's branches move
    together, and the expected widths grow over the same points taken as independent (a 1.9x,
    E 2.3x); four trunks a size (seeds) at the same points halve them (sqrt 4)."""
    n, d = _ladder()
    alone = check_design(n, d)
    one = check_design(n, d, trunks=list(np.searchsorted(np.unique(n), n)))
    assert one.widths["a"] > 1.5 * alone.widths["a"] and one.widths["E"] > 1.3 * alone.widths["E"]
    assert one.trunks == 6 and "96% of it shared by a trunk's branches, 6 trunks" in one.describe()
    n4, d4 = np.tile(n, 4), np.tile(d, 4)
    four = check_design(n4, d4, trunks=[f"{i // len(n)}-{s}" for i, s in
                                        enumerate(np.tile(np.searchsorted(np.unique(n), n), 4))])
    assert four.trunks == 24 and four.widths["a"] == pytest.approx(0.5 * one.widths["a"],
                                                                    rel=1e-6)
