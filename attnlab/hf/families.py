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

import dataclasses
from typing import Any

import numpy as np

from attnlab.config import ModelConfig
from attnlab.errors import AttnlabError
from attnlab.hf.tensors import OFFSET_ROWS, PerHead, Tensor
from attnlab.hf.tensors import one as _one
from attnlab.hf.tensors import side_by_side as _side_by_side


class HFError(AttnlabError):
    """An HF checkpoint directory or config that attnlab cannot read or represent."""


# Keys every transformers PretrainedConfig may carry that do not change the model's function.
BOOKKEEPING = frozenset({
    "_name_or_path", "architectures", "model_type", "torch_dtype", "dtype", "transformers_version",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "use_cache", "return_dict", "output_attentions", "output_hidden_states", "torchscript",
    "is_encoder_decoder", "is_decoder", "add_cross_attention", "tie_encoder_decoder",
    "chunk_size_feed_forward", "pruned_heads", "id2label", "label2id", "problem_type",
    "task_specific_params", "finetuning_task", "tokenizer_class", "prefix",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "temperature",
    "top_k", "top_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate",
    "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "initializer_range",  # mapped to model.init_std where the family says so
    # Dropout rates: training settings, not the function (attnlab's model.dropout is set by the
    # fine-tuning config; import writes 0).
    "attention_dropout", "attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_first_dropout",
    # GPT-2's sequence-summary head (GPT2DoubleHeadsModel only; not in the LM).
    "summary_activation", "summary_proj_to_labels", "summary_type", "summary_use_proj",
})

# ModelConfig fields that choose how the function is computed, not which function.
IMPLEMENTATION_FIELDS = frozenset({"attention_impl", "attention_chunk", "dropout", "dtype",
                                   "init_std", "scan_layers", "remat"})


class Family:
    """One HF ``model_type``: its config map (:meth:`model_config`, :meth:`hf_config`) and its
    tensor map (:meth:`tensors`)."""

    model_type = ""
    architecture = ""  # transformers class written to config.json's "architectures"
    ignored_tensors: tuple[str, ...] = ()  # suffixes of buffers some checkpoints carry
    # (prefix, replacement): key spellings of other saves (a base model's vs the LM's)
    aliases: tuple[tuple[str, str], ...] = ()

    def canonical(self, key: str) -> str:
        """``key`` as :meth:`tensors` spells it."""
        for prefix, replacement in self.aliases:
            if key.startswith(prefix):
                return replacement + key[len(prefix):]
        return key

    def model_config(self, hf: dict[str, Any]) -> ModelConfig:
        raise NotImplementedError

    def hf_config(self, cfg: ModelConfig, context: int) -> dict[str, Any]:
        """The HF config of ``cfg`` (``context``: the run's ``data.seq_len``, written where the
        family records its context, e.g. ``max_position_embeddings``)."""
        raise NotImplementedError

    def represents(self, cfg: ModelConfig) -> bool:
        """Whether ``cfg`` is this family's kind of model (the choice of family on export);
        :meth:`hf_config` then checks every other field."""
        raise NotImplementedError

    def tensors(self, cfg: ModelConfig) -> list[Tensor]:
        raise NotImplementedError

    def context_length(self, cfg_hf: dict[str, Any]) -> int:
        """The training context recorded in the imported run's ``data.seq_len``."""
        raise NotImplementedError

    def tied_copies(self, cfg: ModelConfig) -> dict[str, str]:
        """``{HF key: attnlab path}``: tensors some saves write although they are tied to a
        parameter (a tied head); accepted on import only when equal to it, never exported."""
        return {"lm_head.weight": "token_embedding"} if cfg.tie_embeddings else {}

    def folded(self) -> dict[str, str]:
        """``{HF key: the HF key it is folded into}``: tensors attnlab holds inside another
        parameter (:meth:`fold` adds them on import, :meth:`unfolded` writes them on export)."""
        return {}

    def fold(self, key: str, tensor: np.ndarray, read) -> np.ndarray:
        """Import: the tensor ``key`` with what :meth:`folded` puts into it (``read(key)``
        reads another tensor of the checkpoint, checked)."""
        return tensor

    def unfolded(self, cfg: ModelConfig) -> dict[str, np.ndarray]:
        """Export: the tensors :meth:`folded` names, as attnlab's model has them."""
        return {}

    def notes(self, hf: dict[str, Any]) -> list[str]:
        """What an import of ``hf`` should tell the user (an exact restriction, e.g. inputs of
        one token type)."""
        return []


class _Reader:
    """Reads an HF config: each key once, so that whatever is left is unknown to attnlab."""

    def __init__(self, hf: dict[str, Any], family: str):
        self.hf, self.family, self.read = hf, family, set(BOOKKEEPING)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return self.hf.get(key, default)

    def need(self, key: str) -> Any:
        self.read.add(key)
        if key not in self.hf:
            raise HFError(f"config.json: {key} is missing (needed by model_type={self.family})")
        return self.hf[key]

    def expect(self, key: str, allowed: tuple, what: str) -> Any:
        """``hf[key]`` (absent counts as ``allowed[0]``), refused unless in ``allowed``."""
        value = self.get(key, allowed[0])
        if value not in allowed:
            raise HFError(f"config.json: {key}={value!r} is not representable in attnlab "
                          f"({what}; accepted: {', '.join(map(repr, allowed))})")
        return value

    def done(self) -> None:
        unknown = sorted(set(self.hf) - self.read)
        if unknown:
            raise HFError(f"config.json: {unknown[0]}={self.hf[unknown[0]]!r} is a setting "
                          f"attnlab has no equivalent for (model_type={self.family}); refusing "
                          "rather than approximating")


def _refuse_fields(cfg: ModelConfig, family: str, required: dict[str, Any],
                   mapped: set[str]) -> None:
    """Export: every field not mapped to an HF key must hold the value the family computes
    (``required``) or its default; the first that does not is refused, naming it."""
    default = ModelConfig()
    for field in dataclasses.fields(ModelConfig):
        name = field.name
        if name in mapped or name in IMPLEMENTATION_FIELDS:
            continue
        want = required.get(name, getattr(default, name))
        if getattr(cfg, name) != want:
            raise HFError(f"model.{name}={getattr(cfg, name)!r} has no {family} equivalent "
                          f"(a {family} checkpoint needs {want!r})")


class GPT2(Family):
    """GPT-2 (Radford et al. 2019; transformers ``GPT2Config`` / ``GPT2LMHeadModel``)."""

    model_type = "gpt2"
    architecture = "GPT2LMHeadModel"
    ignored_tensors = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers of old saves
    aliases = (("transformer.", ""),)  # GPT2LMHeadModel's saves prefix the base model
    ACTIVATIONS = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "relu": "relu"}

    def represents(self, cfg):
        return cfg.pos_encoding == "learned"

    def model_config(self, hf):
        r = _Reader(hf, self.model_type)
        d, n_inner = r.need("n_embd"), r.get("n_inner")
        activation = r.expect("activation_function", tuple(self.ACTIVATIONS),
                              "attnlab's GELU is the tanh approximation")
        r.expect("scale_attn_weights", (True,), "scores are scaled by 1/sqrt(head_dim)")
        r.expect("scale_attn_by_inverse_layer_idx", (False,), "no per-layer score scale")
        r.expect("reorder_and_upcast_attn", (False,), "scores are float32 anyway")
        r.expect("add_cross_attention", (False,), "a decoder-only LM")
        tie = r.expect("tie_word_embeddings", (True, False), "")
        r.get("n_ctx")  # an alias of n_positions in old configs
        cfg = ModelConfig(
            vocab_size=r.need("vocab_size"), d_model=d, n_layers=r.need("n_layer"),
            n_heads=r.need("n_head"), d_ff=4 * d if n_inner is None else n_inner,
            max_len=r.need("n_positions"), pos_encoding="learned", norm="layernorm",
            norm_position="pre", norm_eps=float(r.get("layer_norm_epsilon", 1e-5)),
            ffn=self.ACTIVATIONS[activation], tie_embeddings=tie, linear_bias=True,
            init_std=float(r.get("initializer_range", 0.02)))
        r.done()
        return cfg

    def hf_config(self, cfg, context):
        _refuse_fields(cfg, "GPT-2", dict(pos_encoding="learned", norm="layernorm",
                                          linear_bias=True),
                       {"vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len",
                        "norm_eps", "ffn", "tie_embeddings"})
        activation = {"gelu": "gelu_new", "relu": "relu"}.get(cfg.ffn)
        if activation is None:
            raise HFError(f"model.ffn={cfg.ffn!r} has no GPT-2 equivalent (gelu or relu)")
        return {"model_type": "gpt2", "architectures": [self.architecture],
                "vocab_size": cfg.vocab_size, "n_positions": cfg.max_len, "n_embd": cfg.d_model,
                "n_layer": cfg.n_layers, "n_head": cfg.n_heads,
                "n_inner": lm_width(cfg), "activation_function": activation,
                "layer_norm_epsilon": cfg.norm_eps, "initializer_range": cfg.init_std,
                "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                "reorder_and_upcast_attn": False, "tie_word_embeddings": cfg.tie_embeddings,
                "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": 0.0,
                "torch_dtype": "float32"}

    def context_length(self, hf):
        return int(hf["n_positions"])

    def tensors(self, cfg):
        out = [_one("wte.weight", "token_embedding"),
               _one("wpe.weight", "position_embedding"),
               _one("ln_f.weight", "final_norm/scale"), _one("ln_f.bias", "final_norm/bias")]
        for i in range(cfg.n_layers):
            h, b = f"h.{i}.", f"blocks/{i}/"
            qkv = tuple(f"{b}attn/{p}_proj" for p in "qkv")
            out += [
                _one(f"{h}ln_1.weight", f"{b}attn_norm/scale"),
                _one(f"{h}ln_1.bias", f"{b}attn_norm/bias"),
                _side_by_side(f"{h}attn.c_attn.weight", tuple(f"{p}/kernel" for p in qkv)),
                _side_by_side(f"{h}attn.c_attn.bias", tuple(f"{p}/bias" for p in qkv)),
                _one(f"{h}attn.c_proj.weight", f"{b}attn/o_proj/kernel"),
                _one(f"{h}attn.c_proj.bias", f"{b}attn/o_proj/bias"),
                _one(f"{h}ln_2.weight", f"{b}ffn_norm/scale"),
                _one(f"{h}ln_2.bias", f"{b}ffn_norm/bias"),
                _one(f"{h}mlp.c_fc.weight", f"{b}ffn/w_in/kernel"),
                _one(f"{h}mlp.c_fc.bias", f"{b}ffn/w_in/bias"),
                _one(f"{h}mlp.c_proj.weight", f"{b}ffn/w_out/kernel"),
                _one(f"{h}mlp.c_proj.bias", f"{b}ffn/w_out/bias"),
            ]
        if not cfg.tie_embeddings:
            out.append(_one("lm_head.weight", "lm_head", transposed=True))
        return out


class OPT(Family):
    """OPT (Zhang et al. 2022; transformers ``OPTConfig`` / ``OPTForCausalLM``): GPT-2's block
    with separate q, k, v, out projections, ReLU, biases everywhere; its learned position table
    has two leading rows that position ids never reach (OPT offsets every position by 2), so
    import drops them and export writes zeros there."""

    model_type = "opt"
    architecture = "OPTForCausalLM"
    aliases = (("decoder.", "model.decoder."),)  # OPTModel's saves

    def represents(self, cfg):
        return cfg.pos_encoding == "learned" and cfg.ffn == "relu"

    def model_config(self, hf):
        r = _Reader(hf, self.model_type)
        d = r.need("hidden_size")
        r.expect("activation_function", ("relu",), "OPT's FFN is ReLU")
        r.expect("do_layer_norm_before", (True,), "OPT-350m's post-LN blocks keep a final "
                                                  "norm attnlab's post-LN lacks")
        r.expect("enable_bias", (True,), "biases on every projection")
        r.expect("layer_norm_elementwise_affine", (True,), "LayerNorm has a scale and a bias")
        r.expect("_remove_final_layer_norm", (False,), "a final LayerNorm")
        projection = r.get("word_embed_proj_dim", d)
        if projection != d:
            raise HFError(f"config.json: word_embed_proj_dim={projection} is not representable "
                          f"in attnlab (no projection between the embeddings and hidden_size={d})")
        for key in ("dropout", "layerdrop", "init_std"):
            r.get(key)
        cfg = ModelConfig(
            vocab_size=r.need("vocab_size"), d_model=d, n_layers=r.need("num_hidden_layers"),
            n_heads=r.need("num_attention_heads"), d_ff=r.need("ffn_dim"),
            max_len=r.need("max_position_embeddings"), pos_encoding="learned",
            norm="layernorm", norm_position="pre", norm_eps=1e-5, ffn="relu",
            tie_embeddings=r.expect("tie_word_embeddings", (True, False), ""),
            linear_bias=True, init_std=float(r.get("init_std", 0.02)))
        r.done()
        return cfg

    def hf_config(self, cfg, context):
        _refuse_fields(cfg, "OPT", dict(pos_encoding="learned", norm="layernorm",
                                        linear_bias=True, ffn="relu"),
                       {"vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len",
                        "tie_embeddings"})
        return {"model_type": "opt", "architectures": [self.architecture],
                "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
                "word_embed_proj_dim": cfg.d_model, "num_hidden_layers": cfg.n_layers,
                "num_attention_heads": cfg.n_heads, "ffn_dim": lm_width(cfg),
                "max_position_embeddings": cfg.max_len, "activation_function": "relu",
                "do_layer_norm_before": True, "enable_bias": True,
                "layer_norm_elementwise_affine": True, "_remove_final_layer_norm": False,
                "tie_word_embeddings": cfg.tie_embeddings, "init_std": cfg.init_std,
                "dropout": cfg.dropout, "attention_dropout": 0.0, "layerdrop": 0.0,
                "torch_dtype": "float32"}

    def context_length(self, hf):
        return int(hf["max_position_embeddings"])

    def tensors(self, cfg):
        top = "model.decoder."
        out = [_one(f"{top}embed_tokens.weight", "token_embedding"),
               Tensor(f"{top}embed_positions.weight", ("position_embedding",), OFFSET_ROWS),
               _one(f"{top}final_layer_norm.weight", "final_norm/scale"),
               _one(f"{top}final_layer_norm.bias", "final_norm/bias")]
        for i in range(cfg.n_layers):
            h, b = f"{top}layers.{i}.", f"blocks/{i}/"
            for hf_name, ours in (("q_proj", "q_proj"), ("k_proj", "k_proj"),
                                  ("v_proj", "v_proj"), ("out_proj", "o_proj")):
                out += [_one(f"{h}self_attn.{hf_name}.weight", f"{b}attn/{ours}/kernel", True),
                        _one(f"{h}self_attn.{hf_name}.bias", f"{b}attn/{ours}/bias")]
            out += [_one(f"{h}self_attn_layer_norm.weight", f"{b}attn_norm/scale"),
                    _one(f"{h}self_attn_layer_norm.bias", f"{b}attn_norm/bias"),
                    _one(f"{h}fc1.weight", f"{b}ffn/w_in/kernel", True),
                    _one(f"{h}fc1.bias", f"{b}ffn/w_in/bias"),
                    _one(f"{h}fc2.weight", f"{b}ffn/w_out/kernel", True),
                    _one(f"{h}fc2.bias", f"{b}ffn/w_out/bias"),
                    _one(f"{h}final_layer_norm.weight", f"{b}ffn_norm/scale"),
                    _one(f"{h}final_layer_norm.bias", f"{b}ffn_norm/bias")]
        if not cfg.tie_embeddings:
            out.append(_one("lm_head.weight", "lm_head", transposed=True))
        return out


class Bloom(Family):
    """BLOOM (BigScience 2022; transformers ``BloomConfig`` / ``BloomForCausalLM``): ALiBi
    (Press et al.'s slopes, the same for any head count), a LayerNorm of the word embeddings
    (``model.embedding_norm``), pre-LN LayerNorm blocks, q, k, v fused head by head, tanh-GELU
    MLP of width 4d, biases everywhere, tied head. Bloom adds ``m_h j`` (the key's position) to
    row i's scores where attnlab adds ``-m_h (i - j)``: the two differ by ``m_h i``, the same
    for every key of the row, so the softmax is the same."""

    model_type = "bloom"
    architecture = "BloomForCausalLM"
    aliases = (("transformer.", ""),)

    def represents(self, cfg):
        return cfg.pos_encoding == "alibi"

    def model_config(self, hf):
        r = _Reader(hf, self.model_type)
        d = r.get("hidden_size", r.get("n_embed"))
        if d is None:
            raise HFError("config.json: hidden_size is missing (needed by model_type=bloom)")
        r.expect("apply_residual_connection_post_layernorm", (False,),
                 "the residual is the block's input")
        r.expect("pretraining_tp", (1,), "")
        r.expect("slow_but_exact", (False,), "")
        for key in ("hidden_dropout", "attention_softmax_in_fp32", "masked_softmax_fusion",
                    "seq_length", "unk_token_id", "offset_alibi", "skip_bias_add",
                    "skip_bias_add_qkv", "bias_dropout_fusion", "n_inner"):
            r.get(key)
        if hf.get("n_inner") not in (None, 4 * d):
            raise HFError(f"config.json: n_inner={hf['n_inner']} is not representable in "
                          "attnlab (Bloom's MLP is 4 hidden_size wide)")
        cfg = ModelConfig(
            vocab_size=r.need("vocab_size"), d_model=d, n_layers=r.need("n_layer"),
            n_heads=r.need("n_head"), d_ff=4 * d, pos_encoding="alibi", norm="layernorm",
            norm_position="pre", norm_eps=float(r.get("layer_norm_epsilon", 1e-5)),
            ffn="gelu", tie_embeddings=r.expect("tie_word_embeddings", (True, False), ""),
            linear_bias=True, embedding_norm=True,
            init_std=float(r.get("initializer_range", 0.02)))
        r.done()
        return cfg

    def hf_config(self, cfg, context):
        _refuse_fields(cfg, "Bloom", dict(pos_encoding="alibi", norm="layernorm",
                                          linear_bias=True, embedding_norm=True),
                       {"vocab_size", "d_model", "n_layers", "n_heads", "norm_eps", "d_ff",
                        "tie_embeddings", "max_len"})
        if lm_width(cfg) != 4 * cfg.d_model:
            raise HFError(f"model.d_ff={lm_width(cfg)} has no Bloom equivalent (4 d_model)")
        return {"model_type": "bloom", "architectures": [self.architecture],
                "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
                "n_layer": cfg.n_layers, "n_head": cfg.n_heads,
                "layer_norm_epsilon": cfg.norm_eps, "initializer_range": cfg.init_std,
                "apply_residual_connection_post_layernorm": False, "pretraining_tp": 1,
                "slow_but_exact": False, "tie_word_embeddings": cfg.tie_embeddings,
                "hidden_dropout": cfg.dropout, "attention_dropout": 0.0,
                "seq_length": context, "torch_dtype": "float32"}

    def context_length(self, hf):
        return int(hf.get("seq_length") or 2048)

    def tensors(self, cfg):
        out = [_one("word_embeddings.weight", "token_embedding"),
               _one("word_embeddings_layernorm.weight", "embedding_norm/scale"),
               _one("word_embeddings_layernorm.bias", "embedding_norm/bias"),
               _one("ln_f.weight", "final_norm/scale"), _one("ln_f.bias", "final_norm/bias")]
        for i in range(cfg.n_layers):
            h, b = f"h.{i}.", f"blocks/{i}/"
            qkv = tuple(f"{b}attn/{p}_proj" for p in "qkv")
            out += [
                _one(f"{h}input_layernorm.weight", f"{b}attn_norm/scale"),
                _one(f"{h}input_layernorm.bias", f"{b}attn_norm/bias"),
                Tensor(f"{h}self_attention.query_key_value.weight",
                       tuple(f"{p}/kernel" for p in qkv), PerHead(cfg.n_heads)),
                Tensor(f"{h}self_attention.query_key_value.bias",
                       tuple(f"{p}/bias" for p in qkv), PerHead(cfg.n_heads)),
                _one(f"{h}self_attention.dense.weight", f"{b}attn/o_proj/kernel", True),
                _one(f"{h}self_attention.dense.bias", f"{b}attn/o_proj/bias"),
                _one(f"{h}post_attention_layernorm.weight", f"{b}ffn_norm/scale"),
                _one(f"{h}post_attention_layernorm.bias", f"{b}ffn_norm/bias"),
                _one(f"{h}mlp.dense_h_to_4h.weight", f"{b}ffn/w_in/kernel", True),
                _one(f"{h}mlp.dense_h_to_4h.bias", f"{b}ffn/w_in/bias"),
                _one(f"{h}mlp.dense_4h_to_h.weight", f"{b}ffn/w_out/kernel", True),
                _one(f"{h}mlp.dense_4h_to_h.bias", f"{b}ffn/w_out/bias"),
            ]
        if not cfg.tie_embeddings:
            out.append(_one("lm_head.weight", "lm_head", transposed=True))
        return out


def lm_width(cfg: ModelConfig) -> int:
    """The FFN width a config builds (``model.d_ff`` or the kind's default)."""
    from attnlab.model import resolve

    return resolve(cfg).ffn.width


class Llama(Family):
    """Llama (Touvron et al. 2023; transformers ``LlamaConfig`` / ``LlamaForCausalLM``): RoPE,
    RMSNorm, SwiGLU, grouped-query attention, no biases."""

    model_type = "llama"
    architecture = "LlamaForCausalLM"
    ignored_tensors = (".rotary_emb.inv_freq",)  # a buffer some old saves carry

    def represents(self, cfg):
        return cfg.pos_encoding == "rope" and not cfg.qk_norm and not cfg.attention_window

    def _common(self, r: _Reader) -> dict[str, Any]:
        d, heads = r.need("hidden_size"), r.need("num_attention_heads")
        head_dim = r.get("head_dim")
        if head_dim is not None and head_dim * heads != d:
            raise HFError(f"config.json: head_dim={head_dim} is not representable in attnlab "
                          f"(head_dim is hidden_size / num_attention_heads = {d // heads})")
        r.expect("hidden_act", ("silu",), "the FFN is SwiGLU")
        r.expect("attention_bias", (False,), "attention projections have no biases here")
        r.expect("mlp_bias", (False,), "FFN projections have no biases here")
        r.expect("pretraining_tp", (1,), "")
        r.expect("partial_rotary_factor", (1.0, 1), "RoPE rotates every pair")
        r.get("max_position_embeddings")
        fields = dict(
            vocab_size=r.need("vocab_size"), d_model=d, n_layers=r.need("num_hidden_layers"),
            n_heads=heads, n_kv_heads=r.get("num_key_value_heads", heads),
            d_ff=r.need("intermediate_size"), pos_encoding="rope", norm="rmsnorm",
            norm_position="pre", norm_eps=float(r.get("rms_norm_eps", 1e-6)), ffn="swiglu",
            tie_embeddings=r.expect("tie_word_embeddings", (False, True), ""),
            init_std=float(r.get("initializer_range", 0.02)))
        fields.update(self._rope(r))
        if fields["n_kv_heads"] == heads:
            fields["n_kv_heads"] = None
        return fields

    def _rope(self, r: _Reader) -> dict[str, Any]:
        """``rope_theta`` and ``rope_scaling`` (or the newer ``rope_parameters``) -> the RoPE
        fields; a rope type attnlab lacks (dynamic, longrope, llama3) is refused."""
        params = r.get("rope_parameters")
        scaling = r.get("rope_scaling")
        theta = r.get("rope_theta", 10000.0)
        if isinstance(params, dict):
            theta = params.get("rope_theta", theta)
            scaling = params if params.get("rope_type", "default") != "default" else scaling
        out = dict(rope_theta=float(theta))
        if not scaling:
            return out
        kind = scaling.get("rope_type", scaling.get("type"))
        known = {"rope_type", "type", "factor", "rope_theta"}
        if kind == "linear":
            out.update(rope_scaling="pi", rope_factor=float(scaling["factor"]))
        elif kind == "dynamic":
            # transformers grows the base past max_position_embeddings (its original context)
            out.update(rope_scaling="dynamic", rope_factor=float(scaling["factor"]),
                       rope_original_len=int(r.hf.get("max_position_embeddings", 2048)))
        elif kind == "yarn":
            original = scaling.get("original_max_position_embeddings",
                                   r.hf.get("max_position_embeddings"))
            out.update(rope_scaling="yarn", rope_factor=float(scaling["factor"]),
                       rope_original_len=int(original))
            known |= {"original_max_position_embeddings"}
            for key, value in (("beta_fast", 32.0), ("beta_slow", 1.0), ("truncate", True)):
                known.add(key)
                if scaling.get(key) is not None and scaling[key] != value:
                    raise HFError(f"config.json: rope_scaling.{key}={scaling[key]!r} is not "
                                  f"representable in attnlab (its YaRN uses {value!r})")
            # transformers multiplies q, k by 0.1 ln s + 1 unless attention_factor is given or
            # both mscale and mscale_all_dim are (DeepSeek's ratio of two such factors).
            known |= {"attention_factor", "mscale", "mscale_all_dim"}
            if scaling.get("attention_factor") is not None:
                raise HFError("config.json: rope_scaling.attention_factor is not representable "
                              "in attnlab (its YaRN multiplies q and k by 0.1 ln s + 1)")
            if scaling.get("mscale") and scaling.get("mscale_all_dim"):
                raise HFError("config.json: rope_scaling.mscale_all_dim is not representable in "
                              "attnlab (its YaRN multiplies q and k by 0.1 ln s + 1)")
        else:
            raise HFError(f"config.json: rope_scaling.rope_type={kind!r} is not representable in "
                          "attnlab (its RoPE scalings are linear (PI), dynamic and yarn)")
        extra = sorted(set(scaling) - known)
        if extra:
            raise HFError(f"config.json: rope_scaling.{extra[0]} is a setting attnlab has no "
                          "equivalent for")
        return out

    def model_config(self, hf):
        r = _Reader(hf, self.model_type)
        fields = self._common(r)
        self._extra(r, fields)
        r.done()
        return ModelConfig(**fields)

    def _extra(self, r: _Reader, fields: dict[str, Any]) -> None:
        """Family-specific keys (Mistral's window, Qwen3's QK-norm)."""

    REQUIRED = dict(pos_encoding="rope", norm="rmsnorm", ffn="swiglu")
    MAPPED = {"vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff",
              "max_len",  # the learned table's rows: unused with RoPE
              "rope_theta", "norm_eps", "tie_embeddings", "rope_scaling", "rope_factor",
              "rope_original_len"}

    def hf_config(self, cfg, context):
        _refuse_fields(cfg, self.title(), self.REQUIRED, self.MAPPED)
        out = {"model_type": self.model_type, "architectures": [self.architecture],
               "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
               "intermediate_size": lm_width(cfg), "num_hidden_layers": cfg.n_layers,
               "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.kv_heads,
               "head_dim": cfg.head_dim, "hidden_act": "silu",
               "max_position_embeddings": context, "rms_norm_eps": cfg.norm_eps,
               "rope_theta": cfg.rope_theta, "rope_scaling": None, "attention_bias": False,
               "mlp_bias": False, "pretraining_tp": 1, "tie_word_embeddings": cfg.tie_embeddings,
               "initializer_range": cfg.init_std, "attention_dropout": 0.0,
               "torch_dtype": "float32"}
        if cfg.rope_scaling == "pi":
            out["rope_scaling"] = {"rope_type": "linear", "factor": cfg.rope_factor}
        elif cfg.rope_scaling == "yarn":
            out["rope_scaling"] = {"rope_type": "yarn", "factor": cfg.rope_factor,
                                   "original_max_position_embeddings": cfg.rope_original_len}
        elif cfg.rope_scaling == "dynamic":  # its original context is max_position_embeddings
            out["rope_scaling"] = {"rope_type": "dynamic", "factor": cfg.rope_factor}
            out["max_position_embeddings"] = cfg.rope_original_len
        return out

    def title(self) -> str:
        return type(self).__name__

    def context_length(self, hf):
        return int(hf.get("max_position_embeddings", 2048))

    def tensors(self, cfg):
        out = [_one("model.embed_tokens.weight", "token_embedding"),
               _one("model.norm.weight", "final_norm/scale")]
        for i in range(cfg.n_layers):
            h, b = f"model.layers.{i}.", f"blocks/{i}/"
            out += [
                _one(f"{h}input_layernorm.weight", f"{b}attn_norm/scale"),
                _one(f"{h}self_attn.q_proj.weight", f"{b}attn/q_proj/kernel", True),
                _one(f"{h}self_attn.k_proj.weight", f"{b}attn/k_proj/kernel", True),
                _one(f"{h}self_attn.v_proj.weight", f"{b}attn/v_proj/kernel", True),
                _one(f"{h}self_attn.o_proj.weight", f"{b}attn/o_proj/kernel", True),
                _one(f"{h}post_attention_layernorm.weight", f"{b}ffn_norm/scale"),
                _one(f"{h}mlp.gate_proj.weight", f"{b}ffn/w_gate/kernel", True),
                _one(f"{h}mlp.up_proj.weight", f"{b}ffn/w_in/kernel", True),
                _one(f"{h}mlp.down_proj.weight", f"{b}ffn/w_out/kernel", True),
            ]
            out += self._layer_extra(h, b)
        if not cfg.tie_embeddings:
            out.append(_one("lm_head.weight", "lm_head", transposed=True))
        return out

    def _layer_extra(self, h: str, b: str) -> list[Tensor]:
        return []


class Mistral(Llama):
    """Mistral (Jiang et al. 2023): Llama with sliding-window attention of ``sliding_window``
    keys (query i sees keys i - w + 1 .. i; ``null``: full attention)."""

    model_type = "mistral"
    architecture = "MistralForCausalLM"
    MAPPED = Llama.MAPPED | {"attention_window"}

    def represents(self, cfg):
        return cfg.pos_encoding == "rope" and not cfg.qk_norm and cfg.attention_window > 0

    def _extra(self, r, fields):
        fields["attention_window"] = int(r.get("sliding_window") or 0)

    def hf_config(self, cfg, context):
        return {**super().hf_config(cfg, context), "sliding_window": cfg.attention_window}


class Qwen3(Llama):
    """Qwen3 (Qwen team 2025): Llama with QK-norm, an RMSNorm of each head's q and k before
    RoPE (``self_attn.q_norm`` / ``k_norm``, ``[head_dim]``)."""

    model_type = "qwen3"
    architecture = "Qwen3ForCausalLM"
    REQUIRED = {**Llama.REQUIRED, "qk_norm": True}

    def represents(self, cfg):
        return cfg.pos_encoding == "rope" and cfg.qk_norm and not cfg.attention_window

    def _extra(self, r, fields):
        fields["qk_norm"] = True
        r.expect("use_sliding_window", (False,), "Qwen3's windowed layers are not represented")
        r.get("sliding_window")  # read only with use_sliding_window
        r.get("max_window_layers")
        r.get("layer_types")  # all "full_attention" without a window

    def hf_config(self, cfg, context):
        return {**super().hf_config(cfg, context), "use_sliding_window": False,
                "sliding_window": None}

    def _layer_extra(self, h, b):
        return [_one(f"{h}self_attn.q_norm.weight", f"{b}attn/q_norm/scale"),
                _one(f"{h}self_attn.k_norm.weight", f"{b}attn/k_norm/scale")]


class Bert(Family):
    """BERT's masked LM (Devlin et al. 2019; transformers ``BertConfig`` /
    ``BertForMaskedLM``): learned absolute positions, a LayerNorm of the summed embeddings
    (``model.embedding_norm``), post-LN blocks with biases on every projection, the GELU MLP
    (``hidden_act``: ``gelu`` is the exact erf GELU, ``model.ffn=gelu_erf``; ``gelu_new`` the
    tanh one), and the MLM head's transform and output bias (``model.head=bert``) before the
    tied (or untied) decoder.

    Token types: attnlab has none, so import adds row 0 of ``token_type_embeddings`` to the
    position table, exactly the embedding of inputs that are all of type 0 (what an MLM reads
    unless it is given sentence pairs); the run is BERT on such inputs, and the import says
    so. Export writes a table of two zero rows, with which the exported model computes
    attnlab's function for any ``token_type_ids``. The pooler and the next-sentence head that
    pre-training saves carry are not part of ``BertForMaskedLM`` and are skipped, as
    transformers skips them."""

    model_type = "bert"
    architecture = "BertForMaskedLM"
    ignored_tensors = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias",
                       "cls.seq_relationship.weight", "cls.seq_relationship.bias")
    ACTIVATIONS = {"gelu": "gelu_erf", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu",
                   "relu": "relu"}
    EMBEDDINGS = "bert.embeddings."
    POSITIONS = EMBEDDINGS + "position_embeddings.weight"
    TYPES = EMBEDDINGS + "token_type_embeddings.weight"
    EXPORTED_TYPES = 2  # BERT's type_vocab_size (sentence A and B)

    def canonical(self, key):
        # TensorFlow-converted saves name the LayerNorm parameters gamma and beta.
        for old, new in (("LayerNorm.gamma", "LayerNorm.weight"),
                         ("LayerNorm.beta", "LayerNorm.bias")):
            if key.endswith(old):
                return key[:-len(old)] + new
        return key

    def represents(self, cfg):
        return cfg.objective == "mlm"

    def model_config(self, hf):
        r = _Reader(hf, self.model_type)
        activation = r.expect("hidden_act", tuple(self.ACTIVATIONS),
                              "the FFN's and the head transform's activation")
        r.expect("position_embedding_type", ("absolute",), "learned absolute positions")
        r.expect("is_decoder", (False,), "a bidirectional encoder")
        r.expect("add_cross_attention", (False,), "an encoder without cross-attention")
        types = r.get("type_vocab_size", 2)
        if not isinstance(types, int) or types < 1:
            raise HFError(f"config.json: type_vocab_size={types!r} is not a positive integer")
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout",
                    "gradient_checkpointing"):
            r.get(key)
        cfg = ModelConfig(
            vocab_size=r.need("vocab_size"), d_model=r.need("hidden_size"),
            n_layers=r.need("num_hidden_layers"), n_heads=r.need("num_attention_heads"),
            d_ff=r.need("intermediate_size"), max_len=r.need("max_position_embeddings"),
            pos_encoding="learned", norm="layernorm", norm_position="post",
            norm_eps=float(r.get("layer_norm_eps", 1e-12)), ffn=self.ACTIVATIONS[activation],
            tie_embeddings=r.expect("tie_word_embeddings", (True, False), ""),
            linear_bias=True, embedding_norm=True, head="bert", objective="mlm",
            init_std=float(r.get("initializer_range", 0.02)))
        r.done()
        return cfg

    def hf_config(self, cfg, context):
        _refuse_fields(cfg, "BERT", dict(pos_encoding="learned", norm="layernorm",
                                         norm_position="post", linear_bias=True,
                                         embedding_norm=True, head="bert", objective="mlm"),
                       {"vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len",
                        "norm_eps", "ffn", "tie_embeddings"})
        activation = {"gelu_erf": "gelu", "gelu": "gelu_new", "relu": "relu"}.get(cfg.ffn)
        if activation is None:
            raise HFError(f"model.ffn={cfg.ffn!r} has no BERT equivalent (gelu_erf, gelu or "
                          "relu)")
        return {"model_type": "bert", "architectures": [self.architecture],
                "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
                "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
                "intermediate_size": lm_width(cfg), "hidden_act": activation,
                "max_position_embeddings": cfg.max_len, "type_vocab_size": self.EXPORTED_TYPES,
                "layer_norm_eps": cfg.norm_eps, "initializer_range": cfg.init_std,
                "position_embedding_type": "absolute", "is_decoder": False,
                "tie_word_embeddings": cfg.tie_embeddings, "hidden_dropout_prob": cfg.dropout,
                "attention_probs_dropout_prob": 0.0, "torch_dtype": "float32"}

    def context_length(self, hf):
        return int(hf["max_position_embeddings"])

    def tied_copies(self, cfg):
        # transformers ties cls.predictions.decoder.bias to cls.predictions.bias
        out = {"cls.predictions.decoder.bias": "head/bias"}
        if cfg.tie_embeddings:
            out["cls.predictions.decoder.weight"] = "token_embedding"
        return out

    def folded(self):
        return {self.TYPES: self.POSITIONS}

    def fold(self, key, tensor, read):
        if key != self.POSITIONS:
            return tensor
        types = read(self.TYPES)
        if types.ndim != 2 or types.shape[1] != tensor.shape[1]:
            raise HFError(f"tensor {self.TYPES} has shape {list(types.shape)}, the config says "
                          f"[type_vocab_size, {tensor.shape[1]}]")
        return tensor + types[0]  # every input of token type 0

    def unfolded(self, cfg):
        return {self.TYPES: np.zeros((self.EXPORTED_TYPES, cfg.d_model), np.float32)}

    def notes(self, hf):
        return ["token types: row 0 of token_type_embeddings is added to the position table "
                "(attnlab has no token types: the run is BertForMaskedLM on inputs of token "
                "type 0)",
                "[MASK]: attnlab's mlm objective and fill-mask generation use the last id "
                f"({hf.get('vocab_size', 0) - 1}), not the tokenizer's [MASK] token"]

    def tensors(self, cfg):
        e, p = self.EMBEDDINGS, "cls.predictions."
        out = [_one(e + "word_embeddings.weight", "token_embedding"),
               _one(self.POSITIONS, "position_embedding"),
               _one(e + "LayerNorm.weight", "embedding_norm/scale"),
               _one(e + "LayerNorm.bias", "embedding_norm/bias"),
               _one(p + "transform.dense.weight", "head/transform/kernel", True),
               _one(p + "transform.dense.bias", "head/transform/bias"),
               _one(p + "transform.LayerNorm.weight", "head/norm/scale"),
               _one(p + "transform.LayerNorm.bias", "head/norm/bias"),
               _one(p + "bias", "head/bias")]
        for i in range(cfg.n_layers):
            h, b = f"bert.encoder.layer.{i}.", f"blocks/{i}/"
            for hf_name, ours in (("self.query", "attn/q_proj"), ("self.key", "attn/k_proj"),
                                  ("self.value", "attn/v_proj"), ("output.dense", "attn/o_proj")):
                out += [_one(f"{h}attention.{hf_name}.weight", f"{b}{ours}/kernel", True),
                        _one(f"{h}attention.{hf_name}.bias", f"{b}{ours}/bias")]
            out += [_one(f"{h}attention.output.LayerNorm.weight", f"{b}attn_norm/scale"),
                    _one(f"{h}attention.output.LayerNorm.bias", f"{b}attn_norm/bias"),
                    _one(f"{h}intermediate.dense.weight", f"{b}ffn/w_in/kernel", True),
                    _one(f"{h}intermediate.dense.bias", f"{b}ffn/w_in/bias"),
                    _one(f"{h}output.dense.weight", f"{b}ffn/w_out/kernel", True),
                    _one(f"{h}output.dense.bias", f"{b}ffn/w_out/bias"),
                    _one(f"{h}output.LayerNorm.weight", f"{b}ffn_norm/scale"),
                    _one(f"{h}output.LayerNorm.bias", f"{b}ffn_norm/bias")]
        if not cfg.tie_embeddings:
            out.append(_one(p + "decoder.weight", "lm_head", transposed=True))
        return out


class T5(Family):
    """T5 (Raffel et al. 2020; transformers ``T5Config`` / ``T5ForConditionalGeneration``),
    v1.0 and v1.1: the encoder-decoder of ``model.objective=span`` with T5's relative bias
    (``pos_encoding=t5``; one table per stack, held by the stack's first block and shared by
    its layers), unscaled scores in self- and cross-attention (``attention_scale=none``),
    RMSNorm (no bias), no biases, and ``feed_forward_proj`` relu (v1.0), gated-gelu (v1.1;
    tanh GELU: ``ffn=geglu``), gelu (erf: ``ffn=gelu_erf``) or gated-silu (``ffn=swiglu``).
    v1.0's head is tied with the hidden state rescaled by ``d_model^-0.5``
    (``model.head=t5``); v1.1's is untied and not rescaled. Both stacks have ``num_layers``
    layers, and ``d_kv`` is ``d_model / num_heads``, as attnlab builds them."""

    model_type = "t5"
    architecture = "T5ForConditionalGeneration"
    FFNS = {"relu": "relu", "gated-gelu": "geglu", "gelu": "gelu_erf", "gated-silu": "swiglu"}
    # What T5Config derives from feed_forward_proj (and some saves write out).
    ACTIVATION_OF = {"relu": "relu", "gated-gelu": "gelu_new", "gelu": "gelu",
                     "gated-silu": "silu"}
    BIAS = "SelfAttention.relative_attention_bias.weight"

    def represents(self, cfg):
        return cfg.objective == "span"

    def model_config(self, hf):
        r = _Reader(hf, self.model_type)
        d, heads, layers = r.need("d_model"), r.need("num_heads"), r.need("num_layers")
        d_kv = r.get("d_kv", d // heads)
        if d_kv * heads != d:
            raise HFError(f"config.json: d_kv={d_kv} is not representable in attnlab (a head is "
                          f"d_model / num_heads = {d // heads} wide)")
        decoder_layers = r.get("num_decoder_layers", layers)
        if decoder_layers not in (None, layers):
            raise HFError(f"config.json: num_decoder_layers={decoder_layers} is not "
                          f"representable in attnlab (both stacks have num_layers={layers})")
        proj = r.expect("feed_forward_proj", tuple(self.FFNS),
                        "attnlab's FFNs relu, geglu (tanh), gelu_erf and swiglu")
        if r.get("dense_act_fn", self.ACTIVATION_OF[proj]) != self.ACTIVATION_OF[proj]:
            raise HFError(f"config.json: dense_act_fn={hf['dense_act_fn']!r} is not what "
                          f"feed_forward_proj={proj!r} computes in attnlab "
                          f"({self.ACTIVATION_OF[proj]!r})")
        r.expect("is_gated_act", (proj.startswith("gated"),), "given by feed_forward_proj")
        r.expect("is_encoder_decoder", (True,), "an encoder-decoder")
        for key in ("dropout_rate", "initializer_factor", "classifier_dropout", "n_positions",
                    "gradient_checkpointing",
                    "output_past"):
            r.get(key)
        tie = r.expect("tie_word_embeddings", (True, False), "")
        # transformers 5 states the decoder output's d_model^-0.5 rescale; before, a tied
        # head implied it. attnlab rescales the tied head only (model.head=t5).
        scale = r.expect("scale_decoder_outputs", (tie, not tie) if tie else (False,),
                         "the rescale before the head needs tie_word_embeddings=true")
        cfg = ModelConfig(
            vocab_size=r.need("vocab_size"), d_model=d, n_layers=layers, n_heads=heads,
            d_ff=r.need("d_ff"), pos_encoding="t5",
            t5_num_buckets=r.get("relative_attention_num_buckets", 32),
            t5_max_distance=r.get("relative_attention_max_distance", 128),
            norm="rmsnorm", norm_position="pre",
            norm_eps=float(r.get("layer_norm_epsilon", 1e-6)), ffn=self.FFNS[proj],
            tie_embeddings=tie, attention_scale="none", objective="span",
            head="t5" if scale else "linear")
        r.done()
        return cfg

    def hf_config(self, cfg, context):
        tied_heads = ("t5", "linear")  # a tied head with or without the rescale
        head = (cfg.head if cfg.head in tied_heads else "t5") if cfg.tie_embeddings else "linear"
        _refuse_fields(cfg, "T5", dict(pos_encoding="t5", norm="rmsnorm", attention_scale="none",
                                       objective="span", head=head),
                       {"vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "norm_eps", "ffn",
                        "tie_embeddings", "t5_num_buckets", "t5_max_distance",
                        "max_len"})  # max_len: the learned table's rows, unused with T5's bias
        proj = {ours: theirs for theirs, ours in self.FFNS.items()}.get(cfg.ffn)
        if proj is None:
            raise HFError(f"model.ffn={cfg.ffn!r} has no T5 equivalent "
                          f"({', '.join(self.FFNS.values())})")
        return {"model_type": "t5", "architectures": [self.architecture],
                "vocab_size": cfg.vocab_size, "d_model": cfg.d_model, "d_kv": cfg.head_dim,
                "d_ff": lm_width(cfg), "num_layers": cfg.n_layers,
                "num_decoder_layers": cfg.n_layers, "num_heads": cfg.n_heads,
                "relative_attention_num_buckets": cfg.t5_num_buckets,
                "relative_attention_max_distance": cfg.t5_max_distance,
                "layer_norm_epsilon": cfg.norm_eps, "feed_forward_proj": proj,
                "tie_word_embeddings": cfg.tie_embeddings, "is_encoder_decoder": True,
                "scale_decoder_outputs": head == "t5",
                "dropout_rate": cfg.dropout, "initializer_factor": 1.0,
                # attnlab's span decoder starts from [MASK], its last id
                "decoder_start_token_id": cfg.vocab_size - 1, "n_positions": context,
                "torch_dtype": "float32"}

    def context_length(self, hf):
        return int(hf.get("n_positions") or 512)

    def tied_copies(self, cfg):
        # T5ForConditionalGeneration ties each stack's embed_tokens to shared
        out = {"encoder.embed_tokens.weight": "token_embedding",
               "decoder.embed_tokens.weight": "token_embedding"}
        return {**out, **super().tied_copies(cfg)}

    def notes(self, hf):
        return [f"decoder start and sentinels: attnlab's span objective and fill-in decoding "
                f"start the decoder with its last id ({hf.get('vocab_size', 0) - 1}) and use it "
                "for every span, not decoder_start_token_id and <extra_id_k>"]

    def _ffn(self, cfg: ModelConfig, h: str, b: str) -> list[Tensor]:
        gated = {"w_gate": "wi_0", "w_in": "wi_1"} if resolve_inputs(cfg) == 2 else {"w_in": "wi"}
        out = [_one(f"{h}DenseReluDense.{theirs}.weight", f"{b}ffn/{ours}/kernel", True)
               for ours, theirs in gated.items()]
        return out + [_one(f"{h}DenseReluDense.wo.weight", f"{b}ffn/w_out/kernel", True)]

    def tensors(self, cfg):
        out = [_one("shared.weight", "token_embedding"),
               _one(f"encoder.block.0.layer.0.{self.BIAS}", "position_embedding"),
               _one(f"decoder.block.0.layer.0.{self.BIAS}", "decoder_position_embedding"),
               _one("encoder.final_layer_norm.weight", "encoder_norm/scale"),
               _one("decoder.final_layer_norm.weight", "final_norm/scale")]

        def attention(hf_prefix, ours):
            return [_one(f"{hf_prefix}.{p}.weight", f"{ours}/{p}_proj/kernel", True)
                    for p in "qkvo"]

        for i in range(cfg.n_layers):
            h, b = f"encoder.block.{i}.layer.", f"encoder/{i}/"
            out += attention(f"{h}0.SelfAttention", f"{b}attn")
            out += [_one(f"{h}0.layer_norm.weight", f"{b}attn_norm/scale"),
                    _one(f"{h}1.layer_norm.weight", f"{b}ffn_norm/scale")]
            out += self._ffn(cfg, f"{h}1.", b)
            h, b = f"decoder.block.{i}.layer.", f"decoder/{i}/"
            out += attention(f"{h}0.SelfAttention", f"{b}attn")
            out += attention(f"{h}1.EncDecAttention", f"{b}cross")
            out += [_one(f"{h}0.layer_norm.weight", f"{b}attn_norm/scale"),
                    _one(f"{h}1.layer_norm.weight", f"{b}cross_norm/scale"),
                    _one(f"{h}2.layer_norm.weight", f"{b}ffn_norm/scale")]
            out += self._ffn(cfg, f"{h}2.", b)
        if not cfg.tie_embeddings:
            out.append(_one("lm_head.weight", "lm_head", transposed=True))
        return out


def resolve_inputs(cfg: ModelConfig) -> int:
    """The FFN's input projections (2 for a gated FFN)."""
    from attnlab.model import resolve

    return resolve(cfg).ffn.inputs


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
