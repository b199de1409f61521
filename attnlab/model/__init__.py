"""Transformer LM zoo (Flax NNX, driven functionally): decoders, BERT-style encoders and T5-style
encoder-decoders (``model.objective``, ``objectives.py``).

    graphdef, state = init_model(cfg, seed)          # nnx.split once
    logits = jax.jit(lambda s, x: apply(graphdef, s, x))(state, tokens)

The model's config section, ``ModelConfig``, lives here (``config.py``; ``attnlab.config``
re-exports it), so nothing in ``attnlab/model`` imports ``attnlab.config``. Positional encodings
are classes registered in ``ENCODINGS`` (``positions.py``); the model asks ``encoding_for(cfg)``
what to add to embeddings, q/k and scores; the score scale (``1/sqrt(d_k)``, muP, learned,
cosine) is a class in ``SCALES`` (``scales.py``).
"""

from attnlab.model.attention import (
    CausalSelfAttention,
    CrossAttention,
    attention_scores,
    attention_weights,
    causal,
    causal_mask,
    dot_product_attention,
    sliding_window,
)
from attnlab.model.config import ModelConfig
from attnlab.model.counting import count_state_params, flops_per_token, param_counts
from attnlab.model.decoding import (
    KVCache,
    NoMaskError,
    decode_spans,
    decode_step,
    fill_masks,
    generate,
    init_cache,
    init_encdec_cache,
)
from attnlab.model.layers import FeedForward, LayerNorm, RMSNorm
from attnlab.model.objectives import OBJECTIVES, Objective, mask_id, masking_key, objective_for
from attnlab.model.positions import (
    ENCODINGS,
    PositionalEncoding,
    PositionOutOfRangeError,
    RescalingError,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    check_positions,
    encoding_for,
    ntk_rope_theta,
    pi_frequencies,
    rope_angles,
    rope_inverse_frequencies,
    sinusoidal_table,
    t5_bucket_table,
    t5_buckets,
    yarn_attention_factor,
    yarn_frequencies,
)
from attnlab.model.scales import SCALES, ScoreScale, score_scale_for
from attnlab.model.transformer import (
    Block,
    EncoderDecoderLM,
    TransformerLM,
    apply,
    init_model,
    model_class,
    token_losses,
)

__all__ = [
    "ENCODINGS",
    "OBJECTIVES",
    "CrossAttention",
    "EncoderDecoderLM",
    "NoMaskError",
    "Objective",
    "decode_spans",
    "fill_masks",
    "init_encdec_cache",
    "mask_id",
    "masking_key",
    "model_class",
    "objective_for",
    "SCALES",
    "Block",
    "CausalSelfAttention",
    "FeedForward",
    "KVCache",
    "LayerNorm",
    "ModelConfig",
    "PositionOutOfRangeError",
    "PositionalEncoding",
    "RMSNorm",
    "RescalingError",
    "ScoreScale",
    "TransformerLM",
    "alibi_bias",
    "alibi_slopes",
    "apply",
    "apply_rope",
    "attention_scores",
    "attention_weights",
    "causal",
    "causal_mask",
    "check_positions",
    "count_state_params",
    "decode_step",
    "dot_product_attention",
    "encoding_for",
    "flops_per_token",
    "generate",
    "init_cache",
    "init_model",
    "ntk_rope_theta",
    "param_counts",
    "pi_frequencies",
    "rope_angles",
    "rope_inverse_frequencies",
    "score_scale_for",
    "sinusoidal_table",
    "sliding_window",
    "t5_bucket_table",
    "t5_buckets",
    "token_losses",
    "yarn_attention_factor",
    "yarn_frequencies",
]
