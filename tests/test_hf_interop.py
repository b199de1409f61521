"""``attnlab import-hf`` / ``export-hf``: tiny Hugging Face checkpoints built here with NumPy and
``safetensors.numpy`` from the documented transformers schemas (no downloads, no torch), their
logits against float64 NumPy forward passes written from each family's equations, bitwise
round trips, and the one-line refusals (nothing written)."""

import json
import math

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from attnlab import cli
from attnlab.model import apply
from attnlab.train.load import load_params

V, D, LAYERS, HEADS, FF, CTX = 300, 32, 2, 4, 40, 16  # V >= 256: the byte data section


# --------------------------------------------------------------------------------------------
# Tiny checkpoints from the HF schemas
# --------------------------------------------------------------------------------------------


def gpt2_config(**overrides):
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": V,
            "n_positions": CTX, "n_embd": D, "n_layer": LAYERS, "n_head": HEADS, "n_inner": FF,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
            "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
            "initializer_range": 0.02, "bos_token_id": 0, "eos_token_id": 0,
            "torch_dtype": "float32", "transformers_version": "4.46.0", **overrides}


def gpt2_tensors(rng, cfg):
    d, ff = cfg["n_embd"], cfg["n_inner"]
    t = {"wte.weight": (cfg["vocab_size"], d), "wpe.weight": (cfg["n_positions"], d),
         "ln_f.weight": (d,), "ln_f.bias": (d,)}
    for i in range(cfg["n_layer"]):
        t.update({f"h.{i}.ln_1.weight": (d,), f"h.{i}.ln_1.bias": (d,),
                  f"h.{i}.attn.c_attn.weight": (d, 3 * d), f"h.{i}.attn.c_attn.bias": (3 * d,),
                  f"h.{i}.attn.c_proj.weight": (d, d), f"h.{i}.attn.c_proj.bias": (d,),
                  f"h.{i}.ln_2.weight": (d,), f"h.{i}.ln_2.bias": (d,),
                  f"h.{i}.mlp.c_fc.weight": (d, ff), f"h.{i}.mlp.c_fc.bias": (ff,),
                  f"h.{i}.mlp.c_proj.weight": (ff, d), f"h.{i}.mlp.c_proj.bias": (d,)})
    return {k: random(rng, k, s) for k, s in t.items()}


def opt_config(**overrides):
    return {"model_type": "opt", "architectures": ["OPTForCausalLM"], "vocab_size": V,
            "hidden_size": D, "word_embed_proj_dim": D, "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS, "ffn_dim": FF, "max_position_embeddings": CTX,
            "activation_function": "relu", "do_layer_norm_before": True, "enable_bias": True,
            "layer_norm_elementwise_affine": True, "_remove_final_layer_norm": False,
            "dropout": 0.1, "attention_dropout": 0.0, "layerdrop": 0.0, "init_std": 0.02,
            "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2, **overrides}


def opt_tensors(rng, cfg):
    """OPTModel's spelling (``decoder.*``, as facebook/opt-* saves it)."""
    d, ff = cfg["hidden_size"], cfg["ffn_dim"]
    t = {"decoder.embed_tokens.weight": (cfg["vocab_size"], d),
         "decoder.embed_positions.weight": (cfg["max_position_embeddings"] + 2, d),
         "decoder.final_layer_norm.weight": (d,), "decoder.final_layer_norm.bias": (d,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"decoder.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            t.update({f"{p}self_attn.{name}.weight": (d, d), f"{p}self_attn.{name}.bias": (d,)})
        t.update({p + "self_attn_layer_norm.weight": (d,), p + "self_attn_layer_norm.bias": (d,),
                  p + "fc1.weight": (ff, d), p + "fc1.bias": (ff,), p + "fc2.weight": (d, ff),
                  p + "fc2.bias": (d,), p + "final_layer_norm.weight": (d,),
                  p + "final_layer_norm.bias": (d,)})
    return {k: random(rng, k, s) for k, s in t.items()}


def opt_reference(w, cfg, tokens):
    """Zhang et al. 2022: pre-LN, ReLU, biases, position p reads row p + 2; weights [out, in]."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    t, d, h = len(tokens), cfg["hidden_size"], cfg["num_attention_heads"]

    def ln(x, p):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * w[p + ".weight"] + w[p + ".bias"]

    def linear(x, p):
        return x @ w[p + ".weight"].T + w[p + ".bias"]

    x = w["decoder.embed_tokens.weight"][tokens] + w["decoder.embed_positions.weight"][2:t + 2]
    causal = np.tril(np.ones((t, t), bool))
    for i in range(cfg["num_hidden_layers"]):
        p = f"decoder.layers.{i}."
        a = ln(x, p + "self_attn_layer_norm")
        q, k, v = (linear(a, f"{p}self_attn.{n}_proj").reshape(t, h, d // h) for n in "qkv")
        x = x + linear(attend(q, k, v, causal).reshape(t, d), p + "self_attn.out_proj")
        m = np.maximum(linear(ln(x, p + "final_layer_norm"), p + "fc1"), 0)
        x = x + linear(m, p + "fc2")
    return ln(x, "decoder.final_layer_norm") @ w["decoder.embed_tokens.weight"].T


def bloom_config(**overrides):
    return {"model_type": "bloom", "architectures": ["BloomForCausalLM"], "vocab_size": V,
            "hidden_size": D, "n_layer": LAYERS, "n_head": 4, "layer_norm_epsilon": 1e-5,
            "initializer_range": 0.02, "apply_residual_connection_post_layernorm": False,
            "hidden_dropout": 0.0, "attention_dropout": 0.0, "pretraining_tp": 1,
            "slow_but_exact": False, "use_cache": True, "seq_length": CTX, **overrides}


def bloom_tensors(rng, cfg):
    """BloomForCausalLM's spelling (``transformer.*``)."""
    d = cfg["hidden_size"]
    t = {"transformer.word_embeddings.weight": (cfg["vocab_size"], d),
         "transformer.word_embeddings_layernorm.weight": (d,),
         "transformer.word_embeddings_layernorm.bias": (d,),
         "transformer.ln_f.weight": (d,), "transformer.ln_f.bias": (d,)}
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        t.update({p + "input_layernorm.weight": (d,), p + "input_layernorm.bias": (d,),
                  p + "self_attention.query_key_value.weight": (3 * d, d),
                  p + "self_attention.query_key_value.bias": (3 * d,),
                  p + "self_attention.dense.weight": (d, d),
                  p + "self_attention.dense.bias": (d,),
                  p + "post_attention_layernorm.weight": (d,),
                  p + "post_attention_layernorm.bias": (d,),
                  p + "mlp.dense_h_to_4h.weight": (4 * d, d), p + "mlp.dense_h_to_4h.bias": (4 * d,),
                  p + "mlp.dense_4h_to_h.weight": (d, 4 * d), p + "mlp.dense_4h_to_h.bias": (d,)})
    return {k: random(rng, k, s) for k, s in t.items()}


def bloom_slopes(n):
    """BLOOM's build_alibi_tensor slopes: base 2^(-8/c) for the largest power of two c <= n,
    powers 1..c; then base 2^(-8/(2c)) at the odd powers 1, 3, ... for the remaining heads."""
    c = 2 ** int(math.floor(math.log2(n)))
    slopes = [(2 ** (-8 / c)) ** p for p in range(1, c + 1)]
    slopes += [(2 ** (-8 / (2 * c))) ** p for p in range(1, 2 * (n - c), 2)]
    return np.array(slopes)


def bloom_reference(w, cfg, tokens):
    """BigScience 2022: embedding LayerNorm, ALiBi as m_h * (key position), q/k/v interleaved per
    head in query_key_value ([heads, 3, head_dim] output rows), tanh GELU, weights [out, in]."""
    w = {k.removeprefix("transformer."): v.astype(np.float64) for k, v in w.items()}
    t, d, h = len(tokens), cfg["hidden_size"], cfg["n_head"]
    hd = d // h

    def ln(x, p):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + cfg["layer_norm_epsilon"]) * w[p + ".weight"] + w[p + ".bias"]

    def linear(x, p):
        return x @ w[p + ".weight"].T + w[p + ".bias"]

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    slopes = bloom_slopes(h)
    x = ln(w["word_embeddings.weight"][tokens], "word_embeddings_layernorm")
    causal = np.tril(np.ones((t, t), bool))
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        fused = linear(ln(x, p + "input_layernorm"), p + "self_attention.query_key_value")
        fused = fused.reshape(t, h, 3, hd)
        q, k, v = fused[:, :, 0], fused[:, :, 1], fused[:, :, 2]
        s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        s = s + slopes[:, None, None] * np.arange(t)[None, None, :]
        s = np.where(causal[None], s, -np.inf)
        a = np.einsum("hqk,khd->qhd", softmax(s), v).reshape(t, d)
        x = x + linear(a, p + "self_attention.dense")
        m = gelu(linear(ln(x, p + "post_attention_layernorm"), p + "mlp.dense_h_to_4h"))
        x = x + linear(m, p + "mlp.dense_4h_to_h")
    return ln(x, "ln_f") @ w["word_embeddings.weight"].T


def llama_config(model_type="llama", **overrides):
    out = {"model_type": model_type, "architectures": ["LlamaForCausalLM"], "vocab_size": V,
           "hidden_size": D, "intermediate_size": FF, "num_hidden_layers": LAYERS,
           "num_attention_heads": HEADS, "num_key_value_heads": 2, "hidden_act": "silu",
           "max_position_embeddings": CTX, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "rope_scaling": None, "attention_bias": False, "mlp_bias": False,
           "tie_word_embeddings": False, "pretraining_tp": 1, "attention_dropout": 0.0,
           "initializer_range": 0.02, "use_cache": True, "torch_dtype": "bfloat16"}
    if model_type == "mistral":
        out["sliding_window"] = 4
    if model_type == "qwen3":
        out.update(head_dim=D // HEADS, use_sliding_window=False, sliding_window=None,
                   max_window_layers=LAYERS, tie_word_embeddings=True)
    return {**out, **overrides}


def llama_tensors(rng, cfg):
    d, ff = cfg["hidden_size"], cfg["intermediate_size"]
    hd = d // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    t = {"model.embed_tokens.weight": (cfg["vocab_size"], d), "model.norm.weight": (d,)}
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = (cfg["vocab_size"], d)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": (d,), p + "self_attn.q_proj.weight": (d, d),
                  p + "self_attn.k_proj.weight": (kv, d), p + "self_attn.v_proj.weight": (kv, d),
                  p + "self_attn.o_proj.weight": (d, d), p + "post_attention_layernorm.weight":
                  (d,), p + "mlp.gate_proj.weight": (ff, d), p + "mlp.up_proj.weight": (ff, d),
                  p + "mlp.down_proj.weight": (d, ff)})
        if cfg["model_type"] == "qwen3":
            t.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
    return {k: random(rng, k, s) for k, s in t.items()}


def random(rng, key, shape):
    """Norm weights around 1, everything else ~ N(0, 0.3^2) (large enough that a swapped or
    mis-transposed tensor changes the logits far beyond rounding)."""
    if "norm" in key.lower() or "ln_" in key:
        if key.endswith("bias"):
            return (0.1 * rng.standard_normal(shape)).astype(np.float32)
        return (1 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
    return (0.3 * rng.standard_normal(shape)).astype(np.float32)


def write_hf(directory, config, tensors, shards=1, tokenizer=False):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    if shards == 1:
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    else:
        keys, weight_map = sorted(tensors), {}
        for s in range(shards):
            name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {k: tensors[k] for k in keys[s::shards]}
            save_file(part, str(directory / name), metadata={"format": "pt"})
            weight_map.update({k: name for k in part})
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    if tokenizer:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        vocab = {chr(ord("a") + i): i for i in range(26)}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="a"))
        tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
        tok.decoder = decoders.Fuse()
        tok.save(str(directory / "tokenizer.json"))
    return directory


# --------------------------------------------------------------------------------------------
# float64 forward passes of the HF models, from their equations
# --------------------------------------------------------------------------------------------


def softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def attend(q, k, v, allowed):
    """q [t, h, hd], k/v [t, kv, hd] (GQA: head h reads kv head h // (h / kv))."""
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    s = np.where(allowed[None], s, -np.inf)
    return np.einsum("hqk,khd->qhd", softmax(s), v)


def gpt2_reference(w, cfg, tokens):
    """Radford et al. 2019: pre-LN, learned positions, tanh-GELU MLP, Conv1D weights [in, out]."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    t, d, h = len(tokens), cfg["n_embd"], cfg["n_head"]

    def ln(x, p):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + cfg["layer_norm_epsilon"]) * w[p + ".weight"] + w[p + ".bias"]

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    x = w["wte.weight"][tokens] + w["wpe.weight"][:t]
    causal = np.tril(np.ones((t, t), bool))
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        qkv = ln(x, p + "ln_1") @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (a.reshape(t, h, d // h) for a in np.split(qkv, 3, axis=-1))
        a = attend(q, k, v, causal).reshape(t, d)
        x = x + a @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        m = gelu(ln(x, p + "ln_2") @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + m @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    return ln(x, "ln_f") @ w["wte.weight"].T


def llama_reference(w, cfg, tokens, lengths=None):
    """Touvron et al. 2023 (and Mistral's window, Qwen3's QK-norm): RMSNorm, RoPE on rotate-half
    pairs (i, i + hd/2) with theta^(-2i/hd), GQA, SwiGLU; PyTorch weights [out, in].

    ``rope_scaling`` dynamic (dynamic NTK, transformers' ``_compute_dynamic_ntk_parameters``): a
    call of length L > L0 = max_position_embeddings rotates with the base
    theta (s L / L0 - (s - 1))^(hd / (hd - 2)). ``lengths[j]``: the call length token j was
    rotated in (default: one call of all tokens; token by token decoding: j + 1)."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    t, d, h = len(tokens), cfg["hidden_size"], cfg["num_attention_heads"]
    hd, kv, eps = d // h, cfg["num_key_value_heads"], cfg["rms_norm_eps"]

    def rms(x, weight):
        return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * weight

    def inv_freq(length):
        theta, scaling = cfg["rope_theta"], cfg.get("rope_scaling") or {}
        original = cfg["max_position_embeddings"]
        if scaling.get("rope_type") == "dynamic" and length > original:
            s = scaling["factor"]
            theta = theta * (s * length / original - (s - 1)) ** (hd / (hd - 2))
        return theta ** (-np.arange(0, hd, 2) / hd)

    lengths = [t] * t if lengths is None else lengths
    angle = np.stack([j * inv_freq(n) for j, n in enumerate(lengths)])[:, None]  # [t, 1, hd/2]

    def rope(x):
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle),
                               x1 * np.sin(angle) + x2 * np.cos(angle)], -1)

    i_, j_ = np.arange(t)[:, None], np.arange(t)[None]
    allowed = j_ <= i_
    if cfg.get("sliding_window") and cfg["model_type"] == "mistral":
        allowed &= i_ - j_ < cfg["sliding_window"]
    x = w["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms(x, w[p + "input_layernorm.weight"])
        q = (a @ w[p + "self_attn.q_proj.weight"].T).reshape(t, h, hd)
        k = (a @ w[p + "self_attn.k_proj.weight"].T).reshape(t, kv, hd)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).reshape(t, kv, hd)
        if cfg["model_type"] == "qwen3":
            q, k = rms(q, w[p + "self_attn.q_norm.weight"]), rms(k, w[p + "self_attn.k_norm.weight"])
        out = attend(rope(q), rope(k), v, allowed).reshape(t, d)
        x = x + out @ w[p + "self_attn.o_proj.weight"].T
        m = rms(x, w[p + "post_attention_layernorm.weight"])
        gate, up = m @ w[p + "mlp.gate_proj.weight"].T, m @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    head = w["model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"]
    return rms(x, w["model.norm.weight"]) @ head.T


def bert_config(**overrides):
    return {"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": V,
            "hidden_size": D, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
            "intermediate_size": FF, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1, "max_position_embeddings": CTX,
            "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
            "pad_token_id": 0, "position_embedding_type": "absolute", "use_cache": True,
            "classifier_dropout": None, "torch_dtype": "float32",
            "transformers_version": "4.46.0", **overrides}


def bert_tensors(rng, cfg):
    """BertForMaskedLM's spelling (``bert.*``, ``cls.predictions.*``), tied decoder."""
    d, ff = cfg["hidden_size"], cfg["intermediate_size"]
    e, c = "bert.embeddings.", "cls.predictions."
    t = {e + "word_embeddings.weight": (cfg["vocab_size"], d),
         e + "position_embeddings.weight": (cfg["max_position_embeddings"], d),
         e + "token_type_embeddings.weight": (cfg["type_vocab_size"], d),
         e + "LayerNorm.weight": (d,), e + "LayerNorm.bias": (d,),
         c + "transform.dense.weight": (d, d), c + "transform.dense.bias": (d,),
         c + "transform.LayerNorm.weight": (d,), c + "transform.LayerNorm.bias": (d,),
         c + "bias": (cfg["vocab_size"],)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"bert.encoder.layer.{i}."
        for name in ("self.query", "self.key", "self.value", "output.dense"):
            t.update({f"{p}attention.{name}.weight": (d, d), f"{p}attention.{name}.bias": (d,)})
        t.update({p + "attention.output.LayerNorm.weight": (d,),
                  p + "attention.output.LayerNorm.bias": (d,),
                  p + "intermediate.dense.weight": (ff, d), p + "intermediate.dense.bias": (ff,),
                  p + "output.dense.weight": (d, ff), p + "output.dense.bias": (d,),
                  p + "output.LayerNorm.weight": (d,), p + "output.LayerNorm.bias": (d,)})
    return {k: random(rng, k, s) for k, s in t.items()}


_erf = np.vectorize(math.erf)


def bert_reference(w, cfg, tokens, token_type=0):
    """Devlin et al. 2019 as BertForMaskedLM computes it: word + token type + position
    embeddings, LayerNorm; post-LN blocks (x = LN(x + Attn(x)), x = LN(x + FFN(x))) with the
    exact GELU x Phi(x) (``hidden_act: gelu``); the head LN(GELU(x W_t + b_t)) E^T + b;
    PyTorch weights [out, in]."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    t, d, h = len(tokens), cfg["hidden_size"], cfg["num_attention_heads"]
    e, c = "bert.embeddings.", "cls.predictions."

    def ln(x, p):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + cfg["layer_norm_eps"]) * w[p + ".weight"] + w[p + ".bias"]

    def linear(x, p):
        return x @ w[p + ".weight"].T + w[p + ".bias"]

    def gelu(x):
        return 0.5 * x * (1 + _erf(x / math.sqrt(2)))

    x = (w[e + "word_embeddings.weight"][tokens] + w[e + "token_type_embeddings.weight"][token_type]
         + w[e + "position_embeddings.weight"][:t])
    x = ln(x, e + "LayerNorm")
    everything = np.ones((t, t), bool)
    for i in range(cfg["num_hidden_layers"]):
        p = f"bert.encoder.layer.{i}.attention."
        q, k, v = (linear(x, p + f"self.{n}").reshape(t, h, d // h)
                   for n in ("query", "key", "value"))
        x = ln(x + linear(attend(q, k, v, everything).reshape(t, d), p + "output.dense"),
               p + "output.LayerNorm")
        p = f"bert.encoder.layer.{i}."
        x = ln(x + linear(gelu(linear(x, p + "intermediate.dense")), p + "output.dense"),
               p + "output.LayerNorm")
    x = ln(gelu(linear(x, c + "transform.dense")), c + "transform.LayerNorm")
    return x @ w[e + "word_embeddings.weight"].T + w[c + "bias"]


def t5_config(**overrides):
    """T5 v1.0 (t5-small's keys); 8 buckets up to distance 12, so that 16 tokens reach the
    log-spaced buckets and the cap."""
    return {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "vocab_size": V,
            "d_model": D, "d_kv": D // HEADS, "d_ff": FF, "num_layers": LAYERS,
            "num_decoder_layers": LAYERS, "num_heads": HEADS,
            "relative_attention_num_buckets": 8, "relative_attention_max_distance": 12,
            "dropout_rate": 0.1, "layer_norm_epsilon": 1e-6, "initializer_factor": 1.0,
            "feed_forward_proj": "relu", "is_encoder_decoder": True, "use_cache": True,
            "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0,
            "n_positions": CTX, "tie_word_embeddings": True, "output_past": True, **overrides}


def t5_tensors(rng, cfg):
    """T5ForConditionalGeneration's spelling; q weights scaled by d_kv^-0.5 (as T5's init
    folds the score scale into W_q)."""
    d, ff, nb = cfg["d_model"], cfg["d_ff"], cfg["relative_attention_num_buckets"]
    gated = cfg["feed_forward_proj"].startswith("gated")
    t = {"shared.weight": (cfg["vocab_size"], d),
         "encoder.final_layer_norm.weight": (d,), "decoder.final_layer_norm.weight": (d,)}
    for stack in ("encoder", "decoder"):
        t[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = \
            (nb, cfg["num_heads"])
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = (cfg["vocab_size"], d)
    for i in range(cfg["num_layers"]):
        for stack, attentions in (("encoder", ("SelfAttention",)),
                                  ("decoder", ("SelfAttention", "EncDecAttention"))):
            p = f"{stack}.block.{i}.layer."
            for n, name in enumerate(attentions):
                t.update({f"{p}{n}.{name}.{w}.weight": (d, d) for w in "qkvo"})
                t[f"{p}{n}.layer_norm.weight"] = (d,)
            n = len(attentions)
            t[f"{p}{n}.layer_norm.weight"] = (d,)
            t.update({f"{p}{n}.DenseReluDense.{w}.weight": (ff, d)
                      for w in (("wi_0", "wi_1") if gated else ("wi",))})
            t[f"{p}{n}.DenseReluDense.wo.weight"] = (d, ff)
    out = {k: random(rng, k, s) for k, s in t.items()}
    for k in out:
        if k.endswith(".q.weight"):
            out[k] = out[k] / np.float32(math.sqrt(cfg["d_kv"]))
    return out


def t5_bucket(relative, bidirectional, buckets, max_distance):
    """T5's bucket of ``relative = key - query`` (Raffel et al. 2020; the mesh-tensorflow rule
    as transformers' ``_relative_position_bucket`` writes it)."""
    bucket = 0
    if bidirectional:
        buckets //= 2
        bucket += buckets if relative > 0 else 0
        n = abs(relative)
    else:
        n = -min(relative, 0)
    exact = buckets // 2
    if n < exact:
        return bucket + n
    large = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (buckets - exact))
    return bucket + min(large, buckets - 1)


def t5_reference(w, cfg, tokens):
    """Raffel et al. 2020 as T5ForConditionalGeneration computes it, with ``tokens`` as both
    the encoder input and the decoder input: RMSNorm without mean or bias, scores q k^T
    unscaled plus the relative bias of the stack's first block (bidirectional buckets in the
    encoder, causal in the decoder; none in cross-attention), ReLU or gated tanh-GELU FFN, the
    tied head after multiplying by d_model^-0.5; PyTorch weights [out, in]."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    t, d, h = len(tokens), cfg["d_model"], cfg["num_heads"]
    nb, dist = cfg["relative_attention_num_buckets"], cfg["relative_attention_max_distance"]
    gated = cfg["feed_forward_proj"].startswith("gated")

    def rms(x, p):
        return x / np.sqrt((x**2).mean(-1, keepdims=True) + cfg["layer_norm_epsilon"]) * w[p]

    def gelu_new(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    def relative_bias(stack, bidirectional):
        table = w[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
        buckets = np.array([[t5_bucket(j - i, bidirectional, nb, dist) for j in range(t)]
                            for i in range(t)])
        bias = np.moveaxis(table[buckets], -1, 0)  # [h, q, k]
        return bias if bidirectional else np.where(np.tril(np.ones((t, t), bool)), bias, -np.inf)

    def attention(x, memory, p, bias):
        q = (x @ w[p + ".q.weight"].T).reshape(len(x), h, d // h)
        k, v = ((memory @ w[f"{p}.{n}.weight"].T).reshape(len(memory), h, d // h) for n in "kv")
        s = np.einsum("qhd,khd->hqk", q, k) + bias
        return np.einsum("hqk,khd->qhd", softmax(s), v).reshape(len(x), d) @ w[p + ".o.weight"].T

    def ffn(x, p):
        if gated:
            hidden = gelu_new(x @ w[p + ".wi_0.weight"].T) * (x @ w[p + ".wi_1.weight"].T)
        else:
            hidden = np.maximum(x @ w[p + ".wi.weight"].T, 0)
        return hidden @ w[p + ".wo.weight"].T

    x = w["shared.weight"][tokens]
    bias = relative_bias("encoder", True)
    for i in range(cfg["num_layers"]):
        p = f"encoder.block.{i}.layer."
        a = rms(x, p + "0.layer_norm.weight")
        x = x + attention(a, a, p + "0.SelfAttention", bias)
        x = x + ffn(rms(x, p + "1.layer_norm.weight"), p + "1.DenseReluDense")
    memory = rms(x, "encoder.final_layer_norm.weight")
    y = w["shared.weight"][tokens]
    bias = relative_bias("decoder", False)
    for i in range(cfg["num_layers"]):
        p = f"decoder.block.{i}.layer."
        a = rms(y, p + "0.layer_norm.weight")
        y = y + attention(a, a, p + "0.SelfAttention", bias)
        y = y + attention(rms(y, p + "1.layer_norm.weight"), memory, p + "1.EncDecAttention", 0)
        y = y + ffn(rms(y, p + "2.layer_norm.weight"), p + "2.DenseReluDense")
    y = rms(y, "decoder.final_layer_norm.weight")
    if cfg.get("scale_decoder_outputs", cfg["tie_word_embeddings"]):  # transformers 5 says so
        y = y * d**-0.5
    return y @ w["shared.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"].T


FAMILIES = {
    "gpt2": (gpt2_config, gpt2_tensors, gpt2_reference),
    "opt": (opt_config, opt_tensors, opt_reference),
    "bloom": (bloom_config, bloom_tensors, bloom_reference),
    "bloom6": (lambda **o: bloom_config(n_head=6, hidden_size=36, **o), bloom_tensors,
               bloom_reference),  # slopes of a head count that is not a power of two
    "llama": (llama_config, llama_tensors, llama_reference),
    "mistral": (lambda **o: llama_config("mistral", **o), llama_tensors, llama_reference),
    "qwen3": (lambda **o: llama_config("qwen3", **o), llama_tensors, llama_reference),
    "bert": (bert_config, bert_tensors, bert_reference),
    "t5": (t5_config, t5_tensors, t5_reference),
    "t5v11": (lambda **o: t5_config(feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                                    **o), t5_tensors, t5_reference),
    # saved by transformers 5, which states the rescale: with it, and a tied head without it
    "t5_transformers5": (lambda **o: t5_config(scale_decoder_outputs=True, **o), t5_tensors,
                         t5_reference),
    "t5_tied_unscaled": (lambda **o: t5_config(scale_decoder_outputs=False, **o), t5_tensors,
                         t5_reference),
}


def checkpoint(tmp_path, family, name="hf", **kw):
    make_config, make_tensors, _ = FAMILIES[family]
    config = make_config()
    tensors = make_tensors(np.random.default_rng(0), config)
    return write_hf(tmp_path / name, config, tensors, **kw), config, tensors


def run_cli(*argv, capsys=None):
    code = cli.main(list(argv))
    return code, (capsys.readouterr() if capsys else None)


def logits_of(run, tokens):
    """The run's logits of ``tokens`` (an encoder-decoder reads them as its source and as its
    decoder's input)."""
    cfg, graphdef, params = load_params(run)
    tokens = np.asarray(tokens, np.int32)[None]
    if cfg.model.objective == "span":
        from flax import nnx

        return cfg, params, np.asarray(nnx.merge(graphdef, params)(tokens, tokens))[0]
    return cfg, params, np.asarray(apply(graphdef, params, tokens))[0]


# --------------------------------------------------------------------------------------------
# Import: the imported run computes the HF model's function
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", list(FAMILIES))
def test_import_equals_the_float64_reference_and_round_trips_bitwise(tmp_path, family, capsys):
    source, config, tensors = checkpoint(tmp_path, family, shards=2 if family == "llama" else 1)
    code, out = run_cli("import-hf", f"--from={source}", f"--run={tmp_path / 'run'}",
                        capsys=capsys)
    assert code == 0, out.err
    tokens = np.random.default_rng(1).integers(0, V, CTX)
    cfg, params, logits = logits_of(tmp_path / "run", tokens)
    want = FAMILIES[family][2](tensors, config, tokens)
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert cfg.data.seq_len == CTX
    # Export, then import again: the same tensors bit for bit, the same parameters and logits.
    code, out = run_cli("export-hf", f"--run={tmp_path / 'run'}", f"--to={tmp_path / 'out'}",
                        capsys=capsys)
    assert code == 0, out.err
    exported = load_file(str(tmp_path / "out" / "model.safetensors"))
    if family.startswith("bloom"):  # written in BloomModel's spelling
        exported = {"transformer." + k if k != "lm_head.weight" else k: v
                    for k, v in exported.items()}
    if family == "opt":  # written in OPTForCausalLM's spelling; rows 0-1 are never read
        exported = {k.removeprefix("model."): v for k, v in exported.items()}
        exported["decoder.embed_positions.weight"][:2] = \
            tensors["decoder.embed_positions.weight"][:2]
    if family == "bert":  # token type 0 folded into the positions; exported types are zeros
        positions, types = "bert.embeddings.position_embeddings.weight", \
            "bert.embeddings.token_type_embeddings.weight"
        np.testing.assert_array_equal(exported[positions], tensors[positions] + tensors[types][0])
        assert exported[types].shape == (2, D) and not exported[types].any()
        exported[positions], exported[types] = tensors[positions], tensors[types]
    assert set(exported) == set(tensors)
    for key, value in tensors.items():
        assert exported[key].dtype == np.float32
        np.testing.assert_array_equal(exported[key], value, err_msg=key)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    for key, value in config.items():
        if key not in ("torch_dtype", "transformers_version", "resid_pdrop", "embd_pdrop",
                       "attn_pdrop", "architectures", "bos_token_id", "eos_token_id",
                       "use_cache", "max_window_layers", "pad_token_id", "dropout",
                       "hidden_dropout_prob", "attention_probs_dropout_prob",
                       "classifier_dropout", "dropout_rate", "decoder_start_token_id",
                       "output_past"):
            assert written[key] == value, key
    assert run_cli("import-hf", f"--from={tmp_path / 'out'}", f"--run={tmp_path / 'again'}",
                   capsys=capsys)[0] == 0
    cfg2, params2, logits2 = logits_of(tmp_path / "again", tokens)
    assert cfg2.model == cfg.model
    import jax
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(logits, logits2)


def test_bfloat16_tensors_and_the_tokenizer_come_in(tmp_path, capsys):
    import ml_dtypes

    config = llama_config()
    tensors = llama_tensors(np.random.default_rng(0), config)
    halves = {k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()}
    source = write_hf(tmp_path / "hf", config, halves, tokenizer=True)
    assert run_cli("import-hf", f"--from={source}", f"--run={tmp_path / 'run'}",
                   capsys=capsys)[0] == 0
    _, params, _ = logits_of(tmp_path / "run", [1, 2])
    cfg, _, params = load_params(tmp_path / "run")
    from attnlab.train.checkpoint import path_name
    import jax
    flat = {path_name(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(params)}
    np.testing.assert_array_equal(flat["token_embedding"],
                                  halves["model.embed_tokens.weight"].astype(np.float32))
    assert (tmp_path / "run" / "tokenizer.json").read_bytes() == \
        (source / "tokenizer.json").read_bytes()


def test_rope_scaling_maps_to_attnlabs_and_unknown_types_are_refused(tmp_path, capsys):
    from attnlab.hf.families import FAMILIES as F, HFError

    llama = F["llama"]
    yarn = llama.model_config(llama_config(rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}))
    assert (yarn.rope_scaling, yarn.rope_factor, yarn.rope_original_len) == ("yarn", 4.0, 8)
    linear = llama.model_config(llama_config(rope_scaling={"type": "linear", "factor": 2.0}))
    assert (linear.rope_scaling, linear.rope_factor) == ("pi", 2.0)
    assert llama.hf_config(yarn, CTX)["rope_scaling"] == {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
    dynamic = llama.model_config(llama_config(max_position_embeddings=8, rope_scaling={
        "type": "dynamic", "factor": 2.0}))
    assert (dynamic.rope_scaling, dynamic.rope_factor, dynamic.rope_original_len) == \
        ("dynamic", 2.0, 8)
    written = llama.hf_config(dynamic, CTX)  # the original context is max_position_embeddings
    assert written["rope_scaling"] == {"rope_type": "dynamic", "factor": 2.0}
    assert written["max_position_embeddings"] == 8
    for scaling, key in [({"rope_type": "dynamic", "factor": 2.0, "low_freq_factor": 1},
                          "low_freq_factor"),
                         ({"rope_type": "llama3", "factor": 8.0}, "rope_type"),
                         ({"rope_type": "yarn", "factor": 4.0, "beta_fast": 16}, "beta_fast"),
                         ({"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.0},
                          "attention_factor")]:
        with pytest.raises(HFError, match=f"rope_scaling.{key}"):
            llama.model_config(llama_config(rope_scaling=scaling))


def test_dynamic_ntk_equals_the_formula_in_a_forward_pass_and_in_cached_decoding(tmp_path,
                                                                                 capsys):
    """Llama with rope_scaling dynamic (factor 2, original context 8), read at 16 tokens: the
    full forward grows the base for its length 16; within 8 tokens it is the unscaled RoPE;
    token-by-token decoding rotates each new token at its own length and keeps the cached keys
    as they were (transformers' cached generation), so past 8 it differs from the forward."""
    import jax

    from attnlab import model as lm

    config = llama_config(max_position_embeddings=8,
                          rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    tensors = llama_tensors(np.random.default_rng(0), config)
    source = write_hf(tmp_path / "hf", config, tensors)
    assert run_cli("import-hf", f"--from={source}", f"--run={tmp_path / 'run'}",
                   capsys=capsys)[0] == 0
    tokens = np.random.default_rng(1).integers(0, V, CTX)
    cfg, params, logits = logits_of(tmp_path / "run", tokens)
    assert (cfg.model.rope_scaling, cfg.data.seq_len) == ("dynamic", 8)
    want = llama_reference(tensors, config, tokens)
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    unscaled = llama_reference(tensors, {**config, "rope_scaling": None}, tokens)
    assert np.abs(unscaled - want).max() > 1e-2  # the grown base matters at 16 tokens
    _, _, short = logits_of(tmp_path / "run", tokens[:8])
    np.testing.assert_allclose(short, unscaled[:8], rtol=1e-4, atol=1e-4 * np.abs(want).max())
    # Decoding one token at a time: token j rotated at length j + 1.
    _, graphdef, params = load_params(tmp_path / "run")
    cache = lm.init_state(cfg.model, 1, CTX)
    step = jax.jit(lm.decode_step, static_argnums=0)
    decoded = []
    for j in range(CTX):
        out, cache = step(graphdef, params, cache, np.asarray(tokens[None, j:j + 1], np.int32), j)
        decoded.append(np.asarray(out)[0, 0])
    decoded = np.stack(decoded)
    cached = llama_reference(tensors, config, tokens, lengths=range(1, CTX + 1))
    np.testing.assert_allclose(decoded, cached, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    np.testing.assert_allclose(decoded[:8], short, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert np.abs(decoded[8:] - logits[8:]).max() > 1e-2
    # Its growth is relative to the original context, which the config must give.
    from attnlab.config import ModelConfig
    from attnlab.errors import ConfigError

    with pytest.raises(ConfigError, match="model.rope_scaling=dynamic needs the original"):
        lm.resolve(ModelConfig(rope_scaling="dynamic", rope_factor=2.0))


def test_bert_pretraining_saves_come_in_and_the_token_type_fold_is_said(tmp_path, capsys):
    """A BertForPreTraining-style save: LayerNorm gamma/beta names, the pooler, the NSP head and
    the position_ids buffer (skipped), the tied decoder written out (accepted as the tied
    parameters). The run is BERT on inputs of token type 0, and the import says so."""
    config = bert_config()
    tensors = bert_tensors(np.random.default_rng(0), config)
    saved = dict(tensors)
    for name, new in (("weight", "gamma"), ("bias", "beta")):
        saved[f"bert.embeddings.LayerNorm.{new}"] = saved.pop(f"bert.embeddings.LayerNorm.{name}")
    rng = np.random.default_rng(2)
    saved.update({"bert.pooler.dense.weight": random(rng, "p", (D, D)),
                  "bert.pooler.dense.bias": random(rng, "p", (D,)),
                  "cls.seq_relationship.weight": random(rng, "s", (2, D)),
                  "cls.seq_relationship.bias": random(rng, "s", (2,)),
                  "bert.embeddings.position_ids": np.arange(CTX, dtype=np.int64)[None],
                  "cls.predictions.decoder.weight":
                      tensors["bert.embeddings.word_embeddings.weight"],
                  "cls.predictions.decoder.bias": tensors["cls.predictions.bias"]})
    source = write_hf(tmp_path / "hf", config, saved)
    code, out = run_cli("import-hf", f"--from={source}", f"--run={tmp_path / 'run'}",
                        capsys=capsys)
    assert code == 0, out.err
    assert "note: token types: row 0 of token_type_embeddings" in out.out
    tokens = np.random.default_rng(1).integers(0, V, CTX)
    cfg, _, logits = logits_of(tmp_path / "run", tokens)
    assert (cfg.model.ffn, cfg.model.head, cfg.model.norm_position) == ("gelu_erf", "bert", "post")
    want = bert_reference(tensors, config, tokens)
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    other = bert_reference(tensors, config, tokens, token_type=1)
    assert np.abs(other - want).max() > 1e-2  # the fold is what makes type 0 exact


BERT_REFUSALS = {
    "tied bias differs": (lambda c, t: (c, {**t, "cls.predictions.decoder.bias":
                                            t["cls.predictions.bias"] + 1}),
                          "tensor cls.predictions.decoder.bias differs from the tensor it is "
                          "tied to"),
    "no token types": (lambda c, t: (c, _drop(t, "bert.embeddings.token_type_embeddings.weight")),
                       "missing tensor bert.embeddings.token_type_embeddings.weight"),
    "token types misshapen": (lambda c, t: (c, {**t, "bert.embeddings.token_type_embeddings."
                                                "weight": np.zeros((2, D + 1), np.float32)}),
                              "tensor bert.embeddings.token_type_embeddings.weight has shape "
                              "[2, 33]"),
    "gelu_fast": (lambda c, t: ({**c, "hidden_act": "gelu_fast"}, t),
                  "config.json: hidden_act='gelu_fast' is not representable"),
    "relative positions": (lambda c, t: ({**c, "position_embedding_type": "relative_key"}, t),
                           "config.json: position_embedding_type='relative_key'"),
    "decoder": (lambda c, t: ({**c, "is_decoder": True}, t), "config.json: is_decoder=True"),
}


T5_REFUSALS = {
    "d_kv": (lambda c, t: ({**c, "d_kv": 16}, t), "config.json: d_kv=16 is not representable"),
    "decoder depth": (lambda c, t: ({**c, "num_decoder_layers": 3}, t),
                      "config.json: num_decoder_layers=3"),
    "gated-relu": (lambda c, t: ({**c, "feed_forward_proj": "gated-relu"}, t),
                   "config.json: feed_forward_proj='gated-relu'"),
    "rescaled untied head": (lambda c, t: ({**c, "tie_word_embeddings": False,
                                            "scale_decoder_outputs": True},
                                           {**t, "lm_head.weight": t["shared.weight"]}),
                             "config.json: scale_decoder_outputs=True is not representable"),
    "tied head differs": (lambda c, t: (c, {**t, "decoder.embed_tokens.weight":
                                            t["shared.weight"] * 2}),
                          "tensor decoder.embed_tokens.weight differs from the tensor it is tied"),
}
T5_REFUSALS["vocabulary of bytes"] = (
    lambda c, t: ({**c, "vocab_size": 200}, {**t, "shared.weight": t["shared.weight"][:200]}),
    "config.json: vocab_size=200 is smaller than the 256 byte ids and a [MASK] id")
REFUSING_FAMILIES = {"bert": (bert_config, bert_tensors, BERT_REFUSALS),
                     "t5": (t5_config, t5_tensors, T5_REFUSALS)}


@pytest.mark.parametrize("family, case", [(f, c) for f, (_, _, cases) in REFUSING_FAMILIES.items()
                                          for c in cases])
def test_bad_bert_and_t5_checkpoints_are_refused_in_one_line(tmp_path, family, case, capsys):
    make_config, make_tensors, cases = REFUSING_FAMILIES[family]
    change, words = cases[case]
    config = make_config()
    config, tensors = change(config, make_tensors(np.random.default_rng(0), config))
    source = write_hf(tmp_path / "hf", config, tensors)
    code, out = run_cli("import-hf", f"--from={source}", f"--run={tmp_path / 'run'}",
                        capsys=capsys)
    assert code == 2
    assert out.err.count("\n") == 1 and words in out.err, out.err
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]


def test_export_refuses_an_mlm_or_span_model_without_berts_or_t5s_parts():
    from attnlab.config import ModelConfig
    from attnlab.hf.families import HFError, family_of_model

    base = dict(objective="mlm", pos_encoding="learned", norm_position="post", linear_bias=True,
                embedding_norm=True, ffn="gelu_erf", vocab_size=V)
    with pytest.raises(HFError, match="model.head='linear' has no BERT equivalent"):
        family_of_model(ModelConfig(**base)).hf_config(ModelConfig(**base), CTX)
    cfg = ModelConfig(**{**base, "head": "bert", "norm_position": "pre"})
    with pytest.raises(HFError, match="model.norm_position='pre' has no BERT equivalent"):
        family_of_model(cfg).hf_config(cfg, CTX)
    t5 = dict(objective="span", pos_encoding="t5", norm="rmsnorm", ffn="relu", vocab_size=V,
              head="t5")
    with pytest.raises(HFError, match="model.attention_scale='rsqrt' has no T5 equivalent"):
        family_of_model(ModelConfig(**t5)).hf_config(ModelConfig(**t5), CTX)
    cfg = ModelConfig(**{**t5, "attention_scale": "none", "head": "bert"})
    with pytest.raises(HFError, match="model.head='bert' has no T5 equivalent"):
        family_of_model(cfg).hf_config(cfg, CTX)
    # a tied head without the rescale is one since transformers 5 (scale_decoder_outputs)
    cfg = ModelConfig(**{**t5, "attention_scale": "none", "head": "linear"})
    assert family_of_model(cfg).hf_config(cfg, CTX)["scale_decoder_outputs"] is False


# --------------------------------------------------------------------------------------------
# Refusals: one line naming the file or key, nothing written
# --------------------------------------------------------------------------------------------


def _drop(tensors, key):
    return {k: v for k, v in tensors.items() if k != key}


REFUSALS = {
    "unknown model_type": (lambda c, t: ({**c, "model_type": "falcon"}, t),
                           "config.json: model_type='falcon' is not supported"),
    "mamba": (lambda c, t: ({**c, "model_type": "mamba"}, t),
              "model_type='mamba' is not supported: attnlab's Mamba layers"),
    "unknown key": (lambda c, t: ({**c, "rope_dim_mult": 2}, t), "config.json: rope_dim_mult"),
    "unrepresentable value": (lambda c, t: ({**c, "attention_bias": True}, t),
                              "config.json: attention_bias=True"),
    "head_dim": (lambda c, t: ({**c, "head_dim": 16}, t), "config.json: head_dim=16"),
    "missing tensor": (lambda c, t: (c, _drop(t, "model.layers.1.mlp.up_proj.weight")),
                       "missing tensor model.layers.1.mlp.up_proj.weight"),
    "wrong shape": (lambda c, t: (c, {**t, "model.norm.weight": np.ones(D + 1, np.float32)}),
                    "tensor model.norm.weight has shape [33]"),
    "extra tensor": (lambda c, t: (c, {**t, "model.layers.0.self_attn.q_proj.bias":
                                       np.zeros(D, np.float32)}),
                     "model.layers.0.self_attn.q_proj.bias has no place"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_bad_checkpoints_are_refused_in_one_line(tmp_path, case, capsys):
    change, words = REFUSALS[case]
    config = llama_config()
    config, tensors = change(config, llama_tensors(np.random.default_rng(0), config))
    source = write_hf(tmp_path / "hf", config, tensors)
    code, out = run_cli("import-hf", f"--from={source}", f"--run={tmp_path / 'run'}",
                        capsys=capsys)
    assert code == 2
    assert out.err.count("\n") == 1 and words in out.err, out.err
    assert not (tmp_path / "run").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no staging directory left either


def test_truncated_and_missing_files_are_refused(tmp_path, capsys):
    source, _, _ = checkpoint(tmp_path, "gpt2")
    weights = source / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    code, out = run_cli("import-hf", f"--from={source}", f"--run={tmp_path / 'run'}",
                        capsys=capsys)
    assert code == 2 and f"{weights}: not a readable safetensors file" in out.err, out.err
    weights.unlink()
    code, out = run_cli("import-hf", f"--from={source}", f"--run={tmp_path / 'run'}",
                        capsys=capsys)
    assert code == 2 and "holds neither model.safetensors" in out.err
    assert not (tmp_path / "run").exists()


def test_export_refuses_what_no_family_holds(tmp_path, capsys):
    from attnlab.config import ModelConfig
    from attnlab.hf.families import FAMILIES as F, HFError, family_of_model

    with pytest.raises(HFError, match="model.pos_encoding='sinusoidal'"):
        family_of_model(ModelConfig(pos_encoding="sinusoidal"))
    with pytest.raises(HFError, match="model.embedding_norm=False has no Bloom equivalent"):
        F["bloom"].hf_config(ModelConfig(pos_encoding="alibi", linear_bias=True), CTX)
    with pytest.raises(HFError, match="model.norm='layernorm' has no Llama equivalent"):
        F["llama"].hf_config(ModelConfig(ffn="swiglu"), CTX)
    with pytest.raises(HFError, match="model.attention_scale='mup' has no Llama"):
        F["llama"].hf_config(ModelConfig(ffn="swiglu", norm="rmsnorm", attention_scale="mup"),
                             CTX)


# --------------------------------------------------------------------------------------------
# An imported run is a normal run: fine-tuned by `attnlab train`, generated from, exported
# --------------------------------------------------------------------------------------------


@pytest.mark.slow  # ~25 s each: two training steps, generation, export and import
@pytest.mark.parametrize("family", ["gpt2", "opt", "bloom", "llama", "mistral", "qwen3", "bert",
                                    "t5"])
def test_an_imported_run_fine_tunes_generates_and_round_trips_bitwise(tmp_path, family, capsys):
    import jax

    source, config, tensors = checkpoint(tmp_path, family, tokenizer=True)
    run = tmp_path / "run"
    settings = ["--config=configs/tiny.py", "--config.data.source=markov",
                "--config.data.markov_tokens=20000", f"--config.data.cache_dir={tmp_path}/data",
                "--config.data.seq_len=16", "--config.data.batch_size=4",
                "--config.train.steps=2", "--config.train.warmup_steps=1",
                "--config.train.eval_every=2", "--config.train.eval_batches=1",
                "--config.train.checkpoint_every=2", "--config.train.log_every=1"]
    code, out = run_cli("import-hf", f"--from={source}", f"--run={run}", *settings,
                        capsys=capsys)
    assert code == 0, out.err
    _, imported, _ = logits_of(run, [1])
    code, out = run_cli("train", f"--run={run}", "--noprogress", capsys=capsys)
    assert code == 0, out.err
    cfg, trained, _ = logits_of(run, [1])
    assert cfg.train.steps == 2 and cfg.data.source == "markov"
    changed = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(imported),
                                                        jax.tree.leaves(trained))]
    assert all(changed)  # every parameter moved in fine-tuning
    # Greedy generation with the imported tokenizer (letters a-z, ids 0-25).
    # bert fills the [MASK] in place (the prompt around it kept); t5 decodes spans, whose ids
    # past the letters the tokenizer does not write
    prompt = "abc" if family not in ("bert", "t5") else "ab[MASK]c"
    length = [] if family == "bert" else ["--max-new-tokens=4"]  # bert fills in place
    code, out = run_cli("generate", f"--run={run}", f"--prompt={prompt}", "--temperature=0",
                        *length, capsys=capsys)
    assert code == 0, out
    if family != "t5":
        assert out.out.startswith("ab" if family == "bert" else "abc"), out
    # The trained run, exported and imported again: identical parameters and logits.
    assert run_cli("export-hf", f"--run={run}", f"--to={tmp_path / 'out'}", capsys=capsys)[0] == 0
    assert (tmp_path / "out" / "tokenizer.json").is_file()
    assert run_cli("import-hf", f"--from={tmp_path / 'out'}", f"--run={tmp_path / 'again'}",
                   capsys=capsys)[0] == 0
    tokens = np.arange(CTX) % V
    _, params, logits = logits_of(run, tokens)
    _, params2, logits2 = logits_of(tmp_path / "again", tokens)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(logits, logits2)
