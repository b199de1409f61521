"""Sequence mixers (``model.mixer``): the token-mixing layer of each block, one class per mixer.

    mixer = resolve(cfg).stack.layers[i].mixer   # MIXERS[cfg.mixer], or softmax for the
                                                 # attention layers of a hybrid
    module = mixer.build(rngs)      # (x, positions, *, bias=None, state=None, start=0) -> (y, state)
    state = mixer.init_state(batch, max_len)     # its decode state (a pytree)
    mixer.state_length(state)       # positions the state can hold; None = unlimited
    mixer.param_count(); mixer.flops_per_token(seq_len)   # counted in model-info and the fits

| mixer | equations | decode state (per layer) |
|---|---|---|
| ``softmax`` | ``softmax(q k^T / sqrt(d) + bias) v`` (attention.py) | K, V ``[b, max_len, kv, hd]`` |
| ``linear`` | ``phi(q)^T S / phi(q)^T z``, ``phi = elu + 1`` (linear_attention.py) | S ``[b, h, hd, hd]``, z ``[b, h, hd]`` |
| ``performer`` | same, ``phi`` = FAVOR+ with ``m = mixer_features`` | S ``[b, h, m, hd]``, z ``[b, h, m]`` |
| ``mamba`` | selective SSM (mamba.py) | conv ``[b, K - 1, E]``, h ``[b, E, N]`` |

Every mixer is handed the parts it may use (the layer's encoding, mask, score scale and norm
class) when it is resolved, and every module takes the same call: ``bias`` is the layer's
score bias (only softmax attention forms scores; the rules refuse a bias with the others).

A hybrid stack (``model.attention_every = k > 0`` with a non-softmax mixer) makes layers
``k - 1, 2k - 1, ...`` softmax attention. Every layer keeps its FFN and the block's norms and
residuals (the Mamba paper's pure stack has no FFN and twice the layers; ours is the Jamba-style
"Mamba + MLP" layer, so a Mamba model of one shape matches a Transformer's parameter budget more
closely). The mixer module stays at the block's attribute ``attn``, so checkpoints of softmax
models load unchanged.

Adding a mixer is one subclass of :class:`SequenceMixer` and one line in
``architecture.MIXERS``.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from flax import nnx

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError
from attnlab.model import mamba
from attnlab.model.attention import SelfAttention
from attnlab.model.linear_attention import LinearAttention
from attnlab.model.masks import Mask
from attnlab.model.positions import PositionalEncoding
from attnlab.model.scales import ScoreScale


@dataclasses.dataclass(frozen=True)
class SequenceMixer:
    """The token-mixing layer ``layer`` of a model built from ``cfg`` with its parts (immutable,
    hashable).

    Class attributes: ``name`` (the ``model.mixer`` value); ``forms_scores``: it computes
    softmax attention scores (so a score scale, a mask and a score bias act on it);
    ``layer_constants``: each layer holds constants drawn for its index (Performer's random
    features), so its layers cannot be stacked into one scanned module; ``fields``: the
    ``model.*`` fields only this mixer reads; ``undecayed``: names of its module's own
    parameters that weight decay must not touch (Mamba's ``A_log`` and ``D``), whatever their
    shape; the optimizer asks :meth:`Architecture.undecayed`; ``map_is_distribution``: the rows
    of its module's token-mixing map (``module.weights(x, positions, bias=)``, drawn by
    ``attnlab attention``) are non-negative and sum to 1, so a head's map is where it attends
    and the induction / previous-token scores apply.
    """

    cfg: ModelConfig = dataclasses.field(repr=False)
    layer: int
    encoding: PositionalEncoding
    mask: Mask
    score_scale: ScoreScale
    norm: type[nnx.Module]

    name = ""
    forms_scores = False
    map_is_distribution = True
    layer_constants = False
    mup_rule = False  # a published muP rule exists (model.parameterization=mup)
    fields = ()
    undecayed = ()

    def validate(self) -> None:
        """Rules across fields (raises ConfigError naming the field)."""

    def build(self, rngs: nnx.Rngs) -> nnx.Module:
        raise NotImplementedError

    def init_state(self, batch: int, max_len: int):
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
    """Softmax attention, :class:`~attnlab.model.attention.SelfAttention` (the default)."""

    name = "softmax"
    forms_scores = True
    mup_rule = True  # Tensor Programs V, sec. 4

    def validate(self) -> None:
        if self.cfg.attention_every:
            raise ConfigError("model.attention_every",
                              "a hybrid needs a non-softmax model.mixer (linear, performer, mamba)")

    def build(self, rngs):
        return SelfAttention(self.cfg, encoding=self.encoding, score_scale=self.score_scale,
                             mask=self.mask, norm=self.norm, rngs=rngs)

    def init_state(self, batch, max_len):
        cfg = self.cfg
        length = self.mask.cache_length(max_len)
        zeros = jnp.zeros((batch, length, cfg.kv_heads, cfg.head_dim), jnp.dtype(cfg.dtype))
        return zeros, zeros

    def state_length(self, state):
        return self.mask.cache_limit(state[0].shape[1])

    def param_count(self):
        cfg = self.cfg
        d, hd = cfg.d_model, cfg.head_dim
        count = d * cfg.n_heads * hd + 2 * d * cfg.kv_heads * hd + cfg.n_heads * hd * d
        if cfg.linear_bias:  # W_q, W_k, W_v (GQA-aware) and W_o
            count += cfg.n_heads * hd + 2 * cfg.kv_heads * hd + d
        if cfg.qk_norm:
            count += 2 * self.norm.param_count(hd)
        return count + self.score_scale.param_count()  # a learned temperature per head

    def flops_per_token(self, seq_len):
        """Hoffmann et al. 2022, Appendix F: projections; ``QK^T`` ``2 T d_attn``, softmax
        ``3 H T``, ``PV`` ``2 T d_attn`` (every query against all ``T`` keys; with a sliding
        window ``T`` is the band's width, ``Mask.keys_per_query``)."""
        cfg = self.cfg
        d, hd = cfg.d_model, cfg.head_dim
        d_attn = cfg.n_heads * hd
        seq_len = self.mask.keys_per_query(seq_len)
        weights = 2.0 * d * (cfg.n_heads * hd + 2 * cfg.kv_heads * hd) + 2.0 * d_attn * d
        context = 2.0 * seq_len * d_attn + 3.0 * cfg.n_heads * seq_len + 2.0 * seq_len * d_attn
        return {"weights": weights, "context": context}

    def kaplan_context_flops(self, seq_len):
        """Kaplan et al. 2020, Table 1: ``2 n_ctx d_attn`` (the ``QK^T`` products only)."""
        return 2.0 * self.mask.keys_per_query(seq_len) * self.cfg.n_heads * self.cfg.head_dim


class LinearMixer(SequenceMixer):
    """Causal linear attention with ``phi = elu + 1`` (Katharopoulos et al. 2020)."""

    name = "linear"
    fields = ("mixer_chunk",)

    def features(self) -> int | None:
        """Performer's m; None for elu+1 (``m = head_dim``)."""
        return None

    @property
    def m(self) -> int:
        return self.cfg.head_dim if self.features() is None else self.features()

    def validate(self):
        cfg = self.cfg
        if self.encoding.adds_score_bias():
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
        return LinearAttention(self.cfg, self.encoding, layer=self.layer,
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


class Performer(LinearMixer):
    """Causal linear attention with FAVOR+ positive orthogonal random features
    (Choromanski et al. 2021), ``m = model.mixer_features``, fixed per layer (see
    :mod:`attnlab.model.linear_attention`)."""

    name = "performer"
    layer_constants = True  # its FAVOR+ features are drawn per layer
    fields = ("mixer_chunk", "mixer_features")

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
    """The selective SSM of Mamba (Gu & Dao 2023), :class:`attnlab.model.mamba.SelectiveSSM`."""

    name = "mamba"
    fields = ("ssm_state", "ssm_expand", "ssm_conv", "ssm_scan")
    # Mamba's _no_weight_decay: decay would pull A = -exp(A_log) towards -1 and D towards 0.
    undecayed = ("a_log", "d_skip")
    map_is_distribution = False  # the hidden attention is signed: one map per channel

    def validate(self):
        cfg = self.cfg
        encoding = self.encoding
        if not cfg.attention_every and (encoding.adds_score_bias() or encoding.transforms_qk()):
            raise ConfigError("model.pos_encoding", (
                f"{cfg.pos_encoding!r} acts inside attention, and model.mixer=mamba without "
                "model.attention_every has none; use none, learned or sinusoidal"))
        if cfg.qk_norm and not cfg.attention_every:
            raise ConfigError("model.qk_norm", "model.mixer=mamba has no q, k to normalise")
        for name in ("ssm_state", "ssm_expand", "ssm_conv"):
            if getattr(cfg, name) <= 0:
                raise ConfigError(f"model.{name}", f"must be positive, got {getattr(cfg, name)}")
        if cfg.ssm_scan not in mamba.SCANS:
            raise ConfigError("model.ssm_scan", f"unknown scan {cfg.ssm_scan!r}; valid scans are "
                              f"{', '.join(mamba.SCANS)}")

    def build(self, rngs):
        return mamba.SelectiveSSM(self.cfg, rngs=rngs)

    def init_state(self, batch, max_len):
        return mamba.init_state(self.cfg, batch)

    def param_count(self):
        return mamba.param_count(self.cfg)

    def flops_per_token(self, seq_len):
        flops = mamba.forward_flops(self.cfg)
        return {"weights": flops["matmuls"],
                "context": flops["conv"] + flops["selective"] + flops["scan"]}
