"""Causal linear attention: the elu+1 feature map and Performer's FAVOR+ random features.

Katharopoulos et al. 2020 (arXiv 2006.16236, eqs. 4-6 and 16-20): replace ``exp(q.k)`` by
``phi(q).phi(k)`` for a positive feature map ``phi: R^d -> R^m``; the causal output of query ``i``

    out_i = phi(q_i)^T S_i / phi(q_i)^T z_i,   S_i = sum_{j<=i} phi(k_j) v_j^T  [m, d],
                                               z_i = sum_{j<=i} phi(k_j)        [m]

is an RNN over the state ``(S, z)``: O(1) work per decoded token.

Feature maps (``[..., d] -> [..., m]``):

* elu+1 (Katharopoulos eq. 7): ``phi(x) = elu(x) + 1``, ``m = d``.
* FAVOR+ (Choromanski et al. 2021, arXiv 2009.14794, Lemma 1 and sec. 2.4): positive random
  features ``phi(x) = exp(W x - |x|^2 / 2) / sqrt(m)`` with ``x = q / d^(1/4)`` (and the same for
  k), so that ``E[phi(q).phi(k)] = exp(q.k / sqrt(d))``, the softmax kernel; the rows of
  ``W [m, d]`` are orthogonal in blocks of ``d`` with chi(d)-distributed norms (the law of a
  Gaussian row's norm). Redraw policy: none. ``W`` is drawn once, by NumPy, from the seed
  ``(FEATURE_SEED, layer)``, so a layer's features are a fixed function of the config: the same
  at every step, in every checkpoint and at decoding. They are a constant, not a parameter
  (nothing to train, nothing stored).

Training uses a chunked prefix sum (Katharopoulos sec. 3.3.1 in blocks): split the T tokens into
chunks of C; inside a chunk the masked quadratic form, across chunks the state carried by
``jax.lax.scan``. Memory O(T/C * m * d) for the carried states plus O(C^2) per chunk, never
O(T^2).
"""

from __future__ import annotations

import functools
import math
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab.config import ModelConfig
from attnlab.model.layers import dense

FEATURE_SEED = 20210301  # Performer's W: np.random.default_rng((FEATURE_SEED, layer))
EPS = 1e-6  # added to the normaliser phi(q)^T z


def elu_plus_one(x: jax.Array) -> jax.Array:
    """``phi(x) = elu(x) + 1 > 0`` (Katharopoulos et al. 2020, eq. 7); ``[..., d] -> [..., d]``."""
    return jax.nn.elu(x) + 1.0


@functools.lru_cache(maxsize=None)
def orthogonal_features(m: int, d: int, seed: tuple[int, ...]) -> np.ndarray:
    """``W [m, d]`` float32: blocks of ``d`` orthogonal directions (QR of a Gaussian matrix),
    each row rescaled to the norm of an independent Gaussian vector (chi(d)), as in Performer's
    ORF (Choromanski et al. 2021, sec. 4). Deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(-(-m // d)):
        q, _ = np.linalg.qr(rng.standard_normal((d, d)))
        blocks.append(q.T)
    directions = np.concatenate(blocks)[:m]
    norms = np.linalg.norm(rng.standard_normal((m, d)), axis=1)
    return (directions * norms[:, None]).astype(np.float32)


def favor_features(x: jax.Array, w: jax.Array) -> jax.Array:
    """FAVOR+ positive features (Choromanski et al. 2021, Lemma 1):
    ``phi(x) = exp(W x - |x|^2 / 2) / sqrt(m)``, ``x [..., d]`` already scaled by ``d^-1/4``,
    ``w [m, d]`` -> ``[..., m]`` (float32)."""
    x = x.astype(jnp.float32)
    projected = jnp.einsum("...d,md->...m", x, w)
    return jnp.exp(projected - 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)) / math.sqrt(
        w.shape[0])


def causal_linear_attention(phi_q, phi_k, v, state=None, *, chunk: int, documents=None,
                            start=0):
    """The causal linear-attention output by chunks, from an optional carried state.

    Args:
      phi_q, phi_k: features ``[batch, t, heads, m]`` (positive).
      v: ``[batch, t, heads, d]``.
      state: ``(S [batch, heads, m, d], z [batch, heads, m])`` of the tokens before this call,
        or None (zeros).
      chunk: tokens per chunk ``C`` (the last chunk is zero-padded; padded keys add nothing).
      documents: each token's document span (:class:`~attnlab.model.masks.Documents`,
        ``[batch, t]``), or None. With spans the sums run over ``start_i <= j <= i`` only:
        ``S`` and ``z`` restart at each document's first token.
      start: the sequence index of the first token (a decode step's), for ``documents``.

    Returns:
      ``(out [batch, t, heads, d] float32, (S, z) after the last token)``.
    """
    batch, t, heads, m = phi_q.shape
    d = v.shape[-1]
    if state is None:
        state = (jnp.zeros((batch, heads, m, d), jnp.float32),
                 jnp.zeros((batch, heads, m), jnp.float32))
    chunk = max(1, min(chunk, t))
    n_chunks = -(-t // chunk)
    pad = n_chunks * chunk - t

    def blocks(a):  # [batch, t, heads, e] -> [n_chunks, batch, chunk, heads, e]
        a = jnp.pad(a.astype(jnp.float32), ((0, 0), (0, pad), (0, 0), (0, 0)))
        return a.reshape(batch, n_chunks, chunk, heads, a.shape[-1]).swapaxes(0, 1)

    mask = jnp.tril(jnp.ones((chunk, chunk), jnp.float32))  # [C_query, C_key]

    def step(carry, inputs):
        s, z = carry  # [b, h, m, d], [b, h, m]
        q_c, k_c, v_c = inputs  # [b, C, h, m], [b, C, h, m], [b, C, h, d]
        scores = jnp.einsum("bqhm,bkhm->bhqk", q_c, k_c) * mask  # intra-chunk, causal
        numerator = (jnp.einsum("bqhm,bhmd->bqhd", q_c, s)
                     + jnp.einsum("bhqk,bkhd->bqhd", scores, v_c))
        denominator = jnp.einsum("bqhm,bhm->bqh", q_c, z) + jnp.einsum("bhqk->bqh", scores)
        s = s + jnp.einsum("bkhm,bkhd->bhmd", k_c, v_c)
        z = z + jnp.einsum("bkhm->bhm", k_c)
        return (s, z), numerator / (denominator[..., None] + EPS)

    def step_in_documents(carry, inputs):
        s, z = carry  # [b, h, m, d], [b, h, m]
        q_c, k_c, v_c, start_c, index_c = inputs  # [b, C, h, m] x2, [b, C, h, d], [b, C], [C]
        # key j of the chunk counts for query i iff j <= i and j lies in i's document
        in_document = index_c[None, None, :] >= start_c[:, :, None]  # [b, C_query, C_key]
        scores = jnp.einsum("bqhm,bkhm->bhqk", q_c, k_c) * (mask * in_document)[:, None]
        carried = (start_c < index_c[0]).astype(jnp.float32)  # [b, C]: doc began before
        numerator = (jnp.einsum("bqhm,bhmd,bq->bqhd", q_c, s, carried)
                     + jnp.einsum("bhqk,bkhd->bqhd", scores, v_c))
        denominator = (jnp.einsum("bqhm,bhm,bq->bqh", q_c, z, carried)
                       + jnp.einsum("bhqk->bqh", scores))
        # the state after the chunk: its last token's document only
        last = start_c[:, -1]  # [b]
        keep = (last < index_c[0]).astype(jnp.float32)  # [b]
        written = (index_c[None, :] >= last[:, None]).astype(jnp.float32)  # [b, C_key]
        s = keep[:, None, None, None] * s + jnp.einsum("bkhm,bkhd,bk->bhmd", k_c, v_c, written)
        z = keep[:, None, None] * z + jnp.einsum("bkhm,bk->bhm", k_c, written)
        return (s, z), numerator / (denominator[..., None] + EPS)

    chunks = (blocks(phi_q), blocks(phi_k), blocks(v))
    if documents is None:
        state, out = jax.lax.scan(step, state, chunks)
    else:  # padded queries repeat the last token's start: the state keeps its document
        starts = jnp.pad(documents.start, ((0, 0), (0, pad)), mode="edge")
        starts = starts.reshape(batch, n_chunks, chunk).swapaxes(0, 1)  # [n_chunks, b, C]
        index = jnp.asarray(start, jnp.int32) + jnp.arange(n_chunks * chunk, dtype=jnp.int32)
        state, out = jax.lax.scan(step_in_documents, state,
                                  (*chunks, starts, index.reshape(n_chunks, chunk)))
    out = out.swapaxes(0, 1).reshape(batch, n_chunks * chunk, heads, d)[:, :t]
    return out, state


def linear_attention_weights(phi_q, phi_k, documents=None) -> jax.Array:
    """The token-mixing matrix of causal linear attention (Katharopoulos et al. 2020, eq. 6):
    ``A[i, j] = phi(q_i).phi(k_j) / (sum_{j' <= i} phi(q_i).phi(k_j') + EPS)`` for ``j <= i``,
    0 after, so that ``out_i = sum_j A[i, j] v_j`` (:func:`causal_linear_attention`'s output);
    rows are non-negative and sum to 1 (to ``EPS``).

    Args:
      phi_q, phi_k: features ``[batch, t, heads, m]`` (positive).
      documents: each token's document span (:class:`~attnlab.model.masks.Documents`), or
        None; with it the sums run over ``j`` in query ``i``'s document only (the running
        state restarts there).

    Returns:
      float32 ``[batch, heads, t, t]``.
    """
    t = phi_q.shape[1]
    scores = jnp.einsum("bqhm,bkhm->bhqk", phi_q.astype(jnp.float32), phi_k.astype(jnp.float32))
    keep = jnp.tril(jnp.ones((t, t), bool))[None, None]
    if documents is not None:
        keep = keep & documents.allows(jnp.arange(t))[:, None]
    scores = jnp.where(keep, scores, 0.0)
    return scores / (scores.sum(axis=-1, keepdims=True) + EPS)


class LinearAttention(nnx.Module):
    """Causal linear attention with ``phi`` = elu+1 (``features=None``) or FAVOR+ (``features=m``).

    ``q = x W_q``, ``k = x W_k``, ``v = x W_v`` (as softmax attention's ``SelfAttention``: same
    parameter names and init), the encoding's q/k transform (RoPE rotates q, k before ``phi``), then
    :func:`causal_linear_attention` and ``W_o``. One key/value head per query head.

    A sequence mixer: ``(x [batch, t, d_model], positions, *, bias, state=(S, z), start) -> (y,
    state)``; the decode state is ``S [batch, heads, m, head_dim]`` and ``z [batch, heads, m]``
    (``start`` is implied by the state, which holds every earlier token). It forms no scores, so
    ``bias`` must be None (the rules refuse encodings that add one).
    """

    def __init__(self, cfg: ModelConfig, encoding, *, layer: int, features: int | None,
                 rngs: nnx.Rngs):
        self.cfg = cfg
        self.encoding = encoding
        self.features = features
        self.layer = layer
        d, hd = cfg.d_model, cfg.head_dim
        residual_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
        self.q_proj = dense(cfg, d, cfg.n_heads * hd, cfg.init_std, rngs)
        self.k_proj = dense(cfg, d, cfg.n_heads * hd, cfg.init_std, rngs)
        self.v_proj = dense(cfg, d, cfg.n_heads * hd, cfg.init_std, rngs)
        self.o_proj = dense(cfg, cfg.n_heads * hd, d, residual_std, rngs)

    def feature_map(self, x: jax.Array) -> jax.Array:
        """``[batch, t, heads, head_dim] -> float32 [batch, t, heads, m]``."""
        if self.features is None:
            return elu_plus_one(x.astype(jnp.float32))
        w = orthogonal_features(self.features, self.cfg.head_dim, (FEATURE_SEED, self.layer))
        return favor_features(x.astype(jnp.float32) * self.cfg.head_dim**-0.25, jnp.asarray(w))

    def _features(self, x, positions):
        """``(phi(q), phi(k), v)`` of ``x [batch, t, d_model]``, each ``[batch, t, heads, .]``."""
        cfg = self.cfg
        batch, t, _ = x.shape
        q = self.q_proj(x).reshape(batch, t, cfg.n_heads, cfg.head_dim)
        k = self.k_proj(x).reshape(batch, t, cfg.n_heads, cfg.head_dim)
        v = self.v_proj(x).reshape(batch, t, cfg.n_heads, cfg.head_dim)
        q, k = self.encoding.transform_qk(q, k, positions)
        return self.feature_map(q), self.feature_map(k), v

    def weights(self, x, positions, *, bias=None, documents=None) -> jax.Array:
        """Every head's normalised ``phi(q).phi(k)`` map over ``x [batch, t, d_model]``
        (:func:`linear_attention_weights`): float32 ``[batch, heads, t, t]``."""
        phi_q, phi_k, _ = self._features(x, positions)
        return linear_attention_weights(phi_q, phi_k, documents)

    def __call__(self, x, positions, *, bias=None, documents=None, state=None, start=0):
        """``x [batch, t, d_model]`` -> ``([batch, t, d_model], state)`` (None without one);
        ``documents``: each token's document span (the state restarts at each document)."""
        cfg = self.cfg
        batch, t, _ = x.shape
        phi_q, phi_k, v = self._features(x, positions)
        out, new_state = causal_linear_attention(phi_q, phi_k, v, state, chunk=cfg.mixer_chunk,
                                                 documents=documents, start=start)
        out = out.astype(x.dtype).reshape(batch, t, cfg.n_heads * cfg.head_dim)
        return self.o_proj(out), (None if state is None else new_state)
