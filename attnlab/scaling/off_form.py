"""Laws fitted to truths not of their own form, and to their papers' runs: the cases that
tests/test_scaling_off_form.py checks and docs/scripts/off_form.py tabulates (docs/scaling.md).

Each case returns rows {law, truth, seed, quantity, true, estimate, low, high} (low, high: the
95% bootstrap interval; NaN where none).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnlab.scaling import equations, published_runs, synthetic
from attnlab.scaling.bootstrap import percentile_interval
from attnlab.scaling.laws import data_constrained, overtrain
from attnlab.scaling.laws.approach3 import InitGrid, fit_approach3
from attnlab.scaling.laws.kaplan import fit_kaplan

CHINCHILLA = synthetic.CHINCHILLA_PUBLISHED  # alpha 0.34, beta 0.28
# alpha = beta = 0.34 with M* = 20: on the over-training law's form (a = A 6^eta, b = B 6^eta).
EQUAL = CHINCHILLA | {"beta": 0.34, "B": CHINCHILLA["A"] * 20**0.34}
# 36 runs, 1e15-1e18 FLOPs x M 5-160 (tests/test_scaling_overtrain.py's design); starts off the
# truth, 2 per axis.
OT_BUDGETS = 1e15 * 4.0 ** np.arange(6)
OT_RATIOS = (5, 10, 20, 40, 80, 160)
OT_GRID = {"log_a": (2.0, 12.0), "log_b": (2.0, 12.0), "e": (-0.5, 1.0), "eta": (0.05, 0.4)}
OT_TARGET = 1e21  # 1,000x the largest budget fitted, an anchor's question
# Approach 3: 60 runs at log-uniform (N, D) in [1e7, 1e9] x [1e8, 1e11]; 243 starts.
A3_GRID = InitGrid(a=(0.0, 10.0, 20.0), b=(0.0, 10.0, 20.0), e=(-1.0, 0.0, 1.0),
                   alpha=(0.0, 1.0, 2.0), beta=(0.0, 1.0, 2.0))
A3_RUNS = 60
MUENNIGHOFF = synthetic.MUENNIGHOFF_PUBLISHED
MUENNIGHOFF_PART = {k: MUENNIGHOFF[k] for k in ("E", "A", "B", "alpha", "beta")}


def _row(law, truth, seed, quantity, true, estimate, interval=None):
    low, high = interval if interval is not None else (np.nan, np.nan)
    return {"law": law, "truth": truth, "seed": seed, "quantity": quantity, "true": float(true),
            "estimate": float(estimate), "low": float(low), "high": float(high)}


def overtrain_case(params: dict, seed: int, n_bootstrap: int = 40) -> list[dict]:
    """The over-training law on 36 runs of Chinchilla's L(N, D) with ``params`` (0.5% noise):
    its compute penalty at M = 200 and 2000 against the truth's, at 1e21 FLOPs."""
    frame = synthetic.overtrain_points(params, budgets=OT_BUDGETS, ratios=OT_RATIOS,
                                       noise=0.005, law="chinchilla",
                                       rng=np.random.default_rng(seed))
    fit = overtrain.fit_overtrain(frame.params, frame.tokens, frame.loss, grid=OT_GRID,
                                  n_bootstrap=n_bootstrap, seed=seed)
    truth = f"Chinchilla, alpha {params['alpha']:g}, beta {params['beta']:g}"
    rows = []
    for m in (200.0, 2000.0):
        at = overtrain.at_ratio(fit, OT_TARGET, m)
        true = synthetic.true_compute_penalty(lambda n, d: equations.chinchilla_loss(params, n, d),
                                              OT_TARGET, m)
        rows.append(_row("overtrain", truth, seed, f"penalty at M={m:g}, C=1e21", true,
                         at["penalty"], at["penalty_ci"]))
    return rows


def random_runs(seed: int):
    """60 (N, D) log-uniform in [1e7, 1e9] x [1e8, 1e11], and the generator for their noise."""
    rng = np.random.default_rng(seed)
    n = np.exp(rng.uniform(np.log(1e7), np.log(1e9), A3_RUNS))
    d = np.exp(rng.uniform(np.log(1e8), np.log(1e11), A3_RUNS))
    return n, d, rng


def approach3_case(gamma: float, seed: int, n_bootstrap: int = 60) -> list[dict]:
    """Approach 3 on 60 runs of E + (A/N^alpha + B/D^beta)^gamma (Chinchilla's published
    values, 0.5% noise): the compute-optimal loss at 10x the largest run's compute, the
    allocation exponent a (N_opt ~ C^a; the truth's is beta/(alpha+beta) at every gamma) and E."""
    n, d, rng = random_runs(seed)

    def truth(n, d):
        return synthetic.powered_chinchilla_loss(CHINCHILLA, gamma, n, d)

    loss = truth(n, d) * np.exp(0.005 * rng.standard_normal(A3_RUNS))
    fit = fit_approach3(n, d, loss, grid=A3_GRID, n_bootstrap=n_bootstrap, seed=seed)
    c = 10.0 * equations.training_flops(n, d).max()
    optimum = equations.chinchilla_optimal(fit.params, c)["loss"]
    replicates = equations.chinchilla_optimal(fit.interval_samples, c)["loss"]
    label = f"Chinchilla^gamma, gamma {gamma:g}"
    a_true = CHINCHILLA["beta"] / (CHINCHILLA["alpha"] + CHINCHILLA["beta"])
    return [_row("chinchilla3", label, seed, "optimal loss at 10x C_max",
                 synthetic.true_optimum(truth, c)[1], optimum,
                 percentile_interval(replicates, fit.ci_level)),
            _row("chinchilla3", label, seed, "a", a_true, fit.params["a"], fit.ci["a"]),
            _row("chinchilla3", label, seed, "E", CHINCHILLA["E"], fit.params["E"], fit.ci["E"])]


KAPLAN_TRUTHS = {
    "Chinchilla (floor E 1.69)": lambda n, d: equations.chinchilla_loss(CHINCHILLA, n, d),
    "Kaplan (no floor)": lambda n, d: equations.kaplan_loss(synthetic.KAPLAN_PUBLISHED, n, d)}
KAPLAN_TARGETS = ((1e10, 2e11), (1e11, 2e12))  # 10x and 100x the largest N and D fitted


def kaplan_case(truth: str, seed: int, n_bootstrap: int = 40) -> list[dict]:
    """Kaplan's joint L(N, D), which has no floor, on approach 3's 60 runs of ``truth`` (a
    KAPLAN_TRUTHS key, 0.5% noise): the loss of runs 10x and 100x larger in N and D."""
    n, d, rng = random_runs(seed)
    loss_of = KAPLAN_TRUTHS[truth]
    loss = loss_of(n, d) * np.exp(0.005 * rng.standard_normal(A3_RUNS))
    fit = fit_kaplan(n, d, loss, n_bootstrap=n_bootstrap, seed=seed)
    return [_row("kaplan", truth, seed, f"loss at N={nn:.0e}, D={dd:.0e}", loss_of(nn, dd),
                 equations.kaplan_loss(fit.params, nn, dd),
                 percentile_interval(equations.kaplan_loss(fit.interval_samples, nn, dd),
                                     fit.ci_level))
            for nn, dd in KAPLAN_TARGETS]


def data_constrained_case(floor_rise: float, seed: int, n_bootstrap: int = 20) -> list[dict]:
    """The data-constrained law with its Chinchilla part frozen at the truth's (as Muennighoff
    et al. fit R*_D, R*_N) on 84 runs of their published law whose floor rises with repetition,
    E + floor_rise (1 - 1/epochs) (0: their own form): R*_D and R*_N."""
    frame = synthetic.repeated_points(MUENNIGHOFF, sizes=np.geomspace(1e7, 3e9, 4),
                                      unique_tokens=(1e8, 1e9, 1e10),
                                      epochs=(1, 2, 4, 8, 16, 32, 64), noise=0.005,
                                      rng=np.random.default_rng(seed))
    loss = frame.loss + floor_rise * (1 - 1 / frame.epochs)
    fit = data_constrained.fit_data_constrained(frame.params, frame.tokens, frame.unique_tokens,
                                                loss, fixed=MUENNIGHOFF_PART,
                                                n_bootstrap=n_bootstrap, seed=seed,
                                                grid_starts=0)
    truth = f"Muennighoff, floor + {floor_rise:g} (1 - 1/epochs)"
    return [_row("data_constrained", truth, seed, name, MUENNIGHOFF[name], fit.params[name],
                 fit.ci[name]) for name in ("R_D", "R_N")]


def gadre_predictions(frame: pd.DataFrame) -> pd.DataFrame:
    """Per dataset, fits to Gadre et al.'s runs predicting their 1.4B and 6.9B runs: L(C, M) on
    Table 2's five runs by least squares on L (the paper's), the same five by attnlab's Huber on
    log L, every run of the four small sizes by the Huber; and, as a diagnostic of the
    alpha = beta assumption, approach 3 (alpha, beta free) on every small run."""
    rows = []
    for dataset in published_runs.DATASETS:
        five = published_runs.paper_fit_runs(frame, dataset)
        small = published_runs.small_runs(frame, dataset)
        held = published_runs.held_out_runs(frame, dataset)
        n, d = held.params.to_numpy(), held.tokens.to_numpy()
        fits = {"5 runs, least squares on L (paper)": published_runs.least_squares_fit(five)}
        for name, runs in (("5 runs, Huber on log L", five), ("all small runs, Huber on log L",
                                                               small)):
            fits[name] = overtrain.fit_overtrain(runs.params, runs.tokens, runs.loss,
                                                 n_bootstrap=0).params
        predicted = {name: overtrain.overtrain_loss(p, 6.0 * n * d, d / n)
                     for name, p in fits.items()}
        free = fit_approach3(small.params, small.tokens, small.loss).params
        name = "all small runs, approach 3 (alpha, beta free)"
        predicted[name] = equations.chinchilla_loss(free, n, d)
        fits[name] = {"E": free["E"], "eta": np.nan}
        for name, losses in predicted.items():
            for (_, run), loss in zip(held.iterrows(), losses):
                rows.append({"dataset": dataset, "fit": name, "run": run["name"],
                             "params": run.params, "M": run.tokens / run.params,
                             "observed": run.loss, "predicted": loss,
                             "error": loss / run.loss - 1, "eta": float(fits[name]["eta"]),
                             "E": float(fits[name]["E"])})
    return pd.DataFrame(rows)
