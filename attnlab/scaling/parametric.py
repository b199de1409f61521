"""What the parametric laws fitted by multi-start L-BFGS share (Chinchilla's approach 3, the
data-constrained and the over-training laws): the best converged start, the bootstrap refits,
and parameters held at given values (``attnlab fit --fix=E=1.87,A=520.8``).

Holding a parameter: its coordinate of theta is replaced inside the objective by the given value
(``holding``), so its gradient is zero and L-BFGS never moves it; every start and every
bootstrap refit then fits the other coordinates with it frozen, as Muennighoff et al. 2023 fit
R*_D and R*_N with the Chinchilla part frozen. The held values travel as two extra [points, P]
data arrays (rows identical) so that the objective stays one compiled program whatever is held.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import jax.numpy as jnp
import numpy as np

from attnlab.scaling.bootstrap import cluster_index, resample_weights
from attnlab.scaling.errors import FitError, FitInputError
from attnlab.scaling.law import Law
from attnlab.scaling.multistart import minimise_many
from attnlab.scaling.result import ScalingFit

HUBER_DELTA = 1e-3  # on log L: Hoffmann et al. 2022 Sec. 3.3
# A term below this fraction of the predicted loss at every point is invisible to the fit.
NEGLIGIBLE_TERM = 1e-3
# An exponent below this makes X^-exponent ~ 1 over any ladder: the term is a constant.
MIN_EXPONENT = 1e-2


def huber(residual, delta):
    """Huber loss: r^2/2 for |r| <= delta, delta·(|r| - delta/2) beyond."""
    magnitude = jnp.abs(residual)
    return jnp.where(magnitude <= delta, 0.5 * residual * residual,
                     delta * (magnitude - 0.5 * delta))


def held_notes(fixed: Mapping[str, float]) -> list[str]:
    """The note a fit with parameters held by --fix carries: which, and that its intervals are
    conditional on them."""
    if not fixed:
        return []
    return [f"held by --fix: {', '.join(f'{k}={v:g}' for k, v in fixed.items())}; every "
            f"interval is conditional on these values (their own uncertainty is not carried)"]


@dataclasses.dataclass(frozen=True)
class Coordinates:
    """How a law's named parameters sit in its optimised vector theta.

    theta: the coordinates' names in order; logged: parameter -> coordinate holding its log;
    plain: parameter -> coordinate holding it as it is."""

    theta: tuple[str, ...]
    logged: Mapping[str, str]
    plain: Mapping[str, str]

    @property
    def fixable(self) -> tuple[str, ...]:
        return tuple(self.logged) + tuple(self.plain)

    def held(self, given: Mapping[str, float], law: str) -> tuple[np.ndarray, np.ndarray]:
        """(mask [P], values [P]) of theta for the parameters ``given`` holds; FitInputError
        naming the parameter that this law has not or that cannot take the value."""
        mask, values = np.zeros(len(self.theta), bool), np.zeros(len(self.theta))
        for name, value in given.items():
            if name not in self.fixable:
                raise FitInputError(f"--fix: {name} is not a parameter --law={law} can hold "
                                    f"(it holds {', '.join(self.fixable)})")
            if name in self.logged and not value > 0:
                raise FitInputError(f"--fix: {name}={value:g} must be > 0")
            index = self.theta.index(self.logged.get(name) or self.plain[name])
            mask[index] = True
            values[index] = np.log(value) if name in self.logged else value
        return mask, values


def holding(objective):
    """``objective`` with the coordinates of theta that ``data[-2]`` (mask) marks replaced by
    ``data[-1]`` (values); both [points, P], every row alike (see the module docstring)."""
    def held(theta, data, weights):
        mask, values = data[-2][0], data[-1][0]
        return objective(jnp.where(mask, values, theta), data[:-2], weights)
    return held


def with_held(data: tuple, mask: np.ndarray, values: np.ndarray) -> tuple:
    """``data`` with the held mask and values appended as [points, P] arrays."""
    points = len(data[0])
    return data + (np.tile(mask, (points, 1)), np.tile(values, (points, 1)))


def held_starts(starts: np.ndarray, mask: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The distinct starts once the held coordinates take their values."""
    starts = np.where(mask, values, starts)
    return np.unique(starts, axis=0) if mask.any() else starts


def best_converged(objective: np.ndarray, usable: np.ndarray) -> int | None:
    """The index of the lowest objective among the usable problems (None: none is)."""
    if not usable.any():
        return None
    return int(np.argmin(np.where(usable, objective, np.inf)))


def bootstrap_refits(objective, theta: np.ndarray, starts: np.ndarray, data: tuple,
                     n_points: int, *, n_bootstrap: int, grid_starts: int, seed: int,
                     clusters, admissible, max_steps: int) -> np.ndarray:
    """[kept, P] refits of ``n_bootstrap`` resampled tables (clusters drawn whole), each from
    the estimate ``theta`` and ``grid_starts`` random starts of the grid, keeping its best
    usable (converged and ``admissible``) start; a replicate with none is dropped."""
    rng = np.random.default_rng(seed)
    weights = resample_weights(n_points, n_bootstrap, rng,
                               None if clusters is None else cluster_index(clusters))
    k = min(grid_starts, len(starts))
    picks = (np.stack([rng.choice(len(starts), size=k, replace=False)
                       for _ in range(n_bootstrap)]) if k else np.zeros((n_bootstrap, 0), int))
    # Warm starts first, grid starts after: chunks of warm starts converge and stop early.
    boot_starts = np.concatenate([np.repeat(theta[None], n_bootstrap, axis=0),
                                  starts[picks.T.reshape(-1)]])
    boot = minimise_many(objective, boot_starts, data, np.concatenate([weights] * (k + 1)),
                         max_steps=max_steps)
    objective_values = boot.objective.reshape(k + 1, n_bootstrap)
    params = boot.params.reshape(k + 1, n_bootstrap, len(theta))
    usable = boot.converged.reshape(k + 1, n_bootstrap) & admissible(params)
    chosen = [best_converged(objective_values[:, r], usable[:, r]) for r in range(n_bootstrap)]
    return np.array([params[c, r] for r, c in enumerate(chosen) if c is not None]).reshape(
        -1, len(theta))


def dropped_note(kept: int, requested: int, why: str) -> list[str]:
    """The note on refits dropped (none when every refit was kept)."""
    if kept == requested:
        return []
    return [f"{requested - kept} of {requested} bootstrap refits {why} and were dropped"]


def exactly(params: dict, given: Mapping[str, float]) -> dict:
    """``params`` (floats or [replicates] arrays) with each held parameter at its given value
    exactly: exp(log(value)) may differ from it in the last bit."""
    return {name: (np.full(np.shape(v), given[name]) if np.ndim(v) else float(given[name]))
            if name in given else v for name, v in params.items()}


@dataclasses.dataclass(frozen=True)
class Model:
    """A law fitted by ``fit_model``: its coordinates, its objective (and the same with some
    coordinates held), theta -> named parameters, which thetas are laws at all, and the
    parameters a fit's points cannot determine (``unpinned(params, data) -> name -> why``)."""

    part: Law
    coordinates: Coordinates
    objective: Callable
    held_objective: Callable
    params_from_theta: Callable[[np.ndarray], dict]
    admissible: Callable[[np.ndarray], np.ndarray]
    unpinned: Callable[[dict, tuple], dict[str, str]]
    admissible_text: str = "alpha, beta > 0"


def fit_model(model: Model, data: tuple, starts: np.ndarray, *, n_bootstrap: int = 0,
              ci_level: float = 0.95, seed: int = 0, fixed=None, clusters=None,
              source: str = "data", grid_starts: int = 4, max_steps: int = 500,
              flops_per_param_token: float = 6.0, details=None) -> ScalingFit:
    """The best usable start of the grid ``starts`` for ``data`` (a tuple of [points] arrays,
    the last log L), the held parameters at their values (``fixed``), bootstrap refits (clusters
    drawn whole) and the parameters not pinned, as a ``ScalingFit``."""
    fixed = dict(fixed or {})
    mask, values = model.coordinates.held(fixed, model.part.name)
    free, n_points = int((~mask).sum()), len(data[0])
    if n_points < max(free, 1):
        raise FitInputError(f"{source}: {model.part.title} fits {free} free parameter(s) but "
                            f"has only {n_points} usable run(s)")
    objective, fit_data = model.objective, data
    if mask.any():
        objective, fit_data = model.held_objective, with_held(data, mask, values)
    starts = held_starts(starts, mask, values)
    solved = minimise_many(objective, starts, fit_data, np.ones((len(starts), n_points)),
                           max_steps=max_steps)
    best = best_converged(solved.objective, solved.converged & model.admissible(solved.params))
    if best is None:
        raise FitError(f"{source}: no start of the grid converged to a law with "
                       f"{model.admissible_text} within {max_steps} L-BFGS steps")
    theta = solved.params[best]
    params = exactly({k: float(v) for k, v in model.params_from_theta(theta).items()}, fixed)
    unpinned = {k: v for k, v in model.unpinned(params, data).items() if k not in fixed}
    notes = held_notes(fixed)
    samples: dict = {}
    if n_bootstrap > 0:
        replicates = bootstrap_refits(objective, theta, starts, fit_data, n_points,
                                      n_bootstrap=n_bootstrap, grid_starts=grid_starts,
                                      seed=seed, clusters=clusters,
                                      admissible=model.admissible, max_steps=max_steps)
        samples = exactly(model.params_from_theta(replicates), fixed)
        notes += dropped_note(len(replicates), n_bootstrap,
                              f"did not converge to a law with {model.admissible_text}")
    return ScalingFit(part=model.part, params=params, samples=samples, ci_level=ci_level,
                      n_points=n_points, objective=float(solved.objective[best]),
                      objective_name=f"sum of Huber(delta={HUBER_DELTA:g}) terms on log L",
                      flops_per_param_token=flops_per_param_token,
                      n_bootstrap_requested=n_bootstrap,
                      warnings=tuple(f"the data do not pin {k}: {v}" for k, v in unpinned.items()),
                      notes=tuple(notes), unpinned=tuple(unpinned),
                      details={"grid": {"starts": len(starts)},
                               "starts_converged": int(solved.converged.sum()),
                               "theta": dict(zip(model.coordinates.theta, map(float, theta))),
                               "huber_delta": HUBER_DELTA, "fixed": fixed} | (details or {}))


def admissible(theta) -> np.ndarray:
    """theta [..., 5] as approach 3 lays it out (a, b, e, alpha, beta) -> bool [...]:
    finite, alpha > 0 and beta > 0 (a scaling law)."""
    theta = np.asarray(theta, np.float64)
    return np.all(np.isfinite(theta), axis=-1) & (theta[..., 3] > 0) & (theta[..., 4] > 0)


def unpinned_terms(terms, predicted) -> dict[str, str]:
    """The parameters of power-law terms that the points cannot determine, each with the
    reason. terms: (coefficient, exponent, [points] term values, exponent value, axis) per
    term; predicted: [points] the predicted loss. A term below NEGLIGIBLE_TERM of the loss at
    every point leaves its coefficient and exponent free (any smaller coefficient fits as
    well); an exponent below MIN_EXPONENT makes the term a constant that E absorbs."""
    found: dict[str, str] = {}
    for coefficient, exponent, term, value, axis in terms:
        share = float(np.max(term / predicted)) if np.all(np.isfinite(term)) else np.inf
        if share < NEGLIGIBLE_TERM:
            reason = (f"{coefficient}/{axis}^{exponent} is below {NEGLIGIBLE_TERM:g} of the loss "
                      f"at every point (largest share {share:.1e})")
            found.update({coefficient: reason, exponent: reason})
        elif value < MIN_EXPONENT:
            reason = (f"{exponent}={value:.3g} ~ 0: {coefficient}/{axis}^{exponent} is a constant "
                      f"that E absorbs")
            found.update({coefficient: reason, exponent: reason, "E": reason})
    return found
