"""Laws fitted to truths not of their form, each stating what the law then gets wrong, and laws
fitted to their papers' published runs (docs/scaling.md, docs/scripts/off_form.py).

Over-training law (Gadre et al. 2024): L(C, M) assumes Chinchilla's alpha = beta. Its compute
penalty C_M/C_M* is then the same at every loss; with alpha != beta the truth's is not, and the
law carries the penalty of the budgets it was fitted on to 1e21 FLOPs, where its interval misses
the truth (it overstates the price of over-training, 1.6 against 1.16 at M = 200). The same
design with alpha = beta holds the truth."""

import numpy as np
import pytest

from attnlab.scaling import equations, published_runs, synthetic
from attnlab.scaling.laws import overtrain as ot

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized

CHINCHILLA = synthetic.CHINCHILLA_PUBLISHED  # alpha 0.34, beta 0.28: off the law's form
# On its form: alpha = beta = 0.34, B chosen so that M* = 20 (tests/test_scaling_overtrain.py).
EQUAL = CHINCHILLA | {"beta": 0.34, "B": CHINCHILLA["A"] * 20**0.34}
BUDGETS = 1e15 * 4.0 ** np.arange(6)  # 1e15-1e18
RATIOS = (5, 10, 20, 40, 80, 160)
SMALL_GRID = {"log_a": (2.0, 12.0), "log_b": (2.0, 12.0), "e": (-0.5, 1.0), "eta": (0.05, 0.4)}
TARGET = 1e21  # 1,000x the largest budget fitted, as an anchor's question would be


def chinchilla_truth(params):
    return lambda n, d: equations.chinchilla_loss(params, n, d)


def fitted_penalties(params, seed):
    frame = synthetic.overtrain_points(params, budgets=BUDGETS, ratios=RATIOS, noise=0.005,
                                       law="chinchilla", rng=np.random.default_rng(seed))
    fit = ot.fit_overtrain(frame.params, frame.tokens, frame.loss, grid=SMALL_GRID,
                           n_bootstrap=40, seed=seed)
    return {m: ot.at_ratio(fit, TARGET, m) for m in (200.0, 2000.0)}


def test_off_form_the_true_penalty_changes_with_the_loss_the_laws_cannot():
    """Chinchilla's optimal ratio grows with C (alpha > beta: 13 at 1e15, 50 at 1e21), so its
    penalty at M = 200 falls from 1.74 at 1e15 and 1.38 at 1e18 (the budgets fitted) to 1.16 at
    1e21; at alpha = beta it is one number at every budget, as the law says."""
    off = [synthetic.true_compute_penalty(chinchilla_truth(CHINCHILLA), c, 200.0)
           for c in (1e15, 1e18, 1e21)]
    assert off == pytest.approx([1.735, 1.375, 1.158], abs=0.002)
    on = [synthetic.true_compute_penalty(chinchilla_truth(EQUAL), c, 200.0)
          for c in (1e15, 1e18, 1e21)]
    assert on == pytest.approx([on[0]] * 3, rel=1e-6)
    # the formula then agrees with the truth (a = A 6^eta, b = B 6^eta, eta = alpha/2)
    eta = EQUAL["alpha"] / 2
    law = {"E": EQUAL["E"], "a": EQUAL["A"] * 6**eta, "b": EQUAL["B"] * 6**eta, "eta": eta}
    assert ot.compute_penalty(law, 200.0) == pytest.approx(on[0], rel=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_with_alpha_not_beta_the_penalty_interval_misses_the_truth(seed):
    """36 runs of Chinchilla's published law (1e15-1e18 x M 5-160, 0.5% noise): at 1e21 the
    law's penalty lies above the truth (1.158 at M = 200, 2.68 at 2000) with the truth below
    its 95% interval, by more than 25% (measured 1.57-1.64 and 5.0-5.5)."""
    truth = {m: synthetic.true_compute_penalty(chinchilla_truth(CHINCHILLA), TARGET, m)
             for m in (200.0, 2000.0)}
    for m, row in fitted_penalties(CHINCHILLA, seed).items():
        assert truth[m] < row["penalty_ci"][0], (m, truth[m], row["penalty_ci"])
        assert row["penalty"] > 1.25 * truth[m], (m, truth[m], row["penalty"])


def test_with_alpha_equal_beta_the_same_design_holds_the_truth():
    """The control, the same runs from a truth with alpha = beta at six seeds: each penalty
    within 10% of the truth (1.552 at M = 200, 5.18 at 2000; measured 0.6-3% and 1.6-7% above,
    where off the form it is 35% and 90% above), inside its 95% interval in at least 5 of the 6 draws
    (measured 5: seed 1's intervals start 1-2% above the truth). The failure above is the
    form's, not the design's."""
    truth = {m: synthetic.true_compute_penalty(chinchilla_truth(EQUAL), TARGET, m)
             for m in (200.0, 2000.0)}
    inside = {m: 0 for m in truth}
    for seed in range(6):
        for m, row in fitted_penalties(EQUAL, seed).items():
            assert row["penalty"] == pytest.approx(truth[m], rel=0.10), (seed, m, row)
            inside[m] += row["penalty_ci"][0] <= truth[m] <= row["penalty_ci"][1]
    assert min(inside.values()) >= 5, inside


# --- Gadre et al.'s own runs ------------------------------------------------------------------

@pytest.fixture(scope="module")
def gadre():
    return published_runs.gadre_runs()


def test_the_transcribed_runs_are_the_papers_testbed(gadre):
    """104 runs on three datasets; per dataset 5 fitting runs and 3 held out (1.4B at M = 20
    and one over-trained M, 6.9B at M = 20)."""
    assert len(gadre) == 104 and set(gadre.dataset) == set(published_runs.DATASETS)
    for dataset in published_runs.DATASETS:
        fit_runs = published_runs.paper_fit_runs(gadre, dataset)
        held = published_runs.held_out_runs(gadre, dataset)
        assert len(fit_runs) == 5 and len(held) == 3
        assert held.params.min() > 1.4e9 and fit_runs.params.max() < 4.2e8
        assert sorted(held.chinchilla_multiplier)[:2] == [1.0, 1.0]


@pytest.mark.parametrize("dataset", published_runs.DATASETS)
def test_the_papers_fit_predicts_the_held_out_runs(gadre, dataset):
    """Table 2's five runs, the paper's least squares on L and attnlab's Huber on log L alike:
    RedPajama's and RefinedWeb's three held-out runs within 3% (measured max 0.73% and 1.65%),
    C4's 1.4B runs within 3% but its 6.9B 4.3-4.7% too low under both objectives."""
    fit_runs = published_runs.paper_fit_runs(gadre, dataset)
    held = published_runs.held_out_runs(gadre, dataset)
    huber = ot.fit_overtrain(fit_runs.params, fit_runs.tokens, fit_runs.loss, n_bootstrap=0)
    for params in (published_runs.least_squares_fit(fit_runs), huber.params):
        errors = published_runs.holdout_errors(params, held)
        is_7b = (held.model == "open_lm_7b").to_numpy()
        if dataset == "c4_original":
            assert np.all(np.abs(errors[~is_7b]) < 0.03), errors
            assert -0.05 < errors[is_7b][0] < -0.035, errors
        else:
            assert np.all(np.abs(errors) < 0.03), errors
