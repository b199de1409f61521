"""Sequence mixers: the registry the block asks for its token-mixing layer (``model.mixer``).

    mixer = mixer_for(cfg, layer)        # MIXERS[cfg.mixer](cfg, layer), or softmax for the
                                         # attention layers of a hybrid (model.attention_every)
    module = mixer.build(rngs)           # (x, positions, *, kv=None, start=0) -> (y, kv)
    state = mixer.init_state(batch, max_len)    # decode state, two arrays (see below)
    mixer.state_length(state)            # positions the state can hold; None = unlimited
    mixer.param_count(); mixer.flops_per_token(seq_len)   # counted in model-info and the fits

| mixer | equations | decode state (per layer) |
|---|---|---|
| ``softmax`` | ``softmax(q k^T / sqrt(d) + bias) v`` (attention.py) | K, V ``[b, max_len, kv, hd]`` |
| ``linear`` | ``phi(q)^T S / phi(q)^T z``, ``phi = elu + 1`` (linear_attention.py) | S ``[b, h, hd, hd]``, z ``[b, h, hd]`` |
| ``performer`` | same, ``phi`` = FAVOR+ with ``m = mixer_features`` | S ``[b, h, m, hd]``, z ``[b, h, m]`` |
| ``mamba`` | selective SSM (mamba.py) | conv ``[b, K - 1, E]``, h ``[b, E, N]`` |

A hybrid stack (``model.attention_every = k > 0`` with a non-softmax mixer) makes layers
``k - 1, 2k - 1, ...`` softmax attention. Every layer keeps its FFN and the block's norms and
residuals (the Mamba paper's pure stack has no FFN and twice the layers; ours is the Jamba-style
"Mamba + MLP" layer, so a Mamba model of one shape matches a Transformer's parameter budget more
closely). The mixer module stays at the block's attribute ``attn``, so checkpoints of softmax
models load unchanged.

Adding a mixer is one subclass of :class:`SequenceMixer` and one line in :data:`MIXERS`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx

from attnlab.errors import ConfigError
from attnlab.model import mamba
from attnlab.model.attention import CausalSelfAttention
from attnlab.model.linear_attention import LinearAttention
from attnlab.model.positions import PositionalEncoding, encoding_for
from attnlab.model.scales import score_scale_for

if TYPE_CHECKING:
    from attnlab.model.config import ModelConfig


def adds_score_bias(encoding: PositionalEncoding) -> bool:
    """Whether ``encoding`` adds a bias to attention scores (ALiBi, T5): it overrides ``bias``."""
    return type(encoding).bias is not PositionalEncoding.bias


def transforms_qk(encoding: PositionalEncoding) -> bool:
    """Whether ``encoding`` transforms q and k (RoPE): it overrides ``transform_qk``."""
    return type(encoding).transform_qk is not PositionalEncoding.transform_qk


@dataclasses.dataclass(frozen=True)
class SequenceMixer:
    """The token-mixing layer ``layer`` of a model built from ``cfg`` (immutable, hashable).

    Class attributes: ``name`` (the ``model.mixer`` value, key in :data:`MIXERS`);
    ``layer_constants``: True when each layer holds constants drawn for its index (Performer's
    random features), so its layers cannot be stacked into one scanned module.
    """

    cfg: ModelConfig
    layer: int = 0

    name = ""
    layer_constants = False

    def validate(self) -> None:
        """Rules across fields (raises ConfigError naming the field)."""

    def build(self, rngs: nnx.Rngs) -> nnx.Module:
        raise NotImplementedError

    def init_state(self, batch: int, max_len: int) -> tuple[jax.Array, jax.Array]:
        """The empty decode state for ``batch`` sequences of up to ``max_len`` tokens."""
        raise NotImplementedError

    def state_length(self, state) -> int | None:
        """How many positions ``state`` can hold (a KV cache's length); None = unlimited."""
        return None

    def param_count(self) -> int:
        raise NotImplementedError

    def flops_per_token(self, seq_len: int) -> dict[str, float]:
        """Forward FLOPs per token: ``weights`` (the products with parameter matrices, 2 per
        multiply-add) and ``context`` (everything that mixes tokens: scores, states, scans)."""
        raise NotImplementedError

    def kaplan_context_flops(self, seq_len: int) -> float:
        """Forward token-mixing FLOPs per token in Kaplan's convention (``kaplan_attention``)."""
        return self.flops_per_token(seq_len)["context"]


class Softmax(SequenceMixer):
    """Softmax attention, :class:`~attnlab.model.attention.CausalSelfAttention` (the default)."""

    name = "softmax"

    def validate(self) -> None:
        if self.cfg.attention_every:
            raise ConfigError("model.attention_every",
                              "a hybrid needs a non-softmax model.mixer (linear, performer, mamba)")

    def build(self, rngs, *, bidirectional: bool = False):
        """``bidirectional``: an encoder's layer (no causal mask; the encoder's encoding)."""
        return CausalSelfAttention(self.cfg, rngs=rngs, bidirectional=bidirectional)

    def init_state(self, batch, max_len):
        cfg = self.cfg
        if cfg.attention_window:  # a rolling buffer: the global tokens + the last w (issue #14)
            max_len = cfg.attention_global_tokens + cfg.attention_window
        zeros = jnp.zeros((batch, max_len, cfg.kv_heads, cfg.head_dim), jnp.dtype(cfg.dtype))
        return zeros, zeros

    def state_length(self, state):
        return None if self.cfg.attention_window else state[0].shape[1]

    def keys_per_query(self, seq_len: int) -> int:
        """Keys a query attends to in a context of ``seq_len``: all of them (no causal halving),
        or at most ``window + global tokens`` with a sliding window."""
        cfg = self.cfg
        if cfg.attention_window:
            return min(seq_len, cfg.attention_window + cfg.attention_global_tokens)
        return seq_len

    def param_count(self):
        cfg = self.cfg
        d, hd = cfg.d_model, cfg.head_dim
        count = d * cfg.n_heads * hd + 2 * d * cfg.kv_heads * hd + cfg.n_heads * hd * d
        if cfg.qk_norm:
            count += 2 * (2 * hd if cfg.norm == "layernorm" else hd)
        return count + score_scale_for(cfg).param_count()  # a learned temperature per head

    def flops_per_token(self, seq_len):
        """Hoffmann et al. 2022, Appendix F: projections; ``QK^T`` ``2 T d_attn``, softmax
        ``3 H T``, ``PV`` ``2 T d_attn`` (every query against all ``T`` keys; with a sliding
        window ``T`` is :meth:`keys_per_query`, the band's width)."""
        cfg = self.cfg
        d, hd = cfg.d_model, cfg.head_dim
        d_attn = cfg.n_heads * hd
        seq_len = self.keys_per_query(seq_len)
        weights = 2.0 * d * (cfg.n_heads * hd + 2 * cfg.kv_heads * hd) + 2.0 * d_attn * d
        context = 2.0 * seq_len * d_attn + 3.0 * cfg.n_heads * seq_len + 2.0 * seq_len * d_attn
        return {"weights": weights, "context": context}

    def kaplan_context_flops(self, seq_len):
        """Kaplan et al. 2020, Table 1: ``2 n_ctx d_attn`` (the ``QK^T`` products only)."""
        return 2.0 * self.keys_per_query(seq_len) * self.cfg.n_heads * self.cfg.head_dim


class Linear(SequenceMixer):
    """Causal linear attention with ``phi = elu + 1`` (Katharopoulos et al. 2020)."""

    name = "linear"

    def features(self) -> int | None:
        """Performer's m; None for elu+1 (``m = head_dim``)."""
        return None

    @property
    def m(self) -> int:
        return self.cfg.head_dim if self.features() is None else self.features()

    def validate(self):
        cfg = self.cfg
        encoding = encoding_for(cfg)
        if adds_score_bias(encoding):
            raise ConfigError("model.pos_encoding", (
                f"{cfg.pos_encoding!r} adds a bias to attention scores, which "
                f"model.mixer={self.name} never forms; use rope, learned, sinusoidal or none"))
        if cfg.n_kv_heads not in (None, cfg.n_heads):
            raise ConfigError("model.n_kv_heads",
                              f"model.mixer={self.name} has one key/value head per query head")
        if cfg.qk_norm and not cfg.attention_every:
            raise ConfigError("model.qk_norm",
                              f"model.mixer={self.name} has no softmax layer to normalise q, k for")
        if cfg.mixer_chunk <= 0:
            raise ConfigError("model.mixer_chunk", f"must be positive, got {cfg.mixer_chunk}")

    def build(self, rngs):
        return LinearAttention(self.cfg, encoding_for(self.cfg), layer=self.layer,
                               features=self.features(), rngs=rngs)

    def init_state(self, batch, max_len):
        cfg = self.cfg
        return (jnp.zeros((batch, cfg.n_heads, self.m, cfg.head_dim), jnp.float32),
                jnp.zeros((batch, cfg.n_heads, self.m), jnp.float32))

    def param_count(self):
        d, d_attn = self.cfg.d_model, self.cfg.n_heads * self.cfg.head_dim
        return 4 * d * d_attn

    def feature_flops(self) -> float:
        """FLOPs of ``phi`` per head and vector (elu+1: elementwise, not counted)."""
        return 0.0

    def flops_per_token(self, seq_len):
        """Per head, per token of :func:`causal_linear_attention` with chunk ``C``: intra-chunk
        scores ``2 C m`` (+ ``C`` mask), ``A V`` ``2 C d``, row sums ``C``; across chunks
        ``phi(q) S`` ``2 m d``, ``phi(q) z`` ``2 m``, state updates ``2 m d + m``; normalise
        ``2 d``; plus the feature maps of q and k."""
        cfg = self.cfg
        d, hd, m = cfg.d_model, cfg.head_dim, self.m
        c = max(1, min(cfg.mixer_chunk, seq_len))
        per_head = (2 * c * m + c + 2 * c * hd + c + 2 * m * hd + 2 * m + 2 * m * hd + m
                    + 2 * hd + 2 * self.feature_flops())
        return {"weights": 8.0 * d * cfg.n_heads * hd, "context": float(cfg.n_heads * per_head)}


class Performer(Linear):
    """Causal linear attention with FAVOR+ positive orthogonal random features
    (Choromanski et al. 2021), ``m = model.mixer_features``, fixed per layer (see
    :mod:`attnlab.model.linear_attention`)."""

    name = "performer"
    layer_constants = True  # its FAVOR+ features are drawn per layer

    def features(self):
        return self.cfg.mixer_features

    def validate(self):
        super().validate()
        if self.cfg.mixer_features <= 0:
            raise ConfigError("model.mixer_features",
                              f"must be positive, got {self.cfg.mixer_features}")

    def feature_flops(self):
        """``W x`` ``2 d m``, ``|x|^2 / 2`` ``2 d + 1``, subtract, exp and ``1/sqrt(m)`` ``3 m``,
        and the ``d^-1/4`` scaling ``d``."""
        hd, m = self.cfg.head_dim, self.m
        return 2.0 * hd * m + 3 * hd + 1 + 3 * m


class Mamba(SequenceMixer):
    """The selective SSM of Mamba (Gu & Dao 2023), :class:`attnlab.model.mamba.Mamba`."""

    name = "mamba"

    def validate(self):
        cfg = self.cfg
        encoding = encoding_for(cfg)
        if not cfg.attention_every and (adds_score_bias(encoding) or transforms_qk(encoding)):
            raise ConfigError("model.pos_encoding", (
                f"{cfg.pos_encoding!r} acts inside attention, and model.mixer=mamba without "
                "model.attention_every has none; use none, learned or sinusoidal"))
        if cfg.qk_norm and not cfg.attention_every:
            raise ConfigError("model.qk_norm", "model.mixer=mamba has no q, k to normalise")
        for name in ("ssm_state", "ssm_expand", "ssm_conv"):
            if getattr(cfg, name) <= 0:
                raise ConfigError(f"model.{name}", f"must be positive, got {getattr(cfg, name)}")

    def build(self, rngs):
        return mamba.Mamba(self.cfg, rngs=rngs)

    def init_state(self, batch, max_len):
        return mamba.init_state(self.cfg, batch)

    def param_count(self):
        return mamba.param_count(self.cfg)

    def flops_per_token(self, seq_len):
        flops = mamba.forward_flops(self.cfg)
        return {"weights": flops["matmuls"],
                "context": flops["conv"] + flops["selective"] + flops["scan"]}


MIXERS: dict[str, type[SequenceMixer]] = {
    mixer.name: mixer for mixer in (Softmax, Linear, Performer, Mamba)
}


def mixer_for(cfg: ModelConfig, layer: int = 0) -> SequenceMixer:
    """Layer ``layer``'s mixer: softmax on every ``attention_every``-th layer of a hybrid,
    ``MIXERS[cfg.mixer]`` elsewhere."""
    if cfg.attention_every and (layer + 1) % cfg.attention_every == 0:
        return Softmax(cfg, layer)
    return MIXERS[cfg.mixer](cfg, layer)


def layer_mixers(cfg: ModelConfig) -> list[SequenceMixer]:
    """Every layer's mixer, in order."""
    return [mixer_for(cfg, layer) for layer in range(cfg.n_layers)]


def validate_mixer(cfg: ModelConfig) -> None:
    """The ``model.mixer`` rules (called by the config's validation)."""
    if not 0 <= cfg.attention_every <= cfg.n_layers:
        raise ConfigError("model.attention_every",
                          f"must be in [0, model.n_layers={cfg.n_layers}], got "
                          f"{cfg.attention_every}")
    MIXERS[cfg.mixer](cfg).validate()


__all__ = ["MIXERS", "SequenceMixer", "Softmax", "Linear", "Performer", "Mamba", "mixer_for",
           "layer_mixers", "validate_mixer", "adds_score_bias", "transforms_qk"]
