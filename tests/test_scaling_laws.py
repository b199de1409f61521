"""Analytic checks of the scaling-law formulas against independent float64 NumPy/SciPy references:
the compute-optimal allocation, FLOP counting, the parabola vertex, the Huber objective and the
bootstrap helpers."""

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from attnlab.scaling import equations
from attnlab.scaling.bootstrap import percentile_interval, resample_weights
from attnlab.scaling.huber import HUBER_DELTA, with_delta
from attnlab.scaling.laws.approach2 import parabola_vertex
from attnlab.scaling.laws.approach3 import InitGrid, huber_objective, params_from_theta
from attnlab.scaling.points import budget_labels
from attnlab.scaling.synthetic import CHINCHILLA_PUBLISHED, KAPLAN_PUBLISHED

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized


def test_training_flops_is_six_n_d():
    assert equations.training_flops(1e9, 2e10) == pytest.approx(6 * 1e9 * 2e10, rel=1e-15)
    assert equations.training_flops(3.0, 5.0, flops_per_param_token=8.0) == 120.0


@pytest.mark.parametrize("budget", [1e18, 5.76e23])
def test_chinchilla_optimum_minimises_loss_on_the_isoflop_line(budget):
    params = CHINCHILLA_PUBLISHED
    optimum = equations.chinchilla_optimal(params, budget)
    # Independent reference: minimise L(N, C/(6N)) over log N numerically.
    along_isoflop = lambda log_n: equations.chinchilla_loss(params, np.exp(log_n),
                                                       budget / (6 * np.exp(log_n)))
    reference = minimize_scalar(along_isoflop, bounds=(np.log(1e3), np.log(1e15)),
                                method="bounded", options={"xatol": 1e-10})
    assert np.log(optimum["N_opt"]) == pytest.approx(reference.x, abs=1e-5)
    assert optimum["N_opt"] * optimum["D_opt"] * 6 == pytest.approx(budget, rel=1e-12)
    assert optimum["loss"] == pytest.approx(reference.fun, rel=1e-12)


def test_chinchilla_allocation_exponents_and_coefficient():
    alpha, beta, A, B = 0.34, 0.28, 406.4, 410.7
    a, b = equations.allocation_exponents(alpha, beta)
    assert a + b == pytest.approx(1.0)
    assert a == pytest.approx(0.28 / 0.62) and b == pytest.approx(0.34 / 0.62)
    g = equations.allocation_coefficient(A, B, alpha, beta)
    assert g == pytest.approx((alpha * A / (beta * B)) ** (1 / (alpha + beta)), rel=1e-15)
    # Scaling C by 10 scales N_opt by 10^a and D_opt by 10^b.
    one, ten = (equations.chinchilla_optimal(CHINCHILLA_PUBLISHED, c) for c in (1e20, 1e21))
    assert ten["N_opt"] / one["N_opt"] == pytest.approx(10 ** a, rel=1e-12)
    assert ten["D_opt"] / one["D_opt"] == pytest.approx(10 ** b, rel=1e-12)


def test_chinchilla_optimum_with_another_flop_convention():
    """With C = k·N·D, the optimum is the 6ND optimum at the budget C·6/k."""
    at_eight = equations.chinchilla_optimal(CHINCHILLA_PUBLISHED, 8e20, flops_per_param_token=8.0)
    at_six = equations.chinchilla_optimal(CHINCHILLA_PUBLISHED, 6e20)
    assert at_eight["N_opt"] == pytest.approx(at_six["N_opt"], rel=1e-12)


def test_kaplan_optimum_minimises_kaplan_loss():
    budget = 1e21
    optimum = equations.kaplan_optimal(KAPLAN_PUBLISHED, budget)
    along = lambda log_n: np.log(equations.kaplan_loss(KAPLAN_PUBLISHED, np.exp(log_n),
                                                  budget / (6 * np.exp(log_n))))
    reference = minimize_scalar(along, bounds=(np.log(1e4), np.log(1e16)), method="bounded",
                                options={"xatol": 1e-10})
    assert np.log(optimum["N_opt"]) == pytest.approx(reference.x, abs=1e-4)
    p = KAPLAN_PUBLISHED
    exponent = p["alpha_D"] / (p["alpha_N"] + p["alpha_D"])
    ratio = equations.kaplan_optimal(p, 10 * budget)["N_opt"] / optimum["N_opt"]
    assert ratio == pytest.approx(10 ** exponent, rel=1e-12)


def test_kaplan_joint_law_reduces_to_the_single_laws():
    p = KAPLAN_PUBLISHED
    eq = equations
    assert eq.kaplan_loss(p, 1e8, 1e30) == pytest.approx(eq.kaplan_loss_n(p, 1e8), rel=1e-9)
    assert eq.kaplan_loss(p, 1e30, 1e9) == pytest.approx(eq.kaplan_loss_d(p, 1e9), rel=1e-9)
    assert equations.kaplan_loss_n(p, 1e8) == pytest.approx((8.8e13 / 1e8) ** 0.076, rel=1e-12)


def test_parabola_vertex_of_an_exact_parabola():
    x = np.log(np.geomspace(1e7, 1e9, 7))
    x_star = np.log(1.3e8)
    loss = 0.05 * (x - x_star) ** 2 + 2.5
    coefficients, vertex, value = parabola_vertex(x, loss)
    assert vertex == pytest.approx(x_star, abs=1e-9)
    assert value == pytest.approx(2.5, abs=1e-12)
    assert parabola_vertex(x, -loss) is None  # opens downward: no minimum


def test_budget_labels_cluster_nearby_flops():
    flops = np.array([1.0e18, 1.02e18, 0.99e18, 1e19, 1.01e19])
    labels = budget_labels(flops)
    assert len(np.unique(labels)) == 2
    assert labels[0] == labels[1] == labels[2]
    np.testing.assert_array_equal(budget_labels(flops, np.array([1, 1, 1, 2, 2.0])),
                                  [1, 1, 1, 2, 2])


def _huber_reference(theta, log_n, log_d, log_l, weights, delta=1e-3):
    a, b, e, alpha, beta = theta
    predicted = np.log(np.exp(a - alpha * log_n) + np.exp(b - beta * log_d) + np.exp(e))
    r = predicted - log_l
    terms = np.where(np.abs(r) <= delta, 0.5 * r ** 2, delta * (np.abs(r) - 0.5 * delta))
    return float(np.sum(weights * terms))


def test_huber_objective_matches_float64_numpy_sum():
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    log_n, log_d = rng.uniform(15, 23, 40), rng.uniform(18, 27, 40)
    log_l = np.log(equations.chinchilla_loss(CHINCHILLA_PUBLISHED, np.exp(log_n), np.exp(log_d)))
    log_l = log_l + 0.01 * rng.standard_normal(40)
    theta = np.array([6.0, 6.1, 0.5, 0.33, 0.29])
    weights = rng.integers(0, 3, 40).astype(float)
    with jax.enable_x64(True):
        data = tuple(map(jnp.asarray, with_delta((log_n, log_d, log_l), HUBER_DELTA)))
        value = float(huber_objective(jnp.asarray(theta), data, jnp.asarray(weights)))
    reference = _huber_reference(theta, log_n, log_d, log_l, weights)
    assert value == pytest.approx(reference, rel=1e-12)
    # A sum, not a mean: doubling every weight doubles it.
    with jax.enable_x64(True):
        doubled = float(huber_objective(jnp.asarray(theta), data, jnp.asarray(2 * weights)))
    assert doubled == pytest.approx(2 * reference, rel=1e-12)
    # Huber's delta is the data's last array: 10x delta is the reference's at 10x delta.
    with jax.enable_x64(True):
        wider = float(huber_objective(jnp.asarray(theta), tuple(map(jnp.asarray, with_delta(
            (log_n, log_d, log_l), 10 * HUBER_DELTA))), jnp.asarray(weights)))
    assert wider == pytest.approx(_huber_reference(theta, log_n, log_d, log_l, weights, 1e-2),
                                  rel=1e-12)
    assert wider != pytest.approx(reference, rel=1e-3)


def test_params_from_theta():
    theta = np.array([np.log(406.4), np.log(410.7), np.log(1.69), 0.34, 0.28])
    params = params_from_theta(theta)
    assert params["A"] == pytest.approx(406.4) and params["E"] == pytest.approx(1.69)
    assert params["a"] == pytest.approx(0.28 / 0.62)
    assert params["G"] == pytest.approx(equations.allocation_coefficient(406.4, 410.7, 0.34, 0.28))


def test_default_grid_is_hoffmann_et_al():
    grid = InitGrid()
    assert len(grid) == 4500 and grid.points().shape == (4500, 5)
    assert grid.edges_reached(np.array([6.0, 6.0, 0.5, 0.34, 0.28])) == []
    assert grid.edges_reached(np.array([6.0, 6.0, 1.6, 0.34, 0.28])) == ["e=1.6 >= grid max 1"]
    parsed = InitGrid.parse("e:-1:3:1,alpha:0:1:0.5")
    assert parsed.e == (-1.0, 0.0, 1.0, 2.0, 3.0) and parsed.alpha == (0.0, 0.5, 1.0)
    assert parsed.a == grid.a


def test_resample_weights_and_percentile_interval():
    rng = np.random.default_rng(0)
    weights = resample_weights(30, 500, rng)
    assert weights.shape == (500, 30)
    np.testing.assert_array_equal(weights.sum(axis=1), 30)
    # Each point's multiplicity is Binomial(30, 1/30): mean 1.
    assert weights.mean() == pytest.approx(1.0)
    low, high = percentile_interval(np.arange(1001.0), 0.9)
    assert (low, high) == (pytest.approx(50.0), pytest.approx(950.0))
