"""The over-training law (Gadre et al. 2024, arXiv 2403.08540, Sec. 2.1, eq. 4): the loss in
training compute C and tokens per parameter M = D/N,

    L(C, M) = E + (a M^eta + b M^-eta) C^-eta,

which is Chinchilla's E + A/N^alpha + B/D^beta with alpha = beta = 2 eta and C = 6ND (their
derivation: N = sqrt(C/(6M)), D = sqrt(CM/6), so a = A 6^eta, b = B 6^eta). At any fixed M the
reducible loss is a power law in C with the one exponent eta: small runs at several M predict a
larger, more over-trained run (``--holdout``). The reference is the law's own compute-optimal
ratio M* = (b/a)^(1/(2 eta)), where a M*^eta = b M*^-eta = sqrt(ab), so

    L(C, M) = E + sqrt(ab) ((M/M*)^eta + (M/M*)^-eta) C^-eta,

and a model trained at M instead of M* reaches the same loss with the compute penalty
C_M/C_M* = (((M/M*)^eta + (M/M*)^-eta) / 2)^(1/eta) (>= 1, the same at every loss): the
anchors' two questions, the loss at a fixed M (``--tokens-per-param`` with ``--budget``) and
the price of a smaller model at fixed loss, answered with bootstrap intervals.

C is 6ND here, as in Gadre et al. (not the table's FLOPs column). The fit is approach 3's: the
sum of Huber(1e-3) terms on log L, L-BFGS from a grid over (log a, log b, log E, eta), bootstrap
refits with clusters drawn whole, parameters held with ``--fix`` (E, a, b, eta).
"""

from __future__ import annotations

import itertools
import math

import jax.numpy as jnp
import numpy as np

from attnlab.cli_vocab import Flag
from attnlab.scaling import equations, parametric
from attnlab.scaling.bootstrap import percentile_interval
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.law import Law, identifying_design, positive_list
from attnlab.scaling.huber import huber
from attnlab.scaling.parametric import unpinned_terms
from attnlab.scaling.result import ScalingFit

THETA_NAMES = ("log_a", "log_b", "e", "eta")
COORDINATES = parametric.Coordinates(THETA_NAMES, {"E": "e", "a": "log_a", "b": "log_b"},
                                     {"eta": "eta"})
# Starts: log a, log b over Chinchilla's span of log A, log B (a = A 6^eta adds < 1), log E as
# approach 3, eta around half Chinchilla's exponents: 600 starts.
GRID = {"log_a": (0.0, 5.0, 10.0, 15.0, 20.0), "log_b": (0.0, 5.0, 10.0, 15.0, 20.0),
        "e": (-1.0, -0.5, 0.0, 0.5, 1.0), "eta": (0.05, 0.1, 0.2, 0.3, 0.5)}
FLOPS = equations.FLOPS_PER_PARAM_TOKEN  # C = 6ND (Gadre et al.)


def overtrain_loss(params, c, m):
    """L(C, M) = E + (a M^eta + b M^-eta) C^-eta (Gadre et al. 2024 eq. 4)."""
    c, m = np.asarray(c, np.float64), np.asarray(m, np.float64)
    eta = params["eta"]
    return params["E"] + (params["a"] * m**eta + params["b"] * m**-eta) * c**-eta


def optimal_ratio(params):
    """M* = (b/a)^(1/(2 eta)), the tokens per parameter minimising L at fixed C."""
    with np.errstate(all="ignore"):
        return np.power(params["b"] / params["a"], 1.0 / (2.0 * params["eta"]))


def compute_penalty(params, m):
    """C_M / C_M* at equal loss: (((M/M*)^eta + (M/M*)^-eta) / 2)^(1/eta)."""
    eta = params["eta"]
    with np.errstate(all="ignore"):
        x = np.asarray(m, np.float64) / optimal_ratio(params)
        return np.power((x**eta + x**-eta) / 2.0, 1.0 / eta)


def size_at(c, m):
    """(N, D) of a run of C = 6ND FLOPs at M = D/N tokens per parameter."""
    n = np.sqrt(np.asarray(c, np.float64) / (FLOPS * np.asarray(m, np.float64)))
    return n, m * n


def huber_objective(theta, data, weights):
    """sum_i w_i Huber(log L_pred,i - log L_i); data: (log C, log M, log L, Huber's delta)."""
    log_c, log_m, log_l, delta = data
    log_a, log_b, e, eta = theta
    predicted = jnp.logaddexp(jnp.logaddexp(log_a + eta * (log_m - log_c),
                                            log_b - eta * (log_m + log_c)), e)
    return jnp.sum(weights * huber(predicted - log_l, delta))


def params_from_theta(theta) -> dict:
    theta = np.asarray(theta, np.float64)
    log_a, log_b, e, eta = (theta[..., i] for i in range(len(THETA_NAMES)))
    with np.errstate(all="ignore"):
        params = {"E": np.exp(e), "a": np.exp(log_a), "b": np.exp(log_b), "eta": eta}
    return params | {"M_opt": optimal_ratio(params)}


def admissible(theta) -> np.ndarray:
    theta = np.asarray(theta, np.float64)
    return np.all(np.isfinite(theta), axis=-1) & (theta[..., 3] > 0)


def unpinned_parameters(params: dict, data) -> dict[str, str]:
    """Approach 3's rules on the two terms, a (C/M)^-eta and b (CM)^-eta; M_opt derives from
    a, b, eta and inherits their problems."""
    log_c, log_m = data[:2]
    a_term = params["a"] * np.exp(params["eta"] * (log_m - log_c))
    b_term = params["b"] * np.exp(-params["eta"] * (log_m + log_c))
    found = unpinned_terms((("a", "eta", a_term, params["eta"], "(C/M)"),
                            ("b", "eta", b_term, params["eta"], "(CM)")),
                           a_term + b_term + params["E"])
    if found:
        found["M_opt"] = f"derived from {', '.join(found)}, which the data do not pin"
    return found


def fit_overtrain(n, d, loss, *, grid=None, **options) -> ScalingFit:
    """Fits L(C, M) to runs (N, D, L, each [points]) with C = 6ND, M = D/N; grid: axis ->
    starting values (default GRID); options: ``parametric.fit_model``'s."""
    n, d, loss = (np.asarray(x, np.float64) for x in (n, d, loss))
    data = (np.log(equations.training_flops(n, d)), np.log(d / n), np.log(loss))
    grid = GRID if grid is None else grid
    starts = np.array(list(itertools.product(*(grid[k] for k in THETA_NAMES))), np.float64)
    design = identifying_design(MODEL.part, {"params": n, "tokens": d}, options.get("fixed"))
    return parametric.fit_model(MODEL, data, starts, **options, design=design)


def _interval(fit: ScalingFit, values) -> list | None:
    return list(percentile_interval(values, fit.ci_level)) if fit.interval_samples else None


def at_ratio(fit: ScalingFit, c: float, m: float) -> dict:
    """The run of C FLOPs at M tokens per parameter: N, D, its loss and the compute penalty
    of M against M* at equal loss, with intervals over the bootstrap refits."""
    n, d = size_at(c, m)
    replicates = fit.interval_samples
    return {"C": c, "M": m, "N": float(n), "D": float(d),
            "loss": float(overtrain_loss(fit.params, c, m)),
            "loss_ci": _interval(fit, overtrain_loss(replicates, c, m) if replicates else ()),
            "penalty": float(compute_penalty(fit.params, m)),
            "penalty_ci": _interval(fit, compute_penalty(replicates, m) if replicates else ())}


def _cells(row: dict, name: str) -> str:
    low, high = row[f"{name}_ci"] or (math.nan, math.nan)
    return f"{row[name]:>9.4f}{low:>9.4f}{high:>9.4f}"


def format_ratios(fit: ScalingFit, budgets, ratios) -> tuple[str, dict]:
    """The lines and JSON of ``--tokens-per-param``: per budget and ratio M, the run's N, D
    and loss, and the compute penalty of M against M* at equal loss."""
    if not ratios:
        return "", {}
    if not budgets:
        raise FitInputError("--tokens-per-param needs --budget=C[,C...]: the loss of a run of "
                            "C FLOPs at each ratio")
    rows = [at_ratio(fit, c, m) for c in budgets for m in ratios]
    level = f"{100 * fit.ci_level:g}%"
    lines = ["", f"at fixed tokens per parameter (C = 6ND, M = D/N; M* = "
                 f"{fit.params['M_opt']:.4g}), {level} intervals; penalty: C_M / C_M* at "
                 f"equal loss",
             f"  {'C':>10}{'M':>8}{'N':>11}{'D':>11}{'loss':>9}{'low':>9}{'high':>9}"
             f"{'penalty':>9}{'low':>9}{'high':>9}"]
    for row in rows:
        lines.append(f"  {row['C']:>10.3g}{row['M']:>8g}{row['N']:>11.3g}{row['D']:>11.3g}"
                     + _cells(row, "loss") + _cells(row, "penalty"))
    return "\n".join(lines) + "\n", {"at_tokens_per_param": rows}


class Overtrain(Law):
    """Gadre et al. 2024's L(C, M) (module docstring)."""

    name = "overtrain"
    title = "over-training (Gadre et al. 2024): L(C, M) = E + (a M^eta + b M^-eta) C^-eta"
    n_parameters = 4
    capabilities = frozenset({"table", "run-loss", "loss-model", "allocation"})
    fixable = COORDINATES.fixable
    exponents = ("eta",)
    report_flags = (Flag("tokens-per-param", "string", None, "--law=overtrain: ratios M = D/N, "
                  "comma-separated (e.g. 20,200): with --budget, the loss of a run of C FLOPs at "
                  "each M and the compute penalty C_M/C_M* of M against the law's optimal ratio "
                  "at equal loss, with intervals."),)
    refused = ("curves", "by", "multiplier-against", "train-longer")
    scope = "one fit of L(C, M) over a table's runs"
    # At one ratio L(C, M) is E + K C^-eta (Gadre et al. fit compute-optimal and over-trained
    # runs together).
    varies = {"D/N": ("a", "b", "M*")}

    def distinct_needed(self, fixed=None):
        # Along C each ratio's E + K(M) C^-eta sets E and K(M); two ratios then give a and b
        # (M* follows from them), one fewer than a, b, M* counted as parameters.
        return {"D/N": 2} if {"a", "b"} - set(fixed or {}) else {}

    def loss(self, params, n, d):
        n, d = np.asarray(n, np.float64), np.asarray(d, np.float64)
        return overtrain_loss(params, equations.training_flops(n, d), d / n)

    def optimal(self, params, c, flops_per_param_token=FLOPS):
        n, d = size_at(c, optimal_ratio(params))
        return {"N_opt": n, "D_opt": d, "loss": self.loss(params, n, d)}

    def options(self, given):
        return {"tokens_per_param": positive_list(
            given.get("tokens-per-param"), "--tokens-per-param", "ratios D/N", "20,200")}

    def extra_report(self, fit, budgets, settings):
        return format_ratios(fit, budgets, settings.get("tokens_per_param", []))

    def fit(self, table, *, n_bootstrap, ci_level, seed, clusters=None, fixed=None, **_):
        return fit_overtrain(table.array("params"), table.array("tokens"), table.array("loss"),
                             n_bootstrap=n_bootstrap, ci_level=ci_level, seed=seed,
                             fixed=fixed, source=table.source, clusters=clusters)


MODEL = parametric.Model(Overtrain(), COORDINATES, huber_objective,
                         parametric.holding(huber_objective), params_from_theta, admissible,
                         unpinned_parameters, admissible_text="eta > 0")
