"""Positional encodings: sinusoidal, learned (range check), RoPE and ALiBi.

Shapes: ``positions`` are int32 ``[pbatch, seq]`` with ``pbatch`` 1 (shared by the batch) or
``batch``. Every function here is pure; tables and phases are computed in float32 from the
positions themselves, so no encoding except the learned table has a length limit.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from attnlab.errors import AttnlabError


class PositionOutOfRangeError(AttnlabError):
    """A position lies outside what an encoding or a KV cache can represent."""


# --------------------------------------------------------------------------------------------
# Range checks: a learned table (or a KV cache) has a fixed number of rows. Flax embedding
# lookups return NaN out of range and jnp indexing clamps silently, so we check explicitly.
# --------------------------------------------------------------------------------------------


def _out_of_range_message(lowest: int, highest: int, limit: int, what: str) -> str:
    return (
        f"positions {lowest}..{highest} are outside the {what}, which holds positions "
        f"0..{limit - 1} (size {limit})"
    )


def _raise_if_out_of_range(lowest, highest, *, limit: int, what: str) -> None:
    lowest, highest = int(lowest), int(highest)
    if lowest < 0 or highest >= limit:
        raise PositionOutOfRangeError(_out_of_range_message(lowest, highest, limit, what))


def check_positions(positions, limit: int, what: str) -> None:
    """Raises :class:`PositionOutOfRangeError` unless every position is in ``[0, limit)``.

    Concrete positions (NumPy arrays, Python ints, arrays outside ``jit``) are checked at once.
    Traced positions (inside ``jit``) are checked when the computation runs, through a host
    callback; the error then surfaces wrapped in a ``JaxRuntimeError`` whose text holds this
    message.

    Args:
      positions: int array of any shape.
      limit: number of representable positions (rows of the table, length of the cache).
      what: what the limit belongs to, for the message (e.g. ``"learned position table
        (model.max_len)"``).
    """
    if isinstance(positions, jax.core.Tracer):
        jax.debug.callback(
            functools.partial(_raise_if_out_of_range, limit=limit, what=what),
            jnp.min(positions),
            jnp.max(positions),
        )
        return
    values = np.asarray(positions)
    if values.size:
        _raise_if_out_of_range(values.min(), values.max(), limit=limit, what=what)


# --------------------------------------------------------------------------------------------
# Sinusoidal (Vaswani et al. 2017, section 3.5)
# --------------------------------------------------------------------------------------------


def sinusoidal_table(positions, d_model: int, base: float = 10000.0) -> jax.Array:
    """Vaswani's fixed encoding, sin and cos interleaved.

    ``PE[p, 2i] = sin(p / base^(2i/d))`` and ``PE[p, 2i+1] = cos(p / base^(2i/d))``.

    Args:
      positions: int array ``[...]`` (any shape, any non-negative or negative integers).
      d_model: even width of the encoding.

    Returns:
      float32 ``[..., d_model]``.
    """
    if d_model % 2:
        raise ValueError(f"sinusoidal encoding needs an even width, got {d_model}")
    # Frequencies in float64 on the host, then one float32 constant.
    inv_freq = np.power(base, -np.arange(0, d_model, 2, dtype=np.float64) / d_model)
    angles = jnp.asarray(positions, jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    table = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., d/2, 2]
    return table.reshape(*angles.shape[:-1], d_model)


# --------------------------------------------------------------------------------------------
# Rotary position embedding (Su et al. 2021, RoFormer, eq. 34)
# --------------------------------------------------------------------------------------------


def rope_inverse_frequencies(head_dim: int, theta: float = 10000.0) -> np.ndarray:
    """``theta^(-2i/head_dim)`` for ``i = 0 .. head_dim/2 - 1``; float64 ``[head_dim/2]``."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    return np.power(float(theta), -np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def rope_angles(positions, head_dim: int, theta: float = 10000.0) -> jax.Array:
    """Rotation phases ``p * theta^(-2i/d)``, always float32 (bf16 would round position 257 to
    256).

    Args:
      positions: int ``[pbatch, seq]``.

    Returns:
      float32 ``[pbatch, seq, head_dim/2]``.
    """
    inv_freq = jnp.asarray(rope_inverse_frequencies(head_dim, theta), jnp.float32)
    return jnp.asarray(positions, jnp.float32)[..., None] * inv_freq


def apply_rope(x: jax.Array, positions, theta: float = 10000.0) -> jax.Array:
    """Rotates each pair of features of every head by its position's phase.

    Pairs are ``(x[i], x[i + d/2])`` (the "rotate half" layout, a fixed permutation of RoFormer's
    interleaved pairs, so the same function class). The rotation is done in float32 and the
    result cast back to ``x.dtype``; it preserves each head's norm, and
    ``<R(m) q, R(n) k>`` depends only on ``m - n``.

    Args:
      x: ``[batch, seq, heads, head_dim]``.
      positions: int ``[pbatch, seq]`` with ``pbatch`` 1 or ``batch``.

    Returns:
      ``[batch, seq, heads, head_dim]`` in ``x.dtype``.
    """
    half = x.shape[-1] // 2
    angles = rope_angles(positions, x.shape[-1], theta)[:, :, None, :]  # [pb, seq, 1, d/2]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x1 = x[..., :half].astype(jnp.float32)
    x2 = x[..., half:].astype(jnp.float32)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return rotated.astype(x.dtype)


# --------------------------------------------------------------------------------------------
# ALiBi (Press et al. 2022)
# --------------------------------------------------------------------------------------------


def alibi_slopes(n_heads: int) -> np.ndarray:
    """Per-head ALiBi slopes, float64 ``[n_heads]``.

    For a power of two ``n``: the geometric sequence ``2^(-8/n), 2^(-16/n), ..., 2^(-8)``.
    Otherwise (the official rule): the slopes of the largest power of two ``c < n``, followed by
    every other slope of the ``2c``-head sequence until there are ``n``.
    """
    if n_heads < 1:
        raise ValueError(f"n_heads must be positive, got {n_heads}")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = power_of_two(closest)
    if closest < n_heads:
        slopes += power_of_two(2 * closest)[0::2][: n_heads - closest]
    return np.asarray(slopes, dtype=np.float64)


def alibi_bias(slopes, q_positions, k_positions) -> jax.Array:
    """Additive attention bias ``-m_h * |i - j|`` (``-m_h (i - j)`` below the diagonal).

    It is added to ``QK^T / sqrt(d_k)`` as is, without the ``1/sqrt(d_k)`` scaling.

    Args:
      slopes: ``[heads]``.
      q_positions: int ``[pbatch, q_len]``.
      k_positions: int ``[pbatch, k_len]``.

    Returns:
      float32 ``[pbatch, heads, q_len, k_len]``.
    """
    distance = jnp.abs(
        jnp.asarray(q_positions, jnp.float32)[:, :, None]
        - jnp.asarray(k_positions, jnp.float32)[:, None, :]
    )  # [pb, q, k]
    return -jnp.asarray(slopes, jnp.float32)[None, :, None, None] * distance[:, None, :, :]
