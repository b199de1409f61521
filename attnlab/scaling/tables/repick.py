"""Intervals for a fit at each point's best value (``--best-over``) that redraw the picks.

A bootstrap of the picked runs alone holds each pick fixed: it sees their seed spread, not that
another draw of the seeds could have picked another value, so its intervals are too narrow where
the seeds hardly single a pick out (the picks' ``stability``). When the seeds ran at every value
(``--pair``), each of ``OUTER`` replicates draws every point's seeds with replacement, each seed
with its runs at every value (they share its initialisation and data order), picks each point's
best value again, and fits the law to those picks with its own bootstrap; the intervals are the
percentiles of all their refits (a two-stage bootstrap, Davison & Hinkley 1997 Sec. 3.8). The
seeds are drawn at both stages, once here and once by the law's resampling of the picked runs,
so the intervals err wide rather than narrow. A replicate whose picks cannot be fitted counts
all its refits as failed (``ScalingFit.intervals_refused`` past the usual share). What a fit
keeps in ``details`` from its own bootstrap (approach 2's per-budget N_opt intervals) still
holds the picks fixed; ``details["fixed_pick_ci"]`` keeps the parameters' fixed-pick intervals
beside the redrawn ones.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from attnlab.errors import AttnlabError
from attnlab.scaling.law import Law
from attnlab.scaling.result import ScalingFit
from attnlab.scaling.tables.picks import best_points
from attnlab.scaling.tables.prepare import point_columns

# Redraws of the seeds; each is fitted with --bootstrap/OUTER refits of its own.
OUTER = 20


def seeds_drawn(raw: pd.DataFrame, *, point: list[str], pair: str,
                rng: np.random.Generator) -> pd.DataFrame:
    """One draw: at each point, its ``pair`` values drawn with replacement, each with its runs
    at every value; a value drawn twice becomes two pairs (``pair`` relabelled "s/k")."""
    parts = []
    for _, cell in raw.groupby(point, dropna=False, sort=False):
        seeds = cell[pair].unique()
        for k, seed in enumerate(rng.choice(seeds, size=len(seeds))):
            parts.append(cell[cell[pair] == seed].assign(**{pair: f"{seed}/{k}"}))
    return pd.concat(parts, ignore_index=True)


def redraws_possible(raw: pd.DataFrame, *, point: list[str], pair: str) -> bool:
    """True when some point ran two or more ``pair`` values (else there is nothing to draw)."""
    return bool((raw.groupby(point, dropna=False)[pair].nunique() > 1).any())


def repicked_fit(fit: ScalingFit, raw: pd.DataFrame, *, point: list[str], pair: str,
                 n_bootstrap: int, seed: int,
                 fit_picks: Callable[[pd.DataFrame, int, int], ScalingFit]) -> ScalingFit:
    """``fit`` (of the actual picks) with its replicates replaced by the redrawn picks' refits.
    fit_picks(table, n_bootstrap, seed): the law fitted to the runs a table's picks keep."""
    rng = np.random.default_rng(seed)
    inner = math.ceil(n_bootstrap / OUTER)
    samples: dict[str, list] = {}
    unfitted = 0
    for draw in range(OUTER):
        table = seeds_drawn(raw, point=point, pair=pair, rng=rng)
        try:
            refit = fit_picks(table, inner, seed + 1 + draw)
        except AttnlabError:
            unfitted += 1
            continue
        for name, values in refit.samples.items():
            samples.setdefault(name, []).append(np.asarray(values))
    pooled = {name: np.concatenate(parts) for name, parts in samples.items()}
    note = (f"intervals redraw the picks: {OUTER} draws of each point's {pair} values (each "
            f"with its runs at every value), each point picked again and fitted with {inner} "
            f"refits of its own ({OUTER * inner} in all); seeds drawn at both stages, so they "
            f"err wide" + (f"; {unfitted} draws could not be fitted" if unfitted else ""))
    return dataclasses.replace(
        fit, samples=pooled, n_bootstrap_requested=OUTER * inner, notes=fit.notes + (note,),
        details=fit.details | {"fixed_pick_ci": {k: list(v) for k, v in fit.ci.items()}})


def redraw_picks(fit: ScalingFit, full: pd.DataFrame, *, law: Law, over: str, pair: str,
                 columns: dict, n_bootstrap: int, seed: int,
                 fit_kept: Callable[[pd.DataFrame, int, int], ScalingFit]) -> ScalingFit:
    """``fit`` (of each point's best ``over`` value among the runs of ``full``) with intervals
    that redraw the picks (:func:`repicked_fit`), or, when no point ran two ``pair`` values, a
    note. fit_kept(runs, n_bootstrap, seed): the law fitted to the picked runs."""
    used = point_columns(full, law, columns, "results")
    point = [used["params"], used["tokens"]]
    if not redraws_possible(full, point=point, pair=pair):
        return dataclasses.replace(fit, notes=fit.notes + (
            f"the intervals hold the picks fixed: no point ran two {pair} values",))

    def fit_picks(table, n, draw_seed):
        kept, _ = best_points(table, over=over, law=law, pair=pair, columns=columns)
        return fit_kept(kept, n, draw_seed)

    return repicked_fit(fit, full, point=point, pair=pair, n_bootstrap=n_bootstrap, seed=seed,
                        fit_picks=fit_picks)
