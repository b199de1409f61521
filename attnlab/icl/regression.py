"""In-context regression (Garg et al. 2022) scored: a run of ``data.source=regression``
(a vector model, ``model.inputs=vectors``, trained by ``attnlab train`` with
``model.objective=regression``) against the number of in-context examples k, beside the exact
baselines of :func:`attnlab.data.icl_regression.regression_baselines` on the same prompts.

The prompt ``x_1, (y_1, 0..), .., x_k, (y_k, 0..)`` is ``2k`` vectors; the read-out at ``x_i``'s
position predicts ``y_i`` from the ``i - 1`` examples before it, so one prompt scores every
``k = 0 .. K - 1``. Errors are squared errors normalised by ``d`` (Garg et al., section 3),
the zero predictor's error in every function class (``attnlab/data/icl_functions.py``), whose
own baselines and claims join the linear ones.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab.data import icl_regression
from attnlab.model import apply

def predictions(graphdef: nnx.GraphDef, params, xs: np.ndarray, ys: np.ndarray, *,
                batch_size: int = 250) -> np.ndarray:
    """float64 ``[rows, k]``: the model's prediction of every ``y_j`` at ``x_j``'s position."""
    forward = jax.jit(lambda z: apply(graphdef, params, z))
    return np.concatenate([
        np.asarray(forward(jnp.asarray(icl_regression.interleave(xs[s : s + batch_size],
                                                      ys[s : s + batch_size]), jnp.float32)))
        for s in range(0, len(xs), batch_size)])[:, 0::2].astype(np.float64)


def evaluate(graphdef: nnx.GraphDef, params, task: icl_regression.RegressionTask, *, rows: int = 1000,
             batch_size: int = 250) -> dict:
    """The model's normalised error ``mean (yhat - y)^2 / d`` at every ``k`` on ``rows`` test
    prompts of the full task (seed 0 of the test stream), each baseline's on the same prompts,
    and the closed forms; ``stderr``: the standard error of the model's mean at each ``k``;
    ``gap_to_least_squares``: the model's error less least squares' at every ``k``; with no
    noise, whether Garg et al.'s claims hold (``matches``)."""
    xs, ys, functions = task.batch_functions(0, "test", 0, rows)
    squared = (predictions(graphdef, params, xs, ys, batch_size=batch_size) - ys) ** 2 / task.dim
    k = np.arange(task.examples)
    error = squared.mean(axis=0)
    baselines = icl_regression.regression_baselines(xs, ys, task.noise, function=task.function,
                                         functions=functions)
    # The closed forms hold for functions linear in w with E[w w^T] = I.
    expected = icl_regression.expected_errors(k, task.dim, task.noise) if task.function.linear else {}
    result = {
        "task": task.name, "dim": task.dim, "noise": task.noise, "prompts": rows,
        "function": task.function.summary(),
        "k": k.tolist(), "error": error.tolist(),
        "stderr": (squared.std(axis=0, ddof=1) / np.sqrt(rows)).tolist(),
        "error_at_largest_k": float(error[-1]),
        "error_at_largest_k_stderr": float(squared[:, -1].std(ddof=1) / np.sqrt(rows)),
        "gap_to_least_squares": (error - baselines["least_squares"]).tolist(),
        "baselines": {name: v.tolist() for name, v in baselines.items()},
        "expected": {name: [None if not np.isfinite(x) else float(x) for x in v]
                     for name, v in expected.items()},
    }
    if task.noise == 0:  # Garg et al.'s claims for the function class, where they apply
        claims = task.function.claims(error, baselines, task.dim)
        if claims:
            result["matches"] = claims
    return result
