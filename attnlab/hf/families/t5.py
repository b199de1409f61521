"""T5 v1.0 / v1.1 (``model_type`` t5)."""

from __future__ import annotations

from attnlab.config import ModelConfig
from attnlab.hf.families.base import (
    Family,
    HFError,
    Reader,
    lm_width,
    refuse_fields,
    resolve_inputs,
)
from attnlab.hf.tensors import Tensor
from attnlab.hf.tensors import one as _one


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
        r = Reader(hf, self.model_type)
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
        refuse_fields(cfg, "T5", dict(pos_encoding="t5", norm="rmsnorm", attention_scale="none",
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
