"""experiments/mup_transfer.py's report: the best learning rate per width is the argmin of the
seed-mean loss, its bootstrap interval brackets it and collapses when every seed agrees, and a
diverged run (NaN loss) is never the best."""

import pathlib

import numpy as np
import pandas as pd
from repo_files import load_module

ROOT = pathlib.Path(__file__).resolve().parents[1]


def report_module():
    return load_module("experiments/mup_transfer.py")


def frame(losses: dict):
    """``{(parameterization, d_model): {lr: [loss per seed]}}`` -> the results table."""
    rows = [dict(parameterization=p, d_model=d, learning_rate=lr, seed=s, final_val_loss=v)
            for (p, d), by_lr in losses.items() for lr, values in by_lr.items()
            for s, v in enumerate(values)]
    return pd.DataFrame(rows)


def test_best_learning_rate_and_interval():
    best = report_module().best_learning_rates
    table = frame({
        ("sp", 64): {1e-3: [3.0, 3.0], 2e-3: [2.0, 2.0], 4e-3: [2.5, 2.5]},   # seeds agree
        ("mup", 64): {1e-3: [3.0, 2.1], 2e-3: [2.2, 2.3], 4e-3: [np.nan, 1.0]},  # one diverged
    })
    rows = {(p, d): (b, lo, hi) for p, d, b, lo, hi in best(table, resamples=500)}
    assert rows[("sp", 64)] == (2e-3, 2e-3, 2e-3)
    b, lo, hi = rows[("mup", 64)]
    assert b == 2e-3  # means 2.55, 2.25, inf
    assert lo <= b <= hi and 1e-3 <= lo and hi <= 2e-3
