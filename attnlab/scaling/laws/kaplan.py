"""Kaplan et al. 2020 power laws, fitted by least squares on log L.

- form "nd": L(N, D) = [(N_c/N)^(alpha_N/alpha_D) + D_c/D]^alpha_D (Eq. 1.5), fitted with
  scipy's trust-region least squares from a small grid of exponents; N_c and D_c start where
  the law passes through the median point, which leaves only the exponents to search.
- form "n": L(N) = (N_c/N)^alpha_N (Eq. 1.1) on the best (lowest) loss of each model size, the
  closest the table has to "trained to convergence"; a straight line in log-log space.
- form "d": L(D) = (D_c/D)^alpha_D (Eq. 1.2) on the lowest loss at each token count.

N is the non-embedding parameter count (Kaplan's convention). Bootstrap replicates resample the
points (whole clusters of them, e.g. a ladder's trunk with its branches, when the table has
clusters) and refit from the full-data estimate.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from attnlab.cli_vocab import Flag
from attnlab.scaling import equations
from attnlab.scaling.bootstrap import cluster_index, identified, resample_rows
from attnlab.scaling.errors import FitError, FitInputError
from attnlab.scaling.law import Law, identifying_design
from attnlab.scaling.result import ScalingFit

EXPONENT_GRID = (0.03, 0.07, 0.15, 0.3, 0.6)  # initial alpha_N and alpha_D for form "nd"


def _residuals_nd(theta, log_n, log_d, log_l):
    """theta = (log N_c, log D_c, alpha_N, alpha_D) -> log L_pred - log L, [points]."""
    log_nc, log_dc, alpha_n, alpha_d = theta
    log_pred = alpha_d * np.logaddexp(alpha_n / alpha_d * (log_nc - log_n), log_dc - log_d)
    return log_pred - log_l


def _fit_nd(log_n, log_d, log_l, starts):
    best = None
    for theta0 in starts:
        result = least_squares(_residuals_nd, theta0, args=(log_n, log_d, log_l), method="trf",
                               bounds=([-np.inf, -np.inf, 1e-6, 1e-6], np.inf),
                               x_scale="jac", xtol=1e-12, ftol=1e-12, gtol=1e-12)
        if result.success and np.all(np.isfinite(result.x)) and (best is None
                                                                  or result.cost < best.cost):
            best = result
    return best


def _nd_starts(log_n, log_d, log_l):
    """Exponent grid; N_c, D_c such that each term alone would give the median loss."""
    mid_n, mid_d, mid_l = np.median(log_n), np.median(log_d), np.median(log_l)
    return [np.array([mid_n + mid_l / an, mid_d + mid_l / ad, an, ad])
            for an, ad in itertools.product(EXPONENT_GRID, EXPONENT_GRID)]


def _line(log_x, log_l):
    """log L = alpha·log X_c - alpha·log X: returns (X_c, alpha, sum of squared residuals)."""
    slope, intercept = np.polyfit(log_x, log_l, 1)
    residual = log_l - (slope * log_x + intercept)
    alpha = -slope
    with np.errstate(over="ignore"):  # a near-flat line puts X_c at inf: reported, not warned
        x_c = np.exp(intercept / alpha)
    return float(x_c), float(alpha), float(residual @ residual)


def _lowest_per(keys: np.ndarray, loss: np.ndarray) -> np.ndarray:
    """Indices of the lowest loss for each distinct key."""
    frame = pd.DataFrame({"key": keys, "loss": loss})
    return frame.groupby("key")["loss"].idxmin().to_numpy()


class KaplanLaw(Law):
    """Kaplan et al. 2020's laws; ``--form`` picks L(N, D), L(N) or L(D)."""

    name = "kaplan"
    selector = Flag("form", "enum", "nd", "Kaplan law: L(N, D), L(N) or L(D).",
                    enum_values=("nd", "n", "d"))
    default_variant = "nd"
    params_columns = ("non_embedding_params", "params")
    capabilities = frozenset({"table", "run-loss"})

    @property
    def form(self) -> str:
        return self.variant


class KaplanJoint(KaplanLaw):
    """L(N, D) over every point, by trust-region least squares from the exponent grid."""

    variant = "nd"
    title = "Kaplan L(N, D) = [(N_c/N)^(alpha_N/alpha_D) + D_c/D]^alpha_D"
    n_parameters, parameter_names = 4, "N_c, D_c, alpha_N, alpha_D"
    varies = {"N": ("N_c", "alpha_N"), "D": ("D_c", "alpha_D")}
    capabilities = KaplanLaw.capabilities | {"loss-model", "allocation", "table-k"}
    per = None  # every point is used

    def loss(self, params, n, d):
        return equations.kaplan_loss(params, n, d)

    def optimal(self, params, c, flops_per_param_token):
        return equations.kaplan_optimal(params, c, flops_per_param_token)

    def keys(self, n, d):
        """The regressor whose spread a bootstrap replicate needs."""
        return n

    def fit_points(self, log_n, log_d, log_l, starts=None):
        """(params, sum of squared residuals, theta) or (None, None, None) without convergence."""
        starts = starts if starts is not None else _nd_starts(log_n, log_d, log_l)
        result = _fit_nd(log_n, log_d, log_l, starts)
        if result is None:
            return None, None, None
        log_nc, log_dc, alpha_n, alpha_d = result.x
        return ({"N_c": float(np.exp(log_nc)), "D_c": float(np.exp(log_dc)),
                 "alpha_N": float(alpha_n), "alpha_D": float(alpha_d)}, 2.0 * result.cost,
                result.x)

    def fit(self, table, *, n_bootstrap, ci_level, seed, flops_per_param_token, clusters=None,
            **_):
        return fit_kaplan(table.array("params"), table.array("tokens"), table.array("loss"),
                          form=self.variant, n_bootstrap=n_bootstrap, ci_level=ci_level,
                          seed=seed, flops_per_param_token=flops_per_param_token,
                          source=table.source, clusters=clusters)


class KaplanSize(KaplanJoint):
    """L(N) on the best (lowest) loss of each model size: a line in log-log space."""

    variant = "n"
    title = "Kaplan L(N) = (N_c/N)^alpha_N"
    n_parameters, parameter_names = 2, "N_c, alpha_N"
    varies = {"N": ("N_c", "alpha_N")}
    capabilities = KaplanLaw.capabilities
    per = "model sizes"

    def run_loss(self, params, n, d):
        return equations.kaplan_loss_n(params, n) + 0 * np.asarray(d, np.float64)

    def optimal(self, params, c, flops_per_param_token):
        raise FitError(f"{self.title} has no compute-optimal allocation; fit the joint "
                       f"L(N, D) (--form=nd)")

    def size_curve(self, params, n):
        return equations.kaplan_loss_n(params, n)

    def fit_points(self, log_n, log_d, log_l, starts=None):
        n_c, alpha, sse = _line(log_n, log_l)
        return {"N_c": n_c, "alpha_N": alpha}, sse, None


class KaplanData(KaplanSize):
    """L(D) on the lowest loss at each token count."""

    variant = "d"
    title = "Kaplan L(D) = (D_c/D)^alpha_D"
    parameter_names = "D_c, alpha_D"
    varies = {"D": ("D_c", "alpha_D")}
    per = "token counts"

    def size_curve(self, params, n):
        return None

    def keys(self, n, d):
        return d

    def run_loss(self, params, n, d):
        return equations.kaplan_loss_d(params, d) + 0 * np.asarray(n, np.float64)

    def fit_points(self, log_n, log_d, log_l, starts=None):
        d_c, alpha, sse = _line(log_d, log_l)
        return {"D_c": d_c, "alpha_D": alpha}, sse, None


FORMS = {c.variant: c for c in (KaplanJoint, KaplanSize, KaplanData)}


def fit_kaplan(n, d, loss, *, form: str = "nd", n_bootstrap: int = 0, ci_level: float = 0.95,
               seed: int = 0, flops_per_param_token: float = equations.FLOPS_PER_PARAM_TOKEN,
               source: str = "data", clusters=None) -> ScalingFit:
    """Fits Kaplan's L(N, D), L(N) or L(D) to points (N, D, L: [points] each); clusters:
    [points] labels a bootstrap replicate draws whole (None: the points)."""
    if form not in FORMS:
        raise FitInputError(f"Kaplan form must be one of {', '.join(FORMS)}, not {form!r}")
    law = FORMS[form]()
    n, d, loss = (np.asarray(x, np.float64) for x in (n, d, loss))
    notes = []
    if law.per:
        keep = _lowest_per(law.keys(n, d), loss)
        if len(keep) < len(loss):
            notes.append(f"form {form}: kept the lowest loss of each of {len(keep)} distinct "
                         f"{law.per} ({len(loss)} points)")
        n, d, loss = n[keep], d[keep], loss[keep]
        clusters = None if clusters is None else np.asarray(clusters)[keep]
    if clusters is not None:
        clusters = cluster_index(clusters)
        if clusters.max() + 1 == len(clusters):
            clusters = None
    n_params, names = law.n_parameters, law.parameter_names
    if len(loss) < n_params:
        raise FitInputError(f"{source}: Kaplan form {form} fits {n_params} parameters ({names}) "
                            f"but has only {len(loss)} usable point(s)")
    distinct = len(set(zip(n, d)))  # L(N) and L(D) kept one point per x above
    if distinct < n_params:  # repeated runs of one (N, D) pin nothing more
        raise FitInputError(f"{source}: Kaplan form {form} fits {n_params} parameters ({names}) "
                            f"but the {len(loss)} points have only {distinct} distinct (N, D) "
                            f"pair(s)")
    log_n, log_d, log_l = np.log(n), np.log(d), np.log(loss)

    def fit_points(index, starts=None):
        return law.fit_points(log_n[index], log_d[index], log_l[index], starts)

    everything = np.arange(len(loss))
    params, sse, theta = fit_points(everything)
    if params is None:
        raise FitError(f"{source}: Kaplan L(N, D) did not converge from any of the "
                       f"{len(EXPONENT_GRID) ** 2} starts")
    samples: dict[str, list] = {}
    if n_bootstrap > 0:
        rng = np.random.default_rng(seed)
        design = identifying_design(law, {"params": n, "tokens": d})
        failed = 0
        for _ in range(n_bootstrap):
            index = resample_rows(len(loss), rng, clusters)
            drawn = np.bincount(index, minlength=len(loss))[None]
            if not identified(drawn, design)[0]:
                failed += 1  # e.g. a line through one distinct x is undefined
                continue
            replicate, _, _ = fit_points(index, None if theta is None else [theta])
            if replicate is None:
                failed += 1
                continue
            for name, value in replicate.items():
                samples.setdefault(name, []).append(value)
        if failed:
            notes.append(f"{failed} of {n_bootstrap} bootstrap refits failed and were dropped")
    return ScalingFit(part=law, params=params,
                      samples={k: np.asarray(v) for k, v in samples.items()},
                      ci_level=ci_level, n_points=len(loss), objective=float(sse),
                      objective_name="sum of squared residuals of log L",
                      flops_per_param_token=flops_per_param_token,
                      n_bootstrap_requested=n_bootstrap, notes=tuple(notes),
                      details={"exponent_grid": list(EXPONENT_GRID)} if law.per is None else {})

