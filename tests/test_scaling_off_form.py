"""Laws fitted to truths not of their form, each stating what the law then gets wrong, and laws
fitted to their papers' published runs (attnlab/scaling/off_form.py; docs/scaling.md's tables
come from docs/scripts/off_form.py).

Over-training law (Gadre et al. 2024): L(C, M) assumes Chinchilla's alpha = beta, so its compute
penalty C_M/C_M* is the same at every loss. With alpha != beta the truth's is not: the law
carries the penalty of the budgets it was fitted on to 1e21 FLOPs, where its interval misses the
truth (it overstates the price of over-training, 1.6 against 1.16 at M = 200). The same design
with alpha = beta holds the truth.

Approach 3 (Chinchilla): with a truth E + (A/N^alpha + B/D^beta)^gamma, gamma = 1.5, the
allocation exponent a stays right but the floor E absorbs the curvature: E is biased low and the
compute-optimal loss at 10x the largest run's compute is predicted too low at every seed."""

import numpy as np
import pytest

from attnlab.scaling import equations, off_form, published_runs, synthetic
from attnlab.scaling.laws import overtrain as ot

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized


def chinchilla_truth(params):
    return lambda n, d: equations.chinchilla_loss(params, n, d)


def test_off_form_the_true_penalty_changes_with_the_loss_the_laws_cannot():
    """Chinchilla's optimal ratio grows with C (alpha > beta: 13 at 1e15, 50 at 1e21), so its
    penalty at M = 200 falls from 1.74 at 1e15 and 1.38 at 1e18 (the budgets fitted) to 1.16 at
    1e21; at alpha = beta it is one number at every budget, the law's formula's."""
    off = [synthetic.true_compute_penalty(chinchilla_truth(off_form.CHINCHILLA), c, 200.0)
           for c in (1e15, 1e18, 1e21)]
    assert off == pytest.approx([1.735, 1.375, 1.158], abs=0.002)
    on = [synthetic.true_compute_penalty(chinchilla_truth(off_form.EQUAL), c, 200.0)
          for c in (1e15, 1e18, 1e21)]
    assert on == pytest.approx([on[0]] * 3, rel=1e-6)
    equal, eta = off_form.EQUAL, off_form.EQUAL["alpha"] / 2
    law = {"E": equal["E"], "a": equal["A"] * 6**eta, "b": equal["B"] * 6**eta, "eta": eta}
    assert ot.compute_penalty(law, 200.0) == pytest.approx(on[0], rel=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_with_alpha_not_beta_the_penalty_interval_misses_the_truth(seed):
    """36 runs of Chinchilla's published law (1e15-1e18 x M 5-160, 0.5% noise): at 1e21 the
    law's penalty lies above the truth (1.158 at M = 200, 2.68 at 2000), the truth below its
    95% interval, and by more than 25% (measured 1.57-1.64 and 5.0-5.5)."""
    for row in off_form.overtrain_case(off_form.CHINCHILLA, seed):
        assert row["true"] < row["low"], row
        assert row["estimate"] > 1.25 * row["true"], row


def test_with_alpha_equal_beta_the_same_design_holds_the_truth():
    """The control, the same runs from a truth with alpha = beta at six seeds: each penalty
    within 10% of the truth (1.552 at M = 200, 5.18 at 2000; measured 0.6-3% and 1.6-7% above,
    where off the form it is 35% and 90% above), inside its 95% interval in at least 5 of the 6
    draws (measured 5: seed 1's intervals start 1-2% above the truth). The failure above is the
    form's, not the design's."""
    inside = {}
    for seed in range(6):
        for row in off_form.overtrain_case(off_form.EQUAL, seed):
            assert row["estimate"] == pytest.approx(row["true"], rel=0.10), row
            inside[row["quantity"]] = (inside.get(row["quantity"], 0)
                                       + (row["low"] <= row["true"] <= row["high"]))
    assert len(inside) == 2 and min(inside.values()) >= 5, inside


def approach3_rows(gamma):
    rows = [row for seed in range(4) for row in off_form.approach3_case(gamma, seed)]
    return {q: [r for r in rows if r["quantity"] == q] for q in ("optimal loss at 10x C_max",
                                                                 "a", "E")}


def test_approach3_off_form_the_floor_absorbs_the_curvature():
    """gamma = 1.5, four seeds: the 10x-compute optimal loss below the truth at every seed and
    by more than 3% on average (measured -0.8% to -11%, mean -5.9%), E's estimate below 1.69 at
    every seed (1.00-1.66); a's interval holds the truth's 0.452 at every seed (the allocation
    is gamma's-free: the optimum of S^gamma is the optimum of S)."""
    rows = approach3_rows(1.5)
    errors = [r["estimate"] / r["true"] - 1 for r in rows["optimal loss at 10x C_max"]]
    assert max(errors) < 0 and np.mean(errors) < -0.03, errors
    assert all(r["estimate"] < r["true"] for r in rows["E"]), rows["E"]
    assert all(r["low"] <= r["true"] <= r["high"] for r in rows["a"]), rows["a"]


def test_approach3_on_form_the_same_design_extrapolates_within_one_percent():
    """The control, gamma = 1 (Chinchilla's own form), same runs and seeds: |error| of the
    10x-compute optimal loss under 1% (measured 0.2-0.5%), inside its 95% interval in at least 3
    of the 4 draws (a 95% interval may miss one; measured 4 under Python 3.11's scipy, 3 under
    3.12's, where seed 0's upper end falls 0.2% short of the truth), and a's interval holding
    0.452 at every seed."""
    rows = approach3_rows(1.0)
    for r in rows["optimal loss at 10x C_max"]:
        assert r["estimate"] == pytest.approx(r["true"], rel=0.01), r
    inside = [r["low"] <= r["true"] <= r["high"] for r in rows["optimal loss at 10x C_max"]]
    assert sum(inside) >= 3, rows["optimal loss at 10x C_max"]
    assert all(r["low"] <= r["true"] <= r["high"] for r in rows["a"]), rows["a"]


# --- Gadre et al.'s own runs ------------------------------------------------------------------

@pytest.fixture(scope="module")
def predictions():
    return off_form.gadre_predictions(published_runs.gadre_runs())


def test_the_transcribed_runs_are_the_papers_testbed():
    """104 runs on three datasets; per dataset 5 fitting runs and 3 held out (1.4B at M = 20
    and one over-trained M, 6.9B at M = 20)."""
    gadre = published_runs.gadre_runs()
    assert len(gadre) == 104 and set(gadre.dataset) == set(published_runs.DATASETS)
    for dataset in published_runs.DATASETS:
        fit_runs = published_runs.paper_fit_runs(gadre, dataset)
        held = published_runs.held_out_runs(gadre, dataset)
        assert len(fit_runs) == 5 and len(held) == 3
        assert held.params.min() > 1.4e9 and fit_runs.params.max() < 4.2e8
        assert sorted(held.chinchilla_multiplier)[:2] == [1.0, 1.0]


def test_the_papers_fits_predict_the_held_out_runs_but_c4s_7b(predictions):
    """Table 2's five runs, the paper's least squares on L and attnlab's Huber on log L alike:
    RedPajama's and RefinedWeb's three held-out runs within 3% (measured max 0.73% and 1.65%);
    C4's two 1.4B runs within 3%, its 6.9B 4.3-4.7% too low under both objectives (and 5.2%
    fitted on every small run). Approach 3 with alpha and beta free misses C4's 6.9B too (by
    7.9%): the miss is not the equal-exponent assumption's."""
    is_7b = predictions.run.str.contains("open_lm_7b")
    c4 = predictions.dataset == "c4_original"
    free = predictions.fit.str.contains("approach 3")
    assert len(predictions) == 36
    law = predictions[~free]
    assert (law[~(c4[~free] & is_7b[~free])].error.abs() < 0.03).all()
    missed = law[c4[~free] & is_7b[~free]].error
    assert len(missed) == 3 and ((missed > -0.06) & (missed < -0.035)).all(), missed
    assert (predictions[free & c4 & is_7b].error < -0.03).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kaplan_without_a_floor_underpredicts_larger_runs(seed):
    """Kaplan's L(N, D) on approach 3's runs of Chinchilla's published law (E = 1.69): runs 10x
    and 100x larger predicted 10-15% and 24-29% too low (the fit has no floor to approach),
    the truth above each interval; on Kaplan's own law the same design errs < 0.5%."""
    for row in off_form.kaplan_case("Chinchilla (floor E 1.69)", seed):
        assert row["high"] < row["true"] and row["estimate"] < 0.92 * row["true"], row
    for row in off_form.kaplan_case("Kaplan (no floor)", seed):
        assert row["estimate"] == pytest.approx(row["true"], rel=0.005), row


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_data_constrained_reads_a_rising_floor_as_faster_decay(seed):
    """Muennighoff et al.'s law with a floor 0.05 higher at many epochs (E + 0.05 (1 - 1/epochs),
    the Chinchilla part frozen as they fit): R*_D biased low (measured 10.4-11.7 against 15.4)
    with its interval below the truth; at floor_rise 0 R*_D's interval holds 15.4."""
    r_d = off_form.data_constrained_case(0.05, seed)[0]
    assert r_d["quantity"] == "R_D" and r_d["high"] < r_d["true"], r_d
    assert r_d["estimate"] < 0.85 * r_d["true"], r_d
    control = off_form.data_constrained_case(0.0, seed)[0]
    assert control["low"] <= control["true"] <= control["high"], control
