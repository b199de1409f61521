"""Attention: the score function, scaled dot-product attention (MHA / GQA / MQA), and the self-
and cross-attention layers.

    s[b, h, i, j] = scale * <q[b, i, h], k[b, j, h // g]> + bias[b, h, i, j]   (-inf where masked)
    out[b, i, h]  = sum_j softmax_j(s[b, h, i, :]) v[b, j, h // g]

(Vaswani et al. 2017, eq. 1, with ``scale = 1/sqrt(head_dim)``). :func:`attention_scores` is that
score function, written once; :func:`dot_product_attention` adds the softmax and ``P V`` and hides
how they are computed (``impl``: the einsum reference or ``jax.nn.dot_product_attention``;
``chunk``: query blocks), which changes no number beyond float rounding.

Shapes: queries ``[batch, q_len, heads, head_dim]``, keys and values
``[batch, k_len, kv_heads, head_dim]`` with ``heads % kv_heads == 0``. Query head ``h`` reads
key/value head ``h // g``, ``g = heads // kv_heads`` (the grouping of
``jax.nn.dot_product_attention``).

The ingredients of the scores are arguments, so that variants slot in without touching the
implementations: ``scale`` (a number); ``bias``, a function of positions (the encoding's
``layer_bias``: ALiBi, T5), or None; ``mask``, a :class:`~attnlab.model.masks.Mask` of indices,
or None. QK-norm, the score scale's q/k transform and RoPE are applied by the layer before.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from attnlab.config import ModelConfig
from attnlab.model.layers import dense
from attnlab.model.masks import Causal, Documents, Mask
from attnlab.model.positions import Bias, PositionalEncoding
from attnlab.model.scales import ScoreScale

CAUSAL = Causal()


def _group(q: jax.Array, kv_heads: int) -> jax.Array:
    """``[b, t, heads, d] -> [b, t, kv_heads, heads // kv_heads, d]``."""
    b, t, heads, d = q.shape
    return q.reshape(b, t, kv_heads, heads // kv_heads, d)


def attention_scores(q: jax.Array, k: jax.Array, *, scale: float, bias: jax.Array | None = None,
                     mask: jax.Array | None = None) -> jax.Array:
    """The score function ``scale * Q K^T + bias``, ``-inf`` where ``mask`` is False.

    Args:
      q: ``[batch, q_len, heads, head_dim]``; k: ``[batch, k_len, kv_heads, head_dim]``.
      scale: multiplies ``Q K^T`` (not the bias).
      bias: float32, broadcastable to ``[batch, heads, q_len, k_len]``, or None.
      mask: bool ``[q_len, k_len]`` or ``[batch, q_len, k_len]`` (True = may attend), or None.

    Returns:
      float32 ``[batch, heads, q_len, k_len]`` (accumulated in float32 for bf16 inputs too).
    """
    batch, q_len, heads, _ = q.shape
    k_len, kv_heads = k.shape[1], k.shape[2]
    scores = jnp.einsum(
        "bqhgd,bkhd->bhgqk", _group(q, kv_heads), k, preferred_element_type=jnp.float32
    ).reshape(batch, heads, q_len, k_len)
    scores = scores * scale
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = jnp.where(_per_head(mask), scores, -jnp.inf)
    return scores


def _per_head(mask: jax.Array) -> jax.Array:
    """A mask ``[q, k]`` or ``[batch, q, k]`` as ``[1 or batch, 1, q, k]`` (shared by heads)."""
    return mask[None, None] if mask.ndim == 2 else mask[:, None]


def attention_weights(q: jax.Array, k: jax.Array, *, scale: float | None = None,
                      mask: Mask | None = CAUSAL, q_offset: int | jax.Array = 0,
                      bias: jax.Array | None = None) -> jax.Array:
    """``softmax(attention_scores)`` over keys; float32 ``[batch, heads, q_len, k_len]``.
    ``scale`` defaults to ``1/sqrt(head_dim)``; ``mask`` is applied at query offset ``q_offset``."""
    q_len, head_dim, k_len = q.shape[1], q.shape[3], k.shape[1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    mask_array = None if mask is None else mask(q_offset + jnp.arange(q_len), jnp.arange(k_len))
    return jax.nn.softmax(attention_scores(q, k, scale=scale, bias=bias, mask=mask_array), axis=-1)


# --------------------------------------------------------------------------------------------
# Implementations: the same function of (q, k, v, scale, bias, mask). ``is_causal`` says that
# ``mask`` is the plain lower triangle of a square score matrix, which kernels can apply
# without reading the mask array.
# --------------------------------------------------------------------------------------------


def einsum_attention(q, k, v, *, scale, bias, mask, is_causal):
    """The plain reference, ``softmax(attention_scores) V`` for ``q [batch, q_len, heads,
    head_dim]``."""
    batch, q_len, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    probs = jax.nn.softmax(attention_scores(q, k, scale=scale, bias=bias, mask=mask), axis=-1)
    probs = probs.reshape(batch, kv_heads, heads // kv_heads, q_len, -1).astype(v.dtype)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs, v)
    return out.reshape(batch, q_len, heads, head_dim)


def xla_attention(q, k, v, *, scale, bias, mask, is_causal):
    """``jax.nn.dot_product_attention``: GQA natively; cuDNN flash attention on GPUs for
    bf16/fp16 inputs without a bias (ALiBi stays on the XLA path so that its bias keeps
    float32 precision at long distances)."""
    if is_causal:
        mask = None  # the kernel applies the same lower triangle itself
    elif mask is not None:
        mask = _per_head(mask)  # [1 or batch, 1, q_len, k_len]
    if (is_causal and bias is None and jax.default_backend() == "gpu"
            and q.dtype in (jnp.bfloat16, jnp.float16)):
        try:
            return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True,
                                                implementation="cudnn")
        except Exception:  # unsupported shape or cuDNN version: the XLA path below is exact too
            pass
    return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale,
                                        is_causal=is_causal)


IMPLEMENTATIONS = {"einsum": einsum_attention, "xla": xla_attention}  # model.attention_impl

# Causal self-attention at least this long runs in two query halves (the einsum path; see
# dot_product_attention); measured 1.05-1.15x faster CPU train steps at seq 128-256
# (docs/benchmarks.md).
CAUSAL_HALVES_MIN_LEN = 128


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, scale: float | None = None,
                          bias: Bias | None = None, mask: Mask | None = CAUSAL,
                          q_offset: int | jax.Array = 0, q_positions: jax.Array | None = None,
                          k_positions: jax.Array | None = None, impl: str = "einsum",
                          chunk: int = 0, documents: Documents | None = None) -> jax.Array:
    """``softmax(attention_scores) V`` per head, optionally in query blocks.

    Args:
      q: ``[batch, q_len, heads, head_dim]``; k, v: ``[batch, k_len, kv_heads, head_dim]``.
      scale: score scale; default ``1/sqrt(head_dim)``.
      bias: bias function of positions, or None.
      mask: :class:`Mask` of indices (default causal), or None (every query sees every key).
      q_offset: key index of query 0 (a KV-cache step's ``start``); may be traced.
      q_positions, k_positions: int ``[pbatch, q_len]`` / ``[pbatch, k_len]``, given to ``bias``
        (default ``q_offset + arange`` and ``arange``).
      impl: a key of :data:`IMPLEMENTATIONS`.
      chunk: if > 0 and ``q_len > chunk``, queries in blocks of ``chunk`` (rematerialised in the
        backward pass): at most ``[batch, heads, chunk, k_len]`` scores exist at once, or with a
        banded mask (a sliding window) only the ``chunk + band - 1`` keys in reach.
      documents: each query's document span (:class:`~attnlab.model.masks.Documents`,
        ``[batch, q_len]``), or None: keys outside it are hidden too, whatever the mask (the
        mask then becomes ``[batch, q_len, k_len]``, so the fused causal kernels are not used).

    Returns:
      ``[batch, q_len, heads, head_dim]`` in ``q.dtype``.
    """
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"unknown attention impl {impl!r}; valid: {', '.join(IMPLEMENTATIONS)}")
    attend = IMPLEMENTATIONS[impl]
    q_len, k_len = q.shape[1], k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else scale
    q_positions = (q_offset + jnp.arange(q_len))[None] if q_positions is None else q_positions
    k_positions = jnp.arange(k_len)[None] if k_positions is None else k_positions
    chunked = 0 < chunk < q_len
    # a square causal score matrix: its upper quarter is never needed (documents keep that)
    causal_square = (mask is not None and mask.is_causal and isinstance(q_offset, int)
                     and q_offset == 0 and q_len == k_len and not chunked)
    is_causal = causal_square and documents is None  # the plain triangle, no mask array

    def block(q_block, q_positions_block, offset, documents_block):
        """Queries ``offset .. offset + len - 1`` against every key."""
        block_bias = None if bias is None else bias(q_positions_block, k_positions)
        k_index = jnp.arange(k_len)
        block_mask = None if mask is None else mask(offset + jnp.arange(q_block.shape[1]),
                                                    k_index)
        block_mask = in_documents(block_mask, documents_block, mask, k_index)
        if (attend is einsum_attention and causal_square and q_len >= CAUSAL_HALVES_MIN_LEN
                and q_len % 2 == 0):
            return _causal_halves(q_block, k, v, scale=scale, bias=block_bias, mask=block_mask)
        return attend(q_block, k, v, scale=scale, bias=block_bias, mask=block_mask,
                      is_causal=is_causal)

    if not chunked:
        return block(q, q_positions, q_offset, documents)
    if mask is not None and mask.band > 0 and chunk + mask.band - 1 < k_len:
        return _query_blocks(q, q_positions, q_offset, chunk, documents, _banded(
            attend, k, v, k_positions, scale=scale, bias=bias, mask=mask, chunk=chunk))
    return _query_blocks(q, q_positions, q_offset, chunk, documents, block)


def in_documents(mask_array: jax.Array | None, documents: Documents | None, mask: Mask | None,
                 k_index: jax.Array) -> jax.Array | None:
    """``mask_array`` (``[q, k]`` or None) AND each query's document span over the keys at
    ``k_index`` (read as sequence indices through ``mask``: a rolling cache's slots):
    ``[batch, q, k]``; unchanged without ``documents``."""
    if documents is None:
        return mask_array
    key_index = k_index if mask is None else mask.key_index(k_index)
    allowed = documents.allows(key_index)
    return allowed if mask_array is None else allowed & mask_array


def _causal_halves(q, k, v, *, scale, bias, mask):
    """Causal self-attention in two query halves: the first half's queries see only the first
    half's keys, so the quarter of the score matrix that the mask hides entirely (probability
    exactly 0) is never computed."""
    q_len = q.shape[1]
    half = q_len // 2

    def rows(x, start, stop):  # bias rows, unless broadcast along them
        return x if x is None or x.shape[-2] == 1 else x[..., start:stop, :]

    def cols(x, stop):
        return x if x is None or x.shape[-1] == 1 else x[..., :stop]

    first = einsum_attention(q[:, :half], k[:, :half], v[:, :half], scale=scale,
                             bias=cols(rows(bias, 0, half), half), mask=mask[..., :half, :half],
                             is_causal=True)
    second = einsum_attention(q[:, half:], k, v, scale=scale, bias=rows(bias, half, q_len),
                              mask=mask[..., half:, :], is_causal=True)
    return jnp.concatenate([first, second], axis=1)


def _banded(attend, k, v, k_positions, *, scale, bias, mask, chunk):
    """A query block's attention over only the keys a banded mask lets it reach:
    ``[first, first + span)`` plus the global keys not already in that range (masked there, so
    none counts twice)."""
    k_len = k.shape[1]
    band, n_global = mask.band, min(mask.global_keys, k_len)
    span = min(k_len, chunk + band - 1)

    def banded_block(q_block, q_positions_block, offset, documents_block):
        first = jnp.clip(offset - band + 1, 0, k_len - span)
        k_index = first + jnp.arange(span)
        keys = jax.lax.dynamic_slice_in_dim(k, first, span, axis=1)
        values = jax.lax.dynamic_slice_in_dim(v, first, span, axis=1)
        positions = jnp.take(k_positions, k_index, axis=1)
        q_index = offset + jnp.arange(q_block.shape[1])
        block_mask = in_documents(mask(q_index, k_index), documents_block, mask, k_index)
        if n_global:
            g_index = jnp.arange(n_global)
            keys = jnp.concatenate([k[:, :n_global], keys], axis=1)
            values = jnp.concatenate([v[:, :n_global], values], axis=1)
            positions = jnp.concatenate([k_positions[:, :n_global], positions], axis=1)
            global_mask = in_documents(mask(q_index, g_index) & (g_index < first)[None, :],
                                       documents_block, mask, g_index)
            block_mask = jnp.concatenate([global_mask, block_mask], axis=-1)
        block_bias = None if bias is None else bias(q_positions_block, positions)
        return attend(q_block, keys, values, scale=scale, bias=block_bias, mask=block_mask,
                      is_causal=False)

    return banded_block


def _query_blocks(q, q_positions, q_offset, chunk: int, documents, block) -> jax.Array:
    """``block(q_block, q_positions_block, offset, documents_block)`` over query blocks of
    ``chunk`` (the queries padded to whole blocks), mapped by ``jax.lax.map`` with a
    rematerialised body."""
    batch, q_len, heads, head_dim = q.shape
    n_blocks = -(-q_len // chunk)
    pad = n_blocks * chunk - q_len
    q_blocks = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0)))
    q_blocks = q_blocks.reshape(batch, n_blocks, chunk, heads, head_dim).swapaxes(0, 1)
    offsets = q_offset + chunk * jnp.arange(n_blocks)

    def per_query(a):  # [pbatch, q_len] -> [n_blocks, pbatch, chunk], padding repeats the last
        padded = jnp.pad(a, ((0, 0), (0, pad)), mode="edge")
        return padded.reshape(padded.shape[0], n_blocks, chunk).swapaxes(0, 1)

    document_blocks = None if documents is None else jax.tree.map(per_query, documents)
    out = jax.lax.map(
        jax.checkpoint(lambda args: block(*args)),
        (q_blocks, per_query(q_positions), offsets, document_blocks),
    )  # [n_blocks, batch, chunk, heads, head_dim]
    out = out.swapaxes(0, 1).reshape(batch, n_blocks * chunk, heads, head_dim)
    return out[:, :q_len]


# --------------------------------------------------------------------------------------------
# The layers
# --------------------------------------------------------------------------------------------


def projections(cfg: ModelConfig, rngs: nnx.Rngs) -> tuple[nnx.Module, ...]:
    """W_q ``[d_model, heads * hd]``, W_k and W_v ``[d_model, kv_heads * hd]`` (GQA), W_o
    ``[heads * hd, d_model]``, drawn in this order (the parameters' RNG order). W_o starts at
    init_std / sqrt(2 n_layers): each layer's two residual branches add to the stream (GPT-2).
    With ``model.linear_bias`` each has a zero-initialised bias ``[d_out]`` (GPT-2)."""
    d, hd, bias = cfg.d_model, cfg.head_dim, cfg.linear_bias
    residual_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
    return (dense(cfg, d, cfg.n_heads * hd, cfg.init_std, rngs, bias=bias),
            dense(cfg, d, cfg.kv_heads * hd, cfg.init_std, rngs, bias=bias),
            dense(cfg, d, cfg.kv_heads * hd, cfg.init_std, rngs, bias=bias),
            dense(cfg, cfg.n_heads * hd, d, residual_std, rngs, bias=bias))


class SelfAttention(nnx.Module):
    """Multi-head (or grouped-query) self-attention with the parts it is handed: the positional
    ``encoding`` (its q/k transform, RoPE), the ``score_scale`` (``1/sqrt(head_dim)``, muP,
    learned, cosine: :mod:`attnlab.model.scales`), the ``mask`` (causal, sliding window,
    bidirectional: :mod:`attnlab.model.masks`) and, with ``model.qk_norm``, the ``norm`` class
    applied to each head's q and k (Dehghani et al. 2023).

    ``q = x W_q``, ``k = x W_k``, ``v = x W_v`` (``+ b`` with ``model.linear_bias``); QK-norm; the
    score scale; the encoding's q/k transform; attention with the layer's score ``bias``
    (ALiBi, T5) under the mask; then ``W_o`` (a residual output projection).
    """

    def __init__(self, cfg: ModelConfig, *, encoding: PositionalEncoding, score_scale: ScoreScale,
                 mask: Mask, norm: type[nnx.Module], rngs: nnx.Rngs):
        self.cfg = cfg
        self.encoding, self.score_scale, self.mask = encoding, score_scale, mask
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = projections(cfg, rngs)
        if cfg.qk_norm:
            self.q_norm = norm(cfg.head_dim, cfg.norm_eps)
            self.k_norm = norm(cfg.head_dim, cfg.norm_eps)
        # A learned temperature (attention_scale learned / cosine), [heads]; None otherwise.
        self.temperature = score_scale.init_params(rngs)

    def queries_keys(self, x: jax.Array, positions: jax.Array):
        """``(q [batch, t, heads, hd], k [batch, t, kv_heads, hd], scale)`` as the scores read
        them: projected, QK-normed, scaled and transformed by the encoding (RoPE)."""
        cfg = self.cfg
        batch, t, _ = x.shape
        q = self.q_proj(x).reshape(batch, t, cfg.n_heads, cfg.head_dim)
        k = self.k_proj(x).reshape(batch, t, cfg.kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, scale = self.score_scale.apply(q, k, self.temperature)
        q, k = self.encoding.transform_qk(q, k, positions)
        return q, k, scale

    def weights(self, x: jax.Array, positions: jax.Array, *, bias: Bias | None = None,
                documents: Documents | None = None) -> jax.Array:
        """The attention pattern of every head over ``x [batch, t, d_model]`` (no cache):
        float32 ``[batch, heads, t, t]``, rows summing to 1 (the mixer's own mask and bias)."""
        q, k, scale = self.queries_keys(x, positions)
        t = x.shape[1]
        bias = None if bias is None else bias(positions, positions)
        index = jnp.arange(t)
        mask = in_documents(self.mask(index, index), documents, self.mask, index)
        return jax.nn.softmax(attention_scores(q, k, scale=scale, bias=bias, mask=mask), axis=-1)

    def __call__(self, x: jax.Array, positions: jax.Array, *, bias: Bias | None = None,
                 documents: Documents | None = None, state=None, start=0):
        """``x [batch, t, d_model]`` at ``positions [pbatch, t]`` -> ``([batch, t, d_model],
        state)``; ``documents``: each token's document span (keys outside it are hidden).

        ``state``: None, or this layer's KV cache ``(keys, values)``, each ``[batch, cache_len,
        kv_heads, head_dim]``: the step writes this call's keys and values at ``start``
        (``start`` may be traced) the way the mask keeps its cache (:meth:`Mask.cache_step`),
        and attends over it. ``positions`` are ``start + arange(t)``, or with documents whose
        positions restart (``data.reset_positions``) the distance to each document's start;
        the score bias reads indices either way (it depends on distances only, which are the
        same within a document, and other documents are hidden).
        """
        cfg = self.cfg
        batch, t, _ = x.shape
        q, k, scale = self.queries_keys(x, positions)
        v = self.v_proj(x).reshape(batch, t, cfg.kv_heads, cfg.head_dim)
        mask, q_offset, q_positions, k_positions = self.mask, 0, positions, positions
        if state is not None:
            k, v, state, mask, q_offset, k_positions = self.mask.cache_step(state, k, v, start)
            q_positions = (q_offset + jnp.arange(t, dtype=jnp.int32))[None]
        out = dot_product_attention(q, k, v, scale=scale, bias=bias, mask=mask, q_offset=q_offset,
                                    q_positions=q_positions, k_positions=k_positions,
                                    impl=cfg.attention_impl, chunk=cfg.attention_chunk,
                                    documents=documents)
        return self.o_proj(out.reshape(batch, t, cfg.n_heads * cfg.head_dim)), state


class CrossAttention(nnx.Module):
    """Encoder-decoder attention (Vaswani et al. 2017, section 3.2.3; T5): the decoder's queries
    attend to every position of the encoder's output, unmasked, without positional bias (T5
    adds its bias to self-attention only)::

        q = x W_q [batch, t, heads, hd];  k = m W_k, v = m W_v [batch, s, kv_heads, hd]
        out = softmax(scale q k^T) v W_o

    ``scale`` is the model's fixed score scale (``model.attention_scale``: ``1/sqrt(hd)``,
    ``1/hd`` or 1, as in self-attention; T5 itself uses 1, ``none``); the scales with a
    per-layer temperature are refused for the encoder-decoder by its objective's rules. The
    keys and values of the encoder output ``m`` are computed once per sequence
    (:meth:`keys_values`) and reused by every decoding step (the cached encoder output).
    """

    def __init__(self, cfg: ModelConfig, *, score_scale: ScoreScale, rngs: nnx.Rngs):
        self.cfg = cfg
        self.score_scale = score_scale
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = projections(cfg, rngs)

    def keys_values(self, memory: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``memory [batch, s, d_model]`` -> ``(k, v)``, each ``[batch, s, kv_heads, hd]``."""
        cfg = self.cfg
        batch, s, _ = memory.shape
        k = self.k_proj(memory).reshape(batch, s, cfg.kv_heads, cfg.head_dim)
        v = self.v_proj(memory).reshape(batch, s, cfg.kv_heads, cfg.head_dim)
        return k, v

    def __call__(self, x: jax.Array, memory_kv: tuple[jax.Array, jax.Array]) -> jax.Array:
        """``x [batch, t, d_model]`` attends to ``memory_kv`` (:meth:`keys_values`) ->
        ``[batch, t, d_model]``."""
        cfg = self.cfg
        batch, t, _ = x.shape
        q = self.q_proj(x).reshape(batch, t, cfg.n_heads, cfg.head_dim)
        k, v = memory_kv
        out = dot_product_attention(q, k, v, scale=self.score_scale.scale(), mask=None,
                                    impl=cfg.attention_impl, chunk=cfg.attention_chunk)
        return self.o_proj(out.reshape(batch, t, cfg.n_heads * cfg.head_dim))
