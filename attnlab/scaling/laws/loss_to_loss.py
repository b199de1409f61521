"""The loss-to-loss law (Brandfonbrener et al. 2025, arXiv 2411.12925): one loss of a set of
models from another loss of the same models (a training loss and a downstream or test loss,
or two training sets at matched compute), a shifted power law between their reducible parts:

    L_target = K (L_source - E_source)^kappa + E_target

with E_source, E_target the two losses' irreducible parts. A run whose source loss lies below
E_source is predicted E_target (its reducible source loss is spent).

The fit is approach 3's pattern (``parametric.fit_model``): the sum of Huber(1e-3) terms on
log L_target, L-BFGS from every point of a grid over theta = (log K, kappa, z, log E_target),
bootstrap refits with clusters drawn whole, ``--fix`` (K, kappa, E_source, E_target). The
constraints hold by construction: K, E_target > 0 through their logs, 0 < E_source < the least
source loss of the fit's runs as E_source = min(L_source) sigmoid(z); kappa > 0 is the
admissible set's.

The table: ``--columns=source:COL,target:COL``. A hold-out predicts held-out runs' targets from
their observed source losses, beside a direct approach-3 fit of the target on (N, D)
(``DirectFit``).
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
from scipy.special import expit, logit

from attnlab.scaling import parametric
from attnlab.scaling.columns import pick_column, positive_column
from attnlab.scaling.errors import FitError, FitInputError
from attnlab.scaling.huber import huber
from attnlab.scaling.law import Law
from attnlab.scaling.laws import approach3
from attnlab.scaling.parametric import MIN_EXPONENT, NEGLIGIBLE_TERM
from attnlab.scaling.result import ScalingFit

THETA_NAMES = ("log_k", "kappa", "z", "log_e_target")
# Starts: K and E_target within e^+-2 of a loss of order 1, kappa around 1 (their fits between
# training sets give 0.6-1.6), E_source from 0.12 to 0.98 of the least source loss: 256 starts.
GRID = {"log_k": (-2.0, -0.5, 0.5, 2.0), "kappa": (0.5, 1.0, 1.5, 2.5),
        "z": (-2.0, 0.0, 2.0, 4.0), "log_e_target": (-2.0, -0.5, 0.5, 1.5)}


def loss_to_loss(params, source):
    """L_target = K max(L_source - E_source, 0)^kappa + E_target (Brandfonbrener et al. 2025
    eq. 2)."""
    gap = np.maximum(np.asarray(source, np.float64) - params["E_source"], 0.0)
    return params["K"] * gap ** params["kappa"] + params["E_target"]


@dataclasses.dataclass(frozen=True)
class Coordinates(parametric.Coordinates):
    """The law's theta, where E_source = ``least`` sigmoid(z) (``least``: the fit's least
    source loss), so holding E_source holds z at its logit."""

    least: float = 1.0

    @property
    def fixable(self) -> tuple[str, ...]:
        return super().fixable + ("E_source",)

    def held(self, given, law):
        mask, values = super().held({k: v for k, v in given.items() if k != "E_source"}, law)
        if "E_source" in given:
            value = given["E_source"]
            if not 0 < value < self.least:
                raise FitInputError(f"--fix: E_source={value:g} must lie in (0, {self.least:.6g}"
                                    f"), below the least source loss")
            index = self.theta.index("z")
            mask[index], values[index] = True, logit(value / self.least)
        return mask, values


def coordinates(least: float) -> Coordinates:
    return Coordinates(THETA_NAMES, {"K": "log_k", "E_target": "log_e_target"},
                       {"kappa": "kappa"}, least=least)


def huber_objective(theta, data, weights):
    """sum_i w_i Huber(log L_target,pred,i - log L_target,i); data: (L_source, least source
    loss, log L_target, Huber's delta), each [points]."""
    source, least, log_target, delta = data
    log_k, kappa, z, log_e = theta
    log_gap = jnp.log(source - least * jax.nn.sigmoid(z))
    predicted = jnp.logaddexp(log_k + kappa * log_gap, log_e)
    return jnp.sum(weights * huber(predicted - log_target, delta))


def params_from(theta, least: float) -> dict:
    theta = np.asarray(theta, np.float64)
    log_k, kappa, z, log_e = (theta[..., i] for i in range(len(THETA_NAMES)))
    with np.errstate(all="ignore"):
        return {"K": np.exp(log_k), "kappa": kappa, "E_source": least * expit(z),
                "E_target": np.exp(log_e)}


def admissible(theta) -> np.ndarray:
    theta = np.asarray(theta, np.float64)
    return np.all(np.isfinite(theta), axis=-1) & (theta[..., 1] > 0)


def unpinned_parameters(params: dict, data) -> dict[str, str]:
    """K and kappa when the power-law term is below NEGLIGIBLE_TERM of every predicted target
    (any smaller K fits as well); with E_target too when kappa ~ 0 (the term is a constant)."""
    term = loss_to_loss(params, data[0]) - params["E_target"]
    share = float(np.max(term / (term + params["E_target"])))
    if share < NEGLIGIBLE_TERM:
        why = (f"K (L_source - E_source)^kappa is below {NEGLIGIBLE_TERM:g} of the target at "
               f"every run (largest share {share:.1e})")
        return {"K": why, "kappa": why}
    if params["kappa"] < MIN_EXPONENT:
        why = f"kappa={params['kappa']:.3g} ~ 0: the term is a constant E_target absorbs"
        return {"K": why, "kappa": why, "E_target": why}
    return {}


def model_for(least: float) -> parametric.Model:
    """The law's model for a fit whose least source loss is ``least``."""
    return parametric.Model(LossToLoss(), coordinates(least), huber_objective,
                            parametric.holding(huber_objective),
                            lambda theta: params_from(theta, least), admissible,
                            unpinned_parameters, admissible_text="kappa > 0")


def fit_loss_to_loss(source_loss, target_loss, *, grid=None, **options) -> ScalingFit:
    """Fits the law to runs' (L_source, L_target), each [runs]; grid: axis -> starting values
    (default GRID); options: ``parametric.fit_model``'s (fixed, n_bootstrap, clusters, ...)."""
    source, target = (np.asarray(x, np.float64) for x in (source_loss, target_loss))
    least = float(source.min())
    data = (source, np.full(len(source), least), np.log(target))
    grid = GRID if grid is None else grid
    starts = np.array(list(itertools.product(*(grid[k] for k in THETA_NAMES))), np.float64)
    return parametric.fit_model(model_for(least), data, starts, **options,
                                details={"least_source": least})


class DirectFit:
    """The hold-out's baseline: approach 3 of the target on (N, D), the target fitted on its
    own rather than through the source (a forecaster, as ``tables/forecasters.Forecaster``)."""

    name = column = "chinchilla"
    rule_column = None
    needs = "5 distinct kept (N, D) points and an approach-3 fit of them"
    grid = approach3.CHINCHILLA_GRID  # approach 3's own (tests coarsen it)

    def predict(self, kept, test):
        try:
            fit = approach3.fit_approach3(*(kept[c].to_numpy(np.float64)
                                            for c in ("params", "tokens", "loss")),
                                          grid=self.grid)
        except (FitError, FitInputError):
            return np.full(len(test), np.nan), [None] * len(test)
        return np.asarray(fit.loss(test["params"].to_numpy(np.float64),
                                   test["tokens"].to_numpy(np.float64)), np.float64), None


class LossToLoss(Law):
    """Brandfonbrener et al. 2025's shifted power law between two losses (module docstring)."""

    name = "loss_to_loss"
    title = ("loss-to-loss (Brandfonbrener et al. 2025): L_target = K (L_source - E_source)"
             "^kappa + E_target")
    n_parameters = 4
    capabilities = frozenset({"table", "run-loss"})
    fixable = ("K", "kappa", "E_source", "E_target")
    exponents = ("kappa",)
    run_columns = ("source",)
    column_names = ("source", "target")
    loss_name, loss_columns, loss_what = "target", (), "the target loss the law predicts"
    own_forecasters = (DirectFit,)
    refused = ("curves", "by", "budget", "multiplier-against", "train-longer")
    scope = "one fit of a target loss from a source loss over a table's runs"

    def run_loss(self, params, n, d, source=None, **_):
        if source is None:
            raise FitError("the loss-to-loss law needs each run's source loss")
        return loss_to_loss(params, source)

    def table_columns(self, df, mapping, source):
        if "source" not in mapping:
            raise FitInputError(f"{source}: --law=loss_to_loss needs --columns=source:COLUMN "
                                f"(the loss the target is predicted from)")
        return {"source": pick_column(df, "source", (), mapping, source, "")}

    def check_table(self, table):
        frame = table.frame.copy()
        frame["source"] = positive_column(table, "source", "the law takes powers of it")
        if np.allclose(frame["source"], frame["loss"], rtol=1e-12, atol=0):
            raise FitInputError(f"{table.source}: source column {table.columns['source']!r} "
                                f"equals target column {table.columns['loss']!r} at every run: "
                                f"name two different losses")
        return dataclasses.replace(table, frame=frame)

    def fit(self, table, *, n_bootstrap, ci_level, seed, clusters=None, fixed=None, **_):
        return fit_loss_to_loss(table.array("source"), table.array("loss"),
                                n_bootstrap=n_bootstrap, ci_level=ci_level, seed=seed,
                                fixed=fixed, source=table.source, clusters=clusters)
