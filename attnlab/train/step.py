"""The jitted training and evaluation steps: pure functions of (state, batch).

The objective (``model.objective``: next-token, masked LM, span corruption) says what the model
reads and is scored on (:mod:`attnlab.model.objectives`); masked objectives corrupt each batch on
the device with a key from ``(data.seed, batch index, micro-batch)``, so a resumed run corrupts
batch ``i`` exactly as before.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from attnlab.config import Config
from attnlab.data.sources import separator_id, target_weights
from attnlab.model.masks import Packing, documents_from_segments, left_pad, prompt_segments
from attnlab.model.objectives import Scores, token_losses
from attnlab.model.moe import record_routing
from attnlab.model.objectives import masking_key
from attnlab.train.state import TrainState

EVAL_SEED = 2**31 - 1  # validation masks: fixed, apart from every training seed's


@dataclasses.dataclass(frozen=True)
class Targets:
    """What the train and eval steps need of the data source, asked once (:meth:`of`): how
    packed documents are kept apart (None: windows are not packed documents) and each target's
    weight ``[seq_len]`` (None: every target counts;
    :func:`attnlab.data.sources.target_weights`)."""

    packing: Packing | None = None
    weights: np.ndarray | None = None

    @classmethod
    def of(cls, d) -> Targets:
        """The data section ``d``'s."""
        return cls(_packing(d), target_weights(d))


def _packing(d) -> Packing | None:
    return Packing(separator_id(d), d.reset_positions) if d.document_mask else None


def packing_for(cfg: Config) -> Packing | None:
    """How ``cfg``'s packed windows keep documents apart (``data.document_mask``), or None."""
    return _packing(cfg.data)


def batch_scores(graphdef: nnx.GraphDef, params: nnx.State, tokens: jax.Array,
                 key: jax.Array | None = None, dropout_rng: jax.Array | None = None, *,
                 packing: Packing | None = None, weights=None):
    """The objective's :class:`~attnlab.model.objectives.Scores` (sums of loss, hits and
    scored positions) of windows ``tokens [batch, seq_len + 1]``, corrupted with ``key``
    (default: the key of batch 0); ``packing``: documents kept apart (:func:`packing_for`);
    ``weights [seq_len]``: each target's weight (:func:`attnlab.data.sources.target_weights`), None
    for all."""
    model = nnx.merge(graphdef, params)
    key = masking_key(0, 0) if key is None else key
    return model.arch.objective.scores(model, tokens, key, dropout_rng=dropout_rng,
                                       packing=packing, weights=weights)


def mean_loss(graphdef: nnx.GraphDef, params: nnx.State, tokens: jax.Array,
              dropout_rng: jax.Array | None = None, key: jax.Array | None = None, *,
              packing: Packing | None = None, weights=None) -> jax.Array:
    """Mean cross-entropy (nats) over the predicted positions of ``tokens [batch, seq_len +
    1]``: for the decoder, position ``j`` predicts token ``j + 1`` (weighted by ``weights
    [seq_len]``, as :func:`batch_scores`); for the masked objectives, the selected tokens / the
    spans (corrupted with ``key``)."""
    scores = batch_scores(graphdef, params, tokens, key, dropout_rng, packing=packing,
                          weights=weights)
    return scores.loss / jnp.maximum(scores.count, 1.0)


def example_scores(graphdef: nnx.GraphDef, params: nnx.State, examples, *,
                   packing: Packing | None = None) -> Scores:
    """Next-token scores of examples of different lengths (1-D int sequences of >= 2 tokens),
    in one left-padded batch (:func:`~attnlab.model.masks.left_pad`): the pads form a document
    of their own, which no real token sees and whose positions are never scored; each example's
    positions start at its first token. Returns :class:`Scores` of arrays ``[n_examples]`` (the
    sums over each example alone: ``loss / count`` is its mean loss). A causal objective only.
    """
    model = nnx.merge(graphdef, params)
    if not model.arch.objective.causal:
        raise ValueError(f"model.objective={model.cfg.objective}: padded evaluation scores "
                         "next-token predictions (clm) only")
    if min(len(np.asarray(e).reshape(-1)) for e in examples) < 2:
        raise ValueError("every example needs at least 2 tokens (an input and its target)")
    tokens, pads = left_pad(examples)
    per_target = padded_target_scores(graphdef, params, jnp.asarray(tokens), jnp.asarray(pads),
                                      packing=packing)
    return Scores(*(x.sum(1) for x in per_target))


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("packing",))
def padded_target_scores(graphdef: nnx.GraphDef, params: nnx.State, tokens: jax.Array,
                         pads: jax.Array, *, packing: Packing | None) -> Scores:
    """The scores of each target of the left-padded batch ``tokens [n, length]`` with ``pads
    [n]`` (:func:`example_scores`), arrays ``[n, length - 1]`` (``count``: 1 where the input is
    a real token): one program per batch shape, not one per operation."""
    model = nnx.merge(graphdef, params)
    segments = prompt_segments(tokens, pads, None if packing is None else packing.separator)
    index = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None, :]
    if packing is not None and packing.reset_positions:
        positions = index - documents_from_segments(segments).start
    else:
        positions = jnp.maximum(index - pads[:, None], 0)
    logits = model(tokens[:, :-1], positions[:, :-1], segments=segments[:, :-1])
    weights = (index[:, :-1] >= pads[:, None]).astype(jnp.float32)  # a real input
    targets = tokens[:, 1:]
    hits = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    return Scores(token_losses(logits, targets) * weights, hits * weights, weights)


def training_loss(graphdef: nnx.GraphDef, params: nnx.State, tokens: jax.Array,
                  dropout_rng: jax.Array | None = None, key: jax.Array | None = None, *,
                  packing: Packing | None = None, weights=None):
    """``(objective, metrics)``: :func:`mean_loss` plus the FFN's auxiliary loss (an MoE's
    load-balancing and router z-losses, from the statistics its layers recorded during this
    forward pass); ``metrics`` holds ``loss`` (the cross-entropy alone, comparable with a dense
    model's) and the FFN's own (:meth:`~attnlab.model.ffn.FFN.losses`). ``weights``: as
    :func:`batch_scores`."""
    model = nnx.merge(graphdef, params)
    record_routing(model)
    key = masking_key(0, 0) if key is None else key
    scores = model.arch.objective.scores(model, tokens, key, dropout_rng=dropout_rng,
                                         packing=packing, weights=weights)
    loss = scores.loss / jnp.maximum(scores.count, 1.0)
    aux, metrics = model.arch.ffn.losses(nnx.pop(model, nnx.Intermediate))
    return loss + aux, {"loss": loss, **metrics}


def accumulated_grads(grad_fn: Callable, params, batch: jax.Array, step, *, seed, data_seed,
                      use_dropout: bool):
    """``(metrics, grads)`` of one update: ``grad_fn(params, tokens, dropout_rng, masking_key)``
    (:func:`loss_grad_fn`) averaged over the micro-batches of ``batch [grad_accum, micro_batch,
    seq_len + 1]`` (each holds the same number of tokens, so this is the full-batch mean).
    Dropout masks and the masked objectives' corruption depend only on (seed, step,
    micro-batch), so a resumed run draws the same; ``seed`` and ``data_seed`` may be traced
    (an ensemble's members)."""
    step_key = jax.random.fold_in(jax.random.key(seed), step)

    def micro_rng(i):
        return jax.random.fold_in(step_key, i) if use_dropout else None

    def micro_key(i):  # batch index = updates done so far
        return masking_key(data_seed, step, i)

    accum = batch.shape[0]
    if accum == 1:  # no loop for the common case: lets XLA fuse across the whole step
        return grad_fn(params, batch[0], micro_rng(0), micro_key(0))

    def accumulate(sums, inputs):
        i, tokens = inputs
        out = grad_fn(params, tokens, micro_rng(i), micro_key(i))
        return jax.tree.map(jnp.add, sums, out), None

    zeros = jax.tree.map(jnp.zeros_like,
                         jax.eval_shape(grad_fn, params, batch[0], micro_rng(0), micro_key(0)))
    sums, _ = jax.lax.scan(accumulate, zeros, (jnp.arange(accum), batch))
    return jax.tree.map(lambda total: total / accum, sums)


def loss_grad_fn(graphdef: nnx.GraphDef, packing: Packing | None = None,
                 weights=None) -> Callable:
    """``(params, tokens, dropout_rng, masking_key) -> (metrics, grads)``: the gradient of
    :func:`training_loss` (targets weighted by ``weights [seq_len]``, None for all);
    ``metrics["loss"]`` is the mean cross-entropy over the weighted targets."""
    grad = jax.value_and_grad(
        lambda p, tokens, rng, key: training_loss(graphdef, p, tokens, rng, key,
                                                  packing=packing, weights=weights),
        has_aux=True)

    def loss_and_grads(params, tokens, rng, key):
        (_, metrics), grads = grad(params, tokens, rng, key)
        return metrics, grads

    return loss_and_grads


def make_train_step(cfg: Config, graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation,
                    schedule: optax.Schedule, targets: Targets | None = None) -> Callable:
    """Returns ``train_step(state, batch) -> (state, metrics)`` (not yet jitted).

    ``batch`` is int32 ``[grad_accum, micro_batch, seq_len + 1]``; gradients are averaged over
    the micro-batches and one optimizer update is applied. ``metrics``: ``loss`` (mean
    cross-entropy over the batch, before the update), ``grad_norm`` (global L2 norm before
    clipping), ``lr`` (of this update), and an MoE's ``moe_*`` (mean over the micro-batches;
    :meth:`attnlab.model.moe.TokenChoice.losses`). ``targets``: ``Targets.of(cfg.data)`` where
    the caller has it already.
    """
    targets = Targets.of(cfg.data) if targets is None else targets
    grad_fn = loss_grad_fn(graphdef, targets.packing, targets.weights)

    def train_step(state: TrainState, batch: jax.Array) -> tuple[TrainState, dict]:
        metrics, grads = accumulated_grads(grad_fn, state.params, batch, state.step,
                                           seed=cfg.train.seed, data_seed=cfg.data.seed,
                                           use_dropout=cfg.model.dropout > 0)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {**metrics, "grad_norm": optax.global_norm(grads),
                   "lr": jnp.asarray(schedule(state.step), jnp.float32)}
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return train_step


def make_eval_step(graphdef: nnx.GraphDef, *, masked_spans: bool = False,
                   packing: Packing | None = None, weights=None) -> Callable:
    """Returns ``eval_step(params, batch [batch, seq_len + 1], index) -> {"loss", "accuracy"}``
    over the predicted positions (no dropout); validation batch ``index`` is corrupted with the
    same key at every evaluation. ``masked_spans`` (``train.eval_masked_spans``) adds
    ``span_nats`` and ``span_count``, the sums of the objectives' common measure
    (:meth:`~attnlab.model.objectives.Objective.span_scores`). ``weights [seq_len]``: the
    targets scored, as in training (:func:`attnlab.data.sources.target_weights`)."""

    def eval_step(params: nnx.State, batch: jax.Array, index=0) -> dict:
        key = masking_key(EVAL_SEED, index)
        scores = batch_scores(graphdef, params, batch, key, packing=packing, weights=weights)
        count = jnp.maximum(scores.count, 1.0)
        out = {"loss": scores.loss / count, "accuracy": scores.correct / count}
        if masked_spans:
            model = nnx.merge(graphdef, params)
            spans = model.arch.objective.span_scores(model, batch, key, packing=packing)
            out.update(span_nats=spans.loss, span_count=spans.count)
        return out

    return eval_step
