"""Gadre et al. 2024's published runs (tests/data/gadre2024_runs.csv, their C4 eval loss) and
the over-training law fitted to them as the paper does: Table 2's defaults fit L(C, M) to five
runs, the four sizes 11M-411M at M = 20 and the 11M at M = 320, by least squares on L, and
predict the 1.4B and 6.9B runs, which no fit sees.

    frame = gadre_runs()
    fit = least_squares_fit(paper_fit_runs(frame, "rpj"))     # E, a, b, eta
    held = held_out_runs(frame, "rpj")                         # to predict with the fit
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from attnlab.scaling.laws import overtrain

GADRE_RUNS = Path(__file__).resolve().parents[2] / "tests" / "data" / "gadre2024_runs.csv"
DATASETS = ("c4_original", "rpj", "rw_original")
# The open_lm configs of their fitting ladder (11M, 79M, 154M, 411M); 1.4B and 6.9B are held out.
SMALL_MODELS = ("d=96_l=8_h=4", "d=512_l=8_h=4", "d=576_l=24_h=8", "d=1024_l=24_h=8")
# Starts for least squares on L: log a, log b over the span the Huber fits reach on these runs
# (a, b ~ 1e2-1e4 at eta ~ 0.12), eta, E around the losses' floor; 192 starts, the best kept.
LSQ_STARTS = tuple(itertools.product((2.0, 5.0, 8.0, 11.0), (2.0, 5.0, 8.0, 11.0),
                                     (0.05, 0.15, 0.3), (0.5, 1.5, 2.5, 3.5)))


def gadre_runs(path: Path = GADRE_RUNS) -> pd.DataFrame:
    """The 104 runs, params and tokens as floats (6ND overflows int64 at 6.9B)."""
    return pd.read_csv(path).astype({"params": np.float64, "tokens": np.float64})


def small_runs(frame: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """Every run of the four fitting sizes trained on ``dataset``, at every M."""
    return frame[(frame.dataset == dataset) & frame.model.isin(SMALL_MODELS)]


def paper_fit_runs(frame: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """Table 2's defaults: the four sizes at M = 20 and the 11M at M = 320 (5 runs)."""
    small = small_runs(frame, dataset)
    keep = (small.chinchilla_multiplier == 1.0) | (
        (small.model == SMALL_MODELS[0]) & (small.chinchilla_multiplier == 16.0))
    return small[keep]


def held_out_runs(frame: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """The 1.4B (at M = 20 and one over-trained M) and 6.9B (M = 20) runs on ``dataset``."""
    return frame[(frame.dataset == dataset) & ~frame.model.isin(SMALL_MODELS)]


def least_squares_fit(runs: pd.DataFrame) -> dict:
    """E, a, b, eta minimising sum (L_pred - L)^2 (the paper's objective, on L itself), the
    best of LSQ_STARTS by Levenberg-Marquardt."""
    c = 6.0 * runs.params.to_numpy() * runs.tokens.to_numpy()
    m = runs.tokens.to_numpy() / runs.params.to_numpy()
    loss = runs.loss.to_numpy()

    def residuals(theta):
        return overtrain.overtrain_loss(as_params(theta), c, m) - loss

    best = None
    for start in LSQ_STARTS:
        # Far starts step through overflowing a, b; their non-finite residuals are rejected.
        with np.errstate(all="ignore"):
            solved = least_squares(residuals, start, method="lm", max_nfev=20000)
        if np.all(np.isfinite(solved.fun)) and (best is None or solved.cost < best.cost):
            best = solved
    return as_params(best.x)


def as_params(theta) -> dict:
    log_a, log_b, eta, e = theta
    return {"E": e, "a": np.exp(log_a), "b": np.exp(log_b), "eta": eta}
