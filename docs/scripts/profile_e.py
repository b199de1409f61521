"""The profile of approach 3's objective over E: fix E, refit A, B, alpha, beta from Hoffmann et
al.'s grid, print the best summed Huber objective (docs/scaling_studies.md, the Markov floor study).

    .venv/bin/python docs/scripts/profile_e.py runs/markov_floor 2.9 3.299 3.7384 4.0
"""

import sys

import jax.numpy as jnp
import numpy as np

from attnlab.scaling import CHINCHILLA_GRID, prepare_points, read_table
from attnlab.scaling.huber import HUBER_DELTA, huber
from attnlab.scaling.laws.registry import law_named
from attnlab.scaling.multistart import minimise_many


def objective_at_fixed_e(theta, data, weights):
    """sum_i Huber(LSE(a - alpha log N_i, b - beta log D_i, e) - log L_i) with e fixed
    (``data`` carries it as a fourth column); theta = (a, b, alpha, beta)."""
    log_n, log_d, log_l, e = data
    a, b, alpha, beta = theta
    predicted = jnp.log(jnp.exp(a - alpha * log_n) + jnp.exp(b - beta * log_d) + jnp.exp(e[0]))
    return jnp.sum(weights * huber(predicted - log_l, HUBER_DELTA))


def main(source: str, values: list[float]) -> None:
    table = prepare_points(read_table(source), law=law_named("chinchilla"), source=source)
    n, d, loss = (table.array(c) for c in ("params", "tokens", "loss"))
    starts = np.unique(CHINCHILLA_GRID.points()[:, [0, 1, 3, 4]], axis=0)
    for value in values:
        data = (np.log(n), np.log(d), np.log(loss), np.full(len(loss), np.log(value)))
        solved = minimise_many(objective_at_fixed_e, starts, data,
                               np.ones((len(starts), len(loss))))
        usable = solved.converged & (solved.params[:, 2] > 0) & (solved.params[:, 3] > 0)
        best = int(np.argmin(np.where(usable, solved.objective, np.inf)))
        alpha, beta = solved.params[best, 2:]
        print(f"E = {value:.4f}: objective {solved.objective[best]:.4e}, alpha {alpha:.3f}, "
              f"beta {beta:.3f}")


if __name__ == "__main__":
    main(sys.argv[1], [float(v) for v in sys.argv[2:]])
