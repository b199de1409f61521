"""The LR-annealing law (Tissue et al. 2024): its equations against a float64 loop written from
the paper's formula, recovery of known parameters and held-out schedules, its flag."""

import numpy as np
import pytest

from attnlab.scaling.curves import schedule_curve
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.laws.annealing import Annealing, annealing_loss
from attnlab.scaling.synthetic_curves import from_schedule, observed, two_stage, with_losses

TRUE = {"L0": 2.3, "A": 0.6, "alpha": 0.45, "C": 3.0}
PEAK, WARMUP, T, EVERY, DECAY = 3e-4, 30, 600, 10, 0.99


def reference_loss(p, lr, t, decay):
    """L = L0 + A S1^-alpha - C S2, S2 = sum_i m_i, m_i = lambda m_{i-1} + (eta_{i-1} - eta_i)
    over the updates i after the peak (m = 0 before), as a plain loop."""
    peak = int(np.argmax(lr)) + 1
    momentum, s2 = 0.0, 0.0
    for i in range(peak + 1, t + 1):
        momentum = decay * momentum + (lr[i - 2] - lr[i - 1])
        s2 += momentum
    return p["L0"] + p["A"] * sum(lr[:t]) ** -p["alpha"] - p["C"] * s2


def spec(name, total=T):
    return {"constant": f"constant:peak={PEAK},warmup_steps={WARMUP},total_steps={total}",
            "cosine": f"cosine:peak={PEAK},warmup_steps={WARMUP},total_steps={total}",
            "wsd": f"wsd:peak={PEAK},warmup_steps={WARMUP},total_steps={total}",
            "linear": f"wsd:peak={PEAK},warmup_steps={WARMUP},total_steps={total},"
                      f"decay_fraction=1.0,cooldown=linear"}[name]


@pytest.mark.parametrize("name", ["cosine", "wsd", "linear"])
def test_loss_equals_the_papers_formula(name):
    curve = observed(name, schedule_curve(spec(name)).lr, 7)
    expected = [reference_loss(TRUE, list(curve.lr), int(t), DECAY) for t in curve.steps]
    np.testing.assert_allclose(annealing_loss(TRUE, curve, DECAY), expected, rtol=1e-12)


@pytest.fixture(scope="module")
def fit():
    law = Annealing()
    settings = law.options({"annealing-decay": DECAY})
    curves = [from_schedule(spec("constant"), EVERY, "constant"),
              from_schedule(spec("cosine"), EVERY, "cosine"),
              observed("two_stage", two_stage(PEAK, T, 400, 0.3, WARMUP), EVERY)]
    return law.fit(with_losses(law, TRUE, curves, settings=settings), n_bootstrap=0,
                   ci_level=0.95, seed=0, **settings)


def test_fit_recovers_the_parameters(fit):
    for name, value in TRUE.items():
        assert abs(fit.params[name] / value - 1) <= 1e-3, name


@pytest.mark.parametrize("name,total", [("wsd", T), ("linear", T), ("cosine", 3 * T)])
def test_fit_predicts_held_out_schedules(fit, name, total):
    curve = from_schedule(spec(name, total), EVERY)
    truth = np.array([reference_loss(TRUE, list(curve.lr), int(t), DECAY)
                      for t in curve.steps])
    predicted = Annealing().predict(fit.params, curve, {"decay": DECAY})
    assert np.max(np.abs(predicted / truth - 1)) <= 1e-4


@pytest.mark.parametrize("value", [0.0, 1.0, 1.5])
def test_decay_outside_the_unit_interval_is_refused(value):
    with pytest.raises(FitInputError, match="--annealing-decay"):
        Annealing().options({"annealing-decay": value})


def test_a_floor_the_curves_cannot_see_is_reported_not_pinned(fit):
    assert fit.unpinned == ()
    law = Annealing()
    settings = law.options({"annealing-decay": DECAY})
    curves = [from_schedule(spec("constant"), EVERY, "constant"),
              from_schedule(spec("cosine"), EVERY, "cosine")]
    noisy = with_losses(law, TRUE | {"L0": 1e-9}, curves, settings=settings, noise=1e-3,
                        rng=np.random.default_rng(3))
    fitted = law.fit(noisy, n_bootstrap=0, ci_level=0.95, seed=0, **settings)
    assert "L0" in fitted.unpinned and "A" not in fitted.unpinned
    assert any("standard error of log L0" in w for w in fitted.warnings)
