"""Widening a sweep's learning-rate grid where a point's best rate sits at its edge
(``sweep.learning_rate.refine``).

A point is the runs that differ only in learning-rate factor and seed
(:func:`attnlab.sweep.planner.point_name`). Once all its runs are final, its best factor is the
one with the lowest mean final validation loss over seeds; a factor with a run that did not
complete (diverged) is never best, as ``attnlab compare --best-over`` picks. When the best is
the lowest or highest factor the point has, it gains the next factor beyond it, one step the
size of the grid's outermost step on that side, up to ``refine`` on each side. A failed run
holds its point's refinement until it is retried (``--retry-failed``).

The additions are recomputed from the results each time, from the planned grid outward, so a
sweep stopped at any moment and run again plans the same runs.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from attnlab import results as sweep_results
from attnlab import rundir
from attnlab.sweep.definition import SweepSpec, variant_point, variant_spec
from attnlab.sweep.planner import PlannedRun, plan

METRIC = "final_val_loss"


def refines(spec: SweepSpec) -> int:
    """The most factors a side of the sweep's (or a variant's) grid may grow by; 0: none."""
    return max(rule.refine for rule in spec.learning_rate_rules)


def outcomes(table: pd.DataFrame | None) -> dict[str, tuple[str, float]]:
    """run id -> (status, final validation loss) of a sweep's results table."""
    if table is None or table.empty:
        return {}
    loss = (pd.to_numeric(table[METRIC], errors="coerce") if METRIC in table
            else pd.Series(np.nan, index=table.index))
    return {run: (status, float(value))
            for run, status, value in zip(table["run_id"], table["status"], loss)}


def recorded(workdir: str | Path | None) -> dict[str, tuple[str, float]]:
    """The outcomes of the runs a sweep directory already holds (none for a new one)."""
    if workdir is None or not Path(workdir).is_dir():
        return {}
    return outcomes(sweep_results.build_table(workdir))


def grown(spec: SweepSpec, results: Mapping[str, tuple[str, float]]) -> SweepSpec:
    """``spec`` with the extra factors its finished runs call for (``extra_factors`` of the
    spec, or of each variant)."""
    if spec.variants:
        variants = [dataclasses.replace(v, extra_factors=grown(variant_spec(spec, v),
                                                               results).extra_factors)
                    for v in spec.variants]
        return dataclasses.replace(spec, variants=tuple(variants))
    if not spec.learning_rate.refine:
        return dataclasses.replace(spec, extra_factors=())
    added: dict[str, tuple[float, ...]] = {}
    while True:
        current = dataclasses.replace(spec, extra_factors=tuple(added.items()))
        points: dict[str, list[PlannedRun]] = {}
        for run in plan(current):
            points.setdefault(run.point, []).append(run)
        grew = False
        for point, runs in points.items():
            factor = next_factor(spec, runs, results, added.get(point, ()))
            if factor is not None:
                added[point] = added.get(point, ()) + (factor,)
                grew = True
        if not grew:
            return current


def next_factor(spec: SweepSpec, runs: list[PlannedRun],
                results: Mapping[str, tuple[str, float]],
                added: tuple[float, ...]) -> float | None:
    """The factor one point trains at next, or None: its best is inside its grid, some run is
    not final, none completed, or it has grown ``refine`` factors on that side already."""
    outcome = [results.get(run.run_id, (rundir.PENDING, math.nan)) for run in runs]
    if any(status not in (rundir.COMPLETED, rundir.DIVERGED) for status, _ in outcome):
        return None
    losses: dict[float, list[float]] = {}
    for run, (status, loss) in zip(runs, outcome):
        losses.setdefault(run.lr_factor, []).append(
            loss if status == rundir.COMPLETED else math.inf)
    means = {f: float(np.mean(v)) if np.all(np.isfinite(v)) else math.inf
             for f, v in losses.items()}
    grid, base = sorted(means), spec.learning_rate.factors
    best = min(grid, key=lambda f: means[f])
    if len(grid) < 2 or not math.isfinite(means[best]):
        return None
    cap = spec.learning_rate.refine
    if best == grid[0] and sum(f < min(base) for f in added) < cap:
        return float(f"{grid[0] * grid[0] / grid[1]:.6g}")
    if best == grid[-1] and sum(f > max(base) for f in added) < cap:
        return float(f"{grid[-1] * grid[-1] / grid[-2]:.6g}")
    return None


def describe(before: SweepSpec, after: SweepSpec) -> list[str]:
    """The points that gained a factor, in words, for the sweep's log."""
    old = dict(before.refinements)
    lines = []
    for (variant, point), factors in after.refinements:
        new = [f for f in factors if f not in old.get((variant, point), ())]
        if new:
            where = variant_point(variant, point) if variant else point
            lines.append(f"refine: {where}: best learning rate at the grid's edge; adding "
                         f"factor(s) {', '.join(f'{f:g}' for f in new)}")
    return lines
