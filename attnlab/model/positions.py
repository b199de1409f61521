"""Positional encodings: the interface every encoding implements, the range checks, and the
simple encodings (none, sinusoidal, learned, ALiBi). RoPE and its rescalings are in ``rope.py``,
T5's relative bias in ``relative.py``; the registry (``model.pos_encoding`` -> class) is
``architecture.ENCODINGS``.

Shapes: ``positions`` are int32 ``[pbatch, seq]`` with ``pbatch`` 1 (shared by the batch) or
``batch``; heads are ``[batch, seq, heads, head_dim]``. Every function here is pure; tables and
phases are computed in float32 from the positions themselves, so no encoding except the learned
table has a length limit.

    encoding = resolve(cfg).encoding             # the encoding object, built once
    x = encoding.embed(x, positions, table)      # what it adds to the token embeddings
    q, k = encoding.transform_qk(q, k, positions)   # RoPE rotates q and k
    bias = encoding.layer_bias(table, layer)     # ALiBi's / T5's score bias, or None
    encoding.max_positions()                     # None = unlimited; learned = model.max_len

Adding an encoding is one subclass of :class:`PositionalEncoding` (overriding only what it
changes), its tests, and one line in ``architecture.ENCODINGS`` (docs/design.md has a worked
example).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab.config import ModelConfig
from attnlab.errors import AttnlabError, ConfigError

# (q_positions [pbatch, q_len], k_positions [pbatch, k_len]) -> float32 [pbatch, heads, q_len,
# k_len]: an additive score bias, bound to one layer's parameters where it has any.
Bias = Callable[[jax.Array, jax.Array], jax.Array]


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
      name: the ``model.pos_encoding`` value, its key in ``architecture.ENCODINGS``.
      title: how messages name it ("" = the name).
      range_name: what :meth:`max_positions` counts, for range errors.
      rescalings: ``{method: function(cfg, factor, train_length) -> cfg}``, how the encoding may
        be changed to evaluate at ``factor`` x the training context ``train_length``
        (``architecture.rescaled``).
      fields: the ``model.*`` fields only this encoding reads (set while another encoding is
        used, they are refused).
    """

    cfg: ModelConfig = dataclasses.field(repr=False)

    name = ""
    title = ""
    range_name = "positional encoding"
    rescalings = {UNSCALED: unscaled}
    fields = ()

    # --- configuration -----------------------------------------------------------------------

    def validate(self) -> None:
        """Raises :class:`ConfigError` (naming the field) if ``cfg`` breaks this encoding's
        constraints. Called by ``resolve``."""

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
        ``q_positions [pbatch, q_len]`` and ``k_positions [pbatch, k_len]``; None: no bias. An
        encoding with trained bias parameters (T5) takes them as a keyword ``params``, which
        :meth:`layer_bias` binds."""
        return None

    def for_encoder(self) -> PositionalEncoding:
        """The encoding as an encoder's self-attention uses it (keys on both sides of the
        query); itself for every encoding whose equations are already symmetric in ``i - j``
        or absolute (ALiBi's ``-m |i - j|``, RoPE, learned, sinusoidal, none)."""
        return self

    def layer_bias(self, table: nnx.Param | jax.Array | None, layer) -> Bias | None:
        """Layer ``layer``'s score bias as a function of positions (:data:`Bias`), bound to the
        part of ``table`` (:meth:`init_params`) that layer reads; None when the encoding adds
        no bias (the attention may then use fused kernels). ``layer`` may be traced (a scan)."""
        return self.bias if self.adds_score_bias() else None

    # --- what the encoding touches (for the rules between parts) -----------------------------

    def adds_score_bias(self) -> bool:
        """Whether it adds a bias to attention scores (ALiBi, T5): it overrides :meth:`bias`."""
        return type(self).bias is not PositionalEncoding.bias

    def transforms_qk(self) -> bool:
        """Whether it transforms q and k (RoPE): it overrides :meth:`transform_qk`."""
        return type(self).transform_qk is not PositionalEncoding.transform_qk

    def adds_to_embeddings(self) -> bool:
        """Whether it changes the embedding layer's output (learned, sinusoidal)."""
        return type(self).embed is not PositionalEncoding.embed

    # --- evaluation at longer contexts -------------------------------------------------------

    def can_rescale(self, method: str) -> bool:
        return method in self.rescalings


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


class LearnedPositions(PositionalEncoding):
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
