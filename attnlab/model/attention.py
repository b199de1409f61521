"""Scaled dot-product attention (MHA / GQA / MQA) and the causal self-attention layer.

Shapes: queries ``[batch, q_len, heads, head_dim]``, keys and values
``[batch, k_len, kv_heads, head_dim]`` with ``heads % kv_heads == 0``. Query head ``h`` reads
key/value head ``h // (heads // kv_heads)`` (the grouping of ``jax.nn.dot_product_attention``).

Causal masking is by index: query ``i`` sits at key index ``q_offset + i`` and sees keys
``j <= q_offset + i``. Self-attention has ``q_offset = 0``; a KV-cache decode step has
``q_offset = start``. Positions (which may be offset or batch-specific) only enter through the
positional encodings (RoPE on q/k, the ALiBi bias), never through the mask.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from attnlab.config import ModelConfig
from attnlab.model import positions as pos
from attnlab.model.layers import dense, make_norm


def causal_mask(q_len: int, k_len: int, q_offset: int | jax.Array = 0) -> jax.Array:
    """``mask[i, j] = j <= q_offset + i``; bool ``[q_len, k_len]`` (True = may attend)."""
    q_index = q_offset + jnp.arange(q_len)[:, None]
    return jnp.arange(k_len)[None, :] <= q_index


def _group(q: jax.Array, kv_heads: int) -> jax.Array:
    """``[b, t, heads, d] -> [b, t, kv_heads, heads // kv_heads, d]``."""
    b, t, heads, d = q.shape
    return q.reshape(b, t, kv_heads, heads // kv_heads, d)


def attention_weights(
    q: jax.Array,
    k: jax.Array,
    *,
    causal: bool = True,
    q_offset: int | jax.Array = 0,
    bias: jax.Array | None = None,
) -> jax.Array:
    """``softmax(Q K^T / sqrt(d_k) + bias)`` with the causal mask; float32 ``[batch, heads, q_len,
    k_len]``.

    Args:
      q: ``[batch, q_len, heads, head_dim]``.
      k: ``[batch, k_len, kv_heads, head_dim]``.
      causal: mask keys after each query (see the module docstring for ``q_offset``).
      bias: additive float32 bias broadcastable to ``[batch, heads, q_len, k_len]`` (ALiBi); it is
        not scaled by ``1/sqrt(d_k)``.
    """
    batch, q_len, heads, head_dim = q.shape
    k_len, kv_heads = k.shape[1], k.shape[2]
    # Scores accumulate in float32 even for bf16 inputs; the softmax is float32.
    scores = jnp.einsum(
        "bqkgd,bskd->bkgqs", _group(q, kv_heads), k, preferred_element_type=jnp.float32
    ).reshape(batch, heads, q_len, k_len)
    scores = scores / math.sqrt(head_dim)
    if bias is not None:
        scores = scores + bias
    if causal:
        scores = jnp.where(causal_mask(q_len, k_len, q_offset), scores, -jnp.inf)
    return jax.nn.softmax(scores, axis=-1)


def _einsum_attention(q, k, v, *, causal, q_offset, bias):
    """The plain reference: weights from :func:`attention_weights`, then ``P V``."""
    batch, q_len, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    probs = attention_weights(q, k, causal=causal, q_offset=q_offset, bias=bias)
    probs = probs.reshape(batch, kv_heads, heads // kv_heads, q_len, -1).astype(v.dtype)
    out = jnp.einsum("bkgqs,bskd->bqkgd", probs, v)
    return out.reshape(batch, q_len, heads, head_dim)


def _xla_attention(q, k, v, *, causal, q_offset, bias):
    """``jax.nn.dot_product_attention``: GQA natively; cuDNN flash attention on GPUs for
    bf16/fp16 inputs without a bias (ALiBi stays on the XLA path so that its bias keeps
    float32 precision at long distances)."""
    q_len, k_len = q.shape[1], k.shape[1]
    plain_causal = causal and isinstance(q_offset, int) and q_offset == 0 and q_len == k_len
    mask = None
    if causal and not plain_causal:
        mask = causal_mask(q_len, k_len, q_offset)[None, None]
    if (
        plain_causal
        and bias is None
        and jax.default_backend() == "gpu"
        and q.dtype in (jnp.bfloat16, jnp.float16)
    ):
        try:
            return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
        except Exception:  # unsupported shape or cuDNN version: the XLA path below is exact too
            pass
    return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, is_causal=plain_causal)


_IMPLEMENTATIONS = {"einsum": _einsum_attention, "xla": _xla_attention}


def dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = True,
    q_offset: int | jax.Array = 0,
    q_positions: jax.Array | None = None,
    k_positions: jax.Array | None = None,
    alibi_slopes=None,
    impl: str = "einsum",
    chunk: int = 0,
) -> jax.Array:
    """``softmax(Q K^T / sqrt(d_k) [+ ALiBi]) V`` per head, optionally in query blocks.

    Args:
      q: ``[batch, q_len, heads, head_dim]``.
      k, v: ``[batch, k_len, kv_heads, head_dim]``.
      causal: apply the causal mask (False: every query sees every key).
      q_offset: key index of query 0 (a KV-cache step's ``start``); may be traced.
      q_positions, k_positions: int ``[pbatch, q_len]`` / ``[pbatch, k_len]``, used only for the
        ALiBi distance (default ``q_offset + arange`` and ``arange``).
      alibi_slopes: ``[heads]`` or None (no bias).
      impl: ``"einsum"`` (plain reference) or ``"xla"`` (``jax.nn.dot_product_attention``).
      chunk: if > 0 and ``q_len > chunk``, process queries in blocks of ``chunk`` so that at most a
        ``[batch, heads, chunk, k_len]`` score tensor exists at once (memory linear in length for
        a fixed chunk). Each block is rematerialised in the backward pass.

    Returns:
      ``[batch, q_len, heads, head_dim]`` in ``q.dtype``.
    """
    if impl not in _IMPLEMENTATIONS:
        raise ValueError(f"unknown attention impl {impl!r}; valid: {', '.join(_IMPLEMENTATIONS)}")
    attend = _IMPLEMENTATIONS[impl]
    q_len, k_len = q.shape[1], k.shape[1]
    if alibi_slopes is not None:
        if q_positions is None:
            q_positions = (q_offset + jnp.arange(q_len))[None]
        if k_positions is None:
            k_positions = jnp.arange(k_len)[None]

    def block(q_block, q_positions_block, offset):
        bias = None
        if alibi_slopes is not None:
            bias = pos.alibi_bias(alibi_slopes, q_positions_block, k_positions)
        return attend(q_block, k, v, causal=causal, q_offset=offset, bias=bias)

    if chunk <= 0 or q_len <= chunk:
        return block(q, q_positions, q_offset)

    # Memory-linear path: pad the queries to whole blocks and map over the blocks.
    n_blocks = -(-q_len // chunk)
    pad = n_blocks * chunk - q_len
    batch, _, heads, head_dim = q.shape
    q_blocks = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0)))
    q_blocks = q_blocks.reshape(batch, n_blocks, chunk, heads, head_dim).swapaxes(0, 1)
    offsets = q_offset + chunk * jnp.arange(n_blocks)
    if q_positions is None:
        position_blocks = jnp.zeros((n_blocks, 1, chunk), jnp.int32)  # unused without ALiBi
    else:
        padded = jnp.pad(q_positions, ((0, 0), (0, pad)), mode="edge")
        position_blocks = padded.reshape(padded.shape[0], n_blocks, chunk).swapaxes(0, 1)
    out = jax.lax.map(
        jax.checkpoint(lambda args: block(*args)), (q_blocks, position_blocks, offsets)
    )  # [n_blocks, batch, chunk, heads, head_dim]
    out = out.swapaxes(0, 1).reshape(batch, n_blocks * chunk, heads, head_dim)
    return out[:, :q_len]


class CausalSelfAttention(nnx.Module):
    """Multi-head (or grouped-query) causal self-attention with the configured position encoding.

    ``q = x W_q``, ``k = x W_k``, ``v = x W_v`` (no biases), optional QK-norm per head, RoPE on
    q and k, attention, then ``W_o``. ``W_o`` is a residual output projection: GPT-2 init scales
    its std by ``1/sqrt(2 n_layers)``.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, hd = cfg.d_model, cfg.head_dim
        residual_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
        self.q_proj = dense(cfg, d, cfg.n_heads * hd, cfg.init_std, rngs)
        self.k_proj = dense(cfg, d, cfg.kv_heads * hd, cfg.init_std, rngs)
        self.v_proj = dense(cfg, d, cfg.kv_heads * hd, cfg.init_std, rngs)
        self.o_proj = dense(cfg, cfg.n_heads * hd, d, residual_std, rngs)
        if cfg.qk_norm:
            # QK-norm (Dehghani et al. 2023): normalise each head's q and k before the product.
            self.q_norm = make_norm(cfg, hd)
            self.k_norm = make_norm(cfg, hd)

    def _project(self, x, positions):
        """``x [batch, seq, d_model] -> q [b, s, heads, hd], k, v [b, s, kv_heads, hd]``."""
        cfg = self.cfg
        batch, seq, _ = x.shape
        q = self.q_proj(x).reshape(batch, seq, cfg.n_heads, cfg.head_dim)
        k = self.k_proj(x).reshape(batch, seq, cfg.kv_heads, cfg.head_dim)
        v = self.v_proj(x).reshape(batch, seq, cfg.kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if cfg.pos_encoding == "rope":
            q = pos.apply_rope(q, positions, cfg.rope_theta)
            k = pos.apply_rope(k, positions, cfg.rope_theta)
        return q, k, v

    def _attend(self, q, k, v, *, causal, q_offset, q_positions, k_positions):
        cfg = self.cfg
        slopes = pos.alibi_slopes(cfg.n_heads) if cfg.pos_encoding == "alibi" else None
        out = dot_product_attention(
            q, k, v, causal=causal, q_offset=q_offset, q_positions=q_positions,
            k_positions=k_positions, alibi_slopes=slopes, impl=cfg.attention_impl,
            chunk=cfg.attention_chunk,
        )  # [batch, q_len, heads, head_dim]
        batch, q_len = out.shape[:2]
        return self.o_proj(out.reshape(batch, q_len, cfg.n_heads * cfg.head_dim))

    def __call__(self, x: jax.Array, positions: jax.Array, *, causal: bool = True) -> jax.Array:
        """``x [batch, seq, d_model]``, ``positions [pbatch, seq]`` -> ``[batch, seq, d_model]``."""
        q, k, v = self._project(x, positions)
        return self._attend(
            q, k, v, causal=causal, q_offset=0, q_positions=positions, k_positions=positions
        )

    def decode(self, x, positions, start, kv):
        """One KV-cache step: writes this step's keys/values at ``start`` and attends to the cache.

        Args:
          x: ``[batch, t, d_model]`` (the new tokens' hidden states).
          positions: ``[pbatch, t]``, equal to ``start + arange(t)``.
          start: cache index (= position) of the first new token; int or traced int.
          kv: ``(keys, values)``, each ``[batch, cache_len, kv_heads, head_dim]``.

        Returns:
          ``([batch, t, d_model], (keys, values))`` with the cache updated.
        """
        keys, values = kv
        q, k, v = self._project(x, positions)
        keys = jax.lax.dynamic_update_slice_in_dim(keys, k.astype(keys.dtype), start, axis=1)
        values = jax.lax.dynamic_update_slice_in_dim(values, v.astype(values.dtype), start, axis=1)
        # Slots after start + t still hold zeros; the causal mask hides them.
        out = self._attend(
            q, keys, values, causal=True, q_offset=start, q_positions=positions,
            k_positions=jnp.arange(keys.shape[1])[None],
        )
        return out, (keys, values)
