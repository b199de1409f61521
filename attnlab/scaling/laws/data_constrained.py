"""The data-constrained law (Muennighoff et al. 2023, arXiv 2305.16264, eqs. 5-6): repeated
tokens are worth less than new ones, and parameters beyond the data's compute-optimal size less
than those within it:

    L = E + A/N'^alpha + B/D'^beta
    D' = U_D + U_D R*_D (1 - exp(-R_D/R*_D)),  R_D = D/U_D - 1   (repeats beyond the first epoch)
    N' = U_N + U_N R*_N (1 - exp(-R_N/R*_N)),  R_N = N/U_N - 1   (parameters in excess)

U_D is a run's unique tokens and U_N = min(N, N_opt(U_D)), the convention of their paper: the
compute-optimal size for U_D tokens, here from the law's own Chinchilla part, where the
marginal returns of N and D balance at C = 6ND (alpha A/N^alpha = beta B/D^beta):
N_opt(U_D) = (alpha A/(beta B))^(1/alpha) U_D^(beta/alpha). A run without repeats (D = U_D) and
no excess parameters is the Chinchilla law itself. Muennighoff et al. fit the Chinchilla part
first (A 520.8, B 1487.7, E 1.869, alpha = beta = 0.3527), then R*_D = 15.4 and R*_N = 5.3 with
it frozen: ``--fix=E=1.869,A=520.8,B=1487.7,alpha=0.3527,beta=0.3527`` does the same, and
without ``--fix`` all seven are fitted together.

The fit is approach 3's: the sum of Huber(1e-3) terms on log L, L-BFGS from every point of a
grid (R*_D and R*_N searched in log space, so they stay > 0), the best converged start with
alpha, beta > 0, bootstrap refits from the estimate plus random grid starts, clusters drawn
whole. Their minimum in R*_D is flat: compare predicted losses, not R*_D alone.

Repeats come from the table's ``unique_tokens`` column (with ``tokens``), else its ``epochs``
(tokens / unique_tokens); ``--columns=unique_tokens:NAME`` or ``epochs:NAME`` names others.
"""

from __future__ import annotations

import dataclasses
import itertools

import jax.numpy as jnp
import numpy as np

from attnlab.scaling import equations, parametric
from attnlab.scaling.columns import pick_column
from attnlab.scaling.errors import FitError, FitInputError
from attnlab.scaling.law import Law, identifying_design
from attnlab.scaling.huber import huber
from attnlab.scaling.parametric import admissible, unpinned_terms
from attnlab.scaling.result import ScalingFit

THETA_NAMES = ("a", "b", "e", "alpha", "beta", "r_d", "r_n")  # r_d = log R*_D, r_n = log R*_N
COORDINATES = parametric.Coordinates(
    THETA_NAMES, {"E": "e", "A": "a", "B": "b", "R_D": "r_d", "R_N": "r_n"},
    {"alpha": "alpha", "beta": "beta"})
# Starts: Chinchilla's span of a, b, e at a coarser step, exponents around the published 0.28-
# 0.35, and R* from 1 to 90 (their 15.4 and 5.3 inside): 3,888 starts.
GRID = {"a": (0.0, 6.0, 12.0), "b": (0.0, 6.0, 12.0), "e": (-1.0, 0.0, 1.0),
        "alpha": (0.2, 0.4, 0.8), "beta": (0.2, 0.4, 0.8), "r_d": (0.0, 1.5, 3.0, 4.5),
        "r_n": (0.0, 1.5, 3.0, 4.5)}
# R* beyond this many times the most repeats seen leaves D' = D (or N' = N) at every run.
UNPINNED_DECAY = 100.0
REPEATS_TOLERANCE = 1e-9  # relative: unique_tokens rounded in a table is not a negative repeat


def log_optimal_size(params, log_u, xp=np):
    """log N_opt(U_D), the compute-optimal size for U_D unique tokens (module docstring)."""
    return (xp.log(params["alpha"] * params["A"] / (params["beta"] * params["B"]))
            + params["beta"] * log_u) / params["alpha"]


def effective(params, log_n, log_d, log_u, xp=np):
    """(log N', log D') of a run (see the module docstring); ``xp`` numpy or jax.numpy, params
    floats, arrays or tracers. In logs with log1p/expm1: R*(1 - exp(-R/R*)) is R for R << R*."""
    repeats = xp.exp(log_d - log_u) - 1.0
    log_d_eff = log_u + xp.log1p(-params["R_D"] * xp.expm1(-repeats / params["R_D"]))
    log_un = xp.minimum(log_n, log_optimal_size(params, log_u, xp))
    excess = xp.exp(xp.minimum(log_n - log_un, 700.0)) - 1.0
    log_n_eff = log_un + xp.log1p(-params["R_N"] * xp.expm1(-excess / params["R_N"]))
    return log_n_eff, log_d_eff


def data_constrained_loss(params, n, d, unique_tokens):
    """L(N, D, U_D) = E + A/N'^alpha + B/D'^beta (Muennighoff et al. 2023 eq. 7)."""
    with np.errstate(all="ignore"):
        log_n_eff, log_d_eff = effective(params, *(np.log(np.asarray(x, np.float64))
                                                   for x in (n, d, unique_tokens)))
        return equations.chinchilla_loss(params, np.exp(log_n_eff), np.exp(log_d_eff))


def _params(theta, xp=np) -> dict:
    a, b, e, alpha, beta, r_d, r_n = (theta[..., i] for i in range(len(THETA_NAMES)))
    return {"E": xp.exp(e), "A": xp.exp(a), "B": xp.exp(b), "alpha": alpha, "beta": beta,
            "R_D": xp.exp(r_d), "R_N": xp.exp(r_n)}


def huber_objective(theta, data, weights):
    """sum_i w_i Huber(log L_pred,i - log L_i); data: (log N, log D, log U_D, log L, Huber's
    delta)."""
    log_n, log_d, log_u, log_l, delta = data
    log_n_eff, log_d_eff = effective(_params(theta, jnp), log_n, log_d, log_u, jnp)
    a, b, e, alpha, beta = theta[:5]
    predicted = jnp.logaddexp(jnp.logaddexp(a - alpha * log_n_eff, b - beta * log_d_eff), e)
    return jnp.sum(weights * huber(predicted - log_l, delta))


def params_from_theta(theta) -> dict:
    with np.errstate(all="ignore"):
        return _params(np.asarray(theta, np.float64))


def unpinned_parameters(params: dict, data) -> dict[str, str]:
    """The parameters these runs cannot determine: approach 3's rules on the N' and D' terms,
    and a decay constant when no run repeats (or exceeds) or when it is beyond UNPINNED_DECAY
    times the most repeats (excess) seen, where every run has D' = D (N' = N)."""
    log_n, log_d, log_u = data[:3]
    log_n_eff, log_d_eff = effective(params, log_n, log_d, log_u)
    n_term = params["A"] * np.exp(-params["alpha"] * log_n_eff)
    d_term = params["B"] * np.exp(-params["beta"] * log_d_eff)
    found = unpinned_terms((("A", "alpha", n_term, params["alpha"], "N'"),
                            ("B", "beta", d_term, params["beta"], "D'")),
                           n_term + d_term + params["E"])
    log_n_opt = log_optimal_size(params, log_u)
    for name, most, what in (
            ("R_D", np.max(np.exp(log_d - log_u) - 1.0), "repeats R_D"),
            ("R_N", np.max(np.exp(log_n - np.minimum(log_n, log_n_opt)) - 1.0),
             "excess parameters R_N")):
        if most <= REPEATS_TOLERANCE:
            found[name] = f"no run has {what} > 0"
        elif params[name] > UNPINNED_DECAY * most:
            found[name] = (f"{name}={params[name]:.3g} is over {UNPINNED_DECAY:g}x the largest "
                           f"{what} ({most:.3g}): any larger value fits as well")
    return found


def grid_points(grid: dict | None = None) -> np.ndarray:
    """[starts, 7] every combination of the grid's axes, in THETA_NAMES order."""
    grid = GRID if grid is None else grid
    return np.array(list(itertools.product(*(grid[name] for name in THETA_NAMES))), np.float64)


def fit_data_constrained(n, d, unique_tokens, loss, *, grid=None, **options) -> ScalingFit:
    """Fits the law to runs (N, D, U_D, L, each [points]); grid: axis -> starting values
    (default GRID); options: ``parametric.fit_model``'s (fixed, n_bootstrap, clusters, ...)."""
    n, d, u, loss = (np.asarray(x, np.float64) for x in (n, d, unique_tokens, loss))
    data = (np.log(n), np.log(d), np.log(u), np.log(loss))
    design = identifying_design(MODEL.part, {"params": n, "tokens": d}, options.get("fixed"))
    return parametric.fit_model(MODEL, data, grid_points(grid), **options, design=design,
                                details={"max_repeats": float(np.max(d / u) - 1.0)})


def _repeats_column(df, mapping, source) -> dict[str, str]:
    """unique_tokens, else epochs (the one --columns maps first)."""
    order = ("epochs", "unique_tokens") if "epochs" in mapping and "unique_tokens" not in \
        mapping else ("unique_tokens", "epochs")
    for name in order:
        column = pick_column(df, name, (name,), mapping, source, "", required=False)
        if column:
            return {name: column}
    raise FitInputError(f"{source}: missing column 'unique_tokens' (or 'epochs'): "
                        f"--law=data_constrained reads each run's repeats from them; map "
                        f"another with --columns=unique_tokens:NAME or --columns=epochs:NAME")


def _check_repeats(table):
    """The table with ``unique_tokens`` U_D (from ``epochs`` where given): a run that read less
    than its corpus once saw D unique tokens (U_D = min(unique_tokens, D), as attnlab's own
    tables record the corpus's size and epochs below 1), with a note saying how many (the
    table's checks have refused values that are not positive)."""
    frame = table.frame.copy()
    name = "unique_tokens" if "unique_tokens" in frame else "epochs"
    unique = frame["unique_tokens"] if name == "unique_tokens" else \
        frame["tokens"] / frame["epochs"]
    once = int(((frame["tokens"] / unique - 1.0) < -REPEATS_TOLERANCE).sum())
    note = (f"{once} run(s) read less than their corpus once: their unique tokens U_D are the "
            f"tokens they read (no repeats)",) if once else ()
    frame["unique_tokens"] = np.minimum(unique, frame["tokens"])
    return dataclasses.replace(table, frame=frame.drop(columns=["epochs"], errors="ignore"),
                               notes=tuple(table.notes) + note)


class DataConstrained(Law):
    """Muennighoff et al. 2023's law of repeated data (module docstring)."""

    name = "data_constrained"
    title = "data-constrained (Muennighoff et al. 2023): L = E + A/N'^alpha + B/D'^beta"
    n_parameters = 7
    capabilities = frozenset({"table", "run-loss"})
    fixable = COORDINATES.fixable
    exponents = ("alpha", "beta")
    scales = ("R_D", "R_N")  # decay constants: an interval [90, 1e14] pins nothing
    run_columns = ("unique_tokens",)
    floor = "E"
    varies = {"N": ("A", "alpha"), "D": ("B", "beta")}  # R_D, R_N: the repeats (_check_repeats)
    refused = ("curves", "by", "budget", "multiplier-against", "train-longer")
    scope = "one fit of L(N', D') over a table's runs"

    def run_loss(self, params, n, d, unique_tokens=None, **_):
        if unique_tokens is None:
            raise FitError("the data-constrained law needs each run's unique tokens")
        return data_constrained_loss(params, n, d, unique_tokens)

    def table_columns(self, df, mapping, source):
        return _repeats_column(df, mapping, source)

    def check_table(self, table):
        return _check_repeats(table)

    def fit(self, table, *, n_bootstrap, ci_level, seed, clusters=None, fixed=None, **_):
        return fit_data_constrained(
            table.array("params"), table.array("tokens"), table.array("unique_tokens"),
            table.array("loss"), n_bootstrap=n_bootstrap, ci_level=ci_level, seed=seed,
            fixed=fixed, source=table.source, clusters=clusters)


MODEL = parametric.Model(DataConstrained(), COORDINATES, huber_objective,
                         parametric.holding(huber_objective), params_from_theta, admissible,
                         unpinned_parameters)
