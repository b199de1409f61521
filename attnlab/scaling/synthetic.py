"""Synthetic sweeps drawn from known laws with multiplicative noise, for tests, benchmarks and
docs: L_observed = L_true · exp(noise · z), z ~ N(0, 1)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import brentq, minimize_scalar

from attnlab.scaling import equations
from attnlab.scaling.laws import registry

CHINCHILLA_PUBLISHED = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}
KAPLAN_PUBLISHED = {"N_c": 8.8e13, "D_c": 5.4e13, "alpha_N": 0.076, "alpha_D": 0.095}
# Muennighoff et al. 2023's fit (their Sec. 5): the Chinchilla part, then the decay constants.
MUENNIGHOFF_PUBLISHED = {"E": 1.869, "A": 520.8, "B": 1487.7, "alpha": 0.3527, "beta": 0.3527,
                         "R_D": 15.4, "R_N": 5.3}


def _noisy(loss, noise, rng):
    return loss * np.exp(noise * rng.standard_normal(np.shape(loss)))


def grid_points(params: dict, *, law: str = "chinchilla", n_range=(1e7, 1e10),
                d_range=(1e8, 1e12), n_points: int = 250, noise: float = 0.01,
                rng: np.random.Generator) -> pd.DataFrame:
    """Runs at log-uniform random (N, D): columns params, tokens, loss, flops (= 6ND)."""
    n = np.exp(rng.uniform(*np.log(n_range), n_points))
    d = np.exp(rng.uniform(*np.log(d_range), n_points))
    truth = registry.law_named(law).loss(params, n, d)
    return pd.DataFrame({"params": n, "tokens": d, "loss": _noisy(truth, noise, rng),
                         "flops": equations.training_flops(n, d)})


def isoflop_points(params: dict, budgets, *, sizes_per_budget: int = 9, span: float = 8.0,
                   noise: float = 0.005, offsets=None,
                   rng: np.random.Generator) -> pd.DataFrame:
    """IsoFLOP sweep from Chinchilla's L(N, D): per budget C, sizes log-spaced over a factor
    ``span`` either side of offset·N_opt(C) (``offsets``: one factor per budget, default 1: the
    ladder centred on the true optimum), D = C/(6N). Columns params, tokens, loss, flops,
    budget."""
    rows = []
    offsets = np.ones(len(budgets)) if offsets is None else np.asarray(offsets, np.float64)
    for budget, offset in zip(budgets, offsets):
        centre = offset * equations.chinchilla_optimal(params, budget)["N_opt"]
        n = np.geomspace(centre / span, centre * span, sizes_per_budget)
        d = budget / (equations.FLOPS_PER_PARAM_TOKEN * n)
        loss = _noisy(equations.chinchilla_loss(params, n, d), noise, rng)
        rows.append(pd.DataFrame({"params": n, "tokens": d, "loss": loss, "flops": budget,
                                  "budget": budget}))
    return pd.concat(rows, ignore_index=True)


def learning_curves(params: dict, sizes, *, tokens_per_param_max: float = 400.0,
                    steps: int = 60, noise: float = 0.003,
                    rng: np.random.Generator) -> pd.DataFrame:
    """Learning curves for approach 1: for each size N, losses L(N, D) at log-spaced token counts
    up to ``tokens_per_param_max``·N (an idealised run whose every point is its own converged
    schedule). Columns run_id, step, params, tokens, loss, flops."""
    rows = []
    for i, n in enumerate(sizes):
        d = np.geomspace(n / 10, n * tokens_per_param_max, steps)
        loss = _noisy(equations.chinchilla_loss(params, n, d), noise, rng)
        rows.append(pd.DataFrame({"run_id": f"run{i:02d}", "step": np.arange(1, steps + 1),
                                  "params": float(n), "tokens": d, "loss": loss,
                                  "flops": equations.training_flops(n, d)}))
    return pd.concat(rows, ignore_index=True)


def ladder_points(params: dict, sizes, *, trunks_per_size: int = 5,
                  tokens_per_param=(5.0, 10.0, 20.0, 40.0, 80.0), trunk_noise: float = 0.01,
                  noise: float = 0.002, rng: np.random.Generator) -> pd.DataFrame:
    """A ladder from Chinchilla's L(N, D): per size N, ``trunks_per_size`` trunks (seeds), each
    with one branch per tokens-per-parameter ratio. A trunk's branches share its random effect
    (initialisation, data order, stable phase): L = L_true · exp(trunk_noise · u_trunk +
    noise · z_row). Columns params, tokens, loss, flops, trunk."""
    rows = []
    for i, n in enumerate(sizes):
        for t in range(trunks_per_size):
            d = n * np.asarray(tokens_per_param, np.float64)
            shared = trunk_noise * rng.standard_normal()
            loss = equations.chinchilla_loss(params, n, d) * np.exp(
                shared + noise * rng.standard_normal(len(d)))
            rows.append(pd.DataFrame({"params": float(n), "tokens": d, "loss": loss,
                                      "flops": equations.training_flops(n, d),
                                      "trunk": f"n{i}-t{t}"}))
    return pd.concat(rows, ignore_index=True)


def repeated_points(params: dict, *, sizes, unique_tokens, epochs, noise: float = 0.005,
                    rng: np.random.Generator) -> pd.DataFrame:
    """Runs of every (N, U_D, epochs) from the data-constrained law (Muennighoff et al. 2023):
    D = epochs·U_D. Columns params, tokens, unique_tokens, epochs, loss, flops."""
    n, u, e = (a.ravel() for a in np.meshgrid(np.asarray(sizes, np.float64),
                                              np.asarray(unique_tokens, np.float64),
                                              np.asarray(epochs, np.float64), indexing="ij"))
    truth = registry.law_named("data_constrained").run_loss(params, n, e * u, unique_tokens=u)
    return pd.DataFrame({"params": n, "tokens": e * u, "unique_tokens": u, "epochs": e,
                         "loss": _noisy(truth, noise, rng),
                         "flops": equations.training_flops(n, e * u)})


def overtrain_points(params: dict, *, budgets, ratios, noise: float = 0.005, law="overtrain",
                     rng: np.random.Generator) -> pd.DataFrame:
    """Runs of every (C, M) from Gadre et al. 2024's L(C, M) (``params``: E, a, b, eta), or from
    ``law`` (e.g. "chinchilla" with alpha != beta: a truth off the over-training law's form):
    N = sqrt(C/(6M)), D = M·N. Columns params, tokens, loss, flops (= 6ND)."""
    c, m = (a.ravel() for a in np.meshgrid(np.asarray(budgets, np.float64),
                                           np.asarray(ratios, np.float64), indexing="ij"))
    n = np.sqrt(c / (equations.FLOPS_PER_PARAM_TOKEN * m))
    truth = registry.law_named(law).loss(params, n, m * n)
    return pd.DataFrame({"params": n, "tokens": m * n, "loss": _noisy(truth, noise, rng),
                         "flops": c})


def true_optimum(loss, c: float) -> tuple[float, float]:
    """(N_opt, L_opt) of a truth ``loss(n, d)`` (any surface) at C = 6ND FLOPs, numerically."""
    k = equations.FLOPS_PER_PARAM_TOKEN
    best = minimize_scalar(lambda x: loss(np.exp(x), c / (k * np.exp(x))), bounds=(0.0, 50.0),
                           method="bounded", options={"xatol": 1e-10})
    return float(np.exp(best.x)), float(best.fun)


def true_compute_penalty(loss, c: float, m: float) -> float:
    """A truth's C_M / C_opt at equal loss (``loss(n, d)``, any surface): the compute a run at M
    tokens per parameter needs to reach the loss of the compute-optimal run of ``c`` FLOPs, over
    ``c``. Off the over-training law's form this depends on ``c``; on it, it does not."""
    k = equations.FLOPS_PER_PARAM_TOKEN
    best = true_optimum(loss, c)[1]

    def gap(log_c):
        n = np.sqrt(np.exp(log_c) / (k * m))
        return loss(n, m * n) - best

    return float(np.exp(brentq(gap, np.log(c), np.log(c) + 50.0, xtol=1e-13)) / c)


def powered_chinchilla_loss(params: dict, gamma: float, n, d):
    """E + (A/N^alpha + B/D^beta)^gamma: Chinchilla's form at gamma = 1, off it otherwise (the
    reducible loss's log-log slopes then drift with scale; the optimal allocation does not)."""
    return params["E"] + (params["A"] * np.power(n, -params["alpha"])
                          + params["B"] * np.power(d, -params["beta"])) ** gamma


def power_law(coef_exponents: tuple[float, dict], n, d):
    """c N^a D^b from ``(c, {"params": a, "tokens": b})``."""
    coef, e = coef_exponents
    return coef * np.power(n, e["params"]) * np.power(d, e["tokens"])


def hparams_grid(lr_law, batch_law, *, sizes, tokens, noise: float = 0.0, seed: int = 0,
                 shift: float = 0.0) -> pd.DataFrame:
    """Runs on a 5 x 5 grid of learning rates and batch sizes (factors of 2) per (N, D) around
    the optimum the two power laws give (:func:`power_law`), the grid off-centre by a random
    fraction of a step (``shift`` steps more for the smallest size): a loss quadratic in log
    lr and log batch, as Porian et al. 2024's fits assume, plus normal ``noise``. Columns
    params, tokens, train.learning_rate, steps, batch, final_val_loss, status."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in sizes:
        for d in tokens:
            lr_opt, b_opt = power_law(lr_law, n, d), power_law(batch_law, n, d)
            off = rng.uniform(-0.4, 0.4, 2) + (shift if n == sizes[0] else 0.0)
            for i in range(-2, 3):
                for j in range(-2, 3):
                    lr, b = lr_opt * 2.0 ** (i + off[0]), b_opt * 2.0 ** (j + off[1])
                    loss = (3.0 + 50 * n ** -0.3 + 0.02 * np.log(lr / lr_opt) ** 2
                            + 0.01 * np.log(b / b_opt) ** 2 + rng.normal(0, noise))
                    rows.append({"params": n, "tokens": d, "train.learning_rate": lr,
                                 "steps": int(d / b), "batch": b, "final_val_loss": loss,
                                 "status": "completed"})
    return pd.DataFrame(rows)


def hparams_seeds(lr_law, batch_law, *, sizes, tokens, n_seeds: int = 3,
                  noise: float = 0.002, seed: int = 0) -> pd.DataFrame:
    """:func:`hparams_grid`'s grid (one grid for every seed) trained at ``n_seeds`` seeds
    (column train.seed): each seed a loss offset in each (N, D) group shared by all its runs
    there (one initialisation and data order), and noise of each run's own."""
    rng = np.random.default_rng(seed)
    base = hparams_grid(lr_law, batch_law, sizes=sizes, tokens=tokens, seed=seed)
    frames = []
    for s in range(n_seeds):
        frame = base.assign(**{"train.seed": s})
        shared = frame.groupby(["params", "tokens"])["params"].transform(
            lambda g: rng.normal(0, 5 * noise))
        frame["final_val_loss"] += shared + rng.normal(0, noise, len(frame))
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)
