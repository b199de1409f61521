"""Closed-form parameter and FLOP counts from a :class:`ModelConfig`.

Parameter convention (Kaplan et al. 2020, section 2.1): ``N`` = non-embedding parameters, which
excludes the embedding matrices: the token table, the learned position table and, when untied,
the output head (a ``d_model x vocab`` matrix like the token table, so tied and untied models of
one shape share the same ``N``). Norm scales/biases and QK-norm are non-embedding. Linear layers
have no biases, except with ``model.linear_bias``: then softmax attention's ``W_q, W_k, W_v, W_o``
(self- and cross-attention) and the FFN's matrices have one each, counted in ``N`` (their adds
are left out of the FLOPs, as norms are). Porian et al. 2024 show that leaving the head out of ``N`` *and* out of the FLOPs
skews small-scale fits; ``flops_per_token`` therefore also reports the head's FLOPs and the
fuller Chinchilla count, which includes them.
"""

from __future__ import annotations

import numpy as np
from flax import nnx

from attnlab.config import ModelConfig
from attnlab.model.architecture import Architecture, resolve
from attnlab.model.objectives import span_lengths


EMBEDDING_PARAMS = ("token_embedding", "position_embedding", "decoder_position_embedding",
                    "lm_head", "read_in", "read_out")  # the last two: model.inputs=vectors


def recorded_counts(counts: dict[str, int]) -> dict[str, int]:
    """The counts a run records (summary.json, the sweep's plan, the results table): total,
    non-embedding and embedding, and the active ones where they differ (a mixture of experts;
    a dense model's plan and summary stay as they were before MoE existed)."""
    out = {k: counts[k] for k in ("total", "non_embedding", "embedding")}
    if counts["active"] != counts["total"]:
        out.update(active=counts["active"], active_non_embedding=counts["active_non_embedding"])
    return out


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    """Exact parameter counts of the model built from ``cfg``.

    Returns a dict with ``total``, ``non_embedding`` (Kaplan's N), ``embedding`` (token table +
    learned position table + untied head), and the parts ``token_embedding``,
    ``position_embedding``, ``output_head`` (0 when tied), ``attention`` and ``ffn`` (per layer;
    ``attention`` is the first layer's sequence mixer), ``per_layer`` (the first layer),
    ``mixers`` (all layers' mixers: a hybrid's differ), ``final_norm`` (with
    ``model.embedding_norm``, that norm too); ``model.head=bert``'s transform, norm and output
    bias count in ``non_embedding`` (not in a part); ``active``,
    ``active_non_embedding`` and ``active_ffn`` (per layer): the parameters one token uses (a
    mixture of experts' router, its ``k`` routed and its shared experts; for a dense model the
    same as ``total``, ``non_embedding`` and ``ffn``). nGPT has no norms: its
    per-layer vectors (``s_qk`` with the attention, ``s_u, s_v`` with the FFN, ``alpha_A,
    alpha_M`` in place of the norms) and the logit scale ``s_z`` (in place of the final norm)
    count as non-embedding. The encoder-decoder (``objective="span"``) counts both stacks, its
    decoder layers' ``cross_attention`` (per layer) and extra norm, both final norms, and one
    encoding table per stack.
    """
    arch = resolve(cfg)
    d = cfg.d_model
    layers = [layer.param_count() for layer in arch.stack.layers]
    mixers = [layer["mixer"] for layer in layers]
    ffn, norms = layers[0]["ffn"], layers[0]["norms"]
    final_norm = arch.block.head_params()
    per_layer = mixers[0] + ffn + norms
    token_embedding = arch.inputs.read_in_params()  # the token table, or the linear read-in
    position_embedding = arch.encoding.param_count()  # the learned table; 0 for the others
    output_head = arch.inputs.read_out_params()  # 0 when tied
    cross = 0
    if arch.decoder is not None:
        # T5: a second (decoder) stack, each layer with cross-attention and its norm; the
        # encoder's final norm; one table of the encoding per stack.
        cross = _cross_params(cfg)
        position_embedding *= 2
        encoder = sum(mixers) + cfg.n_layers * (ffn + norms)
        decoder = encoder + cfg.n_layers * (cross + arch.norm.param_count(d))
        final_norm = 2 * arch.norm.param_count(d)
        mixers = mixers + mixers
        non_embedding = encoder + decoder + final_norm
    else:
        if cfg.embedding_norm:  # a norm like the others: in N
            final_norm += arch.norm.param_count(d)
        head = arch.head.param_count()  # model.head=bert: its transform and output bias
        non_embedding = sum(mixers) + cfg.n_layers * (ffn + norms) + final_norm + head
    embedding = token_embedding + position_embedding + output_head
    # An MoE layer holds E experts and runs k of them per token: the rest are inactive.
    inactive = arch.ffn.param_count() - arch.ffn.active_param_count()  # per layer
    active_ffn = ffn - inactive
    stacks = 1 if arch.decoder is None else 2
    active_non_embedding = non_embedding - stacks * cfg.n_layers * inactive
    return {
        "total": embedding + non_embedding,
        "non_embedding": non_embedding,
        "active": embedding + active_non_embedding,
        "active_non_embedding": active_non_embedding,
        "active_ffn": active_ffn,
        "embedding": embedding,
        "token_embedding": token_embedding,
        "position_embedding": position_embedding,
        "output_head": output_head,
        "attention": mixers[0],
        "mixers": sum(mixers),
        "ffn": ffn,
        "per_layer": per_layer,
        "final_norm": final_norm,
        "cross_attention": cross,
    }


def _cross_params(cfg: ModelConfig) -> int:
    """One cross-attention layer: ``W_q, W_o`` (``d x d_attn``) and ``W_k, W_v`` (GQA-aware), and
    their biases with ``model.linear_bias``."""
    d, hd = cfg.d_model, cfg.head_dim
    biases = cfg.n_heads * hd + 2 * cfg.kv_heads * hd + d if cfg.linear_bias else 0
    return 2 * d * cfg.n_heads * hd + 2 * d * cfg.kv_heads * hd + biases


def count_state_params(state: nnx.State) -> dict[str, int]:
    """Counts the actual ``nnx.Param`` leaves of a model state: ``total``, ``embedding``,
    ``non_embedding`` (same convention as :func:`param_counts`)."""
    total = embedding = 0
    for path, value in nnx.to_flat_state(nnx.filter_state(state, nnx.Param)):
        size = int(np.prod(value.shape))
        total += size
        if path[0] in EMBEDDING_PARAMS:
            embedding += size
    return {"total": total, "embedding": embedding, "non_embedding": total - embedding}


def flops_per_token(cfg: ModelConfig, seq_len: int) -> dict[str, float]:
    """Training FLOPs per token (forward + backward = 3x forward) for context ``seq_len``.

    A mixture of experts counts what one token runs (Clark et al. 2022): the router, its ``k``
    experts, its shared experts and the weighted combine; ``N`` is then the *active*
    non-embedding count, and ``moe_computed`` adds the FLOPs the dispatch spends beyond that
    (capacity buffers' empty slots; 0 dropless).

    Keys:
      kaplan_6n: ``6 N`` (Kaplan's C = 6ND), N = (active) non-embedding parameters.
      kaplan_attention: ``6 n_layers seq_len d_attn`` with ``d_attn = n_heads head_dim``
        (Kaplan Table 1: ``2 n_layer n_ctx d_attn`` per forward token, x3) for softmax layers;
        a layer with another mixer (linear attention, Mamba) adds 3x its forward token-mixing
        FLOPs instead (``SequenceMixer.kaplan_context_flops``).
      kaplan: ``6 N + kaplan_attention``, Kaplan's convention: every query against all
        ``seq_len`` keys, no causal halving.
      kaplan_causal: ``6 N + kaplan_attention / 2``: a causal query sees on average about
        half the context.
      head: ``6 d_model vocab``, the output layer that ``6 N`` leaves out (Porian et al. 2024).
      chinchilla: Hoffmann et al. 2022 Appendix F, counted in full: embeddings
        ``2 vocab d_model``, per layer the q/k/v projections (GQA-aware), ``QK^T``
        (``2 seq d_attn``), softmax (``3 heads seq``), ``PV`` (``2 seq d_attn``), output
        projection, the FFN (2 matrices, 3 for SwiGLU), and the logits ``2 d_model vocab``;
        x3 for forward + backward. No causal halving (as published); norms and nonlinearities
        are not counted. Non-softmax layers count their mixer's own FLOPs
        (``SequenceMixer.flops_per_token``) in place of the attention terms.
      chinchilla_forward: the forward part of ``chinchilla``.
    """
    arch = resolve(cfg)
    if arch.decoder is not None:
        return _encoder_decoder_flops(arch, seq_len)
    counts = param_counts(cfg)
    L = cfg.n_layers
    n = counts["active_non_embedding"]  # the parameters a token's compute touches
    mixers = arch.stack.mixers
    kaplan_attention = 3.0 * sum(mixer.kaplan_context_flops(seq_len) for mixer in mixers)

    # softmax: q/k/v/o projections + QK^T + softmax + PV (SequenceMixer.flops_per_token)
    mixing = sum(sum(mixer.flops_per_token(seq_len).values()) for mixer in mixers)
    ffn = arch.ffn.flops_per_token()
    encoding = arch.encoding.flops_per_token(seq_len)  # 0 so far: no matrix products
    # The embedding and head (2 V d each; a vector model's read-in and read-out instead).
    forward = (arch.inputs.flops_per_token() + encoding + mixing + L * ffn
               + arch.head.flops_per_token())  # model.head=bert: its transform
    out = {
        "kaplan_6n": 6.0 * n,
        "kaplan_attention": kaplan_attention,
        "kaplan": 6.0 * n + kaplan_attention,
        "kaplan_causal": 6.0 * n + kaplan_attention / 2,
        "head": 3.0 * arch.inputs.read_out_flops(),
        "chinchilla": 3.0 * forward,
        "chinchilla_forward": forward,
    }
    padding = arch.ffn.computed_flops_per_token() - arch.ffn.flops_per_token()
    if padding:
        out["moe_computed"] = 3.0 * (forward + L * padding)
    return out


def _encoder_decoder_flops(arch: Architecture, seq_len: int) -> dict[str, float]:
    """:func:`flops_per_token` of the encoder-decoder, per *input* token (a window of
    ``seq_len`` tokens): the encoder runs over the ``enc_len`` corrupted tokens, the decoder
    over the ``dec_len`` target tokens (:func:`~attnlab.model.objectives.span_lengths`), and
    each decoder token's cross-attention reads ``enc_len`` keys; the cross-attention keys and
    values are computed once per encoder token. Same keys and conventions as the decoder's
    (``kaplan_causal`` halves the decoder's self-attention only)."""
    cfg, norm = arch.cfg, arch.norm.param_count(arch.cfg.d_model)
    d, L, V = cfg.d_model, cfg.n_layers, cfg.vocab_size
    enc_len, dec_len = span_lengths(seq_len)
    mixers = arch.decoder.mixers  # the encoder's are the same but bidirectional
    hd, kv = cfg.head_dim, cfg.kv_heads
    d_attn = cfg.n_heads * hd
    ffn = arch.ffn.flops_per_token()
    stack = sum(m.param_count() for m in mixers) + L * (arch.ffn.active_param_count() + 2 * norm)
    cross_kv = 2 * d * kv * hd  # per layer, applied to encoder tokens
    cross_qo = 2 * d * d_attn  # per layer, applied to decoder tokens
    # with linear_bias: W_k, W_v's biases count with the encoder, W_q, W_o's with the decoder
    kv_bias, qo_bias = (2 * kv * hd, d_attn + d) if cfg.linear_bias else (0, 0)
    n_enc = stack + norm + L * (cross_kv + kv_bias)
    n_dec = stack + norm + L * (cross_qo + qo_bias + norm)
    # forward FLOPs (Hoffmann et al. Appendix F terms) per encoder / decoder token
    cross_context = 2.0 * enc_len * d_attn + 3.0 * cfg.n_heads * enc_len + 2.0 * enc_len * d_attn
    enc_token = (2.0 * V * d + sum(sum(m.flops_per_token(enc_len).values()) for m in mixers)
                 + L * ffn + L * 2.0 * cross_kv)
    dec_token = (2.0 * V * d + sum(sum(m.flops_per_token(dec_len).values()) for m in mixers)
                 + L * (2.0 * cross_qo + cross_context) + L * ffn + 2.0 * d * V)
    forward = (enc_len * enc_token + dec_len * dec_token) / seq_len
    enc_context = enc_len * sum(m.kaplan_context_flops(enc_len) for m in mixers)
    dec_self = dec_len * sum(m.kaplan_context_flops(dec_len) for m in mixers)
    dec_cross = dec_len * L * 2.0 * enc_len * d_attn
    attention = 3.0 * (enc_context + dec_self + dec_cross) / seq_len
    six_n = 6.0 * (n_enc * enc_len + n_dec * dec_len) / seq_len
    return {
        "kaplan_6n": six_n,
        "kaplan_attention": attention,
        "kaplan": six_n + attention,
        "kaplan_causal": six_n + attention - 1.5 * dec_self / seq_len,
        "head": 6.0 * d * V * dec_len / seq_len,
        "chinchilla": 3.0 * forward,
        "chinchilla_forward": forward,
    }
