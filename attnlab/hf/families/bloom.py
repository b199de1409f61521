"""BLOOM (``model_type`` bloom)."""

from __future__ import annotations

from attnlab.config import ModelConfig
from attnlab.hf.families.base import Family, HFError, Reader, lm_width, refuse_fields
from attnlab.hf.tensors import PerHead, Tensor
from attnlab.hf.tensors import one as _one


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
        r = Reader(hf, self.model_type)
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
        refuse_fields(cfg, "Bloom", dict(pos_encoding="alibi", norm="layernorm",
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
