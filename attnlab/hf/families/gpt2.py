"""GPT-2 (``model_type`` gpt2)."""

from __future__ import annotations

from attnlab.config import ModelConfig
from attnlab.hf.families.base import Family, HFError, Reader, lm_width, refuse_fields
from attnlab.hf.tensors import one as _one
from attnlab.hf.tensors import side_by_side as _side_by_side


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
        r = Reader(hf, self.model_type)
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
        refuse_fields(cfg, "GPT-2", dict(pos_encoding="learned", norm="layernorm",
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
