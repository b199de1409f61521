"""Chinchilla approach 3: fit L(N, D) = E + A/N^alpha + B/D^beta (Hoffmann et al. 2022 Sec. 3.3).

Minimise over theta = (a, b, e, alpha, beta)

    sum_i Huber_delta( LSE(a - alpha·log N_i, b - beta·log D_i, e) - log L_i ),  delta = 1e-3,

with L-BFGS from every point of an initialisation grid and keep the best start among those that
converged to an admissible law; then E = exp(e), A = exp(a), B = exp(b). As Besiroglu et al.
2024 found, this must be the *sum* of Huber terms (a mean shrinks the gradients by the number of
points and stops tolerance-based optimisers early) and must run in float64.

Admissible: alpha > 0 and beta > 0, every parameter finite. With a negative exponent
E + A/N^alpha + B/D^beta is not a scaling law (loss would grow with N or D without bound), yet
a few runs can prefer one: on a tiny IsoFLOP sweep whose larger models are undertrained, the
unconstrained optimum was alpha = -65.8 with A ~ 0, a term that only bends the largest runs.
Hoffmann et al. start every exponent at >= 0; we keep the constraint through the whole fit. The
unconstrained multi-start is unchanged (so admissible fits are bitwise what they were); the
constraint only chooses among its converged starts.

Identifiability: a parameter is *not pinned* by the data when the term it belongs to contributes
less than ``NEGLIGIBLE_TERM`` of the predicted loss at every point (any A/alpha then fits as well)
or an exponent is ~0 (the term is a constant that E absorbs). Such fits are reported, flagged
(``ScalingFit.unpinned``) and never used as a headline allocation.

Bootstrap: each replicate refits the resampled points (as multiplicity weights) from the
full-data estimate plus a few starts drawn from the grid, not from the whole grid: with 1,000
replicates the whole grid would cost 1,000x the main fit. The warm start lands in the basin of
the resampled optimum when the replicate is a small perturbation of the data; the grid starts
guard against a replicate whose optimum moved to another basin.
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings

import jax.numpy as jnp
import numpy as np

from attnlab.cli_vocab import Flag
from attnlab.scaling import equations, parametric
from attnlab.scaling.errors import FitError, FitInputError, GridEdgeWarning
from attnlab.scaling.huber import HUBER_DELTA, huber
from attnlab.scaling.law import identifying_design
from attnlab.scaling.laws.chinchilla import ChinchillaLaw
from attnlab.scaling.multistart import minimise_many
from attnlab.scaling.parametric import admissible, best_converged, unpinned_terms
from attnlab.scaling.result import ScalingFit

THETA_NAMES = ("a", "b", "e", "alpha", "beta")  # order of the optimised vector
# The parameters --fix can hold, and where they sit in theta.
COORDINATES = parametric.Coordinates(THETA_NAMES, {"E": "e", "A": "a", "B": "b"},
                                     {"alpha": "alpha", "beta": "beta"})
# What the allocation (a, b, G) is computed from: unpinned inputs leave it undetermined.
_ALLOCATION_INPUTS = ("A", "B", "alpha", "beta")


@dataclasses.dataclass(frozen=True)
class InitGrid:
    """Initial values of theta = (a, b, e, alpha, beta); every combination is one start.

    The default is Hoffmann et al. 2022's grid (App. D.2): alpha, beta in {0, 0.5, ..., 2},
    e in {-1, -0.5, ..., 1}, a, b in {0, 5, ..., 25}: 6·6·5·5·5 = 4,500 starts.
    """

    a: tuple[float, ...] = (0.0, 5.0, 10.0, 15.0, 20.0, 25.0)
    b: tuple[float, ...] = (0.0, 5.0, 10.0, 15.0, 20.0, 25.0)
    e: tuple[float, ...] = (-1.0, -0.5, 0.0, 0.5, 1.0)
    alpha: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0)
    beta: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0)

    def points(self) -> np.ndarray:
        """[starts, 5] in THETA_NAMES order."""
        axes = [getattr(self, name) for name in THETA_NAMES]
        return np.array(list(itertools.product(*axes)), np.float64)

    def __len__(self) -> int:
        return int(np.prod([len(getattr(self, name)) for name in THETA_NAMES]))

    def describe(self) -> dict:
        return {name: list(getattr(self, name)) for name in THETA_NAMES} | {"starts": len(self)}

    def edges_reached(self, theta: np.ndarray) -> list[str]:
        """The coordinates of ``theta`` that lie on or beyond the grid's span."""
        found = []
        for name, value in zip(THETA_NAMES, theta):
            axis = getattr(self, name)
            low, high = min(axis), max(axis)
            if len(axis) > 1 and value <= low:
                found.append(f"{name}={value:.4g} <= grid min {low:g}")
            elif len(axis) > 1 and value >= high:
                found.append(f"{name}={value:.4g} >= grid max {high:g}")
        return found

    @classmethod
    def parse(cls, spec: str, base: "InitGrid | None" = None) -> "InitGrid":
        """``"e:-1:3:0.5,alpha:0:2:0.25"`` -> axes from start to stop inclusive by step; axes not
        named keep ``base``'s values."""
        grid = base or cls()
        changes = {}
        for item in filter(None, (s.strip() for s in spec.split(","))):
            parts = item.split(":")
            if len(parts) != 4 or parts[0] not in THETA_NAMES:
                raise FitInputError(f"--grid: {item!r} is not NAME:START:STOP:STEP with NAME one "
                                    f"of {', '.join(THETA_NAMES)}")
            try:
                start, stop, step = (float(p) for p in parts[1:])
            except ValueError:
                raise FitInputError(f"--grid: {item!r} has a value that is not a number") from None
            if step <= 0 or stop < start:
                raise FitInputError(f"--grid: {item!r} needs STEP > 0 and STOP >= START")
            count = int(np.floor((stop - start) / step + 1e-9)) + 1
            changes[parts[0]] = tuple(float(start + i * step) for i in range(count))
        return dataclasses.replace(grid, **changes)


CHINCHILLA_GRID = InitGrid()


def huber_objective(theta, data, weights):
    """sum_i w_i Huber(LSE(a - alpha log N_i, b - beta log D_i, e) - log L_i).

    theta: [5] (a, b, e, alpha, beta); data: (log N, log D, log L, Huber's delta), each
    [points] (``huber.with_delta``); weights: [points] (bootstrap multiplicities; 0 for
    padding).
    The log-sum-exp of the three terms is log(A N^-alpha + B D^-beta + E); the exponents are
    clipped at 700 (exp overflows float64 at ~709), which only matters far from any fit.
    """
    log_n, log_d, log_l, delta = data
    a, b, e, alpha, beta = theta
    predicted = jnp.log(jnp.exp(jnp.minimum(a - alpha * log_n, 700.0))
                        + jnp.exp(jnp.minimum(b - beta * log_d, 700.0))
                        + jnp.exp(jnp.minimum(e, 700.0)))
    return jnp.sum(weights * huber(predicted - log_l, delta))


def params_from_theta(theta) -> dict:
    """theta [..., 5] -> E, A, B, alpha, beta and the allocation a, b, G (arrays broadcast)."""
    theta = np.asarray(theta, np.float64)
    log_a, log_b, e, alpha, beta = (theta[..., i] for i in range(5))
    with np.errstate(all="ignore"):  # a replicate with alpha + beta ~ 0 (or a huge log A)
        A, B = np.exp(log_a), np.exp(log_b)  # gives inf, not a crash or a warning
        a_exp, b_exp = equations.allocation_exponents(alpha, beta)
        g = equations.allocation_coefficient(A, B, alpha, beta)
    return {"E": np.exp(e), "A": A, "B": B, "alpha": alpha, "beta": beta, "a": a_exp,
            "b": b_exp, "G": g}




def unpinned_parameters(theta, data) -> dict[str, str]:
    """The parameters these points cannot determine at ``theta`` (``unpinned_terms`` of the N
    and D terms), each with the reason.

    theta: [5] (a, b, e, alpha, beta); data: (log N, log D, log L), each [points]. The N term is
    A/N^alpha = exp(a - alpha log N). The allocation a, b, G derives from A, B, alpha, beta and
    inherits their problems.
    """
    log_n, log_d = (np.asarray(c, np.float64) for c in data[:2])
    a, b, e, alpha, beta = np.asarray(theta, np.float64)
    with np.errstate(all="ignore"):
        n_term, d_term = np.exp(a - alpha * log_n), np.exp(b - beta * log_d)
        predicted = n_term + d_term + np.exp(e)
    found = unpinned_terms((("A", "alpha", n_term, alpha, "N"), ("B", "beta", d_term, beta, "D")),
                           predicted)
    if any(name in found for name in _ALLOCATION_INPUTS):
        cause = ", ".join(name for name in _ALLOCATION_INPUTS if name in found)
        for name in ("a", "b", "G"):
            found[name] = f"derived from {cause}, which the data do not pin"
    return found


held_huber_objective = parametric.holding(huber_objective)  # --fix: some coordinates held


def _check_points(n, d, free: int, source: str) -> None:
    n_points, distinct = len(n), len(set(zip(n, d)))
    what = ("approach 3 fits 5 parameters (E, A, B, alpha, beta)" if free == len(THETA_NAMES)
            else f"approach 3 fits {free} of its 5 parameters (the others held by --fix)")
    if free == 0:
        raise FitInputError("--fix holds every parameter of approach 3: nothing to fit")
    if n_points < free:
        raise FitInputError(f"{source}: {what} but has only {n_points} usable point(s)")
    if distinct < free:  # repeated runs of one (N, D) pin nothing more
        raise FitInputError(f"{source}: {what} but the {n_points} points have only {distinct} "
                            f"distinct (N, D) pair(s)")


def _estimate_warnings(solved, best: int, unconstrained: int, data, fixed: dict,
                       edges: list[str]) -> tuple[list[str], dict]:
    """What the report must say about the estimate: a rejected unconstrained optimum, the
    parameters the data do not pin ({name: reason}), a best fit on the grid's edge."""
    theta = solved.params[best]
    warn_list = []
    if unconstrained != best:
        rejected = dict(zip(THETA_NAMES, solved.params[unconstrained]))
        warn_list.append(
            f"the unconstrained optimum has alpha={rejected['alpha']:.3g}, "
            f"beta={rejected['beta']:.3g} (objective {solved.objective[unconstrained]:.4g}), not "
            f"a scaling law; kept the best fit with alpha, beta > 0 "
            f"(objective {solved.objective[best]:.4g})")
    unpinned = {k: v for k, v in unpinned_parameters(theta, data).items() if k not in fixed}
    if unpinned:
        reasons = dict.fromkeys(unpinned.values())  # each reason once, in order
        warn_list.append(f"degenerate fit: the data do not pin {', '.join(unpinned)} ("
                         + "; ".join(reasons) + "); its allocation and predictions beyond the "
                         "runs are not meaningful: add sizes or budgets")
    if edges:
        message = (f"the best fit lies on the edge of the initialisation grid ({'; '.join(edges)});"
                   f" the optimum may be outside the grid's basin: widen the grid (--grid)")
        warnings.warn(message, GridEdgeWarning, stacklevel=3)
        warn_list.append(message)
    return warn_list, unpinned


def _edge_refits(replicate_theta, grid: InitGrid, mask) -> list[str]:
    """A warning counting the bootstrap refits on the initialisation grid's edge (none if no
    refit is)."""
    on_edge = sum(bool(grid.edges_reached(np.where(mask, np.nan, t))) for t in replicate_theta)
    return [f"{on_edge} of {len(replicate_theta)} bootstrap refits lie on the edge of the "
            f"initialisation grid"] if on_edge else []


def fit_approach3(n, d, loss, *, grid: InitGrid = CHINCHILLA_GRID, n_bootstrap: int = 0,
                  bootstrap_grid_starts: int = 4, ci_level: float = 0.95, seed: int = 0,
                  max_steps: int = 500,
                  flops_per_param_token: float = equations.FLOPS_PER_PARAM_TOKEN,
                  source: str = "data", clusters=None, fixed=None) -> ScalingFit:
    """Fits E + A/N^alpha + B/D^beta to points (N [points], D [points], L [points]).

    n_bootstrap replicates refit from the full-data estimate plus ``bootstrap_grid_starts``
    random grid starts each; clusters: [points] labels whose points a replicate draws together
    (None: the points themselves); fixed: parameter -> value held through the fit and every
    refit (``--fix``). Warns (GridEdgeWarning) when the estimate lies on or beyond the
    grid's edge. Raises FitInputError for fewer points than the free parameters, FitError when
    no start converges to an admissible law (alpha, beta > 0). A fit the data cannot pin is
    returned with ``unpinned`` set and a warning, not raised.
    """
    n, d, loss = (np.asarray(x, np.float64) for x in (n, d, loss))
    fixed = dict(fixed or {})
    mask, values = COORDINATES.held(fixed, "chinchilla")
    _check_points(n, d, int((~mask).sum()), source)
    n_points = len(loss)
    data = (np.log(n), np.log(d), np.log(loss))
    objective = held_huber_objective if mask.any() else huber_objective
    data_at = parametric.objective_data(data, mask, values)
    fit_data = data_at(HUBER_DELTA)
    starts = parametric.held_starts(grid.points(), mask, values)
    ones = np.ones((len(starts), n_points))
    solved = minimise_many(objective, starts, fit_data, ones, max_steps=max_steps)
    if not solved.converged.any():
        raise FitError(f"{source}: none of the {len(starts)} starts of the grid converged within "
                       f"{max_steps} L-BFGS steps; check the data or widen the grid")
    unconstrained = best_converged(solved.objective, solved.converged)
    usable = solved.converged & admissible(solved.params)
    best = best_converged(solved.objective, usable)
    if best is None:
        alpha, beta = solved.params[unconstrained, 3:]
        raise FitError(f"{source}: no start of the grid converged to a scaling law (alpha, beta "
                       f"> 0); the best fit has alpha={alpha:.3g}, beta={beta:.3g}: these runs do "
                       f"not follow E + A/N^alpha + B/D^beta")
    theta = solved.params[best]
    warn_list, unpinned = _estimate_warnings(solved, best, unconstrained, data, fixed,
                                             grid.edges_reached(np.where(mask, np.nan, theta)))

    samples: dict[str, np.ndarray] = {}
    notes = parametric.held_notes(fixed)
    details = {"grid": grid.describe(), "huber_delta": HUBER_DELTA,
               "starts_converged": int(solved.converged.sum()),
               "best_start": dict(zip(THETA_NAMES, map(float, starts[best]))),
               "theta": dict(zip(THETA_NAMES, map(float, theta))),
               "max_steps": max_steps, "fixed": fixed}
    if n_bootstrap > 0:
        k = min(bootstrap_grid_starts, len(starts))
        design = identifying_design(Parametric(), {"params": n, "tokens": d}, fixed)
        refits = parametric.bootstrap_refits(
            objective, theta, starts, fit_data, n_points, n_bootstrap=n_bootstrap,
            grid_starts=k, seed=seed, clusters=clusters, admissible=admissible,
            max_steps=max_steps, design=design)
        replicate_theta = refits.params
        samples = parametric.exactly(params_from_theta(replicate_theta), fixed)
        notes += refits.notes(n_bootstrap, "did not converge to a law with alpha, beta > 0",
                              parametric.design_why(design))
        warn_list += _edge_refits(replicate_theta, grid, mask)
        details["bootstrap_starts"] = {"warm": 1, "grid": k}

    params = parametric.exactly({k: float(v) for k, v in params_from_theta(theta).items()},
                                fixed)
    fit = ScalingFit(part=Parametric(), params=params, samples=samples, ci_level=ci_level,
                     n_points=n_points, objective=float(solved.objective[best]),
                     objective_name=f"sum of Huber(delta={HUBER_DELTA:g}) terms on log L",
                     flops_per_param_token=flops_per_param_token,
                     n_bootstrap_requested=n_bootstrap, warnings=tuple(warn_list),
                     notes=tuple(notes), details=details, unpinned=tuple(unpinned))
    return parametric.with_sensitivity(fit, objective, solved, usable, data_at,
                                       params_from_theta, admissible, max_steps)


class Parametric(ChinchillaLaw):
    """Approach 3: L(N, D) = E + A/N^alpha + B/D^beta by Huber loss on log L."""

    variant = 3
    title = "Chinchilla approach 3: L(N, D) = E + A/N^alpha + B/D^beta"
    n_parameters = 5
    capabilities = ChinchillaLaw.capabilities | {"run-loss", "loss-model", "closed-frontier",
                                                 "table-k"}
    fixable = COORDINATES.fixable
    varies = {"N": ("A", "alpha"), "D": ("B", "beta")}
    floor = "E"
    flags = (Flag("grid", "string", None, "Approach 3 initialisation grid overrides (also "
                  "--law=two_step's step 1), "
                  "NAME:START:STOP:STEP for NAME in a, b, e, alpha, beta (default: Hoffmann et "
                  "al.'s grid)."),)

    def options(self, given):
        return {"grid": InitGrid.parse(given["grid"]) if given.get("grid") else CHINCHILLA_GRID}

    def loss(self, params, n, d):
        return equations.chinchilla_loss(params, n, d)

    def optimal(self, params, c, flops_per_param_token):
        return equations.chinchilla_optimal(params, c, flops_per_param_token)

    def fit(self, table, *, n_bootstrap, ci_level, seed, flops_per_param_token,
            grid=CHINCHILLA_GRID, clusters=None, fixed=None, **_):
        return fit_approach3(table.array("params"), table.array("tokens"), table.array("loss"),
                             grid=grid, flops_per_param_token=flops_per_param_token,
                             n_bootstrap=n_bootstrap, ci_level=ci_level, seed=seed,
                             source=table.source, clusters=clusters, fixed=fixed)
