"""What the laws of whole learning curves share (``laws/multipower.py``, ``laws/annealing.py``,
and the S1-only power law they are compared with): their base class :class:`CurveLaw`, which
reads a curves table with each step's rate (``scaling/curves.py``), predicts any schedule's
curve (``--predict-schedule``) and is held out by run (``--holdout=run:NAME``,
``scaling/tables/schedule_fits.py``), and their fit.

A :class:`CurveModel` is a law's maths: its loss along a curve at the curve's steps and the
derivative of that loss by the log of each parameter (every parameter is > 0 and fitted as its
log). The objective is the paper's (Luo et al. 2025): the sum of Huber(delta = 1e-3) terms on
log L over every run's steps after its warmup. scipy's ``least_squares`` with ``loss="huber"``
and ``f_scale = delta`` minimises exactly that sum (its cost, 1/2 sum f^2 rho(r^2/f^2), is
Huber's), by a trust-region Gauss-Newton method that reaches float64 precision on noiseless
curves. Starts: every point of the law's grid is scored and the best few are refined.

The bootstrap draws runs (a curve is the unit of independence) with replacement; a replicate
whose runs are too few, or none of which drops its rate (so the decay terms are unidentified),
whose refit does not converge, or leaves a parameter free (:func:`unpinned`), counts as
failed. Replicates drawing the same multiset of runs are the same fit, solved once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
from scipy.optimize import least_squares

from attnlab.cli_vocab import Flag
from attnlab.scaling.curves import MIN_RUNS, Curve, curves_from_table, schedule_curve
from attnlab.scaling.errors import FitError, FitInputError
from attnlab.scaling.law import Law
from attnlab.scaling.result import ScalingFit

HUBER_DELTA = 1e-3  # on log L: Luo et al. 2025, as Hoffmann et al. 2022 (parametric.py)

REFINED_STARTS = 4  # the best-scoring grid points refined by least_squares
TOLERANCE = 1e-14  # least_squares' ftol, xtol and gtol: noiseless curves fit to float64
MAX_EVALUATIONS = 2000
# A parameter whose log has a larger standard error (local: s^2 (J^T J)^-1 at the optimum) is
# left free by the curves within a factor e: e.g. beta -> inf with C -> 0 (G then tends to
# 1 - exp(-beta C x), which pins only their product).
UNPINNED_LOG_SE = 1.0


@dataclasses.dataclass(frozen=True)
class CurveModel:
    """A law of whole curves: ``names`` its parameters (each > 0); ``loss(params, curve)`` and
    ``jacobian(params, curve)`` ([points, P], d L / d log p) at the curve's steps; ``grid(curves)``
    [starts, P] the logs of its starting points; ``decay`` the parameters only a drop of the
    rate determines."""

    names: tuple[str, ...]
    loss: Callable[[dict, Curve], np.ndarray]
    jacobian: Callable[[dict, Curve], np.ndarray]
    grid: Callable[[list[Curve]], np.ndarray]
    decay: tuple[str, ...] = ()

    def params(self, theta) -> dict[str, float]:
        return {name: float(np.exp(value)) for name, value in zip(self.names, theta)}

    def residuals(self, theta, curves: list[Curve]) -> np.ndarray:
        """[points] log L_pred - log L over the curves' steps."""
        params = self.params(theta)
        with np.errstate(all="ignore"):
            return np.concatenate([np.log(self.loss(params, c)) - np.log(c.loss)
                                   for c in curves])

    def residual_jacobian(self, theta, curves: list[Curve]) -> np.ndarray:
        params = self.params(theta)
        with np.errstate(all="ignore"):
            return np.concatenate([self.jacobian(params, c) / self.loss(params, c)[:, None]
                                   for c in curves])


def huber_cost(residuals: np.ndarray) -> float:
    """sum Huber(delta) of the residuals (least_squares' cost with loss="huber")."""
    magnitude = np.abs(residuals)
    terms = np.where(magnitude <= HUBER_DELTA, 0.5 * residuals**2,
                     HUBER_DELTA * (magnitude - 0.5 * HUBER_DELTA))
    return float(np.sum(terms))


def _refine(model: CurveModel, theta0, curves):
    """(theta, cost) of least_squares from theta0; None when it fails or does not converge."""
    with np.errstate(all="ignore"):
        solved = least_squares(model.residuals, theta0, jac=model.residual_jacobian,
                               args=(curves,), loss="huber", f_scale=HUBER_DELTA,
                               x_scale="jac", ftol=TOLERANCE, xtol=TOLERANCE,
                               gtol=TOLERANCE, max_nfev=MAX_EVALUATIONS)
    if solved.status <= 0 or not np.all(np.isfinite(solved.x)) or not np.isfinite(solved.cost):
        return None
    return solved.x, huber_cost(model.residuals(solved.x, curves))


def best_fit(model: CurveModel, curves: list[Curve], starts: np.ndarray,
             refined: int = REFINED_STARTS):
    """(theta, cost, converged starts) of the best converged refinement of the ``refined``
    lowest-cost starts; theta None when none converged."""
    with np.errstate(all="ignore"):
        costs = np.array([huber_cost(model.residuals(s, curves)) for s in starts])
    order = np.argsort(np.where(np.isfinite(costs), costs, np.inf))[:refined]
    outcomes = [o for o in (_refine(model, starts[i], curves) for i in order) if o is not None]
    if not outcomes:
        return None, np.inf, 0
    theta, cost = min(outcomes, key=lambda o: o[1])
    return theta, cost, len(outcomes)


def identified(model: CurveModel, curves: list[Curve]) -> str | None:
    """Why these curves cannot determine the model's parameters (None: they can)."""
    if len({c.run_id for c in curves}) < MIN_RUNS:
        return f"fewer than {MIN_RUNS} distinct runs"
    if model.decay and not any(c.decays for c in curves):
        return f"no run's rate drops after its peak, which alone determines " \
               f"{', '.join(model.decay)}"
    return None


def unpinned(model: CurveModel, theta, curves: list[Curve]) -> dict[str, str]:
    """name -> why, for the parameters the curves leave free (:data:`UNPINNED_LOG_SE`)."""
    residuals = model.residuals(theta, curves)
    jacobian = model.residual_jacobian(theta, curves)
    variance = residuals @ residuals / max(len(residuals) - len(theta), 1)
    # (J^T J)^-1 from J's singular values, none truncated: a direction they do not determine
    # must show as an infinite error, not be dropped as pinv would.
    _, singular, rows = np.linalg.svd(jacobian, full_matrices=False)
    with np.errstate(all="ignore"):
        errors = np.sqrt(variance * np.sum((rows / singular[:, None]) ** 2, axis=0))
    return {name: f"the standard error of log {name} is {se:.3g} (from the Jacobian at the "
                  f"optimum), above {UNPINNED_LOG_SE:g}: the curves leave it free"
            for name, se in zip(model.names, errors) if not se <= UNPINNED_LOG_SE}


def _replicates(model, curves, theta, starts, n_bootstrap, seed):
    """[kept, P] bootstrap refits over runs and the number that failed."""
    rng = np.random.default_rng(seed)
    solved: dict[tuple, np.ndarray | None] = {}
    kept, failed = [], 0
    for _ in range(n_bootstrap):
        counts = tuple(np.bincount(rng.integers(0, len(curves), len(curves)),
                                   minlength=len(curves)))
        if counts not in solved:
            drawn = [c for c, k in zip(curves, counts) for _ in range(k)]
            usable = identified(model, drawn) is None
            warm = np.vstack([theta[None], starts])
            theta_r = best_fit(model, drawn, warm, refined=2)[0] if usable else None
            # A refit whose objective is flat along a parameter has not estimated it.
            pinned = theta_r is not None and not unpinned(model, theta_r, drawn)
            solved[counts] = theta_r if pinned else None
        if solved[counts] is None:
            failed += 1
        else:
            kept.append(solved[counts])
    return np.array(kept).reshape(-1, len(model.names)), failed


def fit_curves(model: CurveModel, law: Law, curves: list[Curve], *, n_bootstrap: int = 0,
               ci_level: float = 0.95, seed: int = 0, source: str = "curves",
               notes=()) -> ScalingFit:
    """The fit of ``model`` to the curves (each fitted after its warmup), with bootstrap
    refits over runs, as a ``ScalingFit`` of ``law``."""
    fitted = [c.fitted() for c in curves]
    fitted = [c for c in fitted if len(c.steps)]
    why = identified(model, fitted)
    if why:
        raise FitInputError(f"{source}: --law={law.name} cannot be fitted: {why} (after each "
                            f"run's warmup)")
    points = sum(len(c.steps) for c in fitted)
    if points <= len(model.names):
        raise FitInputError(f"{source}: {points} losses after the warmups for "
                            f"{len(model.names)} parameters")
    starts = model.grid(fitted)
    theta, cost, converged = best_fit(model, fitted, starts)
    if theta is None:
        raise FitError(f"{source}: no start of the grid converged ({len(starts)} starts, "
                       f"{REFINED_STARTS} refined by least_squares)")
    free = unpinned(model, theta, fitted)
    samples, failed = {}, 0
    if n_bootstrap > 0:
        replicates, failed = _replicates(model, fitted, theta, starts, n_bootstrap, seed)
        samples = {name: np.exp(replicates[:, i]) for i, name in enumerate(model.names)}
    return ScalingFit(
        part=law, params=model.params(theta), samples=samples, ci_level=ci_level,
        n_points=len(fitted), objective=cost,
        objective_name=f"sum of Huber(delta={HUBER_DELTA:g}) terms on log L over {points} "
                       f"losses after the warmups",
        n_bootstrap_requested=n_bootstrap, unpinned=tuple(free),
        warnings=tuple(f"the data do not pin {k}: {v}" for k, v in free.items()),
        notes=tuple(notes) + ((f"{failed} of {n_bootstrap} bootstrap refits failed: they drew "
                               f"fewer than {MIN_RUNS} runs or none whose rate drops, did not "
                               f"converge, or left a parameter free",) if failed else ()),
        resampling={"unit": "run", "column": "run_id", "clusters": len(fitted)},
        details={"grid": {"starts": len(starts), "refined": REFINED_STARTS},
                 "refined_converged": converged, "huber_delta": HUBER_DELTA,
                 "runs": [c.run_id for c in fitted], "points": points})


# The baseline both laws are set against: L0 + A S1^-alpha, blind to the schedule's shape.
def s1_loss(params: dict, curve: Curve) -> np.ndarray:
    """L(t) = L0 + A S1(t)^-alpha."""
    return params["L0"] + params["A"] * curve.area[curve.steps - 1] ** -params["alpha"]


def s1_jacobian(params: dict, curve: Curve) -> np.ndarray:
    """d L / d log p of :func:`s1_loss`: [points, (L0, A, alpha)]."""
    area = curve.area[curve.steps - 1]
    power = params["A"] * area ** -params["alpha"]
    ones = np.ones_like(area)
    return np.stack([params["L0"] * ones, power, -params["alpha"] * power * np.log(area)], 1)


def power_grid(curves: list[Curve]) -> np.ndarray:
    """[starts, (log L0, log A, log alpha)]: L0 a fraction of the lowest loss, alpha over the
    published span, A through the median loss at the median S1."""
    losses = np.concatenate([c.loss for c in curves])
    area = np.median(np.concatenate([c.area[c.steps - 1] for c in curves]))
    starts = []
    for l0 in np.array([0.3, 0.6, 0.9]) * losses.min():
        for alpha in (0.2, 0.45, 0.8):
            a = max(np.median(losses) - l0, 1e-3 * l0) * area**alpha
            starts.append(np.log([l0, a, alpha]))
    return np.array(starts)


S1_ONLY = CurveModel(("L0", "A", "alpha"), s1_loss, s1_jacobian, power_grid)
S1_TITLE = "S1-only power law L0 + A S1^-alpha (blind to the schedule's shape)"


PREDICT_SCHEDULE = Flag(
    "predict-schedule", "string", None, "--law=multipower or annealing: the curve the fitted "
    "law predicts for a schedule, in the fields of attnlab's schedule classes, e.g. "
    "wsd:peak=3e-4,warmup_steps=100,total_steps=3000,decay_fraction=0.2,cooldown=linear "
    "(cosine, constant, wsd, noam; several separated by ';').")


class CurveLaw(Law):
    """A law of whole curves under their schedules: a ``CurveModel`` (``model``) fitted
    to a curves table's runs."""

    capabilities = frozenset({"curves", "schedule"})
    flags = (PREDICT_SCHEDULE,)
    refused = ("by", "cluster", "floor", "pair", "budget", "train-longer", "multiplier-against")
    scope = "one fit of whole learning curves, each run's curve resampled whole"
    column_names = ("lr",)

    def model(self, settings) -> CurveModel:
        raise NotImplementedError

    def options(self, given):
        specs = [s for s in (given.get("predict-schedule") or "").split(";") if s.strip()]
        return {"predict": tuple(schedule_curve(s) for s in specs)}

    def curves(self, table, source: str, columns=None) -> tuple[list[Curve], list[str]]:
        """(curves, notes) of a curves table, or the curves as they are."""
        if isinstance(table, (list, tuple)):
            return list(table), []
        return curves_from_table(table, source=source, columns=columns)

    def fit(self, table, *, n_bootstrap, ci_level, seed, source="curves", columns=None,
            **settings) -> ScalingFit:
        """The fit to a curves table (or a list of ``Curve``) with intervals over runs."""
        curves, notes = self.curves(table, source, columns)
        return fit_curves(self.model(settings), self, curves, n_bootstrap=n_bootstrap,
                                   ci_level=ci_level, seed=seed, source=source, notes=notes)

    def predict(self, params, curve: Curve, settings=None) -> np.ndarray:
        """The loss the law predicts at the curve's steps."""
        return self.model(settings or {}).loss(params, curve)
