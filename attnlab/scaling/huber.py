"""Huber's loss on log L, and how far a fit leans on its delta.

Hoffmann et al. 2022 (Sec. 3.3) fit approach 3 by Huber's loss on log L with delta = 1e-3. With
residuals of 0.2-1%, most points then sit in the loss's linear regime and the fit is close to
least absolute deviation: delta is a choice the estimate may depend on. So every fit by this loss
is redone at ``DELTA_FACTORS`` times delta (from the estimate's best starts), the estimates are
kept in the fit's details, and the report says when one moves past the parameter's interval.

The objectives read delta as their data's last [points] array (``with_delta``), so one compiled
program serves every delta.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import jax.numpy as jnp
import numpy as np

from attnlab.scaling.multistart import minimise_many

HUBER_DELTA = 1e-3  # on log L: Hoffmann et al. 2022 Sec. 3.3
DELTA_FACTORS = (0.1, 10.0)
# The refits at another delta start from this many of the estimate's best usable starts. Their
# convergence tolerance is looser than a fit's 1e-10: near delta -> 0 the loss is nearly |r|,
# whose kinks keep L-BFGS stepping by 1e-9 (on the Markov ladder at delta 1e-4 it stops at 31
# steps with 1e-8 and is still moving the 7th digit at 2,000 with 1e-10).
DELTA_STARTS = 8
DELTA_TOLERANCE = 1e-8


def huber(residual, delta):
    """Huber loss: r^2/2 for |r| <= delta, delta·(|r| - delta/2) beyond."""
    magnitude = jnp.abs(residual)
    return jnp.where(magnitude <= delta, 0.5 * residual * residual,
                     delta * (magnitude - 0.5 * delta))


def with_delta(data: tuple, delta: float = HUBER_DELTA) -> tuple:
    """The objective's data: ``data`` ([points] arrays) and delta as a last [points] array."""
    return data + (np.full(len(data[0]), float(delta)),)


def refits_at_deltas(objective, params: np.ndarray, usable: np.ndarray, objectives: np.ndarray,
                     data_at: Callable[[float], tuple], *, admissible,
                     max_steps: int) -> dict[float, np.ndarray | None]:
    """delta factor -> the best usable theta of a refit with Huber's delta times the factor
    (None: no start converged to an admissible law). The refits start from the
    ``DELTA_STARTS`` best usable starts of the main fit (params, usable, objectives: its
    [starts, P], [starts], [starts]); data_at(delta): the objective's data at that delta."""
    order = np.argsort(np.where(usable, objectives, np.inf))[:min(DELTA_STARTS, int(usable.sum()))]
    starts = params[order]
    found = {}
    for factor in DELTA_FACTORS:
        data = data_at(HUBER_DELTA * factor)
        solved = minimise_many(objective, starts, data, np.ones((len(starts), len(data[0]))),
                               max_steps=max_steps, rtol=DELTA_TOLERANCE,
                               atol=DELTA_TOLERANCE)
        ok = solved.converged & admissible(solved.params)
        found[factor] = (solved.params[int(np.argmin(np.where(ok, solved.objective, np.inf)))]
                         if ok.any() else None)
    return found


@dataclasses.dataclass(frozen=True)
class Sensitivity:
    """The estimates at each delta (``estimates``: delta -> name -> value, None: no refit
    converged) and what the report says of them."""

    estimates: dict
    notes: tuple[str, ...]
    warnings: tuple[str, ...]


def sensitivity(estimate: Mapping[str, float], refits: Mapping[str, dict | None],
                intervals: Mapping[str, tuple[float, float]], shown: tuple[str, ...],
                level: float) -> Sensitivity:
    """What moving delta does: refits (delta as text -> name -> value, or None), compared with
    ``intervals`` (name -> (low, high); empty when refused) for every parameter; ``shown``: the
    parameters the note lists."""
    estimates = dict(sorted(({f"{HUBER_DELTA:g}": dict(estimate)} | dict(refits)).items(),
                            key=lambda item: float(item[0])))
    values = " / ".join(estimates)
    cells = [f"{name} " + " / ".join("n/a" if row is None else f"{row[name]:.4g}"
                                     for row in estimates.values()) for name in shown]
    notes = [f"Huber delta {values}: " + ", ".join(cells)] if cells else []
    warnings = []
    for delta, row in refits.items():
        if row is None:
            notes.append(f"the refit at Huber delta {delta} did not converge to a law")
            continue
        for name, (low, high) in intervals.items():
            value = row.get(name)
            if value is not None and np.isfinite(value) and not low <= value <= high:
                warnings.append(f"Huber delta {delta} (not {HUBER_DELTA:g}) moves {name} to "
                                f"{value:.4g}, outside its {100 * level:g}% interval "
                                f"[{low:.4g}, {high:.4g}]: the estimate depends on delta")
    return Sensitivity(estimates, tuple(notes), tuple(warnings))
