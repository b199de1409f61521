"""In-context linear regression (Garg et al. 2022) with a vector model (``model.inputs=vectors``):
training on fresh prompts and the error against the number of in-context examples, beside the
exact baselines of :func:`attnlab.data.icl.regression_baselines` on the same prompts.

The prompt ``x_1, (y_1, 0..), .., x_k, (y_k, 0..)`` is ``2k`` vectors; the read-out at ``x_i``'s
position predicts ``y_i`` from the ``i - 1`` examples before it, so one prompt scores every
``k = 0 .. K - 1``. The loss is the squared error averaged over those positions (Garg et al.,
section 3). Batch ``i`` is a pure function of ``(data seed, i)``.

This trainer is a plain loop (AdamW of :func:`attnlab.train.optimizer.make_optimizer`, no
checkpoints): ``attnlab train`` reads token batches only.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from attnlab.config import ModelConfig, TrainConfig
from attnlab.data import icl
from attnlab.errors import ConfigError
from attnlab.model import apply, init_model, resolve
from attnlab.train.optimizer import make_optimizer


def check_model(cfg: ModelConfig, task: icl.RegressionTask) -> None:
    """The model must read vectors of the prompt's width (raises ConfigError naming it)."""
    task.validate()
    if resolve(cfg).inputs.fields != ("input_dim",):
        raise ConfigError("model.inputs", f"in-context regression reads vectors: set "
                          f"model.inputs=vectors, got {cfg.inputs}")
    if cfg.input_dim != task.dim:
        raise ConfigError("model.input_dim", f"{cfg.input_dim} differs from the task's "
                          f"data.icl_dim={task.dim}")


def prompt_loss(predictions: jax.Array, ys: jax.Array) -> jax.Array:
    """``predictions [batch, 2k]`` (the read-out at every position), ``ys [batch, k]`` ->
    the mean squared error of the predictions at the ``x`` positions."""
    return jnp.mean((predictions[:, 0::2] - ys) ** 2)


def _batch(task: icl.RegressionTask, seed: int, split: str, i: int, rows: int):
    xs, ys = task.batch(seed, split, i, rows)
    return (jnp.asarray(icl.interleave(xs, ys), jnp.float32), jnp.asarray(ys, jnp.float32))


def train(cfg: ModelConfig, task: icl.RegressionTask, train_cfg: TrainConfig, *,
          batch_size: int, data_seed: int = 0, log=None):
    """Trains ``cfg`` for ``train_cfg.steps`` steps of ``batch_size`` fresh prompts.

    Returns ``(graphdef, params, record)``: ``record`` holds the loss every ``log_every`` steps
    and the wall time."""
    check_model(cfg, task)
    graphdef, params = init_model(cfg, train_cfg.seed)
    optimizer, _ = make_optimizer(train_cfg, train_cfg.steps, cfg.d_model)
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, inputs, ys):
        loss, grads = jax.value_and_grad(
            lambda p: prompt_loss(apply(graphdef, p, inputs), ys))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    record, started = {"step": [], "loss": []}, time.perf_counter()
    for i in range(train_cfg.steps):
        params, opt_state, loss = step(params, opt_state, *_batch(task, data_seed, "train", i,
                                                                    batch_size))
        if (i + 1) % train_cfg.log_every == 0 or i + 1 == train_cfg.steps:
            record["step"].append(i + 1)
            record["loss"].append(float(loss))
            if log is not None:
                log(f"step {i + 1}: loss {float(loss):.4f}")
    record["wall_s"] = time.perf_counter() - started
    return graphdef, params, record


def evaluate(graphdef: nnx.GraphDef, params, task: icl.RegressionTask, *, rows: int = 1000,
             batch_size: int = 250) -> dict:
    """The model's normalised error ``mean (yhat - y)^2 / d`` at every ``k`` on ``rows`` test
    prompts (seed 0 of the test stream), each baseline's on the same prompts, and the closed
    forms; ``stderr``: the standard error of the model's mean at each ``k``."""
    xs, ys = task.batch(0, "test", 0, rows)
    forward = jax.jit(lambda z: apply(graphdef, params, z))
    predictions = np.concatenate([
        np.asarray(forward(jnp.asarray(icl.interleave(xs[s : s + batch_size],
                                                      ys[s : s + batch_size]), jnp.float32)))
        for s in range(0, rows, batch_size)])[:, 0::2]
    squared = (predictions.astype(np.float64) - ys) ** 2 / task.dim
    k = np.arange(task.examples)
    expected = icl.expected_errors(k, task.dim, task.noise)
    return {
        "task": "regression", "dim": task.dim, "noise": task.noise, "prompts": rows,
        "k": k.tolist(), "error": squared.mean(axis=0).tolist(),
        "stderr": (squared.std(axis=0, ddof=1) / np.sqrt(rows)).tolist(),
        "baselines": {name: v.tolist() for name, v in
                      icl.regression_baselines(xs, ys, task.noise).items()},
        "expected": {name: [None if not np.isfinite(x) else float(x) for x in v]
                     for name, v in expected.items()},
    }
