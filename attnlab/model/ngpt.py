"""nGPT, the normalized Transformer (Loshchilov et al. 2024, arXiv 2410.01131): the block kind
:class:`NGPT` (``model.ngpt``).

Every vector that lives in the ``d_model`` space is on the unit sphere: token embeddings, the
hidden state after every sublayer, and the rows of every matrix along their ``d_model`` axis
(weights are renormalised after every optimizer step: :func:`renormalize`, chained into the
optimizer by ``attnlab.train.optimizer``). With ``Norm(x) = x / |x|``:

    h_A = Norm(Attn(h));   h <- Norm(h + alpha_A * (h_A - h))          (paper eq. 10)
    h_M = Norm(MLP(h));    h <- Norm(h + alpha_M * (h_M - h))          (paper eq. 11)
    Attn: q = s_qk * Norm(RoPE(h W_q)), k = s_qk * Norm(RoPE(h W_k)) per head, scores
          q.k * sqrt(d_k) (the softmax scale is sqrt(d_k), since q and k are unit vectors)
    MLP:  u = s_u * (h W_u), v = s_v * sqrt(d_model) * (h W_v), out = (u * SiLU(v)) W_o
    logits = s_z * (h E^T)                                               (paper eq. 16-17)

``alpha_A, alpha_M`` (the "eigen learning rates") and ``s_qk, s_u, s_v, s_z`` are learnable
vectors, each stored with the paper's scale trick (sec. 2.6): the parameter starts at
``s_scale`` and the value used is ``param * s_init / s_scale``, so that Adam's step size on it
matches the matrices'. Inits (paper Table 1 / sec. 2.6): ``alpha_init = 0.05``,
``alpha_scale = s_qk_scale = s_z_scale = 1/sqrt(d_model)``, ``s_qk_init = s_u_init = s_v_init =
s_z_init = 1``, ``s_u_scale = s_v_scale = 1``. There are no norm layers, the MLP is SwiGLU-like
(its own parameters ``w_gate``/``w_in``), and the paper trains without weight decay or warmup
(the config refuses ``train.weight_decay > 0`` and ``train.warmup_steps > 0`` for nGPT).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from attnlab.config import ModelConfig, TrainConfig
from attnlab.errors import ConfigError
from attnlab.model.attention import attention_scores, dot_product_attention, in_documents
from attnlab.model.blocks import BlockKind
from attnlab.model.ffn import SwiGLU
from attnlab.model.layers import dense
from attnlab.model.masks import Mask
from attnlab.model.positions import PositionalEncoding
from attnlab.model.scales import InverseSqrt

ALPHA_INIT = 0.05

# Which axis of each matrix is its d_model axis (the one its rows are normalised along): the
# kernels of input projections are [d_model, out] (axis 0), of output projections
# [in, d_model] (axis 1); embedding tables are [vocab, d_model] and the untied head
# [d_model, vocab] (axis 0).
INPUT_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "w_in", "w_gate")
OUTPUT_PROJECTIONS = ("o_proj", "w_out")


def unit(x: jax.Array, axis: int = -1) -> jax.Array:
    """``Norm(x) = x / |x|`` along ``axis`` (float32 statistics), in ``x.dtype``."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=axis, keepdims=True) + 1e-12)
            ).astype(x.dtype)


def norm_axis(path) -> int | None:
    """The ``d_model`` axis of the parameter at ``path`` (a tuple of names), or None for a
    vector (the scalings, the eigen learning rates) that is not normalised."""
    names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    if names[0] == "token_embedding":
        return 1
    if names[0] == "lm_head":
        return 0
    if "kernel" in names:
        if any(n in INPUT_PROJECTIONS for n in names):
            return 0
        if any(n in OUTPUT_PROJECTIONS for n in names):
            return 1
    return None


def renormalize(params):
    """Every matrix of an nGPT model's parameters with its rows back on the unit sphere (along
    its ``d_model`` axis, :func:`norm_axis`; each layer of a stacked ``[n_layers, ...]``
    matrix); vectors unchanged. Works on any pytree whose paths carry the parameter names (an
    ``nnx.State`` or a dict of it)."""

    def one(path, leaf):
        axis = norm_axis(path)
        if axis is None or jnp.ndim(leaf) < 2:
            return leaf
        # A stacked layer's matrices (model.scan_layers) are [n_layers, rows, cols]: the d_model
        # axis counts from the matrix's own two.
        return unit(leaf, axis + jnp.ndim(leaf) - 2)

    return jax.tree_util.tree_map_with_path(one, params)


class Scale(nnx.Module):
    """A learnable vector with the scale trick: value = param * init / scale, param starts at
    ``scale`` (so the value starts at ``init``)."""

    def __init__(self, dim: int, init: float, scale: float):
        self.ratio = init / scale
        self.param = nnx.Param(jnp.full((dim,), scale, jnp.float32))

    def __call__(self) -> jax.Array:
        return self.param[...] * self.ratio


class NGPTAttention(nnx.Module):
    """nGPT attention (the ``Attn`` of the module docstring): ``[batch, t, d_model] ->
    [batch, t, d_model]`` with the layer's encoding and mask, a KV cache like
    :class:`~attnlab.model.attention.SelfAttention` (same parameter names and cache layout)."""

    def __init__(self, cfg: ModelConfig, *, encoding: PositionalEncoding, mask: Mask,
                 rngs: nnx.Rngs):
        self.cfg = cfg
        self.encoding, self.mask = encoding, mask
        d, hd = cfg.d_model, cfg.head_dim
        self.q_proj = dense(cfg, d, cfg.n_heads * hd, cfg.init_std, rngs)
        self.k_proj = dense(cfg, d, cfg.kv_heads * hd, cfg.init_std, rngs)
        self.v_proj = dense(cfg, d, cfg.kv_heads * hd, cfg.init_std, rngs)
        self.o_proj = dense(cfg, cfg.n_heads * hd, d, cfg.init_std, rngs)
        self.s_qk = Scale(hd, 1.0, 1.0 / math.sqrt(d))

    def _queries_keys(self, x, positions):
        """``(q [b, t, heads, hd], k [b, t, kv_heads, hd])``: unit per head, then ``s_qk``."""
        cfg = self.cfg
        batch, t, _ = x.shape
        q = self.q_proj(x).reshape(batch, t, cfg.n_heads, cfg.head_dim)
        k = self.k_proj(x).reshape(batch, t, cfg.kv_heads, cfg.head_dim)
        q, k = self.encoding.transform_qk(q, k, positions)
        s_qk = self.s_qk().astype(q.dtype)
        return s_qk * unit(q), s_qk * unit(k)

    def weights(self, x, positions, *, bias=None, documents=None) -> jax.Array:
        """Every head's attention pattern over ``x [batch, t, d_model]`` (no cache): float32
        ``[batch, heads, t, t]``, ``softmax(sqrt(d_k) q.k + bias)`` under the layer's mask (and
        ``documents``' spans)."""
        q, k = self._queries_keys(x, positions)
        t = x.shape[1]
        bias = None if bias is None else bias(positions, positions)
        index = jnp.arange(t)
        mask = in_documents(self.mask(index, index), documents, self.mask, index)
        scores = attention_scores(q, k, scale=math.sqrt(self.cfg.head_dim), bias=bias, mask=mask)
        return jax.nn.softmax(scores, axis=-1)

    def __call__(self, x, positions, *, bias=None, documents=None, state=None, start=0):
        cfg = self.cfg
        batch, t, _ = x.shape
        q, k = self._queries_keys(x, positions)
        v = self.v_proj(x).reshape(batch, t, cfg.kv_heads, cfg.head_dim)
        mask, q_offset, q_positions, k_positions = self.mask, 0, positions, positions
        if state is not None:  # the bias reads indices, as SelfAttention's
            k, v, state, mask, q_offset, k_positions = self.mask.cache_step(state, k, v, start)
            q_positions = (q_offset + jnp.arange(t, dtype=jnp.int32))[None]
        out = dot_product_attention(
            q, k, v, scale=math.sqrt(cfg.head_dim), bias=bias, mask=mask,
            q_offset=q_offset, q_positions=q_positions, k_positions=k_positions,
            impl=cfg.attention_impl, chunk=cfg.attention_chunk, documents=documents)
        return self.o_proj(out.reshape(batch, t, cfg.n_heads * cfg.head_dim)), state


class NGPTMLP(nnx.Module):
    """nGPT's MLP: ``u = s_u (h W_in)``, ``v = s_v sqrt(d_model) (h W_gate)``,
    ``(u * SiLU(v)) W_out``; ``[batch, t, d_model] -> [batch, t, d_model]``."""

    def __init__(self, cfg: ModelConfig, width: int, *, rngs: nnx.Rngs):
        d, f = cfg.d_model, width
        self.sqrt_d = math.sqrt(d)
        self.w_in = dense(cfg, d, f, cfg.init_std, rngs)
        self.w_gate = dense(cfg, d, f, cfg.init_std, rngs)
        self.w_out = dense(cfg, f, d, cfg.init_std, rngs)
        self.s_u = Scale(f, 1.0, 1.0)
        self.s_v = Scale(f, 1.0, 1.0)

    def __call__(self, x):
        u = self.s_u().astype(x.dtype) * self.w_in(x)
        v = self.s_v().astype(x.dtype) * self.sqrt_d * self.w_gate(x)
        return self.w_out(u * jax.nn.silu(v))


class NGPTBlock(nnx.Module):
    """One nGPT layer (paper eqs. 10-11); the attention stays at ``attn`` and the MLP at
    ``ffn``; no norm layers."""

    def __init__(self, kind: BlockKind, *, rngs: nnx.Rngs):
        cfg, d = kind.cfg, kind.cfg.d_model
        self.attn = NGPTAttention(cfg, encoding=kind.mixer.encoding, mask=kind.mixer.mask,
                                  rngs=rngs)
        self.ffn = NGPTMLP(cfg, kind.ffn.width, rngs=rngs)
        self.alpha_attn = Scale(d, ALPHA_INIT, 1.0 / math.sqrt(d))
        self.alpha_mlp = Scale(d, ALPHA_INIT, 1.0 / math.sqrt(d))

    def mixer_input(self, x: jax.Array) -> jax.Array:
        """What the attention reads: the stream itself (no norm layers)."""
        return x

    def __call__(self, x, positions, *, bias=None, documents=None, state=None, start=0,
                 dropout_key=None):
        """``x [batch, seq, d_model]`` (unit rows) -> ``(x, state)`` (unit rows); no dropout."""
        update, state = self.attn(x, positions, bias=bias, documents=documents, state=state,
                                  start=start)
        x = unit(x + self.alpha_attn().astype(x.dtype) * (unit(update) - x))
        x = unit(x + self.alpha_mlp().astype(x.dtype) * (unit(self.ffn(x)) - x))
        return x, state


class NGPT(BlockKind):
    """nGPT's block kind: the layer above, no final norm, the logits scaled by ``s_z``, every
    matrix's rows renormalised after each optimizer step (:func:`renormalize`). Its rules: no
    norm layers (so no post-LN, no QK-norm), softmax attention scaled by ``sqrt(d_k)``, the
    SwiGLU-like MLP, no dropout, no biases, nothing added to the (unit) embeddings; trained
    without weight decay or warmup."""

    name = "ngpt"
    title = "nGPT"
    final_norm = False
    causal_only = True
    mup_rule = False  # no published muP rule for weights kept on the unit sphere

    def setting(self):
        return "model.ngpt=true"

    def validate(self):
        m = self.cfg
        rules = [
            ("model.norm_position", m.norm_position != ModelConfig.norm_position,
             "nGPT has no norm layers (its residual update normalises); post-LN does not apply"),
            ("model.qk_norm", m.qk_norm, "nGPT normalises q and k itself (s_qk * Norm(q))"),
            ("model.mixer", not self.mixer.forms_scores, "nGPT is defined with softmax attention"),
            ("model.ffn", not isinstance(self.ffn, SwiGLU),
             "nGPT's MLP is u * SiLU(v): set model.ffn=swiglu"),
            ("model.dropout", m.dropout > 0, "nGPT is trained without dropout"),
            ("model.pos_encoding", self.mixer.encoding.adds_to_embeddings(),
             "nGPT keeps embeddings on the unit sphere; use rope, alibi or none"),
            ("model.linear_bias", m.linear_bias,
             "nGPT's matrices have unit rows and no biases (Loshchilov et al. 2024)"),
            ("model.attention_scale", not isinstance(self.mixer.score_scale, InverseSqrt),
             "nGPT scales the scores of its unit q, k by sqrt(d_k) itself"),
        ]
        for field, bad, why in rules:
            if bad:
                raise ConfigError(field, why)

    def check_train(self, train: TrainConfig):
        if train.weight_decay or train.warmup_steps:
            name = "train.weight_decay" if train.weight_decay else "train.warmup_steps"
            raise ConfigError(name, "nGPT trains without weight decay or warmup (Loshchilov et "
                                    "al. 2024): set train.weight_decay=0 and train.warmup_steps=0")

    def build(self, rngs):
        return NGPTBlock(self, rngs=rngs)

    def param_count(self):
        """``mixer``: q/k/v/o + s_qk; ``ffn``: three matrices + s_u, s_v; ``norms``: in their
        place, alpha_A and alpha_M."""
        cfg = self.cfg
        d, hd, f = cfg.d_model, cfg.head_dim, self.ffn.width
        attention = d * cfg.n_heads * hd + 2 * d * cfg.kv_heads * hd + cfg.n_heads * hd * d + hd
        return {"mixer": attention, "ffn": 3 * d * f + 2 * f, "norms": 2 * d}

    def head_params(self):
        return self.cfg.vocab_size  # s_z

    def head_scale(self, rngs):
        return Scale(self.cfg.vocab_size, 1.0, self.cfg.d_model**-0.5)

    def param_constraint(self):
        return renormalize
