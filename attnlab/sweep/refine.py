"""Widening a sweep's learning-rate grid where a point's best rate sits at its edge
(``sweep.learning_rate.refine``).

A point is the runs that differ only in learning-rate factor and seed
(:func:`attnlab.sweep.planner.point_name`). Once all its runs are final, its best factor is the
one with the lowest mean final validation loss over seeds; a factor with a run that did not
complete (diverged) is never best, as ``attnlab compare --best-over`` picks. When the best is
the lowest or highest factor the point has, it gains the next factor beyond it, one step the
size of the grid's outermost step on that side, up to ``refine`` on each side. A failed run
holds its point's refinement until it is retried (``--retry-failed``).

With ``sweep.refine_batch`` the batch-size axis widens alike: a group (the points that differ
only in batch size, :func:`attnlab.sweep.planner.group_name`) whose best (batch size, factor),
once all its runs are final, has its smallest or largest batch size gains the next one beyond
it (the outermost step's ratio, in whole sequences), at the rule's factors.

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
from attnlab.sweep.definition import BATCH_KEY, SweepSpec, variant_point, variant_spec
from attnlab.sweep.planner import PlannedRun, plan

METRIC = "final_val_loss"


def refines(spec: SweepSpec) -> int:
    """The most factors a side of the sweep's (or a variant's) grid may grow by; 0: none."""
    return max(rule.refine for rule in spec.learning_rate_rules)


def refining(spec: SweepSpec) -> bool:
    """Whether the sweep's grid grows from its results (learning rates or batch sizes)."""
    return bool(refines(spec) or spec.refine_batch)


def outcomes(table: pd.DataFrame | None) -> dict[str, tuple[str, float]]:
    """run id -> (status, final validation loss) of a sweep's results table."""
    if table is None or table.empty:
        return {}
    loss = (pd.to_numeric(table[METRIC], errors="coerce") if METRIC in table
            else pd.Series(np.nan, index=table.index))
    return {run: (status, float(value))
            for run, status, value in zip(table["run_id"], table["status"], loss)}


def recorded_outcomes(workdir: str | Path | None) -> dict[str, tuple[str, float]]:
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
    added: dict[str, tuple[float, ...]] = {}
    batches: dict[str, tuple[int, ...]] = {}
    while True:
        current = dataclasses.replace(spec, extra_factors=tuple(added.items()),
                                      extra_batches=tuple(batches.items()))
        if not refining(spec):
            return current
        points: dict[str, list[PlannedRun]] = {}
        groups: dict[str, list[PlannedRun]] = {}
        for run in plan(current):
            points.setdefault(run.point, []).append(run)
            groups.setdefault(run.group, []).append(run)
        grew = _grow(added, points, lambda runs, more: next_factor(spec, runs, results, more),
                     spec.learning_rate.refine)
        grew |= _grow(batches, groups, lambda runs, more: next_batch(spec, runs, results, more),
                      spec.refine_batch)
        if not grew:
            return current


def _grow(added: dict, units: dict, step, cap: int) -> bool:
    """Adds to ``added[unit]`` what ``step(runs, added so far)`` calls for; whether any."""
    grew = False
    for unit, runs in units.items() if cap else ():
        value = step(runs, added.get(unit, ()))
        if value is not None:
            added[unit] = added.get(unit, ()) + (value,)
            grew = True
    return grew


def mean_losses(runs: list[PlannedRun], results: Mapping[str, tuple[str, float]],
                key) -> dict | None:
    """``key(run)`` -> the mean final loss over its runs (inf where one diverged), or None
    while some run is not final."""
    outcome = [results.get(run.run_id, (rundir.PENDING, math.nan)) for run in runs]
    if any(status not in (rundir.COMPLETED, rundir.DIVERGED) for status, _ in outcome):
        return None
    losses: dict = {}
    for run, (status, loss) in zip(runs, outcome):
        losses.setdefault(key(run), []).append(loss if status == rundir.COMPLETED else math.inf)
    return {k: float(np.mean(v)) if np.all(np.isfinite(v)) else math.inf
            for k, v in losses.items()}


def next_factor(spec: SweepSpec, runs: list[PlannedRun],
                results: Mapping[str, tuple[str, float]],
                added: tuple[float, ...]) -> float | None:
    """The factor one point trains at next, or None: its best is inside its grid, some run is
    not final, none completed, or it has grown ``refine`` factors on that side already."""
    means = mean_losses(runs, results, lambda run: run.lr_factor)
    if means is None:
        return None
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


def next_batch(spec: SweepSpec, runs: list[PlannedRun],
               results: Mapping[str, tuple[str, float]],
               added: tuple[int, ...]) -> int | None:
    """The batch size (sequences) one group trains at next, or None: its best (batch size,
    factor) is inside the batch sizes, some run is not final, none completed, it has grown
    ``refine_batch`` on that side already, or the next size would be under one sequence."""
    means = mean_losses(runs, results, lambda run: (run.cfg.data.batch_size, run.lr_factor))
    if not means or not math.isfinite(min(means.values())):
        return None
    best = min(means, key=means.get)[0]
    sizes, base = sorted({b for b, _ in means}), dict(spec.axes)[BATCH_KEY]
    if len(sizes) < 2:
        return None
    if best == sizes[0] and sum(b < min(base) for b in added) < spec.refine_batch:
        smaller = round(sizes[0] * sizes[0] / sizes[1])
        return smaller if 1 <= smaller < sizes[0] else None
    if best == sizes[-1] and sum(b > max(base) for b in added) < spec.refine_batch:
        return max(round(sizes[-1] * sizes[-1] / sizes[-2]), sizes[-1] + 1)
    return None


def describe_growth(before: SweepSpec, after: SweepSpec) -> list[str]:
    """The points that gained a factor, in words, for the sweep's log."""
    old = dict(before.refinements)
    lines = []
    for (variant, point), factors in after.refinements:
        new = [f for f in factors if f not in old.get((variant, point), ())]
        if new:
            where = variant_point(variant, point) if variant else point
            lines.append(f"refine: {where}: best learning rate at the grid's edge; adding "
                         f"factor(s) {', '.join(f'{f:g}' for f in new)}")
    old_batches = dict(before.extra_batches)
    for group, sizes in after.extra_batches:
        new = [b for b in sizes if b not in old_batches.get(group, ())]
        if new:
            lines.append(f"refine: {group}: best batch size at the grid's edge; adding batch "
                         f"size(s) {', '.join(map(str, new))}")
    return lines
