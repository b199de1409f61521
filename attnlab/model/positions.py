"""Positional encodings: the pure functions of each equation, and one class per encoding that the
model, the KV cache, the counters, config validation and the extrapolation code ask.

Shapes: ``positions`` are int32 ``[pbatch, seq]`` with ``pbatch`` 1 (shared by the batch) or
``batch``; heads are ``[batch, seq, heads, head_dim]``. Every function here is pure; tables and
phases are computed in float32 from the positions themselves, so no encoding except the learned
table has a length limit.

    encoding = encoding_for(cfg)                 # ENCODINGS[cfg.pos_encoding](cfg)
    x = encoding.embed(x, positions, table)      # what it adds to the token embeddings
    q, k = encoding.transform_qk(q, k, positions)   # RoPE rotates q and k
    bias = encoding.bias(q_positions, k_positions)  # ALiBi's score bias (None: no bias)
    encoding.max_positions()                     # None = unlimited; learned = model.max_len

Adding an encoding is one subclass of :class:`PositionalEncoding` (overriding only what it
changes), its tests, and one line in :data:`ENCODINGS` (docs/design.md has a worked example).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab.errors import AttnlabError, ConfigError

if TYPE_CHECKING:  # model/config.py imports this module to validate model.pos_encoding
    from attnlab.model.config import ModelConfig


class PositionOutOfRangeError(AttnlabError):
    """A position lies outside what an encoding or a KV cache can represent."""


class RescalingError(AttnlabError):
    """An encoding cannot be rescaled (for longer contexts) the way that was asked."""


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
# The interface every encoding implements. The defaults are "does nothing here", so an encoding
# overrides only the hooks where it acts.
# --------------------------------------------------------------------------------------------


def unscaled(cfg: ModelConfig, factor: float, train_length: int = 0) -> ModelConfig:
    """The identity rescaling: evaluate longer contexts with the trained encoding as it is."""
    return cfg


UNSCALED = "none"  # the name of :func:`unscaled` in every encoding's ``rescalings``


@dataclasses.dataclass(frozen=True)
class PositionalEncoding:
    """One positional encoding of a model built from ``cfg`` (immutable and hashable, so that
    modules may hold it as static structure).

    Class attributes:
      name: the ``model.pos_encoding`` value, the key in :data:`ENCODINGS`.
      title: how messages name it ("" = the name).
      range_name: what :meth:`max_positions` counts, for range errors.
      rescalings: ``{method: function(cfg, factor, train_length) -> cfg}``, how the encoding may
        be changed to evaluate at ``factor`` x the training context ``train_length`` (see
        :meth:`rescaled`).
    """

    cfg: ModelConfig

    name = ""
    title = ""
    range_name = "positional encoding"
    rescalings = {UNSCALED: unscaled}

    # --- configuration -----------------------------------------------------------------------

    def validate(self) -> None:
        """Raises :class:`ConfigError` (naming the field) if ``cfg`` breaks this encoding's
        constraints. Called by ``ModelConfig.__post_init__``."""

    def max_positions(self) -> int | None:
        """How many positions (0 .. n-1) the encoding can represent; None = no limit."""
        return None

    def unrepresentable(self, length: int) -> str | None:
        """Why a window of ``length`` tokens (positions ``0 .. length-1``) cannot be fed to the
        model, for reports; None if it can."""
        limit = self.max_positions()
        if limit is None or length <= limit:
            return None
        return (f"the {self.range_name} holds positions 0..{limit - 1}, length {length} needs "
                f"positions 0..{length - 1} (not clamped)")

    def param_count(self) -> int:
        """Scalars of :meth:`init_params`. Embedding parameters (not in Kaplan's N)."""
        return 0

    def flops_per_token(self, seq_len: int) -> float:
        """Forward FLOPs per token outside matrix products: 0 for every encoding so far, as
        Hoffmann et al. (Appendix F) count only the matrix products, the softmax and the
        embeddings. ``seq_len`` is the context of a training step."""
        return 0.0

    # --- the model ---------------------------------------------------------------------------

    def init_params(self, rngs: nnx.Rngs) -> nnx.Param | None:
        """The encoding's trainable table, stored by the model as ``position_embedding`` (that
        parameter path is what checkpoints hold); None when it has none."""
        return None

    def check_range(self, positions) -> None:
        """Raises :class:`PositionOutOfRangeError` for positions beyond :meth:`max_positions`
        (at once when concrete, at run time when traced; see :func:`check_positions`)."""
        limit = self.max_positions()
        if limit is not None:
            check_positions(positions, limit, self.range_name)

    def embed(self, x: jax.Array, positions: jax.Array, table: nnx.Param | None) -> jax.Array:
        """Token embeddings ``x`` float32 ``[batch, seq, d_model]``, positions ``[pbatch, seq]``,
        this encoding's ``table`` -> the embedding-layer output ``[batch, seq, d_model]``."""
        return x

    def transform_qk(self, q: jax.Array, k: jax.Array, positions: jax.Array
                     ) -> tuple[jax.Array, jax.Array]:
        """``q [batch, seq, heads, head_dim]``, ``k [batch, seq, kv_heads, head_dim]`` of the
        tokens at ``positions [pbatch, seq]`` -> ``(q, k)`` of the same shapes and dtypes."""
        return q, k

    def bias(self, q_positions: jax.Array, k_positions: jax.Array) -> jax.Array | None:
        """Additive attention-score bias, float32 ``[pbatch, heads, q_len, k_len]``, for
        ``q_positions [pbatch, q_len]`` and ``k_positions [pbatch, k_len]``; None: no bias
        (the attention then may use fused kernels). An encoding with trained bias parameters
        (T5) takes them as a keyword ``params`` (what :meth:`layer_params` returns)."""
        return None

    def for_encoder(self) -> PositionalEncoding:
        """The encoding as an encoder's self-attention uses it (keys on both sides of the
        query); itself for every encoding whose equations are already symmetric in ``i - j``
        or absolute (ALiBi's ``-m |i - j|``, RoPE, learned, sinusoidal, none)."""
        return self

    def layer_params(self, table: nnx.Param | None, layer: int) -> jax.Array | None:
        """What layer ``layer``'s attention needs of the encoding's table for :meth:`bias`
        (passed as ``bias(..., params=...)``); None (the default): the bias takes no
        parameters."""
        return None

    # --- evaluation at longer contexts -------------------------------------------------------

    def can_rescale(self, method: str) -> bool:
        return method in self.rescalings

    def rescaled(self, method: str, factor: float, train_length: int = 0) -> ModelConfig:
        """The model config to evaluate with at ``factor`` x the training context
        ``train_length`` (tokens; YaRN needs it, 0 = unknown).

        ``"none"`` (:data:`UNSCALED`) returns ``cfg`` unchanged for every encoding.

        Raises:
          RescalingError: this encoding has no rescaling ``method``.
        """
        if not self.can_rescale(method):
            owners = [c.title or c.name for c in ENCODINGS.values() if method in c.rescalings]
            where = f"{' and '.join(owners)} models" if owners else "no encoding"
            raise RescalingError(
                f"{method} applies to {where}; this run uses pos_encoding={self.name}")
        return self.rescalings[method](self.cfg, factor, train_length)


class NoPE(PositionalEncoding):
    """No positional information (Kazemnejad et al. 2023): a causal decoder still infers
    positions from the mask alone."""

    name = "none"
    title = "NoPE"


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


class Sinusoidal(PositionalEncoding):
    """``x = E[tokens] sqrt(d_model) + PE[positions]`` (Vaswani et al. 2017, sections 3.4-3.5):
    the embeddings are scaled so that the unit-amplitude sinusoids do not swamp them."""

    name = "sinusoidal"

    def validate(self) -> None:
        if self.cfg.d_model % 2:
            raise ConfigError(
                "model.d_model", f"sinusoidal encoding needs an even d_model, got {self.cfg.d_model}")

    def embed(self, x, positions, table):
        d_model = self.cfg.d_model
        return x * math.sqrt(d_model) + sinusoidal_table(positions, d_model)


# --------------------------------------------------------------------------------------------
# Learned absolute positions (Gehring et al. 2017; GPT-2): one trained row per position
# --------------------------------------------------------------------------------------------


class Learned(PositionalEncoding):
    """``x = E[tokens] + P[positions]`` with a trained table ``P [model.max_len, d_model]``
    (initialised like every matrix, N(0, init_std^2)). It has no rows beyond ``max_len``:
    positions outside raise :class:`PositionOutOfRangeError`, never clamp."""

    name = "learned"
    range_name = "learned position table (model.max_len)"

    def max_positions(self) -> int:
        return self.cfg.max_len

    def unrepresentable(self, length):
        limit = self.cfg.max_len
        if length <= limit:
            return None
        return (f"learned absolute positions: the table has model.max_len={limit} rows, length "
                f"{length} needs positions 0..{length - 1}; learned embeddings cannot "
                "extrapolate (not clamped)")

    def param_count(self) -> int:
        return self.cfg.max_len * self.cfg.d_model

    def init_params(self, rngs):
        init = nnx.initializers.normal(self.cfg.init_std)
        return nnx.Param(init(rngs.params(), (self.cfg.max_len, self.cfg.d_model)))

    def embed(self, x, positions, table):
        return x + jnp.take(table[...], positions, axis=0)  # [pbatch, seq, d] broadcasts


# --------------------------------------------------------------------------------------------
# Rotary position embedding (Su et al. 2021, RoFormer, eq. 34)
# --------------------------------------------------------------------------------------------


def rope_inverse_frequencies(head_dim: int, theta: float = 10000.0) -> np.ndarray:
    """``theta^(-2i/head_dim)`` for ``i = 0 .. head_dim/2 - 1``; float64 ``[head_dim/2]``."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    return np.power(float(theta), -np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def rope_angles(positions, head_dim: int, theta: float = 10000.0,
                inv_freq: np.ndarray | None = None) -> jax.Array:
    """Rotation phases ``p * theta^(-2i/d)`` (or ``p * inv_freq[i]``), always float32 (bf16 would
    round position 257 to 256).

    Args:
      positions: int ``[pbatch, seq]``.
      inv_freq: float64 ``[head_dim/2]`` frequencies replacing ``theta^(-2i/d)`` (PI, YaRN).

    Returns:
      float32 ``[pbatch, seq, head_dim/2]``.
    """
    if inv_freq is None:
        inv_freq = rope_inverse_frequencies(head_dim, theta)
    return jnp.asarray(positions, jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)


def apply_rope(x: jax.Array, positions, theta: float = 10000.0,
               inv_freq: np.ndarray | None = None) -> jax.Array:
    """Rotates each pair of features of every head by its position's phase.

    Pairs are ``(x[i], x[i + d/2])`` (the "rotate half" layout, a fixed permutation of RoFormer's
    interleaved pairs, so the same function class). The rotation is done in float32 and the
    result cast back to ``x.dtype``; it preserves each head's norm, and
    ``<R(m) q, R(n) k>`` depends only on ``m - n``.

    Args:
      x: ``[batch, seq, heads, head_dim]``.
      positions: int ``[pbatch, seq]`` with ``pbatch`` 1 or ``batch``.
      inv_freq: optional float64 ``[head_dim/2]`` frequencies (default ``theta^(-2i/d)``).

    Returns:
      ``[batch, seq, heads, head_dim]`` in ``x.dtype``.
    """
    half = x.shape[-1] // 2
    angles = rope_angles(positions, x.shape[-1], theta, inv_freq)[:, :, None, :]  # [pb, seq, 1, d/2]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x1 = x[..., :half].astype(jnp.float32)
    x2 = x[..., half:].astype(jnp.float32)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return rotated.astype(x.dtype)


def ntk_rope_theta(theta: float, head_dim: int, factor: float) -> float:
    """NTK-aware RoPE base (bloc97 2023; Peng et al. 2023, YaRN section 3.2):
    ``theta * s^(d / (d - 2))`` stretches the lowest frequency ``theta^(-(d-2)/d)`` by exactly
    ``1/s`` and leaves frequency 1 (i = 0) unchanged."""
    if head_dim <= 2:
        raise RescalingError(f"ntk needs head_dim > 2, got {head_dim}")
    return float(theta) * float(factor) ** (head_dim / (head_dim - 2))


def pi_frequencies(inv_freq: np.ndarray, factor: float) -> np.ndarray:
    """Position interpolation (Chen et al. 2023, eq. 4): position ``m`` is read as ``m / s``, i.e.
    every frequency divided by ``s``; float64 ``[head_dim/2]``."""
    return np.asarray(inv_freq, np.float64) / float(factor)


YARN_ALPHA, YARN_BETA = 1.0, 32.0  # Peng et al. 2023, section 3.2, for LLaMA


def yarn_frequencies(inv_freq: np.ndarray, factor: float, original_length: int,
                     alpha: float = YARN_ALPHA, beta: float = YARN_BETA) -> np.ndarray:
    """YaRN's "NTK-by-parts" frequencies (Peng et al. 2023, eqs. 17-19); float64 ``[head_dim/2]``.

    With wavelength ``lambda_i = 2 pi / inv_freq_i`` and ``r_i = L / lambda_i`` (``L`` the
    original context): ``gamma(r) = 0`` for ``r < alpha``, 1 for ``r > beta``, linear between;
    ``h_i = (1 - gamma_i) inv_freq_i / s + gamma_i inv_freq_i``. Dimensions whose wavelength is
    longer than the context are interpolated like PI; short wavelengths (more than ``beta``
    turns within ``L``) are left alone.
    """
    inv_freq = np.asarray(inv_freq, np.float64)
    r = original_length * inv_freq / (2.0 * np.pi)
    gamma = np.clip((r - alpha) / (beta - alpha), 0.0, 1.0)
    return (1.0 - gamma) * inv_freq / float(factor) + gamma * inv_freq


def yarn_attention_factor(factor: float) -> float:
    """``sqrt(1/t) = 0.1 ln(s) + 1`` (Peng et al. 2023, eq. 22): q and k are both multiplied by
    it, so the logits are multiplied by its square (``1/t``)."""
    return 0.1 * math.log(float(factor)) + 1.0 if factor > 1 else 1.0


def _ntk_scaled(cfg: ModelConfig, factor: float, train_length: int = 0) -> ModelConfig:
    return dataclasses.replace(cfg, rope_theta=ntk_rope_theta(cfg.rope_theta, cfg.head_dim, factor))


def _pi_scaled(cfg: ModelConfig, factor: float, train_length: int = 0) -> ModelConfig:
    return dataclasses.replace(cfg, rope_scaling="pi", rope_factor=float(factor))


def _yarn_scaled(cfg: ModelConfig, factor: float, train_length: int = 0) -> ModelConfig:
    if train_length < 1:
        raise RescalingError("yarn needs the training context length (its wavelength ramp is "
                             "relative to it)")
    return dataclasses.replace(cfg, rope_scaling="yarn", rope_factor=float(factor),
                               rope_original_len=int(train_length))


# model.rope_scaling -> the frequencies of a RoPE model at factor model.rope_factor, and the
# factor its q and k are multiplied by (YaRN's temperature; 1 otherwise).
def _unchanged_frequencies(cfg: ModelConfig) -> tuple[np.ndarray, float]:
    return rope_inverse_frequencies(cfg.head_dim, cfg.rope_theta), 1.0


def _pi(cfg: ModelConfig) -> tuple[np.ndarray, float]:
    return pi_frequencies(rope_inverse_frequencies(cfg.head_dim, cfg.rope_theta),
                          cfg.rope_factor), 1.0


def _yarn(cfg: ModelConfig) -> tuple[np.ndarray, float]:
    inv_freq = rope_inverse_frequencies(cfg.head_dim, cfg.rope_theta)
    return (yarn_frequencies(inv_freq, cfg.rope_factor, cfg.rope_original_len),
            yarn_attention_factor(cfg.rope_factor))


ROPE_FREQUENCIES = {UNSCALED: _unchanged_frequencies, "pi": _pi, "yarn": _yarn}


class RoPE(PositionalEncoding):
    """Rotates every query and key head by its position (Su et al. 2021, eq. 34), so that
    ``<R(m) q, R(n) k>`` depends only on ``m - n``; base ``model.rope_theta``.

    Rescalings for longer contexts (evaluation settings; each returns a model config):
    ``ntk`` raises the base (:func:`ntk_rope_theta`); ``pi`` divides the frequencies by ``s``
    (:func:`pi_frequencies`, Chen et al. 2023); ``yarn`` interpolates by parts and multiplies q
    and k by ``0.1 ln s + 1`` (:func:`yarn_frequencies`, Peng et al. 2023). PI and YaRN are the
    config fields ``model.rope_scaling`` / ``rope_factor`` / ``rope_original_len``.
    """

    name = "rope"
    title = "RoPE"
    rescalings = {UNSCALED: unscaled, "ntk": _ntk_scaled, "pi": _pi_scaled, "yarn": _yarn_scaled}

    def validate(self) -> None:
        if self.cfg.head_dim % 2:
            raise ConfigError(
                "model.pos_encoding",
                f"rope needs an even head_dim, but d_model/n_heads = {self.cfg.head_dim}",
            )
        if ROPE_FREQUENCIES.get(self.cfg.rope_scaling) is _yarn and self.cfg.rope_original_len < 1:
            raise ConfigError("model.rope_original_len",
                              "model.rope_scaling=yarn needs the training context length (>= 1)")

    def frequencies(self) -> tuple[np.ndarray, float]:
        """``(inv_freq float64 [head_dim/2], q/k multiplier)`` under ``model.rope_scaling``."""
        return ROPE_FREQUENCIES[self.cfg.rope_scaling](self.cfg)

    def transform_qk(self, q, k, positions):
        inv_freq, multiplier = self.frequencies()
        q = apply_rope(q, positions, inv_freq=inv_freq)
        k = apply_rope(k, positions, inv_freq=inv_freq)
        if multiplier != 1.0:
            q, k = q * multiplier, k * multiplier
        return q, k


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


class ALiBi(PositionalEncoding):
    """Adds ``-m_h |i - j|`` to head ``h``'s scores (Press et al. 2022), with the slopes of
    :func:`alibi_slopes`; nothing is added to the embeddings or to q/k."""

    name = "alibi"
    title = "ALiBi"

    def bias(self, q_positions, k_positions):
        return alibi_bias(alibi_slopes(self.cfg.n_heads), q_positions, k_positions)


# --------------------------------------------------------------------------------------------
# T5 relative position bias (Raffel et al. 2020, section 2.1)
# --------------------------------------------------------------------------------------------


def t5_bucket_table(num_buckets: int, max_distance: int, *, bidirectional: bool) -> np.ndarray:
    """Bucket of every distance ``n = i - j`` in ``-max_distance .. max_distance`` (Raffel et al.
    2020; the mesh-tensorflow rule), int32 ``[2 max_distance + 1]`` indexed by
    ``n + max_distance``.

    Causal (``bidirectional=False``): ``n <= 0`` (the key at or after the query) -> ``n = 0``;
    the ``B = num_buckets`` buckets cover ``n >= 0``. Bidirectional: keys after the query
    (``n < 0``) use buckets ``B/2 .. B-1`` with ``|n|``, so each direction has ``B' = B/2``.
    Within a direction, ``n < B'/2`` is its own bucket (exact small offsets); larger ``n`` go to
    ``B'/2 + floor(log(n / (B'/2)) / log(max_distance / (B'/2)) * (B' - B'/2))``, capped at
    ``B' - 1`` (every distance ``>= max_distance`` shares the last bucket). Computed once in
    float64 on the host, so the model indexes an integer table and float32 rounding cannot move a
    distance across a bucket edge.
    """
    n = np.arange(-max_distance, max_distance + 1, dtype=np.int64)
    buckets = num_buckets
    offset = np.zeros_like(n)
    if bidirectional:
        buckets //= 2
        offset = np.where(n < 0, buckets, 0)
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    max_exact = buckets // 2
    with np.errstate(divide="ignore"):
        log_ratio = np.log(np.maximum(n, 1) / max_exact) / np.log(max_distance / max_exact)
    large = max_exact + np.floor(log_ratio * (buckets - max_exact)).astype(np.int64)
    large = np.minimum(large, buckets - 1)
    return (offset + np.where(n < max_exact, n, large)).astype(np.int32)


def t5_buckets(q_positions, k_positions, num_buckets: int, max_distance: int, *,
               bidirectional: bool) -> jax.Array:
    """Bucket of every (query, key) pair; int32 ``[pbatch, q_len, k_len]`` for
    ``q_positions [pbatch, q_len]`` and ``k_positions [pbatch, k_len]`` (see
    :func:`t5_bucket_table`; distances beyond ``max_distance`` share the outermost buckets)."""
    table = jnp.asarray(t5_bucket_table(num_buckets, max_distance, bidirectional=bidirectional))
    n = (jnp.asarray(q_positions, jnp.int32)[:, :, None]
         - jnp.asarray(k_positions, jnp.int32)[:, None, :])
    return jnp.take(table, jnp.clip(n, -max_distance, max_distance) + max_distance)


class T5Bias(PositionalEncoding):
    """Adds a learned scalar ``b[h, bucket(i - j)]`` to head ``h``'s scores, unscaled (Raffel et
    al. 2020): ``model.t5_num_buckets`` log-spaced buckets up to ``model.t5_max_distance``,
    causal bucketing (a decoder). One table ``[num_buckets, heads]`` shared by every layer, as in
    T5, or one per layer (``model.t5_per_layer``: ``[n_layers, num_buckets, heads]``), stored at
    ``position_embedding`` (an embedding parameter, not in Kaplan's N); init N(0, init_std^2).
    """

    name = "t5"
    title = "T5 bias"
    bidirectional = False  # the decoder's bucketing; an encoder subclass sets True

    def validate(self) -> None:
        cfg = self.cfg
        if cfg.t5_num_buckets < 4 or cfg.t5_num_buckets % 2:
            raise ConfigError("model.t5_num_buckets",
                              f"must be an even number >= 4, got {cfg.t5_num_buckets}")
        direction = cfg.t5_num_buckets // (2 if self.bidirectional else 1)
        if cfg.t5_max_distance <= direction // 2:
            raise ConfigError("model.t5_max_distance",
                              f"must exceed the {direction // 2} exact buckets of "
                              f"model.t5_num_buckets={cfg.t5_num_buckets}, got {cfg.t5_max_distance}")

    def _shape(self) -> tuple[int, ...]:
        cfg = self.cfg
        shape = (cfg.t5_num_buckets, cfg.n_heads)
        return (cfg.n_layers, *shape) if cfg.t5_per_layer else shape

    def param_count(self) -> int:
        return int(np.prod(self._shape()))

    def init_params(self, rngs):
        return nnx.Param(nnx.initializers.normal(self.cfg.init_std)(rngs.params(), self._shape()))

    def layer_params(self, table, layer):
        return table[layer] if self.cfg.t5_per_layer else table[...]

    def for_encoder(self):
        return T5BidirectionalBias(self.cfg)

    def bias(self, q_positions, k_positions, params=None):
        """float32 ``[pbatch, heads, q_len, k_len]`` from ``params [num_buckets, heads]``."""
        buckets = t5_buckets(q_positions, k_positions, self.cfg.t5_num_buckets,
                             self.cfg.t5_max_distance, bidirectional=self.bidirectional)
        values = jnp.take(jnp.asarray(params, jnp.float32), buckets, axis=0)  # [pb, q, k, heads]
        return jnp.einsum("bqkh->bhqk", values)


class T5BidirectionalBias(T5Bias):
    """The T5 bias of an encoder (Raffel et al. 2020): keys after the query get their own
    ``num_buckets / 2`` buckets (:func:`t5_bucket_table` with ``bidirectional=True``). Not a
    ``model.pos_encoding`` value: ``encoding_for(cfg, bidirectional=True)`` gives it for
    ``pos_encoding="t5"``."""

    bidirectional = True


# --------------------------------------------------------------------------------------------
# The registry: model.pos_encoding -> class. Config validation reads its keys.
# --------------------------------------------------------------------------------------------

ENCODINGS: dict[str, type[PositionalEncoding]] = {
    encoding.name: encoding
    for encoding in (
        NoPE,
        Sinusoidal,
        Learned,
        RoPE,
        ALiBi,
        T5Bias,
    )
}


def encoding_for(cfg: ModelConfig, *, bidirectional: bool = False) -> PositionalEncoding:
    """The encoding of ``cfg`` (``cfg.pos_encoding`` is validated against :data:`ENCODINGS`);
    ``bidirectional``: as an encoder's self-attention uses it (``for_encoder``)."""
    encoding = ENCODINGS[cfg.pos_encoding](cfg)
    return encoding.for_encoder() if bidirectional else encoding
