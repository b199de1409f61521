"""BERT (``model_type`` bert, BertForMaskedLM)."""

from __future__ import annotations

import numpy as np

from attnlab.config import ModelConfig
from attnlab.hf.families.base import Family, HFError, Reader, lm_width, refuse_fields
from attnlab.hf.tensors import one as _one


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
        r = Reader(hf, self.model_type)
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
        refuse_fields(cfg, "BERT", dict(pos_encoding="learned", norm="layernorm",
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
