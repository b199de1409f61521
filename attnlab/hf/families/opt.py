"""OPT (``model_type`` opt)."""

from __future__ import annotations

from attnlab.config import ModelConfig
from attnlab.hf.families.base import Family, HFError, Reader, lm_width, refuse_fields
from attnlab.hf.tensors import OFFSET_ROWS, Tensor
from attnlab.hf.tensors import one as _one


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
        r = Reader(hf, self.model_type)
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
        refuse_fields(cfg, "OPT", dict(pos_encoding="learned", norm="layernorm",
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
