"""The multi-power law (Luo et al., ICLR 2025, arXiv 2503.12811): a whole loss curve from its
learning-rate schedule,

    L(t) = L0 + A (S1(t) + S_W)^-alpha - LD(t),
    LD(t) = B sum_{k=1..t} (eta_{k-1} - eta_k) G(eta_k^-gamma S_k(t)),
    G(x) = 1 - (C x + 1)^-beta,   S_k(t) = sum_{tau=k..t} eta_tau,

t counted from the end of the warmup (the update at which the rate first peaks, eta_0 the
peak), S1(t) + S_W the summed rate since the first update. Every drop of the rate after the
peak lowers the loss by an amount that saturates (G -> 1) as training at the lower rate goes
on. Seven parameters, all > 0, fitted as in the paper: Huber(delta = 1e-3) on log L over 2-3
curves (a constant, a cosine, a two-stage drop); published at 400M parameters L0 2.375,
A 0.654, alpha 0.429, B 523.4, C 2.025, beta 0.594, gamma 0.635.

LD is a sum over the updates where the rate drops (none for a constant rate), each with
S_k(t) = S1(t) - S1(k - 1) read off the cumulative sum, so a curve costs [points x drops].
"""

from __future__ import annotations

import itertools

import numpy as np

from attnlab.scaling import curvefit
from attnlab.scaling.curves import Curve

NAMES = ("L0", "A", "alpha", "B", "C", "beta", "gamma")
# Starts for the decay terms (L0, A, alpha from the S1-only grid): B so that B eta_peak is a
# share of the lowest loss, C, beta, gamma around the published values.
B_SHARES = (0.02, 0.2)
C_VALUES, BETA_VALUES, GAMMA_VALUES = (0.3, 3.0), (0.3, 0.8), (0.3, 0.7)


def _terms(params, curve):
    """The pieces of LD the loss and its derivatives share: drop, x = C eta_k^-gamma S_k(t),
    u = x + 1 (so G = 1 - u^-beta), log eta_k."""
    drop, eta, summed = curve.drops
    eta = np.maximum(eta, np.finfo(np.float64).tiny)  # a rate decayed to 0: G saturates
    scaled = eta ** -params["gamma"] * summed
    x = params["C"] * scaled
    return drop, x, x + 1.0, np.log(eta)


def loss_drop(params: dict, curve: Curve) -> np.ndarray:
    """LD(t) at the curve's steps."""
    drop, _, u, _ = _terms(params, curve)
    return params["B"] * ((1.0 - u ** -params["beta"]) @ drop)


def multipower_loss(params: dict, curve: Curve) -> np.ndarray:
    """L(t) = L0 + A (S1 + S_W)^-alpha - LD(t) at the curve's steps."""
    return curvefit.s1_loss(params, curve) - loss_drop(params, curve)


def multipower_jacobian(params: dict, curve: Curve) -> np.ndarray:
    """[points, 7] d L / d log p, in NAMES order."""
    drop, x, u, log_eta = _terms(params, curve)
    b, beta = params["B"], params["beta"]
    ld = b * ((1.0 - u**-beta) @ drop)
    slope = beta * u ** (-beta - 1.0) * x  # x dG/dx
    d_c = -b * (slope @ drop)
    d_beta = -b * beta * ((u**-beta * np.log(u)) @ drop)
    d_gamma = b * params["gamma"] * ((slope * log_eta) @ drop)
    return np.column_stack([curvefit.s1_jacobian(params, curve), -ld, d_c, d_beta, d_gamma])


def multipower_grid(curves: list[Curve]) -> np.ndarray:
    """[starts, 7] logs of the starts: the S1-only grid times the decay terms' values."""
    floor = min(c.loss.min() for c in curves)
    peak = max(c.lr.max() for c in curves)
    decay = [np.log([share * floor / peak, c, beta, gamma]) for share, c, beta, gamma in
             itertools.product(B_SHARES, C_VALUES, BETA_VALUES, GAMMA_VALUES)]
    return np.array([np.concatenate([s, d]) for s in curvefit.power_grid(curves)
                     for d in decay])


MODEL = curvefit.CurveModel(NAMES, multipower_loss, multipower_jacobian, multipower_grid,
                            decay=("B", "C", "beta", "gamma"))


class MultiPower(curvefit.CurveLaw):
    """Luo et al. 2025's multi-power law of whole curves (module docstring)."""

    name = "multipower"
    title = ("multi-power law (Luo et al. 2025): L(t) = L0 + A (S1 + S_W)^-alpha - LD(t), "
             "LD = B sum (eta_k-1 - eta_k) G(eta_k^-gamma S_k(t))")
    n_parameters = len(NAMES)
    exponents = ("alpha", "beta", "gamma")
    scales = ("B", "C")

    def model(self, settings) -> curvefit.CurveModel:
        return MODEL
