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

Also what a positional encoding does with positions (:func:`position_pictures`), from the
encoding's hooks alone: a similarity matrix where it adds to the embeddings, a kernel against
distance where it rotates q and k, a bias against distance where it adds to the scores.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab.model.masks import documents_from_segments
from attnlab.model.transformer import positions_for


def attention_maps(graphdef: nnx.GraphDef, state: nnx.State, tokens,
                   distributions_only: bool = False, *, segments=None,
                   positions=None) -> list[np.ndarray | None]:
    """Each layer's token-mixing map on ``tokens`` (int ``[batch, t]``, or a vector model's
    float inputs ``[batch, t, input_dim]``), float32 ``[batch, heads, t, t]`` (query rows, key
    columns), as the mixer's ``weights`` forms it:

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
    tokens = jnp.asarray(tokens)
    if jnp.issubdtype(tokens.dtype, jnp.integer):
        tokens = tokens.astype(jnp.int32)
    batch, t = tokens.shape[:2]
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


# --------------------------------------------------------------------------------------------
# What a positional encoding does with positions, as arrays to draw. Each picture comes from the
# encoding's own hooks (embed, transform_qk, layer_bias), so a new encoding is drawn unchanged.
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SimilarityPicture:
    """``matrix [n, n]``: cosine similarity of the vectors an encoding adds to the embeddings
    at positions ``i`` and ``j`` (sinusoidal: Vaswani et al. 2017, sec. 3.5; a learned table)."""

    title: str
    matrix: np.ndarray


@dataclasses.dataclass(frozen=True)
class DistancePicture:
    """``values [rows, n]``: what the encoding adds to (or makes of) a query's score against
    a key ``0 .. n-1`` tokens back, one row per head (or a single row shared by all heads)."""

    title: str
    values: np.ndarray
    ylabel: str


def embedding_similarity(encoding, table, length: int) -> np.ndarray:
    """``[length, length]`` cosine similarity of ``encoding.embed(0, p, table)`` between
    positions; zero rows (none added) give 0."""
    positions = jnp.arange(length, dtype=jnp.int32)[None]
    zeros = jnp.zeros((1, length, encoding.cfg.d_model), jnp.float32)
    vectors = np.asarray(encoding.embed(zeros, positions, table)[0], np.float64)
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    unit = vectors / np.maximum(norms, 1e-30)
    return unit @ unit.T


def rotary_kernel(encoding, length: int) -> np.ndarray:
    """``[length]``: ``<T(q at m), T(k at 0)> / head_dim`` for ``q = k = 1`` after the
    encoding's q/k transform ``T``. For RoPE this is ``mean_i cos(m theta_i)``, the expected
    score of a query against itself ``m`` tokens back for ``q ~ N(0, I)`` (Su et al. 2021,
    sec. 3.4.3: its decay with distance)."""
    head_dim = encoding.cfg.head_dim
    positions = jnp.arange(length, dtype=jnp.int32)[None]
    ones = jnp.ones((1, length, 1, head_dim), jnp.float32)
    q, k = encoding.transform_qk(ones, ones, positions)
    return np.asarray(jnp.einsum("qd,d->q", q[0, :, 0], k[0, 0, 0]), np.float64) / head_dim


def bias_by_distance(encoding, table, layer: int, length: int) -> np.ndarray:
    """``[heads, length]``: layer ``layer``'s score bias for a query at ``length - 1`` against
    the key ``distance`` tokens back, ``distance = 0 .. length - 1`` (ALiBi's ``-m_h d``,
    Press et al. 2022; T5's bucketed table, Raffel et al. 2020)."""
    bias = encoding.layer_bias(table, layer)
    query = jnp.full((1, 1), length - 1, jnp.int32)
    keys = jnp.arange(length, dtype=jnp.int32)[None]
    values = np.asarray(bias(query, keys)[0, :, 0], np.float64)  # [heads, keys]
    return values[:, ::-1]


def has_position_pictures(encoding) -> bool:
    """Whether :func:`position_pictures` draws anything of ``encoding`` (not NoPE): checkable
    before a model is built."""
    return encoding.adds_to_embeddings() or encoding.transforms_qk() or encoding.adds_score_bias()


def position_pictures(model, length: int) -> list[SimilarityPicture | DistancePicture]:
    """Every picture of ``model``'s positional encoding (its stack's ``encoding`` and
    ``position_embedding``) over ``length`` positions: the embedding similarity where it adds
    to the embeddings, the q/k kernel where it transforms them, the score bias per layer where
    it adds one (one picture when every layer's is the same); ``[]`` for NoPE."""
    encoding, table = model.encoding, model.position_embedding
    name = encoding.title or encoding.name
    pictures = []
    if encoding.adds_to_embeddings():
        pictures.append(SimilarityPicture(f"{name}: cosine similarity of positions",
                                          embedding_similarity(encoding, table, length)))
    if encoding.transforms_qk():
        pictures.append(DistancePicture(f"{name}: score of q = k = 1 against distance",
                                        rotary_kernel(encoding, length)[None],
                                        "<T(q, m), T(k, 0)> / head_dim"))
    if encoding.adds_score_bias():
        layers = [bias_by_distance(encoding, table, layer, length)
                  for layer in range(encoding.cfg.n_layers)]
        if all(np.array_equal(layers[0], other) for other in layers[1:]):
            layers = layers[:1]
        for layer, values in enumerate(layers):
            where = "every layer" if len(layers) == 1 else f"layer {layer}"
            pictures.append(DistancePicture(f"{name} ({where}): score bias against distance",
                                            values, "bias added to the score"))
    return pictures
