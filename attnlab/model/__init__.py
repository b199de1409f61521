"""Transformer LM zoo (Flax NNX, driven functionally): decoders, BERT-style encoders and T5-style
encoder-decoders (``model.objective``).

    arch = resolve(cfg)                              # the parts, checked once (architecture.py)
    graphdef, state = init_model(cfg, seed)          # nnx.split once
    logits = jax.jit(lambda s, x: apply(graphdef, s, x))(state, tokens)

The model's config section is the leaf ``attnlab.config.ModelConfig``; every part it names (an
encoding, a score scale, a mask, a mixer, an FFN, a norm, a block kind, an objective) is a class
in a registry of ``architecture.py``, and modules are handed the resolved parts.
"""

from attnlab.config import ModelConfig
from attnlab.model.architecture import (BLOCKS, ENCODINGS, FFNS, MASKS, MIXERS, NORMS, OBJECTIVES,
                                        PARAMETERIZATIONS, SCORE_SCALES, Architecture, check,
                                        rescaled, resolve)
from attnlab.model.attention import (CrossAttention, SelfAttention, attention_scores,
                                     attention_weights, dot_product_attention)
from attnlab.model.counting import (count_state_params, flops_per_token, param_counts,
                                    recorded_counts)
from attnlab.model.decoding import (DecodeState, NoMaskError, decode_spans, decode_step,
                                    fill_masks, generate, init_encdec_state, init_state)
from attnlab.model.layers import LayerNorm, RMSNorm
from attnlab.model.masks import Bidirectional, Causal, Mask, SlidingWindow
from attnlab.model.objectives import Objective, mask_id, masking_key, token_losses
from attnlab.model.positions import (PositionalEncoding, PositionOutOfRangeError, RescalingError,
                                     alibi_bias, alibi_slopes, check_positions, sinusoidal_table)
from attnlab.model.relative import t5_bucket_table, t5_buckets
from attnlab.model.rope import (apply_rope, ntk_rope_theta, pi_frequencies, rope_angles,
                                rope_inverse_frequencies, yarn_attention_factor, yarn_frequencies)
from attnlab.model.scales import ScoreScale
from attnlab.model.transformer import (TransformerLM, apply, build_model, init_model,
                                       model_class, param_shapes)
from attnlab.model.encoder_decoder import EncoderDecoderLM

__all__ = [
    "BLOCKS", "ENCODINGS", "FFNS", "MASKS", "MIXERS", "NORMS", "OBJECTIVES", "PARAMETERIZATIONS",
    "SCORE_SCALES",
    "Architecture", "Bidirectional", "Causal", "CrossAttention", "DecodeState",
    "EncoderDecoderLM", "LayerNorm", "Mask", "ModelConfig", "NoMaskError", "Objective",
    "PositionOutOfRangeError", "PositionalEncoding", "RMSNorm", "RescalingError", "ScoreScale",
    "SelfAttention", "SlidingWindow", "TransformerLM", "alibi_bias", "alibi_slopes", "apply",
    "apply_rope", "attention_scores", "attention_weights", "build_model", "check",
    "check_positions", "count_state_params", "decode_spans", "decode_step",
    "dot_product_attention", "fill_masks", "flops_per_token", "generate", "init_encdec_state",
    "init_model", "init_state", "mask_id", "masking_key", "model_class", "ntk_rope_theta",
    "param_counts", "param_shapes", "pi_frequencies", "recorded_counts", "rescaled", "resolve", "rope_angles",
    "rope_inverse_frequencies", "sinusoidal_table", "t5_bucket_table", "t5_buckets",
    "token_losses", "yarn_attention_factor", "yarn_frequencies",
]
