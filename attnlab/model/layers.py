"""Building blocks: linear layers (bias-free unless ``model.linear_bias``), the norms (LayerNorm,
RMSNorm: ``model.norm``), dropout, the remat policies.

Dtype policy: parameters are float32; layers compute in ``cfg.dtype`` (float32 or bfloat16);
norm statistics are always float32.
"""

from __future__ import annotations

import functools
import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from attnlab.config import ModelConfig


# model.remat -> jax.checkpoint policy (applied per layer by attnlab.model.transformer.run_layer;
# "none" calls the layer as is). "save_dots" keeps the outputs of matmuls without batch
# dimensions (the q/k/v/o and FFN projections: cheap to keep, [batch, seq, d]-sized, and the
# FLOPs of a layer) and recomputes everything else, notably the attention scores and
# probabilities ([batch, heads, seq, seq], batched dots), the part that grows with seq^2.
# (checkpoint_dots would keep those too, saving little memory at long context.)
# The projections' matmuls sit inside a custom VJP (``project`` below), where the dots policy
# cannot see them, so their outputs are also saved by name.
PROJECTION = "projection"
REMAT_POLICIES = {  # model.remat -> the jax.checkpoint policy (None: the layer runs as is)
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "save_dots": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        jax.checkpoint_policies.save_only_these_names(PROJECTION)),
}


def compute_dtype(cfg: ModelConfig) -> jnp.dtype:
    return jnp.dtype(cfg.dtype)


# Projections ``x W`` get a hand-written backward that only orders the weight-gradient matmul.
# For ``y = x W`` autodiff writes ``dW = (g^T x)^T``; XLA:CPU's dot wants its contracted (token)
# axis minor on the left operand, so it copies ``g`` into ``[d_out, tokens]`` first, and folds
# into that transposing copy whatever elementwise backward math produced ``g`` (the GELU's, the
# softmax's), recomputed in strided order. Writing ``dW = x^T g`` when ``x`` is the narrower
# operand transposes the narrower one instead, and ``g`` is read as it is (the bias-free step
# 1.3x faster at d_model 128 and 256; benchmarks/peer_pytorch.py). Same products
# as autodiff, so the same numbers up to float rounding (tests/test_model_bias_norms.py).


def project(x: jax.Array, kernel: jax.Array, preferred_element_type=None) -> jax.Array:
    """``x W``: ``[..., d_in] x [d_in, d_out] -> [..., d_out]`` (result in
    ``preferred_element_type`` when given, as :func:`jax.lax.dot_general`), named PROJECTION
    for the ``save_dots`` remat policy."""
    return checkpoint_name(_project(x, kernel, preferred_element_type),
                           PROJECTION)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _project(x, kernel, preferred_element_type):
    return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())),
                               preferred_element_type=preferred_element_type)


def _project_forward(x, kernel, preferred_element_type):
    return _project(x, kernel, preferred_element_type), (x, kernel)


def _project_backward(preferred_element_type, residuals, g):
    """``dx = g W^T``; ``dW = x^T g`` over all tokens, the narrower of ``x`` and ``g``
    transposed (see above). Cast back to the operands' dtypes, as autodiff does.

    A wider ``g`` (float32 logits' gradient of a bfloat16 projection) is rounded to the
    operands' dtype first, as autodiff of ``project(x, W).astype(float32)`` would: otherwise
    both backward products run in float32 (the weight upcast), the largest matmuls of a step."""
    x, kernel = residuals
    g = g.astype(x.dtype)
    dx = jax.lax.dot_general(g, kernel, (((g.ndim - 1,), (1,)), ((), ())),
                             preferred_element_type=preferred_element_type)
    x_rows, g_rows = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    over_tokens = (((0,), (0,)), ((), ()))
    if x.shape[-1] <= g.shape[-1]:
        dkernel = jax.lax.dot_general(x_rows, g_rows, over_tokens,
                                      preferred_element_type=preferred_element_type)
    else:
        dkernel = jax.lax.dot_general(g_rows, x_rows, over_tokens,
                                      preferred_element_type=preferred_element_type).T
    return dx.astype(x.dtype), dkernel.astype(kernel.dtype)


_project.defvjp(_project_forward, _project_backward)


def _projection_dot_general(x, kernel, dimension_numbers, precision=None,
                            preferred_element_type=None, out_sharding=None):
    """nnx.Linear's ``dot_general``: :func:`project` for its ``x W`` contraction."""
    if dimension_numbers != (((x.ndim - 1,), (0,)), ((), ())) or precision is not None \
            or out_sharding is not None:
        return jax.lax.dot_general(x, kernel, dimension_numbers, precision=precision,
                                   preferred_element_type=preferred_element_type,
                                   out_sharding=out_sharding)
    return project(x, kernel, preferred_element_type)


def dense(cfg: ModelConfig, d_in: int, d_out: int, std: float, rngs: nnx.Rngs, *,
          bias: bool = False, kernel_init=None) -> nnx.Linear:
    """``[d_in, d_out]`` projection ``x W (+ b)``, kernel ~ N(0, std^2) (or ``kernel_init``, a
    ``(key, shape, dtype)`` initialiser, where a paper draws otherwise), float32 params computed
    in ``cfg.dtype``. ``bias``: a ``[d_out]`` bias, zero-initialised (GPT-2, Radford et al.
    2019); callers pass ``cfg.linear_bias`` where the model has one (attention projections,
    FFN), so the bias-free mixers (linear attention, Mamba) keep their parameter counts. The
    bias draws no random key, so a model with biases starts as the same function, with the same
    kernels, as the model without them."""
    linear = nnx.Linear(
        d_in,
        d_out,
        use_bias=False,
        kernel_init=kernel_init or nnx.initializers.normal(std),
        dtype=compute_dtype(cfg),
        param_dtype=jnp.float32,
        dot_general=_projection_dot_general,
        rngs=rngs,
    )
    if bias:  # added after construction: nnx.Linear would draw (and waste) a key for it
        linear.use_bias = True
        linear.bias = nnx.Param(jnp.zeros((d_out,), jnp.float32))
    return linear


# The normalisations' backward passes are written by hand (custom VJPs). Autodiff of the
# textbook formulas leaves the backward as a chain of elementwise ops on x, mean and rstd, and
# XLA:CPU folds that chain (and, through the residual stream, the chains of every norm above it)
# into the transposing copies that feed the weight-gradient matmuls, recomputing it there in
# strided order (at d_model 384 and 6 layers, copy fusions with up to 120 inputs, 984
# in all; with these VJPs at most 7, 137 in all, and the step ~1.15x faster; see
# benchmarks/hlo_fusions.py). Saving the normalised output and writing the backward in terms of
# it materialises each norm's gradient once. Same numbers as autodiff up to float rounding
# (tested against float64). Forward-mode (jax.jvp) is not defined through a custom VJP.


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def standardize(x: jax.Array, eps: float) -> jax.Array:
    """``x_hat = (x - mean) / sqrt(var + eps)`` over the last axis (Ba et al. 2016, eq. 4),
    ``[..., dim] -> [..., dim]``; the two-pass variance, as before."""
    return _standardize_forward(x, eps)[0]


def _standardize_forward(x, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = jnp.square(x - mean).mean(axis=-1, keepdims=True)
    rstd = jax.lax.rsqrt(var + eps)
    x_hat = (x - mean) * rstd
    return x_hat, (x_hat, rstd)


def _standardize_backward(eps, residuals, g):
    """``dx = rstd (g - mean(g) - x_hat mean(g x_hat))``: the Jacobian of ``x_hat``, which is
    symmetric, applied to ``g`` (Ioffe & Szegedy 2015's batch-norm derivation, per row)."""
    del eps
    x_hat, rstd = residuals
    return (rstd * (g - g.mean(axis=-1, keepdims=True)
                    - x_hat * (g * x_hat).mean(axis=-1, keepdims=True)),)


standardize.defvjp(_standardize_forward, _standardize_backward)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def rms_normalize(x: jax.Array, eps: float) -> jax.Array:
    """``x / sqrt(mean(x^2) + eps)`` over the last axis (Zhang & Sennrich 2019, eq. 4),
    ``[..., dim] -> [..., dim]``."""
    return _rms_forward(x, eps)[0]


def _rms_forward(x, eps):
    rrms = jax.lax.rsqrt(jnp.square(x).mean(axis=-1, keepdims=True) + eps)
    y = x * rrms
    return y, (y, rrms)


def _rms_backward(eps, residuals, g):
    """``dx = rrms (g - y mean(g y))``, ``y`` the normalised output."""
    del eps
    y, rrms = residuals
    return (rrms * (g - y * (g * y).mean(axis=-1, keepdims=True)),)


rms_normalize.defvjp(_rms_forward, _rms_backward)


class LayerNorm(nnx.Module):
    """``y = (x - mean) / sqrt(var + eps) * scale + bias`` over the last axis (Ba et al. 2016);
    the normalisation's backward is :func:`standardize`'s custom VJP."""

    name = "layernorm"
    fields = ()

    @staticmethod
    def param_count(dim: int) -> int:
        return 2 * dim  # scale and bias

    def __init__(self, dim: int, eps: float):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
        self.bias = nnx.Param(jnp.zeros((dim,), jnp.float32))

    def __call__(self, x: jax.Array) -> jax.Array:
        """``[..., dim] -> [..., dim]`` in ``x.dtype``; statistics in float32."""
        y = standardize(x.astype(jnp.float32), self.eps) * self.scale[...] + self.bias[...]
        return y.astype(x.dtype)


class RMSNorm(nnx.Module):
    """``y = x / sqrt(mean(x^2) + eps) * scale`` over the last axis (Zhang & Sennrich 2019);
    the normalisation's backward is :func:`rms_normalize`'s custom VJP."""

    name = "rmsnorm"
    fields = ()

    @staticmethod
    def param_count(dim: int) -> int:
        return dim  # scale

    def __init__(self, dim: int, eps: float):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))

    def __call__(self, x: jax.Array) -> jax.Array:
        """``[..., dim] -> [..., dim]`` in ``x.dtype``; statistics in float32."""
        y = rms_normalize(x.astype(jnp.float32), self.eps)
        return (y * self.scale[...]).astype(x.dtype)


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """Inverted dropout; the identity when ``key`` is None or ``rate`` is 0 (evaluation)."""
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)
