"""The Hugging Face model families attnlab represents exactly, each as a config map and a
tensor map.

A family turns an HF ``config.json`` (the documented ``transformers`` schema of its
``model_type``) into a :class:`ModelConfig` and back, and names every tensor of the HF
checkpoint with the attnlab parameters it holds:

| HF ``model_type`` | attnlab model |
|---|---|
| ``gpt2`` | learned positions, pre-LN LayerNorm, tanh-GELU MLP, biases everywhere, tied head |
| ``opt`` | the same with ReLU and separate q, k, v projections (position rows offset by 2) |
| ``llama`` | RoPE (``rope_scaling``: linear -> PI, dynamic -> dynamic NTK, yarn -> YaRN), RMSNorm,
  SwiGLU, GQA, no biases |
| ``mistral`` | Llama with a sliding window (``sliding_window`` -> ``model.attention_window``) |
| ``qwen3`` | Llama with QK-norm (RMSNorm over each head's q and k before RoPE) |
| ``bloom`` | ALiBi, an embedding LayerNorm, GPT-2's blocks with q, k, v fused head by head |
| ``bert`` | BertForMaskedLM: learned positions (token type 0 folded in), an embedding LayerNorm,
  post-LN blocks, erf- or tanh-GELU MLP, biases, ``model.head=bert`` (transform + output bias) |
| ``t5`` | T5 v1.0 / v1.1: the span encoder-decoder, T5 bias, unscaled scores, RMSNorm, ReLU or
  gated GELU, tied head rescaled by ``d_model^-0.5`` (``model.head=t5``) or untied |

Every key of an HF config is either mapped, one of the generic bookkeeping keys
(:data:`BOOKKEEPING`), or must hold the one value attnlab computes (e.g. ``attention_bias:
false``); anything else is refused in one line naming the key, never approximated. Tensors:
HF (PyTorch) linear weights are ``[out, in]``, attnlab kernels ``[in, out]`` (transposed
exactly); GPT-2's ``Conv1D`` weights are already ``[in, out]`` and its ``c_attn`` holds q, k,
v side by side. Both layouts rotate q, k as "rotate half" pairs ``(i, i + d/2)``, so RoPE
weights copy as they are.
"""

from __future__ import annotations

from typing import Any

from attnlab.config import ModelConfig
from attnlab.hf.families.base import (
    BOOKKEEPING,
    IMPLEMENTATION_FIELDS,
    Family,
    HFError,
    lm_width,
    resolve_inputs,
)
from attnlab.hf.families.bert import Bert
from attnlab.hf.families.bloom import Bloom
from attnlab.hf.families.gpt2 import GPT2
from attnlab.hf.families.llama import Llama, Mistral, Qwen3
from attnlab.hf.families.opt import OPT
from attnlab.hf.families.t5 import T5

# Bert and T5 first: an mlm or span model is theirs, whatever its positions.
FAMILIES: dict[str, Family] = {f.model_type: f for f in (Bert(), T5(), OPT(), GPT2(), Llama(),
                                                          Mistral(), Qwen3(), Bloom())}


# Families attnlab has a kindred model of, and why it is not the same function.
NOT_THE_SAME = {
    "mamba": "attnlab's Mamba layers (model.mixer=mamba) carry an FFN and the block's norms "
             "(Jamba-style); a Hugging Face Mamba block is the mixer alone (docs/attention.md)",
    "qwen2": "Qwen2 has biases on q, k, v but not on the output projection; attnlab's "
             "model.linear_bias puts them on every projection",
}


def family_of_config(hf: dict[str, Any]) -> Family:
    model_type = hf.get("model_type")
    if model_type in NOT_THE_SAME:
        raise HFError(f"config.json: model_type={model_type!r} is not supported: "
                      f"{NOT_THE_SAME[model_type]}")
    if model_type not in FAMILIES:
        raise HFError(f"config.json: model_type={model_type!r} is not supported; attnlab reads "
                      f"{', '.join(FAMILIES)}")
    return FAMILIES[model_type]


def family_of_model(cfg: ModelConfig) -> Family:
    for family in FAMILIES.values():
        if family.represents(cfg):
            return family
    raise HFError(f"model.pos_encoding={cfg.pos_encoding!r} (qk_norm={cfg.qk_norm}, "
                  f"attention_window={cfg.attention_window}) matches no exported family "
                  f"({', '.join(FAMILIES)})")


__all__ = ["BOOKKEEPING", "FAMILIES", "IMPLEMENTATION_FIELDS", "NOT_THE_SAME", "Bert", "Bloom",
           "Family", "GPT2", "HFError", "Llama", "Mistral", "OPT", "Qwen3", "T5",
           "family_of_config", "family_of_model", "lm_width", "resolve_inputs"]
