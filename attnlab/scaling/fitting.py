"""One entry point from a checked table to a fit: ``fit_table(table, law=..., approach=...)``."""

from __future__ import annotations

import dataclasses

import numpy as np

from attnlab.scaling.approach1 import fit_approach1
from attnlab.scaling.approach2 import DEFAULT_WINDOW, fit_approach2
from attnlab.scaling.approach3 import CHINCHILLA_GRID, InitGrid, fit_approach3
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.kaplan import fit_kaplan
from attnlab.scaling.result import ScalingFit
from attnlab.scaling.table import ScalingTable

LAWS = ("kaplan", "chinchilla")
APPROACHES = (1, 2, 3)


def flops_per_param_token(table: ScalingTable) -> float:
    """k in C = k·N·D: the median of flops/(N·D) over the table (6 when C was computed as 6ND).
    A FLOPs column that counts attention and the output head gives k > 6 at small scale."""
    frame = table.frame
    return float(np.median(frame["flops"] / (frame["params"] * frame["tokens"])))


def fit_table(table: ScalingTable, *, law: str, approach: int | None = None, form: str = "nd",
              n_bootstrap: int = 0, ci_level: float = 0.95, seed: int = 0,
              grid: InitGrid = CHINCHILLA_GRID, profile: str = "window",
              window: float = DEFAULT_WINDOW) -> ScalingFit:
    """Fits ``law`` to a checked table (points for Kaplan and approaches 2-3, curves for
    approach 1); the table's notes are carried into the fit's notes. profile, window: how
    approach 2 finds each budget's minimum."""
    if law not in LAWS:
        raise FitInputError(f"--law must be one of {', '.join(LAWS)}, not {law!r}")
    if not 0.0 < ci_level < 1.0:
        raise FitInputError(f"--ci-level must lie in (0, 1), not {ci_level}")
    if n_bootstrap < 0:
        raise FitInputError(f"--bootstrap must be >= 0, not {n_bootstrap}")
    common = dict(n_bootstrap=n_bootstrap, ci_level=ci_level, seed=seed, source=table.source)
    frame = table.frame
    n, d, loss = table.array("params"), table.array("tokens"), table.array("loss")
    k = flops_per_param_token(table)
    if law == "kaplan":
        fit = fit_kaplan(n, d, loss, form=form, flops_per_param_token=k, **common)
    elif approach == 1:
        if "run_id" not in frame:
            raise FitInputError(f"{table.source}: approach 1 needs learning curves (one row per "
                                f"logged step, with run_id); pass --curves=FILE or a sweep "
                                f"directory")
        fit = fit_approach1(table.array("run_id"), n, d, loss, table.array("flops"), **common)
    elif approach == 2:
        fit = fit_approach2(n, d, loss, table.array("flops"), budget=table.budget,
                            profile=profile, window=window, **common)
    elif approach == 3:
        fit = fit_approach3(n, d, loss, grid=grid, flops_per_param_token=k, **common)
    else:
        raise FitInputError(f"--approach must be one of 1, 2, 3 for --law=chinchilla, "
                            f"not {approach!r}")
    return dataclasses.replace(fit, notes=tuple(table.notes) + fit.notes)
