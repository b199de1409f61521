"""Attention: the score function, scaled dot-product attention (MHA / GQA / MQA), and the causal
self-attention layer.

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
implementations:

* ``scale``: a number (``1/sqrt(head_dim)`` by default).
* ``bias``: a function ``(q_positions [pbatch, q_len], k_positions [pbatch, k_len]) -> float32
  [pbatch, heads, q_len, k_len] | None``; the layer passes its positional encoding's
  :meth:`~attnlab.model.positions.PositionalEncoding.bias` (ALiBi).
* ``mask``: a function ``(q_index [q_len], k_index [k_len]) -> bool [q_len, k_len]`` (True = may
  attend), or None for no mask. Masks are by index, not position: query ``i`` of a call sits at
  key index ``q_offset + i`` (0 for a forward pass, ``start`` for a KV-cache step).
* q/k normalisation and q/k transforms (QK-norm, RoPE) are applied by the layer before the
  scores.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from attnlab.model.layers import dense, make_norm
from attnlab.model.positions import encoding_for
from attnlab.model.scales import score_scale_for

if TYPE_CHECKING:  # annotations only: model/config.py imports the mixer registry, which imports us
    from attnlab.model.config import ModelConfig

# (q_index [q_len], k_index [k_len]) -> bool [q_len, k_len], True = may attend.
Mask = Callable[[jax.Array, jax.Array], jax.Array]
# (q_positions [pbatch, q_len], k_positions [pbatch, k_len]) -> float32 [pbatch, heads, q_len, k_len]
# or None (no bias).
Bias = Callable[[jax.Array, jax.Array], "jax.Array | None"]


def causal(q_index: jax.Array, k_index: jax.Array) -> jax.Array:
    """The causal mask: query ``i`` sees key ``j`` iff ``j <= i``; bool ``[q_len, k_len]``."""
    return k_index[None, :] <= q_index[:, None]


def causal_mask(q_len: int, k_len: int, q_offset: int | jax.Array = 0) -> jax.Array:
    """``mask[i, j] = j <= q_offset + i``; bool ``[q_len, k_len]`` (True = may attend)."""
    return causal(q_offset + jnp.arange(q_len), jnp.arange(k_len))


def sliding_window(window: int, n_global: int = 0) -> Mask:
    """Local causal attention (Beltagy et al. 2020; Mistral, Jiang et al. 2023): query ``i`` sees
    keys ``i - window + 1 .. i``, plus the first ``n_global`` keys (global tokens). A mask
    function ``(q_index [q_len], k_index [k_len]) -> bool [q_len, k_len]``; after ``L`` layers
    the output at ``i`` depends on no token before ``i - L (window - 1)`` (global tokens
    aside)."""

    def mask(q_index: jax.Array, k_index: jax.Array) -> jax.Array:
        distance = q_index[:, None] - k_index[None, :]
        return (distance >= 0) & ((distance < window) | (k_index[None, :] < n_global))

    return mask


NOT_WRITTEN = 2**30  # position of an empty rolling-cache slot: after every query, so masked


def rolling_slot_positions(start: jax.Array | int, window: int, n_global: int) -> jax.Array:
    """Positions held by a rolling KV cache before a step at ``start``; int32 ``[n_global +
    window]``. Slots ``0 .. n_global-1`` hold positions ``0 .. n_global-1``; slot ``n_global + r``
    the latest position ``p < start`` with ``p % window == r``. Slots not written yet, and rolling
    slots whose position is a global one (counted once, in its global slot), read
    :data:`NOT_WRITTEN`."""
    start = jnp.asarray(start, jnp.int32)
    global_positions = jnp.arange(n_global, dtype=jnp.int32)
    r = jnp.arange(window, dtype=jnp.int32)
    rolling = start - 1 - jnp.mod(start - 1 - r, window)
    positions = jnp.concatenate([
        jnp.where(global_positions < start, global_positions, NOT_WRITTEN),
        jnp.where(rolling >= n_global, rolling, NOT_WRITTEN),  # also < 0: not written
    ])
    return positions


def write_kv_cache(kv, k: jax.Array, v: jax.Array, start):
    """One KV-cache step: writes this step's keys and values at cache index ``start``.

    kv: ``(keys, values)``, each ``[batch, cache_len, kv_heads, head_dim]``; k, v: this step's
    ``[batch, t, kv_heads, head_dim]``. Returns (keys, values, new kv, q_offset = start,
    k_positions ``[1, cache_len]``): the queries attend to the whole cache, and the causal mask
    hides the slots after ``start + t`` that still hold zeros.
    """
    keys, values = kv
    keys = jax.lax.dynamic_update_slice_in_dim(keys, k.astype(keys.dtype), start, axis=1)
    values = jax.lax.dynamic_update_slice_in_dim(values, v.astype(values.dtype), start, axis=1)
    return keys, values, (keys, values), start, jnp.arange(keys.shape[1])[None]


def _group(q: jax.Array, kv_heads: int) -> jax.Array:
    """``[b, t, heads, d] -> [b, t, kv_heads, heads // kv_heads, d]``."""
    b, t, heads, d = q.shape
    return q.reshape(b, t, kv_heads, heads // kv_heads, d)


def attention_scores(
    q: jax.Array,
    k: jax.Array,
    *,
    scale: float,
    bias: jax.Array | None = None,
    mask: jax.Array | None = None,
) -> jax.Array:
    """The score function ``scale * Q K^T + bias``, ``-inf`` where ``mask`` is False.

    Args:
      q: ``[batch, q_len, heads, head_dim]``.
      k: ``[batch, k_len, kv_heads, head_dim]``.
      scale: multiplies ``Q K^T`` (not the bias).
      bias: float32, broadcastable to ``[batch, heads, q_len, k_len]``, or None.
      mask: bool ``[q_len, k_len]`` (True = may attend), or None.

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
        scores = jnp.where(mask, scores, -jnp.inf)
    return scores


def attention_weights(
    q: jax.Array,
    k: jax.Array,
    *,
    scale: float | None = None,
    mask: Mask | None = causal,
    q_offset: int | jax.Array = 0,
    bias: jax.Array | None = None,
) -> jax.Array:
    """``softmax(attention_scores)`` over keys; float32 ``[batch, heads, q_len, k_len]``.

    ``scale`` defaults to ``1/sqrt(head_dim)``; ``mask`` is a mask function (see the module
    docstring) applied at query offset ``q_offset``; ``bias`` as in :func:`attention_scores`.
    """
    q_len, head_dim, k_len = q.shape[1], q.shape[3], k.shape[1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    mask_array = None if mask is None else mask(q_offset + jnp.arange(q_len), jnp.arange(k_len))
    scores = attention_scores(q, k, scale=scale, bias=bias, mask=mask_array)
    return jax.nn.softmax(scores, axis=-1)


# --------------------------------------------------------------------------------------------
# Implementations: the same function of (q, k, v, scale, bias, mask). ``is_causal`` says that
# ``mask`` is the plain lower triangle of a square score matrix, which kernels can apply
# without reading the mask array.
# --------------------------------------------------------------------------------------------


# Causal self-attention at least this long runs in two query halves (see _einsum_attention);
# measured 1.05-1.15x faster CPU train steps at seq 128-256 (docs/benchmarks.md).
CAUSAL_HALVES_MIN_LEN = 128


def _einsum_attention(q, k, v, *, scale, bias, mask, is_causal):
    """The plain reference: :func:`attention_scores`, softmax, then ``P V``.

    Causal self-attention (``is_causal``, at least ``CAUSAL_HALVES_MIN_LEN`` queries, an even
    number) runs in two query halves: the first half's queries see only the first half's keys,
    so the quarter of the score matrix that the mask hides entirely (probability exactly 0) is
    never computed.
    """
    q_len = q.shape[1]
    if not (is_causal and q_len >= CAUSAL_HALVES_MIN_LEN and q_len % 2 == 0):
        return _softmax_pv(q, k, v, scale=scale, bias=bias, mask=mask)
    half = q_len // 2

    def rows(x, start, stop):  # bias rows, unless broadcast along them
        return x if x is None or x.shape[-2] == 1 else x[..., start:stop, :]

    def cols(x, stop):
        return x if x is None or x.shape[-1] == 1 else x[..., :stop]

    first = _softmax_pv(q[:, :half], k[:, :half], v[:, :half], scale=scale,
                        bias=cols(rows(bias, 0, half), half), mask=mask[:half, :half])
    second = _softmax_pv(q[:, half:], k, v, scale=scale, bias=rows(bias, half, q_len),
                         mask=mask[half:])
    return jnp.concatenate([first, second], axis=1)


def _softmax_pv(q, k, v, *, scale, bias, mask):
    """``softmax(attention_scores) V`` for ``q [batch, q_len, heads, head_dim]``."""
    batch, q_len, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    probs = jax.nn.softmax(attention_scores(q, k, scale=scale, bias=bias, mask=mask), axis=-1)
    probs = probs.reshape(batch, kv_heads, heads // kv_heads, q_len, -1).astype(v.dtype)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs, v)
    return out.reshape(batch, q_len, heads, head_dim)


def _xla_attention(q, k, v, *, scale, bias, mask, is_causal):
    """``jax.nn.dot_product_attention``: GQA natively; cuDNN flash attention on GPUs for
    bf16/fp16 inputs without a bias (ALiBi stays on the XLA path so that its bias keeps
    float32 precision at long distances)."""
    if is_causal:
        mask = None  # the kernel applies the same lower triangle itself
    elif mask is not None:
        mask = mask[None, None]  # [1, 1, q_len, k_len]
    if (
        is_causal
        and bias is None
        and jax.default_backend() == "gpu"
        and q.dtype in (jnp.bfloat16, jnp.float16)
    ):
        try:
            return jax.nn.dot_product_attention(
                q, k, v, scale=scale, is_causal=True, implementation="cudnn"
            )
        except Exception:  # unsupported shape or cuDNN version: the XLA path below is exact too
            pass
    return jax.nn.dot_product_attention(
        q, k, v, bias=bias, mask=mask, scale=scale, is_causal=is_causal
    )


_IMPLEMENTATIONS = {"einsum": _einsum_attention, "xla": _xla_attention}


def dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    scale: float | None = None,
    bias: Bias | None = None,
    mask: Mask | None = causal,
    q_offset: int | jax.Array = 0,
    q_positions: jax.Array | None = None,
    k_positions: jax.Array | None = None,
    impl: str = "einsum",
    chunk: int = 0,
    band: int = 0,
    global_keys: int = 0,
) -> jax.Array:
    """``softmax(attention_scores) V`` per head, optionally in query blocks.

    Args:
      q: ``[batch, q_len, heads, head_dim]``.
      k, v: ``[batch, k_len, kv_heads, head_dim]``.
      scale: score scale; default ``1/sqrt(head_dim)``.
      bias: bias function of positions (see the module docstring), or None.
      mask: mask function of indices (default :func:`causal`), or None (every query sees every
        key).
      q_offset: key index of query 0 (a KV-cache step's ``start``); may be traced.
      q_positions, k_positions: int ``[pbatch, q_len]`` / ``[pbatch, k_len]``, given to ``bias``
        (default ``q_offset + arange`` and ``arange``).
      impl: ``"einsum"`` (plain reference) or ``"xla"`` (``jax.nn.dot_product_attention``).
      chunk: if > 0 and ``q_len > chunk``, process queries in blocks of ``chunk`` so that at most a
        ``[batch, heads, chunk, k_len]`` score tensor exists at once (memory linear in length for
        a fixed chunk). Each block is rematerialised in the backward pass.
      band, global_keys: with query blocks, promise that ``mask`` hides every key more than
        ``band - 1`` indices before its query except the first ``global_keys`` (a
        :func:`sliding_window`); each block then reads only the ``chunk + band - 1`` keys that
        can reach it (and the global ones), so memory is ``O(q_len (chunk + band))``.

    Returns:
      ``[batch, q_len, heads, head_dim]`` in ``q.dtype``.
    """
    if impl not in _IMPLEMENTATIONS:
        raise ValueError(f"unknown attention impl {impl!r}; valid: {', '.join(_IMPLEMENTATIONS)}")
    attend = _IMPLEMENTATIONS[impl]
    batch, q_len, heads, head_dim = q.shape
    k_len = k.shape[1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    if q_positions is None:
        q_positions = (q_offset + jnp.arange(q_len))[None]
    if k_positions is None:
        k_positions = jnp.arange(k_len)[None]
    chunked = 0 < chunk < q_len
    is_causal = (mask is causal and isinstance(q_offset, int) and q_offset == 0
                 and q_len == k_len and not chunked)

    def block(q_block, q_positions_block, offset):
        """Queries ``offset .. offset + len - 1`` against every key."""
        block_bias = None if bias is None else bias(q_positions_block, k_positions)
        block_mask = None
        if mask is not None:
            block_mask = mask(offset + jnp.arange(q_block.shape[1]), jnp.arange(k_len))
        return attend(q_block, k, v, scale=scale, bias=block_bias, mask=block_mask,
                      is_causal=is_causal)

    def banded_block(q_block, q_positions_block, offset):
        """Queries ``offset ..`` against the keys a band can reach: ``[first, first + span)``
        plus the global keys not already in that range (masked there, so none counts twice)."""
        span = min(k_len, chunk + band - 1)
        first = jnp.clip(offset - band + 1, 0, k_len - span)
        k_index = first + jnp.arange(span)
        keys = jax.lax.dynamic_slice_in_dim(k, first, span, axis=1)
        values = jax.lax.dynamic_slice_in_dim(v, first, span, axis=1)
        positions = jnp.take(k_positions, k_index, axis=1)
        q_index = offset + jnp.arange(q_block.shape[1])
        block_mask = mask(q_index, k_index)
        n_global = min(global_keys, k_len)
        if n_global:
            g_index = jnp.arange(n_global)
            keys = jnp.concatenate([k[:, :n_global], keys], axis=1)
            values = jnp.concatenate([v[:, :n_global], values], axis=1)
            positions = jnp.concatenate([k_positions[:, :n_global], positions], axis=1)
            block_mask = jnp.concatenate(
                [mask(q_index, g_index) & (g_index < first)[None, :], block_mask], axis=1)
        block_bias = None if bias is None else bias(q_positions_block, positions)
        return attend(q_block, keys, values, scale=scale, bias=block_bias, mask=block_mask,
                      is_causal=False)

    if chunked and band > 0 and mask is not None and chunk + band - 1 < k_len:
        block = banded_block

    if not chunked:
        return block(q, q_positions, q_offset)

    # Memory-linear path: pad the queries to whole blocks and map over the blocks.
    n_blocks = -(-q_len // chunk)
    pad = n_blocks * chunk - q_len
    q_blocks = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0)))
    q_blocks = q_blocks.reshape(batch, n_blocks, chunk, heads, head_dim).swapaxes(0, 1)
    offsets = q_offset + chunk * jnp.arange(n_blocks)
    padded = jnp.pad(q_positions, ((0, 0), (0, pad)), mode="edge")
    position_blocks = padded.reshape(padded.shape[0], n_blocks, chunk).swapaxes(0, 1)
    out = jax.lax.map(
        jax.checkpoint(lambda args: block(*args)), (q_blocks, position_blocks, offsets)
    )  # [n_blocks, batch, chunk, heads, head_dim]
    out = out.swapaxes(0, 1).reshape(batch, n_blocks * chunk, heads, head_dim)
    return out[:, :q_len]


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


class CausalSelfAttention(nnx.Module):
    """Multi-head (or grouped-query) causal self-attention with the configured position encoding.

    ``q = x W_q``, ``k = x W_k``, ``v = x W_v`` (``+ b`` with ``model.linear_bias``); QK-norm per head (optional); the
    positional encoding's q/k transform (RoPE); attention with the encoding's score bias
    (ALiBi, T5), the score scale of ``model.attention_scale`` (``1/sqrt(head_dim)``, ``1/d``, 1,
    a learned per-head temperature, or cosine attention: :mod:`attnlab.model.scales`) and the
    causal mask, banded when ``model.attention_window > 0`` (:func:`sliding_window`; its KV cache
    is a rolling buffer of ``window`` slots plus the global tokens); then ``W_o``. ``W_o`` is a
    residual output projection: GPT-2 init scales its std by ``1/sqrt(2 n_layers)``.

    A sequence mixer: ``(x, positions, kv, start) -> (y, kv)``, with or without a cache.

    ``bidirectional=True`` makes it an encoder's self-attention (Devlin et al. 2019): no mask,
    every query sees every key, with the encoder's form of the encoding (T5's bidirectional
    buckets); it has no KV cache.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, bidirectional: bool = False):
        self.cfg = cfg
        self.bidirectional = bidirectional
        self.encoding = encoding_for(cfg, bidirectional=bidirectional)
        self.scale = 1.0 / math.sqrt(cfg.head_dim)
        self.score_scale = score_scale_for(cfg)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = projections(cfg, rngs)
        if cfg.qk_norm:
            # QK-norm (Dehghani et al. 2023): normalise each head's q and k before the product.
            self.q_norm = make_norm(cfg, cfg.head_dim)
            self.k_norm = make_norm(cfg, cfg.head_dim)
        # A learned temperature (attention_scale learned / cosine), [heads]; None otherwise.
        self.temperature = self.score_scale.init_params(rngs)

    def __call__(self, x: jax.Array, positions: jax.Array, *, kv=None, start=0,
                 mask: Mask | None = causal, pos_params=None):
        """Self-attention of ``x [batch, t, d_model]`` at ``positions [pbatch, t]``.

        Without ``kv``: plain self-attention under ``mask`` (a mask function of indices, see the
        module docstring; None: every query sees every key). With ``kv = (keys, values)``, each
        ``[batch, cache_len, kv_heads, head_dim]``: a KV-cache step that writes this call's keys
        and values at cache slots ``start .. start + t - 1`` (``positions`` must equal
        ``start + arange(t)``; ``start`` may be traced) and attends over the whole cache; slots
        not yet written are hidden by the causal mask (a cache needs one). With a sliding window
        (``model.attention_window``) the default ``mask`` becomes :func:`sliding_window` and a
        cache holds ``n_global + window`` slots, written as a rolling buffer (exact past the
        window). ``pos_params``: the encoding's bias parameters for this layer (T5).

        Returns:
          ``([batch, t, d_model], kv)``: ``kv`` updated, or None without a cache.
        """
        cfg = self.cfg
        batch, t, _ = x.shape
        if self.bidirectional:
            mask = None
        q = self.q_proj(x).reshape(batch, t, cfg.n_heads, cfg.head_dim)
        k = self.k_proj(x).reshape(batch, t, cfg.kv_heads, cfg.head_dim)
        v = self.v_proj(x).reshape(batch, t, cfg.kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, scale = self.score_scale.apply(q, k, self.temperature)
        q, k = self.encoding.transform_qk(q, k, positions)
        bias = self.encoding.bias
        if pos_params is not None:
            bias = functools.partial(self.encoding.bias, params=pos_params)
        band = 0  # a sliding window's query blocks read only the keys in reach (no cache)
        if cfg.attention_window and mask is causal:
            mask = sliding_window(cfg.attention_window, cfg.attention_global_tokens)
            band = 0 if kv is not None else cfg.attention_window
        q_offset, k_positions = 0, positions
        if kv is not None and cfg.attention_window:
            k, v, kv, mask, k_positions = self._rolling_cache(k, v, kv, start, t, mask)
            q_offset = start
        elif kv is not None:
            k, v, kv, q_offset, k_positions = write_kv_cache(kv, k, v, start)
        out = dot_product_attention(
            q, k, v, scale=scale, bias=bias,
            mask=mask, q_offset=q_offset, q_positions=positions,
            k_positions=k_positions, impl=cfg.attention_impl, chunk=cfg.attention_chunk,
            band=band, global_keys=cfg.attention_global_tokens,
        )  # [batch, t, heads, head_dim]
        return self.o_proj(out.reshape(batch, t, cfg.n_heads * cfg.head_dim)), kv

    def _rolling_cache(self, k, v, kv, start, t: int, mask: Mask):
        """A sliding-window KV-cache step: this call's ``t`` keys/values attend with the cached
        ones, whose slot positions come from :func:`rolling_slot_positions`; the last
        ``min(t, window)`` are then written at slots ``n_global + p % window`` (and positions
        ``p < n_global`` also at slot ``p``).

        Returns ``(keys, values)`` to attend over (``[batch, n_global + window + t, ...]``), the
        updated cache, the mask function by slot index (queries by position) and the keys'
        positions ``[1, n_global + window + t]`` for the bias.
        """
        window, n_global = self.cfg.attention_window, self.cfg.attention_global_tokens
        keys, values = kv
        k, v = k.astype(keys.dtype), v.astype(values.dtype)
        new_positions = jnp.asarray(start, jnp.int32) + jnp.arange(t, dtype=jnp.int32)
        k_positions = jnp.concatenate(
            [rolling_slot_positions(start, window, n_global), new_positions])
        attend_k = jnp.concatenate([keys, k], axis=1)
        attend_v = jnp.concatenate([values, v], axis=1)
        keep = min(t, window)  # distinct slots: later tokens overwrite earlier ones
        slots = n_global + jnp.mod(new_positions[t - keep:], window)
        keys = keys.at[:, slots].set(k[:, t - keep:])
        values = values.at[:, slots].set(v[:, t - keep:])
        if n_global:
            global_slots = jnp.where(new_positions < n_global, new_positions, n_global + window)
            keys = keys.at[:, global_slots].set(k, mode="drop")
            values = values.at[:, global_slots].set(v, mode="drop")

        def slot_mask(q_index, k_index):
            return mask(q_index, k_positions[k_index])

        return attend_k, attend_v, (keys, values), slot_mask, k_positions[None]


class CrossAttention(nnx.Module):
    """Encoder-decoder attention (Vaswani et al. 2017, section 3.2.3; T5): the decoder's queries
    attend to every position of the encoder's output, unmasked, without positional bias (T5
    adds its bias to self-attention only)::

        q = x W_q [batch, t, heads, hd];  k = m W_k, v = m W_v [batch, s, kv_heads, hd]
        out = softmax(q k^T / sqrt(hd)) v W_o

    The keys and values of the encoder output ``m`` are computed once per sequence
    (:meth:`keys_values`) and reused by every decoding step (the cached encoder output).
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
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
        out = dot_product_attention(q, k, v, mask=None, impl=cfg.attention_impl,
                                    chunk=cfg.attention_chunk)
        return self.o_proj(out.reshape(batch, t, cfg.n_heads * cfg.head_dim))
