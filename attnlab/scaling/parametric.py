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

from attnlab.scaling.bootstrap import cluster_index, identified, resample_weights
from attnlab.scaling.errors import FitError, FitInputError
from attnlab.scaling.huber import HUBER_DELTA, refits_at_deltas, sensitivity, with_delta
from attnlab.scaling.law import Law
from attnlab.scaling.multistart import minimise_many
from attnlab.scaling.result import ScalingFit

# A term below this fraction of the predicted loss at every point is invisible to the fit.
NEGLIGIBLE_TERM = 1e-3
# An exponent below this makes X^-exponent ~ 1 over any ladder: the term is a constant.
MIN_EXPONENT = 1e-2


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


def objective_data(data: tuple, mask: np.ndarray, values: np.ndarray):
    """delta -> the objective's data at Huber's delta: ``data``, delta, and the held mask and
    values where --fix holds some coordinate."""
    def at(delta: float) -> tuple:
        with_it = with_delta(data, delta)
        return with_held(with_it, mask, values) if mask.any() else with_it
    return at


def with_sensitivity(fit: ScalingFit, objective, solved, usable: np.ndarray, data_at,
                     params_from_theta, admissible, max_steps: int) -> ScalingFit:
    """``fit`` with the estimates at other Huber deltas (``huber.sensitivity``) in its details,
    notes and warnings; solved, usable: the main fit's starts and which are usable."""
    fixed = fit.details.get("fixed") or {}
    thetas = refits_at_deltas(objective, solved.params, usable, solved.objective, data_at,
                              admissible=admissible, max_steps=max_steps)
    refits = {f"{HUBER_DELTA * factor:g}": None if theta is None else exactly(
        {k: float(v) for k, v in params_from_theta(theta).items()}, fixed)
        for factor, theta in thetas.items()}
    shown = tuple(k for k in fit.params if (k == "E" or k in fit.part.exponents)
                  and k not in fixed)
    found = sensitivity(fit.params, refits, {k: v for k, v in fit.ci.items() if k not in fixed},
                        shown, fit.ci_level)
    return dataclasses.replace(fit, notes=fit.notes + found.notes,
                               warnings=fit.warnings + found.warnings,
                               details=fit.details | {"huber_sensitivity": found.estimates})


def held_starts(starts: np.ndarray, mask: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The distinct starts once the held coordinates take their values."""
    starts = np.where(mask, values, starts)
    return np.unique(starts, axis=0) if mask.any() else starts


def best_converged(objective: np.ndarray, usable: np.ndarray) -> int | None:
    """The index of the lowest objective among the usable problems (None: none is)."""
    if not usable.any():
        return None
    return int(np.argmin(np.where(usable, objective, np.inf)))


@dataclasses.dataclass(frozen=True)
class Refits:
    """The bootstrap refits of a fit: ``params`` [kept, P] and why the others were dropped
    (``unidentified``: draws whose design cannot determine the law; ``unusable``: refits that
    converged to no admissible law). Both count as failed (``ScalingFit.n_bootstrap_failed``)."""

    params: np.ndarray
    unidentified: int
    unusable: int
    # [kept] which draw each row of params refits: a law refitting more on the same draws
    # (two_step's sigmoid) reads their weights.
    kept: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))

    def notes(self, requested: int, why: str, design_why: str) -> list[str]:
        """The notes on refits dropped (none when every refit was kept)."""
        notes = []
        if self.unidentified:
            notes.append(f"{self.unidentified} of {requested} bootstrap draws {design_why}, too "
                         f"few to determine the law, and count as failed refits")
        if self.unusable:
            notes.append(f"{self.unusable} of {requested} bootstrap refits {why} and were "
                         f"dropped")
        return notes


def design_why(design) -> str:
    """What an unidentified draw lacked, for :meth:`Refits.notes`."""
    return "held fewer distinct " + " or ".join(
        f"{axis} than {needed}" for axis, (_, needed) in (design or {}).items())


def bootstrap_refits(objective, theta: np.ndarray, starts: np.ndarray, data: tuple,
                     n_points: int, *, n_bootstrap: int, grid_starts: int, seed: int,
                     clusters, admissible, max_steps: int, design=None,
                     weights=None) -> Refits:
    """Refits of ``n_bootstrap`` resampled tables (clusters drawn whole), each from the estimate
    ``theta`` and ``grid_starts`` random starts of the grid, keeping its best usable (converged
    and ``admissible``) start; a draw that ``design`` says cannot determine the law
    (``bootstrap.identified``) is not refitted, and a replicate with no usable start is
    dropped. weights: [draws, points] multiplicities to refit (default: drawn here)."""
    rng = np.random.default_rng(seed)
    if weights is None:
        weights = resample_weights(n_points, n_bootstrap, rng,
                                   None if clusters is None else cluster_index(clusters))
    n_bootstrap = len(weights)
    k = min(grid_starts, len(starts))
    picks = (np.stack([rng.choice(len(starts), size=k, replace=False)
                       for _ in range(n_bootstrap)]) if k else np.zeros((n_bootstrap, 0), int))
    ok = identified(weights, design)
    weights, picks, drawn, index = weights[ok], picks[ok], int(ok.sum()), np.flatnonzero(ok)
    if not drawn:
        return Refits(np.zeros((0, len(theta))), n_bootstrap, 0)
    # Warm starts first, grid starts after: chunks of warm starts converge and stop early.
    boot_starts = np.concatenate([np.repeat(theta[None], drawn, axis=0),
                                  starts[picks.T.reshape(-1)]])
    boot = minimise_many(objective, boot_starts, data, np.concatenate([weights] * (k + 1)),
                         max_steps=max_steps)
    objective_values = boot.objective.reshape(k + 1, drawn)
    params = boot.params.reshape(k + 1, drawn, len(theta))
    usable = boot.converged.reshape(k + 1, drawn) & admissible(params)
    chosen = [best_converged(objective_values[:, r], usable[:, r]) for r in range(drawn)]
    kept = np.array([params[c, r] for r, c in enumerate(chosen) if c is not None])
    rows = np.array([index[r] for r, c in enumerate(chosen) if c is not None], np.int64)
    return Refits(kept.reshape(-1, len(theta)), n_bootstrap - drawn, drawn - len(kept), rows)


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
              flops_per_param_token: float = 6.0, details=None, design=None) -> ScalingFit:
    """The best usable start of the grid ``starts`` for ``data`` (a tuple of [points] arrays,
    the last log L), the held parameters at their values (``fixed``), bootstrap refits (clusters
    drawn whole) and the parameters not pinned, as a ``ScalingFit``."""
    fixed = dict(fixed or {})
    mask, values = model.coordinates.held(fixed, model.part.name)
    free, n_points = int((~mask).sum()), len(data[0])
    if n_points < max(free, 1):
        raise FitInputError(f"{source}: {model.part.title} fits {free} free parameter(s) but "
                            f"has only {n_points} usable run(s)")
    objective = model.held_objective if mask.any() else model.objective
    data_at = objective_data(data, mask, values)
    fit_data = data_at(HUBER_DELTA)
    starts = held_starts(starts, mask, values)
    solved = minimise_many(objective, starts, fit_data, np.ones((len(starts), n_points)),
                           max_steps=max_steps)
    usable = solved.converged & model.admissible(solved.params)
    best = best_converged(solved.objective, usable)
    if best is None:
        raise FitError(f"{source}: no start of the grid converged to a law with "
                       f"{model.admissible_text} within {max_steps} L-BFGS steps")
    theta = solved.params[best]
    params = exactly({k: float(v) for k, v in model.params_from_theta(theta).items()}, fixed)
    unpinned = {k: v for k, v in model.unpinned(params, data).items() if k not in fixed}
    notes = held_notes(fixed)
    samples: dict = {}
    if n_bootstrap > 0:
        refits = bootstrap_refits(objective, theta, starts, fit_data, n_points,
                                  n_bootstrap=n_bootstrap, grid_starts=grid_starts, seed=seed,
                                  clusters=clusters, admissible=model.admissible,
                                  max_steps=max_steps, design=design)
        samples = exactly(model.params_from_theta(refits.params), fixed)
        notes += refits.notes(n_bootstrap, f"did not converge to a law with "
                              f"{model.admissible_text}", design_why(design))
    fit = ScalingFit(part=model.part, params=params, samples=samples, ci_level=ci_level,
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
    return with_sensitivity(fit, objective, solved, usable, data_at, model.params_from_theta,
                            model.admissible, max_steps)


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
