"""Decoder-only Transformer LM zoo (Flax NNX, driven functionally).

    graphdef, state = init_model(cfg, seed)          # nnx.split once
    logits = jax.jit(lambda s, x: apply(graphdef, s, x))(state, tokens)

The model's config section, ``ModelConfig``, lives here (``config.py``; ``attnlab.config``
re-exports it), so nothing in ``attnlab/model`` imports ``attnlab.config``. Positional encodings
are classes registered in ``ENCODINGS`` (``positions.py``); the model asks ``encoding_for(cfg)``
what to add to embeddings, q/k and scores.
"""

from attnlab.model.attention import (
    CausalSelfAttention,
    attention_scores,
    attention_weights,
    causal,
    causal_mask,
    dot_product_attention,
)
from attnlab.model.config import ModelConfig
from attnlab.model.counting import count_state_params, flops_per_token, param_counts
from attnlab.model.decoding import KVCache, decode_step, generate, init_cache
from attnlab.model.layers import FeedForward, LayerNorm, RMSNorm
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
    rope_angles,
    rope_inverse_frequencies,
    sinusoidal_table,
)
from attnlab.model.transformer import Block, TransformerLM, apply, init_model, token_losses

__all__ = [
    "ENCODINGS",
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
    "rope_angles",
    "rope_inverse_frequencies",
    "sinusoidal_table",
    "token_losses",
]
