"""The multi-power law (Luo et al. 2025): its equations against a float64 loop written from the
paper's formula, recovery of known parameters from synthetic curves, held-out schedules, the
bootstrap over runs and bad input."""

import numpy as np
import pytest

from attnlab.scaling import curvefit
from attnlab.scaling.curves import curves_from_table, schedule_curve
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.laws.multipower import MODEL, MultiPower, multipower_loss
from attnlab.scaling.laws.registry import law_named
from attnlab.scaling.synthetic_curves import (MULTIPOWER_PUBLISHED, curves_frame,
                                              from_schedule, observed, two_stage, with_losses)

TRUE = MULTIPOWER_PUBLISHED
PEAK, WARMUP, T, EVERY = 3e-4, 30, 600, 10


def reference_loss(p, lr, t):
    """L(t) = L0 + A (S1(t) + S_W)^-alpha - B sum_{k} (eta_{k-1} - eta_k) G(eta_k^-gamma S_k(t))
    with k over the updates after the warmup's peak, as a plain loop (lr[i] is update i + 1)."""
    peak = int(np.argmax(lr)) + 1
    area = sum(lr[:t])
    summed, drop_loss = 0.0, 0.0
    for k in range(t, peak, -1):  # S_k(t) = sum_{tau=k..t} eta_tau, built from k = t down
        summed += lr[k - 1]
        x = lr[k - 1] ** -p["gamma"] * summed
        drop_loss += (lr[k - 2] - lr[k - 1]) * (1.0 - (p["C"] * x + 1.0) ** -p["beta"])
    return p["L0"] + p["A"] * area ** -p["alpha"] - p["B"] * drop_loss


def schedules(total=T):
    return {"constant": f"constant:peak={PEAK},warmup_steps={WARMUP},total_steps={total}",
            "cosine": f"cosine:peak={PEAK},warmup_steps={WARMUP},total_steps={total},"
                      f"min_lr_ratio=0.1",
            "wsd": f"wsd:peak={PEAK},warmup_steps={WARMUP},total_steps={total},"
                   f"decay_fraction=0.2",
            "linear": f"wsd:peak={PEAK},warmup_steps={WARMUP},total_steps={total},"
                      f"decay_fraction=1.0,cooldown=linear,min_lr_ratio=0.05"}


def fitted_curves():
    named = schedules()
    curves = [from_schedule(named["constant"], EVERY, "constant"),
              from_schedule(named["cosine"], EVERY, "cosine"),
              observed("two_stage", two_stage(PEAK, T, 400, 0.3, WARMUP), EVERY)]
    return with_losses(MultiPower(), TRUE, curves)


@pytest.mark.parametrize("name", ["cosine", "wsd", "linear", "two_stage"])
def test_loss_equals_the_papers_formula(name):
    lr = (two_stage(PEAK, T, 400, 0.3, WARMUP) if name == "two_stage"
          else schedule_curve(schedules()[name]).lr)
    curve = observed(name, lr, 7)
    expected = [reference_loss(TRUE, list(lr), int(t)) for t in curve.steps]
    np.testing.assert_allclose(multipower_loss(TRUE, curve), expected, rtol=1e-12)
    assert np.ptp(expected) > 0.1  # the schedule moves the loss


def test_jacobian_equals_finite_differences():
    curve = fitted_curves()[1].fitted()
    theta = np.log([TRUE[n] for n in MODEL.names])
    analytic = MODEL.jacobian(TRUE, curve)
    for i in range(len(theta)):
        step = np.zeros_like(theta)
        step[i] = 1e-6
        numeric = (MODEL.loss(MODEL.params(theta + step), curve)
                   - MODEL.loss(MODEL.params(theta - step), curve)) / 2e-6
        np.testing.assert_allclose(analytic[:, i], numeric, rtol=1e-5, atol=1e-9)


@pytest.fixture(scope="module")
def fit():
    return MultiPower().fit(fitted_curves(), n_bootstrap=0, ci_level=0.95, seed=0)


def test_fit_recovers_the_parameters(fit):
    assert fit.unpinned == ()
    for name, value in TRUE.items():
        assert abs(fit.params[name] / value - 1) <= 1e-3, name


@pytest.mark.parametrize("name,total", [("wsd", T), ("linear", T), ("cosine", 3 * T)])
def test_fit_predicts_held_out_schedules(fit, name, total):
    curve = from_schedule(schedules(total)[name], EVERY)
    truth = np.array([reference_loss(TRUE, list(curve.lr), int(t)) for t in curve.steps])
    predicted = MultiPower().predict(fit.params, curve)
    assert np.max(np.abs(predicted / truth - 1)) <= 1e-4
    baseline = curvefit.s1_loss(TRUE, curve)  # the schedule's shape is what the law adds
    assert np.max(np.abs(baseline / truth - 1)) > 1e-3


def test_bootstrap_counts_replicates_without_two_runs_as_failed():
    curves = fitted_curves()[1:]  # cosine and two-stage: a draw of one run twice fails
    fit = MultiPower().fit(curves, n_bootstrap=12, ci_level=0.9, seed=1)
    assert fit.n_bootstrap_failed > 0
    assert fit.n_bootstrap + fit.n_bootstrap_failed == 12
    assert fit.intervals_refused and fit.resampling["unit"] == "run"


def test_rates_logged_only_at_some_steps_are_interpolated():
    lr = schedule_curve(f"wsd:peak={PEAK},total_steps=200,decay_fraction=0.5,"
                        f"cooldown=linear").lr  # piecewise linear, kinks at logged steps
    curves = [observed("wsd", lr, 10), observed("flat", np.full(200, PEAK), 10)]
    curves = with_losses(MultiPower(), TRUE, curves)
    full, _ = curves_from_table(curves_frame(curves), source="t.csv")
    sparse, notes = curves_from_table(curves_frame(curves, lr_every_step=False),
                                      source="t.csv")
    np.testing.assert_allclose(sparse[1].lr, full[1].lr, rtol=1e-12)
    assert any("interpolated linearly" in note for note in notes)


def ladder_frame():
    """A WSD ladder as a sweep logs it: a constant-rate trunk to update 480 and branches of 200,
    400 and 600 updates, each with a (1 - sqrt) cooldown over its last 20%, logging only its
    cooldown (column trunk names the trunk); beside it, each branch trained from scratch."""
    trunk = from_schedule(f"constant:peak={PEAK},warmup_steps={WARMUP},total_steps=480",
                          EVERY, "trunk")
    branches = [from_schedule(f"wsd:peak={PEAK},warmup_steps={WARMUP},total_steps={n},"
                              f"decay_fraction=0.2", EVERY, f"b{n}") for n in (200, 400, 600)]
    curves = with_losses(MultiPower(), TRUE, [trunk, *branches])
    frame = curves_frame(curves)
    start = {f"b{n}": int(0.8 * n) for n in (200, 400, 600)}
    logged = frame["step"] > frame["run_id"].map(start).fillna(0)
    frame = frame[logged].assign(trunk=frame["run_id"].map(lambda r: "trunk" if r in start
                                                             else None))
    return frame, curves


def test_a_ladders_branch_curves_begin_with_their_trunks():
    """Each branch's curve is the trunk's up to its branch point, then its own: equal to the
    branch trained from scratch (rates and losses); and the law fitted on the trunk and the
    shortest branch predicts the two longer branches' cooldowns (known answer: within 1e-4)."""
    frame, scratch = ladder_frame()
    curves, notes = curves_from_table(frame, source="ladder.csv")
    for got, want in zip(curves, sorted(scratch, key=lambda c: c.run_id)):
        assert got.run_id == want.run_id
        np.testing.assert_array_equal(got.lr, want.lr)
        np.testing.assert_array_equal(got.steps, want.steps)
        np.testing.assert_allclose(got.loss, want.loss, rtol=1e-15)
    assert any("3 cooldown branch(es)" in note for note in notes)
    by_id = {c.run_id: c for c in curves}
    fit = MultiPower().fit([by_id["trunk"], by_id["b200"]], n_bootstrap=0, ci_level=0.95, seed=0)
    for name in ("b400", "b600"):
        branch = by_id[name].fitted()
        tail = branch.steps > 0.8 * len(branch.lr)
        predicted = MultiPower().predict(fit.params, branch)[tail]
        np.testing.assert_allclose(predicted, branch.loss[tail], rtol=1e-4)


@pytest.mark.parametrize("change,named", [
    (lambda df: df.drop(columns="lr"), "'lr'"),
    (lambda df: df[df["run_id"] == "cosine"], "at least 2 runs"),
    (lambda df: df.assign(lr=-df["lr"]), "column 'lr'"),
    (lambda df: df.drop(columns="step"), "'step'"),
])
def test_bad_input_is_one_line_naming_the_field(change, named):
    frame = change(curves_frame(fitted_curves()))
    with pytest.raises(FitInputError, match=named) as error:
        curves_from_table(frame, source="curves.csv")
    assert "curves.csv" in str(error.value) and "\n" not in str(error.value)


def test_constant_rates_alone_are_refused():
    flat = [observed(f"flat{i}", np.full(100, PEAK * (i + 1)), 10) for i in range(2)]
    with pytest.raises(FitInputError, match="no run's rate drops"):
        MultiPower().fit(with_losses(MultiPower(), TRUE, flat), n_bootstrap=0, ci_level=0.95,
                         seed=0)


def test_registered():
    law = law_named("multipower")
    assert law.can("curves") and law.can("schedule") and "predict-schedule" in law.flag_names
