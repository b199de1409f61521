"""Looking inside a trained model: every softmax head's attention pattern, and the scores that
name the heads of an induction circuit (Olsson et al. 2022, "In-context learning and induction
heads", section 2 and appendix).

On a window that repeats its first ``P`` tokens (``x_i = x_{i - P}`` for ``i >= P``,
:class:`attnlab.data.icl.InductionTask`), with ``A[i, j]`` a head's weight from query ``i`` to
key ``j``:

* previous-token score: ``mean_{i >= 1} A[i, i - 1]``: the head attends to the token before;
* induction score: ``mean_{i in repeat} A[i, i - P + 1]``: from a repeated token to the token
  *after* its earlier occurrence (the prefix-matching pattern; its value is what gets copied).

Both are 1 for a perfect head and ``~ 1 / (i + 1)`` on average for a uniform one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab.model.masks import documents_from_segments
from attnlab.model.transformer import positions_for


def attention_maps(graphdef: nnx.GraphDef, state: nnx.State, tokens,
                   distributions_only: bool = False, *, segments=None,
                   positions=None) -> list[np.ndarray | None]:
    """Each layer's token-mixing map on ``tokens`` (int32 ``[batch, t]``), float32 ``[batch,
    heads, t, t]`` (query rows, key columns), as the mixer's ``weights`` forms it:

    * softmax attention (nGPT's too): the attention weights;
    * linear attention and Performer: ``phi(q).phi(k)`` normalised over the keys
      (:func:`attnlab.model.linear_attention.linear_attention_weights`);
    * Mamba: the implicit attention of the selective scan, one signed map per channel
      (``heads`` = E; :meth:`attnlab.model.mamba.SelectiveSSM.weights`).

    ``distributions_only``: None for the layers whose maps are not distributions over the keys
    (Mamba's; ``map_is_distribution``). ``segments`` (int ``[batch, t]``) and ``positions``: a
    document-masked run's inputs (:meth:`attnlab.model.masks.Packing.inputs`): each map is 0
    outside its query's document, as the forward pass sees it. The layers run as in the
    forward pass."""
    model = nnx.merge(graphdef, state)
    tokens = jnp.asarray(tokens, jnp.int32)
    batch, t = tokens.shape
    documents = None if segments is None else documents_from_segments(jnp.asarray(segments))
    positions = jnp.asarray(positions_for(positions, batch, t), jnp.int32)
    x = model.embed(tokens, positions)
    maps = []
    for layer, (block, kind) in enumerate(zip(model.layers(), model.arch.stack.layers)):
        bias = model.bias(layer)
        if kind.mixer.map_is_distribution or not distributions_only:
            weights = block.attn.weights(block.mixer_input(x), positions, bias=bias,
                                         documents=documents)
            maps.append(np.asarray(weights, np.float32))
        else:
            maps.append(None)
        x, _ = block(x, positions, bias=bias, documents=documents)
    return maps


def drawable(weights: np.ndarray, columns: int = 8) -> np.ndarray:
    """One window's maps ``[heads, t, t]`` as at most ``columns`` pictures in ``[0, 1]``: as
    they are when they fit and are distributions; otherwise (Mamba's ``E`` signed channel maps)
    the mean ``|alpha|`` of ``columns`` equal groups of channels, each row scaled by its
    largest entry."""
    heads = weights.shape[0]
    if heads <= columns and weights.min() >= 0 and weights.max() <= 1 + 1e-5:
        return weights
    groups = np.array_split(np.abs(weights), min(columns, heads), axis=0)
    out = np.stack([g.mean(axis=0) for g in groups])
    return out / np.maximum(out.max(axis=-1, keepdims=True), 1e-30)


def previous_token_scores(weights: np.ndarray) -> np.ndarray:
    """``weights [batch, heads, t, t] -> [heads]``: ``mean_{b, i >= 1} A[b, h, i, i - 1]``."""
    t = weights.shape[-1]
    i = np.arange(1, t)
    return weights[..., i, i - 1].mean(axis=(0, 2))


def induction_scores(weights: np.ndarray, prefixes) -> np.ndarray:
    """``weights [batch, heads, t, t] -> [heads]``: ``mean A[b, h, i, i - P_b + 1]`` over every
    repeated query ``i >= P_b`` of every window ``b`` (``prefixes``: ``P_b``, an int or
    ``[batch]``; query ``i``'s previous occurrence is ``i - P_b``)."""
    batch, _, _, t = weights.shape
    prefixes = np.broadcast_to(np.asarray(prefixes), (batch,))
    rows, queries = [], []
    for b, period in enumerate(prefixes.tolist()):
        i = np.arange(period, t)
        rows.append(np.full(len(i), b))
        queries.append(i)
    rows, queries = np.concatenate(rows), np.concatenate(queries)
    if len(queries) == 0:
        raise ValueError(f"no repeated query in windows of {t} tokens with periods {prefixes}")
    keys = queries - prefixes[rows] + 1
    return weights[rows, :, queries, keys].mean(axis=0)


def head_scores(maps: list[np.ndarray | None], prefixes) -> dict[str, list]:
    """Per layer, per head: ``{"induction": [[...]], "previous_token": [[...]]}`` (None for a
    layer without attention weights), plus the best induction head ``[layer, head, score]``."""
    induction = [None if m is None else induction_scores(m, prefixes).tolist() for m in maps]
    previous = [None if m is None else previous_token_scores(m).tolist() for m in maps]
    best = max(((layer, head, s) for layer, row in enumerate(induction) if row is not None
                for head, s in enumerate(row)), key=lambda c: c[2], default=None)
    return {"induction": induction, "previous_token": previous,
            "best_induction_head": None if best is None else list(best)}

