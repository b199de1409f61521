"""Llama and its kin: Mistral (a sliding window) and Qwen3 (QK-norm)."""

from __future__ import annotations

from typing import Any

from attnlab.config import ModelConfig
from attnlab.hf.families.base import Family, HFError, Reader, lm_width, refuse_fields
from attnlab.hf.tensors import Tensor
from attnlab.hf.tensors import one as _one


class Llama(Family):
    """Llama (Touvron et al. 2023; transformers ``LlamaConfig`` / ``LlamaForCausalLM``): RoPE,
    RMSNorm, SwiGLU, grouped-query attention, no biases."""

    model_type = "llama"
    architecture = "LlamaForCausalLM"
    ignored_tensors = (".rotary_emb.inv_freq",)  # a buffer some old saves carry

    def represents(self, cfg):
        return cfg.pos_encoding == "rope" and not cfg.qk_norm and not cfg.attention_window

    def _common(self, r: Reader) -> dict[str, Any]:
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

    def _rope(self, r: Reader) -> dict[str, Any]:
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
        r = Reader(hf, self.model_type)
        fields = self._common(r)
        self._extra(r, fields)
        r.done()
        return ModelConfig(**fields)

    def _extra(self, r: Reader, fields: dict[str, Any]) -> None:
        """Family-specific keys (Mistral's window, Qwen3's QK-norm)."""

    REQUIRED = dict(pos_encoding="rope", norm="rmsnorm", ffn="swiglu")
    MAPPED = {"vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff",
              "max_len",  # the learned table's rows: unused with RoPE
              "rope_theta", "norm_eps", "tie_embeddings", "rope_scaling", "rope_factor",
              "rope_original_len"}

    def hf_config(self, cfg, context):
        refuse_fields(cfg, self.title(), self.REQUIRED, self.MAPPED)
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
