"""The scaling laws' equations: plain functions of their parameters, and the compute-optimal allocation.

Every function takes a ``params`` mapping whose values are floats or arrays of bootstrap
replicates (shape [replicates]); inputs n, d, c broadcast against them, so the same code gives a
point estimate and, applied to the replicates, its interval.

Notation: N parameters, D training tokens, C training FLOPs, C = k·N·D with k = 6 by default
(forward + backward pass, Kaplan et al. 2020 Sec. 2.1).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

FLOPS_PER_PARAM_TOKEN = 6.0


def training_flops(n, d, flops_per_param_token: float = FLOPS_PER_PARAM_TOKEN):
    """C = 6·N·D (Kaplan et al. 2020 Eq. 2.1; Hoffmann et al. 2022 Sec. 3)."""
    return flops_per_param_token * np.asarray(n, np.float64) * np.asarray(d, np.float64)


# --- Kaplan et al. 2020 -----------------------------------------------------------------------

def kaplan_loss(params: Mapping, n, d):
    """L(N, D) = [(N_c/N)^(alpha_N/alpha_D) + D_c/D]^alpha_D (Kaplan et al. 2020 Eq. 1.5),
    computed in log space so that N_c ~ 1e13 neither overflows nor loses precision."""
    log_nc, log_dc = np.log(params["N_c"]), np.log(params["D_c"])
    alpha_n, alpha_d = params["alpha_N"], params["alpha_D"]
    log_l = alpha_d * np.logaddexp(alpha_n / alpha_d * (log_nc - np.log(n)),
                                   log_dc - np.log(d))
    return np.exp(log_l)


def kaplan_loss_n(params: Mapping, n):
    """L(N) = (N_c/N)^alpha_N (Kaplan et al. 2020 Eq. 1.1)."""
    return np.exp(params["alpha_N"] * (np.log(params["N_c"]) - np.log(n)))


def kaplan_loss_d(params: Mapping, d):
    """L(D) = (D_c/D)^alpha_D (Kaplan et al. 2020 Eq. 1.2)."""
    return np.exp(params["alpha_D"] * (np.log(params["D_c"]) - np.log(d)))


def kaplan_optimal(params: Mapping, c, flops_per_param_token: float = FLOPS_PER_PARAM_TOKEN):
    """The (N, D) minimising Kaplan's L(N, D) subject to C = k·N·D.

    With p = alpha_N/alpha_D, minimising (N_c/N)^p + D_c·k·N/C over N gives
    N_opt = (p·N_c^p·C / (k·D_c))^(1/(1+p)), i.e. N_opt ~ C^(alpha_D/(alpha_N+alpha_D)).
    (Kaplan's own N ~ C^0.73 comes from L(N, S) with the critical batch size, a different law.)
    """
    p = params["alpha_N"] / params["alpha_D"]
    log_n = (np.log(p) + p * np.log(params["N_c"]) + np.log(c)
             - np.log(flops_per_param_token) - np.log(params["D_c"])) / (1.0 + p)
    n_opt = np.exp(log_n)
    d_opt = np.asarray(c, np.float64) / (flops_per_param_token * n_opt)
    return {"N_opt": n_opt, "D_opt": d_opt, "loss": kaplan_loss(params, n_opt, d_opt)}


# --- Hoffmann et al. 2022 (Chinchilla) --------------------------------------------------------

def chinchilla_loss(params: Mapping, n, d):
    """L(N, D) = E + A/N^alpha + B/D^beta (Hoffmann et al. 2022 Eq. 2)."""
    return (params["E"] + params["A"] / np.power(n, params["alpha"])
            + params["B"] / np.power(d, params["beta"]))


def allocation_exponents(alpha, beta):
    """(a, b) of N_opt ~ C^a, D_opt ~ C^b: a = beta/(alpha+beta), b = alpha/(alpha+beta)
    (Hoffmann et al. 2022 Eq. 4)."""
    return beta / (alpha + beta), alpha / (alpha + beta)


def allocation_coefficient(A, B, alpha, beta):
    """G = (alpha·A / (beta·B))^(1/(alpha+beta)) (Hoffmann et al. 2022 Eq. 4); inf or NaN (no
    warning) for a bootstrap replicate far from any law, which the percentiles then rank."""
    with np.errstate(all="ignore"):
        return np.power(alpha * A / (beta * B), 1.0 / (alpha + beta))


def chinchilla_optimal(params: Mapping, c,
                       flops_per_param_token: float = FLOPS_PER_PARAM_TOKEN):
    """N_opt = G·(C/k)^a, D_opt = G^-1·(C/k)^b, the minimiser of E + A/N^alpha + B/D^beta on
    N·D = C/k (Hoffmann et al. 2022 Eq. 4 with k = 6), and the loss there."""
    with np.errstate(all="ignore"):  # see allocation_coefficient
        a, b = allocation_exponents(params["alpha"], params["beta"])
        g = allocation_coefficient(params["A"], params["B"], params["alpha"], params["beta"])
        per_param_token = np.asarray(c, np.float64) / flops_per_param_token
        n_opt = g * np.power(per_param_token, a)
        d_opt = np.power(per_param_token, b) / g
        return {"N_opt": n_opt, "D_opt": d_opt, "loss": chinchilla_loss(params, n_opt, d_opt)}


def power_law_optimal(params: Mapping, c):
    """Approaches 1 and 2: N_opt = k_N·C^a and D_opt = k_D·C^b, fitted directly; they model no
    loss, so ``loss`` is None."""
    c = np.asarray(c, np.float64)
    return {"N_opt": params["k_N"] * np.power(c, params["a"]),
            "D_opt": params["k_D"] * np.power(c, params["b"]), "loss": None}
