"""The model section of the run config: shape and architecture of the decoder-only LM.

It lives with the model (``attnlab.config`` re-exports it and composes it with the data and train
sections), so no model module imports ``attnlab.config``. It validates itself when built
(``__post_init__``, so ``dataclasses.replace`` validates too), raising
:class:`~attnlab.errors.ConfigError` naming the field (``model.d_model``).
"""

from __future__ import annotations

import dataclasses

from attnlab.errors import ConfigError
from attnlab.model.ngpt import validate_ngpt
from attnlab.model.objectives import OBJECTIVES, objective_for
from attnlab.model.layers import REMAT_POLICIES
from attnlab.model.mixers import MIXERS, Softmax, layer_mixers, validate_mixer
from attnlab.model.positions import ENCODINGS, ROPE_FREQUENCIES, UNSCALED, encoding_for
from attnlab.model.scales import SCALES, score_scale_for

NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post")
FFNS = ("relu", "gelu", "swiglu")
ATTENTION_IMPLS = ("einsum", "xla")
DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and architecture of the Transformer (decoder, encoder or encoder-decoder:
    ``objective``)."""

    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # None -> n_heads (MHA); 1 -> MQA; in between -> GQA
    d_ff: int | None = None  # None -> 4 * d_model, or 8/3 * d_model for SwiGLU (rounded up to 8)
    max_len: int = 256  # rows of the learned position table; other encodings ignore it
    pos_encoding: str = "rope"
    rope_theta: float = 10000.0
    norm: str = "layernorm"
    norm_position: str = "pre"
    norm_eps: float = 1e-5
    ffn: str = "gelu"
    tie_embeddings: bool = True
    qk_norm: bool = False
    attention_impl: str = "einsum"
    attention_chunk: int = 0  # query-block size for memory-linear attention; 0 -> one block
    dropout: float = 0.0
    dtype: str = "float32"  # compute dtype; parameters are always float32
    init_std: float = 0.02
    # Issue #14 variants; the defaults reproduce the models made before them.
    t5_num_buckets: int = 32  # pos_encoding="t5": buckets of the relative bias (Raffel et al.)
    t5_max_distance: int = 128  # distances >= this share the last bucket
    t5_per_layer: bool = False  # False: one bias table shared by all layers (as in T5)
    rope_scaling: str = "none"  # RoPE frequencies: none | pi | yarn (set by attnlab extrapolate)
    rope_factor: float = 1.0  # s of rope_scaling (evaluation length / training length)
    rope_original_len: int = 0  # YaRN: the training context L its ramp is relative to
    attention_scale: str = "rsqrt"  # rsqrt (1/sqrt(d_k)) | mup (1/d_k) | none | learned | cosine
    cosine_tau_init: float = 10.0  # attention_scale="cosine": initial temperature tau
    attention_window: int = 0  # sliding-window attention: keys i-w+1..i; 0 -> full causal
    attention_global_tokens: int = 0  # with a window: the first n tokens stay visible to all

    # Issue #15 sequence mixers (attnlab/model/mixers.py); the defaults are softmax attention.
    mixer: str = "softmax"  # softmax | linear (elu+1) | performer (FAVOR+) | mamba
    attention_every: int = 0  # hybrid: layers k-1, 2k-1, ... are softmax attention; 0 -> none
    mixer_features: int = 64  # performer: random features m per head
    mixer_chunk: int = 64  # linear / performer: tokens per chunk of the causal prefix sum
    ssm_state: int = 16  # mamba: N, states per channel
    ssm_expand: int = 2  # mamba: E = ssm_expand * d_model channels
    ssm_conv: int = 4  # mamba: causal depthwise conv kernel
    ngpt: bool = False  # nGPT (Loshchilov et al. 2024, attnlab/model/ngpt.py): all on the sphere
    # Issue #16 (attnlab/model/objectives.py): clm (causal decoder) | mlm (BERT encoder) |
    # span (T5 encoder-decoder); the default is the decoder-only LM.
    objective: str = "clm"
    # Issue #19 (speed): implementation choices; the defaults are the models made before them.
    linear_bias: bool = False  # biases on the attention and FFN projections (GPT-2 style)
    scan_layers: bool = False  # layers as one stacked module run by a scan: compile flat in depth
    remat: str = "none"  # rematerialise each layer in the backward pass: none | full | save_dots

    def __post_init__(self):
        validate_model(self)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def ffn_dim(self) -> int:
        if self.d_ff is not None:
            return self.d_ff
        if self.ffn == "swiglu":
            # Shazeer 2020: 8/3 d keeps SwiGLU's three matrices at the cost of a 4d two-matrix FFN.
            return -(-(8 * self.d_model // 3) // 8) * 8
        return 4 * self.d_model


def check_choice(path: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(path, f"unknown value {value!r}; valid values are {', '.join(valid)}")


def check_positive(path: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(path, f"must be positive, got {value}")


def validate_model(m: ModelConfig) -> None:
    """Every field of the model section; raises ConfigError on the first bad one."""
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_len"):
        check_positive(f"model.{name}", getattr(m, name))
    check_choice("model.pos_encoding", m.pos_encoding, tuple(ENCODINGS))
    check_choice("model.norm", m.norm, NORMS)
    check_choice("model.norm_position", m.norm_position, NORM_POSITIONS)
    check_choice("model.ffn", m.ffn, FFNS)
    check_choice("model.attention_impl", m.attention_impl, ATTENTION_IMPLS)
    check_choice("model.dtype", m.dtype, DTYPES)
    if m.d_model % m.n_heads:
        raise ConfigError(
            "model.d_model", f"{m.d_model} is not divisible by model.n_heads={m.n_heads}"
        )
    if m.n_kv_heads is not None:
        check_positive("model.n_kv_heads", m.n_kv_heads)
        if m.n_heads % m.n_kv_heads:
            raise ConfigError(
                "model.n_heads",
                f"{m.n_heads} is not divisible by model.n_kv_heads={m.n_kv_heads}",
            )
    if m.d_ff is not None:
        check_positive("model.d_ff", m.d_ff)
    encoding_for(m).validate()  # e.g. RoPE: even head_dim; sinusoidal: even d_model
    check_positive("model.rope_theta", m.rope_theta)
    check_positive("model.norm_eps", m.norm_eps)
    check_positive("model.init_std", m.init_std)
    if m.attention_chunk < 0:
        raise ConfigError("model.attention_chunk", f"must be >= 0, got {m.attention_chunk}")
    if not 0.0 <= m.dropout < 1.0:
        raise ConfigError("model.dropout", f"must be in [0, 1), got {m.dropout}")
    check_choice("model.mixer", m.mixer, tuple(MIXERS))
    validate_mixer(m)  # e.g. performer with ALiBi, pure mamba with RoPE
    if m.ngpt:
        validate_ngpt(m)  # e.g. nGPT with post-LN
    validate_variants(m)
    check_choice("model.remat", m.remat, ("none", *REMAT_POLICIES))
    if m.scan_layers:
        validate_scan(m)
    if m.linear_bias and m.ngpt:
        raise ConfigError("model.linear_bias",
                          "nGPT's matrices have unit rows and no biases (Loshchilov et al. 2024)")
    check_choice("model.objective", m.objective, tuple(OBJECTIVES))
    objective = objective_for(m)
    objective.validate()  # e.g. mlm with a causal-only mixer
    if not objective.causal:
        encoding_for(m, bidirectional=True).validate()  # T5's encoder buckets


def validate_scan(m: ModelConfig) -> None:
    """``model.scan_layers``: one stacked layer run by a scan needs every layer alike (same
    parameters and static attributes); the combinations whose layers differ are refused."""
    mixers = layer_mixers(m)
    if len({type(mixer) for mixer in mixers}) > 1:
        raise ConfigError("model.scan_layers",
                          f"needs identical layers; model.attention_every={m.attention_every} "
                          f"makes some layers softmax attention and others {m.mixer}")
    if any(mixer.layer_constants for mixer in mixers):
        raise ConfigError("model.scan_layers",
                          f"needs identical layers; model.mixer={m.mixer} fixes different "
                          "constants (random features) per layer")
    if objective_for(m).encoder_decoder:
        raise ConfigError("model.scan_layers",
                          f"is not implemented for the encoder-decoder "
                          f"(model.objective={m.objective}); use it with clm or mlm")


def validate_variants(m: ModelConfig) -> None:
    """The fields of issue #14's variants (T5 bias, PI/YaRN, score scale, sliding window)."""
    check_choice("model.rope_scaling", m.rope_scaling, tuple(ROPE_FREQUENCIES))
    if m.rope_scaling != UNSCALED:
        if not encoding_for(m).can_rescale(m.rope_scaling):
            raise ConfigError("model.rope_scaling",
                              f"{m.rope_scaling} rescales RoPE frequencies; model.pos_encoding="
                              f"{m.pos_encoding} has none")
        if not m.rope_factor >= 1.0:
            raise ConfigError("model.rope_factor",
                              f"must be >= 1 with model.rope_scaling={m.rope_scaling}, "
                              f"got {m.rope_factor}")
    check_choice("model.attention_scale", m.attention_scale, tuple(SCALES))
    score_scale_for(m).validate()  # e.g. cosine attention with qk_norm
    if m.attention_window < 0:
        raise ConfigError("model.attention_window",
                          f"must be >= 1 (0 = full causal attention), got {m.attention_window}")
    if m.attention_global_tokens < 0:
        raise ConfigError("model.attention_global_tokens",
                          f"must be >= 0, got {m.attention_global_tokens}")
    if m.attention_global_tokens and not m.attention_window:
        raise ConfigError("model.attention_global_tokens",
                          "global tokens need a sliding window (model.attention_window >= 1)")
    if not any(isinstance(mixer, Softmax) for mixer in layer_mixers(m)):
        for name in ("attention_scale", "attention_window"):
            if getattr(m, name) != ModelConfig.__dataclass_fields__[name].default:
                raise ConfigError(f"model.{name}",
                                  f"acts on softmax attention, which model.mixer={m.mixer} "
                                  "never forms (a hybrid's attention layers do: "
                                  "model.attention_every)")
