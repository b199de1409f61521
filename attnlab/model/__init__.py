"""Decoder-only Transformer LM zoo (Flax NNX, driven functionally).

    graphdef, state = init_model(cfg, seed)          # nnx.split once
    logits = jax.jit(lambda s, x: apply(graphdef, s, x))(state, tokens)
"""

from attnlab.model.attention import (
    CausalSelfAttention,
    attention_weights,
    causal_mask,
    dot_product_attention,
)
from attnlab.model.counting import count_state_params, flops_per_token, param_counts
from attnlab.model.decoding import KVCache, decode_step, generate, init_cache
from attnlab.model.layers import FeedForward, LayerNorm, RMSNorm
from attnlab.model.positions import (
    PositionOutOfRangeError,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    check_positions,
    rope_angles,
    rope_inverse_frequencies,
    sinusoidal_table,
)
from attnlab.model.transformer import Block, TransformerLM, apply, init_model, token_losses

__all__ = [
    "Block",
    "CausalSelfAttention",
    "FeedForward",
    "KVCache",
    "LayerNorm",
    "PositionOutOfRangeError",
    "RMSNorm",
    "TransformerLM",
    "alibi_bias",
    "alibi_slopes",
    "apply",
    "apply_rope",
    "attention_weights",
    "causal_mask",
    "check_positions",
    "count_state_params",
    "decode_step",
    "dot_product_attention",
    "flops_per_token",
    "generate",
    "init_cache",
    "init_model",
    "param_counts",
    "rope_angles",
    "rope_inverse_frequencies",
    "sinusoidal_table",
    "token_losses",
]
