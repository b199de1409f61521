"""How the attention scores are scaled: the temperature of the softmax, one class per choice.

    s[b, h, i, j] = scale * <q[b, i, h], k[b, j, h // g]> + bias     (attention.attention_scores)

Each class turns the layer's ``(q, k)`` into ``(q, k, scale)`` for the score function; a per-head
factor is folded into ``q`` (query head ``h`` is multiplied by ``tau[h]``) and ``scale`` is then 1,
so every attention implementation (einsum, XLA, query blocks, GQA) takes it unchanged.

    scaler = resolve(cfg).score_scale            # SCORE_SCALES[cfg.attention_scale](cfg)
    params = scaler.init_params(rngs)             # None, or a per-head nnx.Param (one per layer)
    q, k, scale = scaler.apply(q, k, params)      # before the encoding's transform_qk (RoPE)

Shapes: ``q [batch, seq, heads, head_dim]``, ``k [batch, seq, kv_heads, head_dim]``.
"""

from __future__ import annotations

import dataclasses
import math
import jax
import jax.numpy as jnp
from flax import nnx

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError

L2_EPS = 1e-6  # cosine attention: q / max(|q|, eps)


@dataclasses.dataclass(frozen=True)
class ScoreScale:
    """One choice of ``model.attention_scale`` for a model built from ``cfg`` (immutable).

    Class attributes: ``name`` (the config value, its key in ``architecture.SCORE_SCALES``);
    ``fields``: the ``model.*`` fields only this scale reads; ``mup_rule``: it is muP's
    (``model.parameterization=mup`` accepts only such a scale).

    ``base_head_dim``: set by muP's parameterisation (``Parameterization.anchored``), the head
    width of its base model; 0 otherwise.
    """

    cfg: ModelConfig = dataclasses.field(repr=False)
    base_head_dim: int = 0

    name = ""
    fields = ()
    mup_rule = False

    def validate(self) -> None:
        """Raises :class:`ConfigError` naming the fields of a bad combination."""

    def param_count(self) -> int:
        """Scalars of :meth:`init_params` per layer (non-embedding parameters)."""
        return 0

    def init_params(self, rngs: nnx.Rngs) -> nnx.Param | None:
        """The layer's trainable temperature (stored at ``attn.temperature``), or None."""
        return None

    def apply(self, q: jax.Array, k: jax.Array, params: nnx.Param | None
              ) -> tuple[jax.Array, jax.Array, float]:
        """``(q, k, scale)`` for :func:`attnlab.model.attention.attention_scores`."""
        return q, k, self.scale()

    def scale(self) -> float:
        return 1.0 / math.sqrt(self.cfg.head_dim)


class InverseSqrt(ScoreScale):
    """``1/sqrt(d_k)`` (Vaswani et al. 2017, eq. 1): keeps the logits' variance at that of one
    product of unit-variance entries at init. The default."""

    name = "rsqrt"


class MuPScale(ScoreScale):
    """``1/d_k`` (muP, Yang et al. 2022, Tensor Programs V section 4): once q and k are correlated
    (after training) their product grows like ``d_k``, so ``1/d_k`` keeps the logits ``O(1)``
    across widths. Under ``model.parameterization=mup`` it is anchored at the base head width
    ``d_0``: ``sqrt(d_0) / d_k``, written ``(1/sqrt(d_k)) sqrt(d_0 / d_k)`` so that at the base
    it is the standard ``1/sqrt(d_k)`` to the last bit."""

    name = "mup"
    mup_rule = True

    def scale(self) -> float:
        hd = self.cfg.head_dim
        if self.base_head_dim:
            return 1.0 / math.sqrt(hd) * math.sqrt(self.base_head_dim / hd)
        return 1.0 / hd


class Unscaled(ScoreScale):
    """No scale (1): the notes' saturation experiment; the logits' std grows like ``sqrt(d_k)``."""

    name = "none"

    def scale(self) -> float:
        return 1.0


def _per_head(q: jax.Array, tau: jax.Array) -> jax.Array:
    """``q [batch, seq, heads, head_dim] * tau [heads]`` (in float32, cast back)."""
    return (q.astype(jnp.float32) * tau[None, None, :, None]).astype(q.dtype)


class LearnedTemperature(ScoreScale):
    """A learnable temperature per head, ``tau [heads]`` initialised to ``1/sqrt(d_k)`` (so the
    model starts as the default): ``s = tau_h <q, k>``."""

    name = "learned"

    def param_count(self) -> int:
        return self.cfg.n_heads

    def init_params(self, rngs):
        return nnx.Param(jnp.full((self.cfg.n_heads,), 1.0 / math.sqrt(self.cfg.head_dim),
                                  jnp.float32))

    def apply(self, q, k, params):
        return _per_head(q, params[...]), k, 1.0


def l2_normalize(x: jax.Array) -> jax.Array:
    """``x / max(|x|_2, eps)`` over ``head_dim`` (float32, cast back); ``[..., head_dim]``."""
    x32 = x.astype(jnp.float32)
    norm = jnp.sqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True))
    return (x32 / jnp.maximum(norm, L2_EPS)).astype(x.dtype)


class CosineScale(ScoreScale):
    """Cosine attention (Henry et al. 2020, "Query-Key Normalization for Transformers", eq. 3):
    q and k L2-normalised per head (not RMSNorm: only unit vectors make ``<q, k>`` a cosine),
    ``s = tau_h cos(q, k)`` in ``[-|tau_h|, |tau_h|]``, a learnable ``tau [heads]`` initialised to
    ``model.cosine_tau_init`` (Henry et al. initialise their scale to ``log2(L^2 - L)`` for the
    97.5th-percentile length ``L``: 9.95 at L = 32, 12.0 at L = 64; the default 10).
    RoPE rotations keep norms, so the bound holds with RoPE too (YaRN's q/k factor widens it).
    """

    name = "cosine"
    fields = ("cosine_tau_init",)

    def validate(self) -> None:
        if self.cfg.qk_norm:
            raise ConfigError("model.attention_scale",
                              "cosine attention L2-normalises q and k itself; it cannot be "
                              "combined with model.qk_norm=True")
        if not math.isfinite(self.cfg.cosine_tau_init) or self.cfg.cosine_tau_init <= 0:
            raise ConfigError("model.cosine_tau_init",
                              f"must be positive, got {self.cfg.cosine_tau_init}")

    def param_count(self) -> int:
        return self.cfg.n_heads

    def init_params(self, rngs):
        return nnx.Param(jnp.full((self.cfg.n_heads,), self.cfg.cosine_tau_init, jnp.float32))

    def apply(self, q, k, params):
        return _per_head(l2_normalize(q), params[...]), l2_normalize(k), 1.0
