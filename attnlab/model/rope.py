"""Rotary position embedding (Su et al. 2021, RoFormer, eq. 34) and its rescalings for longer
contexts: position interpolation (Chen et al. 2023), NTK-aware bases (bloc97 2023), dynamic NTK
(emozilla and bloc97 2023) and YaRN (Peng et al. 2023).

Shapes: ``positions`` int32 ``[pbatch, seq]``; heads ``[batch, seq, heads, head_dim]``. Phases are
float32 (bf16 would round position 257 to 256); frequencies float64 on the host (dynamic NTK's:
float32 on the device, from each call's positions).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError
from attnlab.model.positions import UNSCALED, PositionalEncoding, RescalingError, unscaled

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


YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0  # Peng et al. 2023, sec. 3.2 (beta, alpha), for LLaMA


def yarn_boundary_dimension(turns: float, head_dim: int, theta: float,
                            original_length: int) -> float:
    """The (fractional) pair index ``i`` whose wavelength ``2 pi theta^(2i/d)`` fits ``turns``
    times into ``original_length``: solving ``L / (2 pi theta^(2i/d)) = turns`` for ``i`` gives
    ``d ln(L / (2 pi turns)) / (2 ln theta)`` (the YaRN authors' ``find_correction_dim``)."""
    return (head_dim * math.log(original_length / (turns * 2.0 * math.pi))
            / (2.0 * math.log(theta)))


def yarn_frequencies(head_dim: int, theta: float, factor: float, original_length: int,
                     beta_fast: float = YARN_BETA_FAST, beta_slow: float = YARN_BETA_SLOW
                     ) -> np.ndarray:
    """YaRN's "NTK-by-parts" frequencies as the YaRN authors' code and Hugging Face compute them
    (Peng et al. 2023, eqs. 17-19, with the ramp over the pair index); float64 ``[head_dim/2]``.

    The pairs that turn more than ``beta_fast`` times within the original context ``L`` keep
    their frequency, those that turn fewer than ``beta_slow`` times are interpolated like PI
    (divided by ``s``). The boundaries are the pair indices :func:`yarn_boundary_dimension` of
    ``beta_fast`` (low, rounded down) and ``beta_slow`` (high, rounded up), clipped to
    ``[0, d/2 - 1]``; between them the share of the original frequency falls linearly in the
    index: with ``ramp_i = clip((i - low) / (high - low), 0, 1)`` (the paper's ``1 - gamma``),
    ``h_i = ramp_i theta_i / s + (1 - ramp_i) theta_i``. (The paper writes the ramp linear in
    ``r = L / lambda``, which is exponential in the index; the released code, and with it every
    deployed YaRN model, ramps in the index.)
    """
    inv_freq = rope_inverse_frequencies(head_dim, theta)
    low = math.floor(yarn_boundary_dimension(beta_fast, head_dim, theta, original_length))
    high = math.ceil(yarn_boundary_dimension(beta_slow, head_dim, theta, original_length))
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:  # one boundary: a step (the reference code's guard against 0/0)
        high += 0.001
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    return ramp * inv_freq / float(factor) + (1.0 - ramp) * inv_freq


def dynamic_ntk_frequencies(head_dim: int, theta: float, factor: float, original_length: int,
                            length) -> jax.Array:
    """Dynamic NTK scaling (emozilla and bloc97 2023; transformers'
    ``_compute_dynamic_ntk_parameters``): a forward call over positions ``0 .. length - 1``
    past the original context ``L0`` uses the base
    ``theta' = theta (s L / L0 - (s - 1))^(d / (d - 2))``, ``L = length``, so the base grows
    with the sequence (the NTK-aware base of factor ``s L / L0 - s + 1``); calls within ``L0``
    use ``theta`` itself (the frequencies of the unscaled model, exactly).

    Args:
      length: int, or a traced int32 scalar: one past the call's largest position.

    Returns:
      float32 ``[head_dim/2]``.
    """
    length = jnp.asarray(length, jnp.float32)
    grown = float(factor) * length / float(original_length) - (float(factor) - 1.0)
    base = float(theta) * jnp.maximum(grown, 1.0) ** (head_dim / (head_dim - 2))
    exponents = jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim
    unscaled = jnp.asarray(rope_inverse_frequencies(head_dim, theta), jnp.float32)
    return jnp.where(length > original_length, base ** -exponents, unscaled)


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
# factor its q and k are multiplied by (YaRN's temperature; 1 otherwise), for a call at
# ``positions [pbatch, seq]`` (only dynamic NTK depends on them; None: no call).
def _unchanged_frequencies(cfg: ModelConfig, positions=None) -> tuple[np.ndarray, float]:
    return rope_inverse_frequencies(cfg.head_dim, cfg.rope_theta), 1.0


def _pi(cfg: ModelConfig, positions=None) -> tuple[np.ndarray, float]:
    return pi_frequencies(rope_inverse_frequencies(cfg.head_dim, cfg.rope_theta),
                          cfg.rope_factor), 1.0


def _yarn(cfg: ModelConfig, positions=None) -> tuple[np.ndarray, float]:
    return (yarn_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_factor,
                             cfg.rope_original_len),
            yarn_attention_factor(cfg.rope_factor))


def _dynamic(cfg: ModelConfig, positions=None) -> tuple[jax.Array | np.ndarray, float]:
    if positions is None:  # no call: the frequencies within the original context
        return _unchanged_frequencies(cfg)
    return (dynamic_ntk_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_factor,
                                    cfg.rope_original_len, jnp.max(positions) + 1), 1.0)


ROPE_FREQUENCIES = {UNSCALED: _unchanged_frequencies, "pi": _pi, "yarn": _yarn,
                    "dynamic": _dynamic}
# The scalings whose ramp or growth is relative to the original context model.rope_original_len.
NEEDS_ORIGINAL_LENGTH = (_yarn, _dynamic)


class RoPE(PositionalEncoding):
    """Rotates every query and key head by its position (Su et al. 2021, eq. 34), so that
    ``<R(m) q, R(n) k>`` depends only on ``m - n``; base ``model.rope_theta``.

    Rescalings for longer contexts (evaluation settings; each returns a model config):
    ``ntk`` raises the base (:func:`ntk_rope_theta`); ``pi`` divides the frequencies by ``s``
    (:func:`pi_frequencies`, Chen et al. 2023); ``yarn`` interpolates by parts and multiplies q
    and k by ``0.1 ln s + 1`` (:func:`yarn_frequencies`, Peng et al. 2023). PI and YaRN are the
    config fields ``model.rope_scaling`` / ``rope_factor`` / ``rope_original_len``, and so is
    dynamic NTK (``rope_scaling=dynamic``: the base grows with each call's length past
    ``rope_original_len``, :func:`dynamic_ntk_frequencies`), which checkpoints bring
    (``attnlab import-hf``) but ``attnlab extrapolate`` does not offer.
    """

    name = "rope"
    title = "RoPE"
    rescalings = {UNSCALED: unscaled, "ntk": _ntk_scaled, "pi": _pi_scaled, "yarn": _yarn_scaled}
    fields = ("rope_scaling", "rope_factor", "rope_original_len")

    def validate(self) -> None:
        cfg = self.cfg
        if cfg.head_dim % 2:
            raise ConfigError(
                "model.pos_encoding",
                f"rope needs an even head_dim, but d_model/n_heads = {cfg.head_dim}",
            )
        if cfg.rope_scaling not in ROPE_FREQUENCIES:
            raise ConfigError("model.rope_scaling", f"unknown value {cfg.rope_scaling!r}; valid "
                                                    f"values are {', '.join(ROPE_FREQUENCIES)}")
        if cfg.rope_scaling != UNSCALED and not cfg.rope_factor >= 1.0:
            raise ConfigError("model.rope_factor",
                              f"must be >= 1 with model.rope_scaling={cfg.rope_scaling}, "
                              f"got {cfg.rope_factor}")
        if ROPE_FREQUENCIES[cfg.rope_scaling] in NEEDS_ORIGINAL_LENGTH \
                and cfg.rope_original_len < 1:
            raise ConfigError("model.rope_original_len",
                              f"model.rope_scaling={cfg.rope_scaling} needs the original "
                              "(training) context length (>= 1)")

    def frequencies(self, positions=None) -> tuple[np.ndarray | jax.Array, float]:
        """``(inv_freq [head_dim/2], q/k multiplier)`` under ``model.rope_scaling`` for a call at
        ``positions`` (float64 NumPy; dynamic NTK: float32, from the largest position, traced
        when they are)."""
        return ROPE_FREQUENCIES[self.cfg.rope_scaling](self.cfg, positions)

    def transform_qk(self, q, k, positions):
        # Dynamic NTK: the call's own length sets the base. A decoding step's new keys are
        # rotated at its length and the cached keys keep the rotation they had (transformers'
        # cached generation), so past the original context decoding is not a full forward.
        inv_freq, multiplier = self.frequencies(positions)
        q = apply_rope(q, positions, inv_freq=inv_freq)
        k = apply_rope(k, positions, inv_freq=inv_freq)
        if multiplier != 1.0:
            q, k = q * multiplier, k * multiplier
        return q, k
