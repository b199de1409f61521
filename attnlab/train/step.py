"""The jitted training and evaluation steps: pure functions of (state, batch)."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from attnlab.config import Config
from attnlab.train.state import TrainState


def mean_loss(graphdef: nnx.GraphDef, params: nnx.State, tokens: jax.Array,
              dropout_rng: jax.Array | None = None) -> jax.Array:
    """Mean next-token cross-entropy (nats) of ``tokens [batch, seq_len + 1]``: position ``j``
    predicts token ``j + 1``."""
    from attnlab.model import apply, token_losses

    logits = apply(graphdef, params, tokens[:, :-1], dropout_rng=dropout_rng)
    return token_losses(logits, tokens[:, 1:]).mean()


def make_train_step(cfg: Config, graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation,
                    schedule: optax.Schedule) -> Callable:
    """Returns ``train_step(state, batch) -> (state, metrics)`` (not yet jitted).

    ``batch`` is int32 ``[grad_accum, micro_batch, seq_len + 1]``; gradients are averaged over
    the micro-batches (each has the same number of tokens, so this is the full-batch mean) and
    one optimizer update is applied. ``metrics``: ``loss`` (mean over the batch, before the
    update), ``grad_norm`` (global L2 norm before clipping) and ``lr`` (of this update).
    """
    use_dropout = cfg.model.dropout > 0
    dropout_root = jax.random.key(cfg.train.seed)
    grad_fn = jax.value_and_grad(lambda p, tokens, rng: mean_loss(graphdef, p, tokens, rng))

    def train_step(state: TrainState, batch: jax.Array) -> tuple[TrainState, dict]:
        # Dropout masks depend only on (seed, step, micro-batch): a resumed run draws the same.
        step_key = jax.random.fold_in(dropout_root, state.step)
        accum = batch.shape[0]

        def micro_rng(i):
            return jax.random.fold_in(step_key, i) if use_dropout else None

        if accum == 1:  # no loop for the common case: lets XLA fuse across the whole step
            loss, grads = grad_fn(state.params, batch[0], micro_rng(0))
        else:
            def accumulate(carry, inputs):
                loss_sum, grad_sum = carry
                i, tokens = inputs
                loss, grads = grad_fn(state.params, tokens, micro_rng(i))
                return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)), None

            zeros = jax.tree.map(jnp.zeros_like, state.params)
            (loss_sum, grad_sum), _ = jax.lax.scan(
                accumulate, (jnp.zeros((), jnp.float32), zeros), (jnp.arange(accum), batch))
            loss = loss_sum / accum
            grads = jax.tree.map(lambda g: g / accum, grad_sum)

        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss, "grad_norm": optax.global_norm(grads),
                   "lr": jnp.asarray(schedule(state.step), jnp.float32)}
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return train_step


def make_eval_step(graphdef: nnx.GraphDef) -> Callable:
    """Returns ``eval_step(params, batch [batch, seq_len + 1]) -> mean loss`` (no dropout)."""

    def eval_step(params: nnx.State, batch: jax.Array) -> jax.Array:
        return mean_loss(graphdef, params, batch)

    return eval_step
