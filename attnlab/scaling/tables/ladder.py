"""IsoFLOP slices of a ladder: approach 2's profiles from cooldown branches.

A ladder sweep (``sweep.mode=ladder``) trains each size N at several token counts D, so its runs
lie on lines of constant N, not on IsoFLOP lines. Approach 2 (Hoffmann et al. 2022, sec. 3.2)
needs, at each budget C, the loss of several sizes trained with C FLOPs. Per size, the loss at
C is read off the size's branches by interpolating the loss linearly in log C (equivalently in
log D: C / D is constant within a size) between the two branches that bracket C; a size is
not extrapolated beyond its shortest and longest branch. Budgets are log-spaced over the
ladder's range, ``per_decade`` a decade; a budget enters with at least ``min_sizes`` sizes.
At fixed C a size trains D = C / (6N), so a slice spans sizes whose ratio D/N differs by the
square of their ratio of N: with branches over a factor R of D/N per size, three sizes share a
slice only if neighbouring sizes are at most R^(1/4) apart (R = 32, 5-160 tokens per
parameter: 2.4x).

The sliced points are interpolations, not runs. Without clusters approach 2's bootstrap
resamples them within each budget, which treats neighbouring slices of one size as independent
(an interval somewhat narrower than resampling the branches would give); with a ``cluster``
column (a ladder's trunk) every slice point of a size keeps its size's trunks as its cluster, so
a size's points across budgets are drawn together.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from attnlab.scaling.errors import FitInputError
from attnlab.scaling.points import ScalingTable

PER_DECADE = 4  # slices per decade of compute
MIN_SIZES = 3  # sizes an IsoFLOP slice needs (a parabola's three coefficients)


def slice_budgets(flops_min: np.ndarray, flops_max: np.ndarray, per_decade: int) -> np.ndarray:
    """Log-spaced budgets over [min of ``flops_min``, max of ``flops_max``] (``per_decade`` a
    decade, both ends included)."""
    lo, hi = np.log10(flops_min.min()), np.log10(flops_max.max())
    count = max(2, int(np.ceil((hi - lo) * per_decade)) + 1)
    return 10.0 ** np.linspace(lo, hi, count)


def isoflop_slices(table: ScalingTable, *, per_decade: int = PER_DECADE,
                   min_sizes: int = MIN_SIZES) -> ScalingTable:
    """``table`` (a ladder's branches: params, tokens, loss, flops) as IsoFLOP slices: one
    point per (budget, size covering it), with a ``budget`` column for approach 2.

    Raises:
      FitInputError: fewer than two budgets have ``min_sizes`` sizes.
    """
    frame = table.frame
    sizes = []
    for n, group in frame.groupby("params"):
        group = group.sort_values("flops")
        log_c = np.log(group["flops"].to_numpy())
        if len(group) < 2 or np.any(np.diff(log_c) <= 0):
            continue  # one branch (or two at one C) gives no line to read a slice off
        cluster = ("+".join(sorted(group["cluster"].unique())) if "cluster" in group
                   else None)
        sizes.append((float(n), log_c, group["loss"].to_numpy(),
                      float((group["flops"] / group["tokens"]).mean()), cluster))
    if not sizes:
        raise FitInputError(f"{table.source}: no size of the ladder has two branches to slice")
    budgets = slice_budgets(np.exp([s[1][0] for s in sizes]), np.exp([s[1][-1] for s in sizes]),
                            per_decade)
    rows = []
    for c in budgets:
        inside = [s for s in sizes if s[1][0] - 1e-9 <= np.log(c) <= s[1][-1] + 1e-9]
        if len(inside) < min_sizes:
            continue
        for n, log_c, loss, per_token, cluster in inside:
            rows.append({"params": n, "tokens": c / per_token, "flops": c, "budget": c,
                         "loss": float(np.interp(np.log(c), log_c, loss)), "cluster": cluster})
    columns = ["params", "tokens", "loss", "flops", "budget"]
    sliced = pd.DataFrame(rows, columns=columns + ["cluster"])
    if "cluster" not in frame:
        sliced = sliced[columns]
    kept = sliced["budget"].nunique() if len(sliced) else 0
    if kept < 2:
        raise FitInputError(f"{table.source}: approach 2 on a ladder needs two or more IsoFLOP "
                            f"slices with >= {min_sizes} sizes each; found {kept} (the sizes' "
                            f"branches must overlap in compute)")
    note = (f"approach 2 on a ladder: {kept} IsoFLOP slices ({per_decade} a decade), each "
            f"size's loss interpolated linearly in log C between its neighbouring branches (no "
            f"extrapolation), >= {min_sizes} sizes a slice; {len(sliced)} interpolated points "
            f"from {len(frame)} branches")
    return dataclasses.replace(table, frame=sliced, notes=table.notes + (note,))
