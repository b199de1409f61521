"""The scaling laws as plain functions of their parameters, and the compute-optimal allocation.

Every function takes a ``params`` mapping whose values are floats or arrays of bootstrap
replicates (shape [replicates]); inputs n, d, c broadcast against them, so the same code gives a
point estimate and, applied to the replicates, its interval.

Notation: N parameters, D training tokens, C training FLOPs, C = k·N·D with k = 6 by default
(forward + backward pass, Kaplan et al. 2020 Sec. 2.1).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from attnlab.scaling.errors import FitError

FLOPS_PER_PARAM_TOKEN = 6.0
# Fit flags that only some laws read (Law.reads, and a family's own selector): refused where
# the law would ignore them.
VARIANT_FLAGS = ("profile", "window", "grid", "form", "approach")


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


# --- The laws as parts ------------------------------------------------------------------------

class Law:
    """One scaling law as the commands see it: which table columns it reads, what its fit can
    answer, and its maths. Each law is a subclass beside the code that fits it (kaplan.py,
    approach1.py-approach3.py, clark.py) and one line of ``registry.LAWS``; commands ask the
    law, never compare its name.

    name: the ``--law`` value; variant: the ``--approach`` (Chinchilla) or ``--form`` (Kaplan)
    that selects it within its family; title: the equation reports print."""

    name: str = ""
    variant: int | str | None = None
    selector: str | None = None  # the flag that picks the variant ("approach", "form")
    default_variant: int | str | None = None  # the variant taken without that flag
    title: str = ""
    n_parameters: int = 0
    # N is the non-embedding count for Kaplan (their convention), all parameters otherwise.
    params_columns: tuple[str, ...] = ("params",)
    flops_columns: tuple[str, ...] = ("flops",)
    fits_table = True        # a ScalingFit of (N, D, L) points or curves (Clark: its own fit)
    needs_curves = False     # fitted to learning curves rather than final points
    isoflop_profiles = False  # fitted per FLOP budget (a ladder's branches become budgets)
    predicts_loss = False    # a loss for any run (L(N, D), L(N) or L(D))
    has_loss_model = False   # a loss at any (N, D)
    has_allocation = False   # N_opt(C), D_opt(C)
    closed_frontier = False  # L*(C) = E + K (C/k)^-gamma inverts in closed form (multipliers)
    table_k = False  # prices a budget as C = k·N·D with k read off the table's FLOPs
    own_flags: tuple[str, ...] = ()      # fit flags only this law reads
    fixable: tuple[str, ...] = ()        # the parameters --fix can hold
    # Parameters whose interval is read as an exponent's (``ScalingFit.too_wide``).
    exponents: tuple[str, ...] = ("alpha", "beta", "a", "b", "alpha_N", "alpha_D")
    # Positive constants read on a log scale (a decay constant): pinned within a factor of
    # MAX_SCALE_RATIO (``ScalingFit.too_wide``).
    scales: tuple[str, ...] = ()
    run_columns: tuple[str, ...] = ()    # table columns beyond N and D a run's loss reads
    refused_flags: tuple[str, ...] = ()  # fit flags that would mean nothing to this law
    column_names: tuple[str, ...] = ()  # --columns names beyond the (N, D, L) table's
    reads_pair = False  # --pair without --best-over: its own fit resamples those units
    reads: tuple[str, ...] = ()  # those of VARIANT_FLAGS this law reads
    scope: str = ""                      # what one fit of this law is, for those refusals

    @property
    def short_title(self) -> str:
        """The law's name without its equation: "Chinchilla approach 2", "Kaplan L(N, D)"."""
        return (self.title or self.name).split(":")[0].split(" = ")[0]

    @property
    def approach(self) -> int | None:
        """Chinchilla's approach number (None for other laws), as JSON reports name it."""
        return None

    @property
    def form(self) -> str:
        """Kaplan's form ("" for other laws), as JSON reports name it."""
        return ""

    def fit(self, table, *, n_bootstrap: int, ci_level: float, seed: int, **options):
        """The fit of this law to a checked ``table.ScalingTable``. ``options`` holds every
        other fit setting (``grid``, ``profile``, ``window``, ``flops_per_param_token``); a
        law takes those it reads and ignores the rest."""
        raise NotImplementedError

    def options(self, given: Mapping) -> dict:
        """A law with its own fit (``fits_table`` False): its settings from the values of its
        ``own_flags`` (flag name -> value, None where not given)."""
        return {}

    def report(self, fit, source: str) -> str:
        """A law with its own fit: the report ``attnlab fit`` prints."""
        raise NotImplementedError

    def table_columns(self, df, mapping: Mapping, source: str) -> dict[str, str]:
        """The columns beyond N, D, L and C this law reads from a results table (canonical
        name -> column), for ``table.prepare_points``."""
        return {}

    def check_table(self, table):
        """The checked table with this law's own columns derived and checked (e.g. the
        repeats of a data-constrained run); the table as it is by default."""
        return table

    def extra_report(self, fit, budgets, given: Mapping) -> tuple[str, dict]:
        """A table law's report beyond the parameters, from the values of its ``own_flags``:
        (text, JSON entries); nothing by default."""
        return "", {}

    def loss(self, params: Mapping, n, d):
        raise FitError(f"{self.title} has no L(N, D); fit --law=kaplan (form nd) or "
                          f"--law=chinchilla --approach=3 to predict losses")

    def size_curve(self, params: Mapping, n):
        """L(N) alone, for a law fitted on the best loss of each size (Kaplan's L(N)); None for
        the others."""
        return None

    def run_loss(self, params: Mapping, n, d, **columns):
        """The loss predicted for a run of N parameters trained on D tokens (``columns``: the
        run's values of ``run_columns``)."""
        return self.loss(params, n, d)

    def optimal(self, params: Mapping, c, flops_per_param_token: float):
        raise FitError(f"{self.title} has no compute-optimal allocation")


class KaplanLaw(Law):
    """Kaplan et al. 2020's laws; ``--form`` picks L(N, D), L(N) or L(D)."""

    name = "kaplan"
    selector, default_variant = "form", "nd"
    params_columns = ("non_embedding_params", "params")
    predicts_loss = True

    @property
    def form(self) -> str:
        return self.variant


class ChinchillaLaw(Law):
    """Hoffmann et al. 2022's three approaches; ``--approach`` picks one. Their FLOPs column
    is Chinchilla's own count where the table has it."""

    name = "chinchilla"
    selector, default_variant = "approach", 3
    flops_columns = ("flops_chinchilla", "flops")
    has_allocation = True

    @property
    def approach(self) -> int:
        return self.variant

    def optimal(self, params: Mapping, c, flops_per_param_token: float):
        return power_law_optimal(params, c)
