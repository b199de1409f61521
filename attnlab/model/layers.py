"""Building blocks: linear layers (bias-free unless ``model.linear_bias``), LayerNorm / RMSNorm, feed-forward nets, dropout.

Dtype policy: parameters are float32; layers compute in ``cfg.dtype`` (float32 or bfloat16);
norm statistics are always float32.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx

if TYPE_CHECKING:  # annotations only: model/config.py imports the mixer registry, which imports us
    from attnlab.model.config import ModelConfig


def compute_dtype(cfg: ModelConfig) -> jnp.dtype:
    return jnp.dtype(cfg.dtype)


def dense(cfg: ModelConfig, d_in: int, d_out: int, std: float, rngs: nnx.Rngs, *,
          bias: bool = False) -> nnx.Linear:
    """``[d_in, d_out]`` projection ``x W (+ b)``, kernel ~ N(0, std^2), float32 params computed
    in ``cfg.dtype``. ``bias``: a ``[d_out]`` bias, zero-initialised (GPT-2, Radford et al.
    2019); callers pass ``cfg.linear_bias`` where the model has one (attention projections,
    FFN), so the bias-free mixers (linear attention, Mamba) keep their parameter counts."""
    return nnx.Linear(
        d_in,
        d_out,
        use_bias=bias,
        kernel_init=nnx.initializers.normal(std),
        bias_init=nnx.initializers.zeros,
        dtype=compute_dtype(cfg),
        param_dtype=jnp.float32,
        rngs=rngs,
    )


class LayerNorm(nnx.Module):
    """``y = (x - mean) / sqrt(var + eps) * scale + bias`` over the last axis (Ba et al. 2016)."""

    def __init__(self, dim: int, eps: float):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
        self.bias = nnx.Param(jnp.zeros((dim,), jnp.float32))

    def __call__(self, x: jax.Array) -> jax.Array:
        """``[..., dim] -> [..., dim]`` in ``x.dtype``; statistics in float32."""
        x32 = x.astype(jnp.float32)
        mean = x32.mean(axis=-1, keepdims=True)
        var = jnp.square(x32 - mean).mean(axis=-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps) * self.scale[...] + self.bias[...]
        return y.astype(x.dtype)


class RMSNorm(nnx.Module):
    """``y = x / sqrt(mean(x^2) + eps) * scale`` over the last axis (Zhang & Sennrich 2019)."""

    def __init__(self, dim: int, eps: float):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))

    def __call__(self, x: jax.Array) -> jax.Array:
        """``[..., dim] -> [..., dim]`` in ``x.dtype``; statistics in float32."""
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.square(x32).mean(axis=-1, keepdims=True) + self.eps)
        return (y * self.scale[...]).astype(x.dtype)


def make_norm(cfg: ModelConfig, dim: int) -> LayerNorm | RMSNorm:
    return LayerNorm(dim, cfg.norm_eps) if cfg.norm == "layernorm" else RMSNorm(dim, cfg.norm_eps)


class FeedForward(nnx.Module):
    """Position-wise FFN, ``d_model -> d_ff -> d_model`` (Vaswani et al. 2017, eq. 2).

    * relu / gelu: ``act(x W_in) W_out`` (GELU is the tanh approximation, as in GPT-2).
    * swiglu (Shazeer 2020): ``(silu(x W_gate) * (x W_in)) W_out``.

    Every ``x W`` is ``x W + b`` with ``model.linear_bias`` (biases ``[d_ff]``, ``[d_model]``).

    ``W_out`` is a residual output projection (std scaled by ``1/sqrt(2 n_layers)``).
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.kind = cfg.ffn
        d, d_ff = cfg.d_model, cfg.ffn_dim
        residual_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
        bias = cfg.linear_bias
        self.w_in = dense(cfg, d, d_ff, cfg.init_std, rngs, bias=bias)
        if cfg.ffn == "swiglu":
            self.w_gate = dense(cfg, d, d_ff, cfg.init_std, rngs, bias=bias)
        self.w_out = dense(cfg, d_ff, d, residual_std, rngs, bias=bias)

    def __call__(self, x: jax.Array) -> jax.Array:
        """``[batch, seq, d_model] -> [batch, seq, d_model]``."""
        if self.kind == "relu":
            hidden = jax.nn.relu(self.w_in(x))
        elif self.kind == "gelu":
            hidden = jax.nn.gelu(self.w_in(x), approximate=True)
        else:
            hidden = jax.nn.silu(self.w_gate(x)) * self.w_in(x)
        return self.w_out(hidden)


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """Inverted dropout; the identity when ``key`` is None or ``rate`` is 0 (evaluation)."""
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)
