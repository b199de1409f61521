"""Encoders and encoder-decoders (issue #16) against float64 NumPy references written from the
equations: bidirectional attention, permutation equivariance of an encoder without positions,
cross-attention, cached decoding of the encoder-decoder, BERT's 15/80/10/10 masking and T5's
span corruption (statistics, determinism, invertibility), and bad combinations."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab.config import from_config_dict
from attnlab.errors import ConfigError
from attnlab.checks import check
from attnlab.model import (ModelConfig, attention_weights, count_state_params, param_counts,
                           resolve)
from attnlab.model.attention import CrossAttention
from attnlab.model.decoding import (NoMaskError, decode_spans, fill_masks, init_encdec_state,
                                    init_state)
from attnlab.model.objectives import (bert_mask, corrupt_spans, decoder_inputs, mask_id,
                                      masking_key, span_counts, span_lengths,
                                      span_noise)
from attnlab.model.relative import t5_bucket_table
from attnlab.model.transformer import EncoderDecoderLM, TransformerLM, init_model

VOCAB = 257  # the byte tokenizer's 256 ids and [MASK] = 256
MASK = mask_id(VOCAB)


def small(**overrides) -> ModelConfig:
    """A small model config, resolved (a bad combination raises here)."""
    base = dict(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, max_len=64)
    cfg = ModelConfig(**{**base, **overrides})
    resolve(cfg)
    return cfg


def tokens(shape, seed=0) -> jnp.ndarray:
    return jnp.asarray(np.random.default_rng(seed).integers(1, 256, shape), jnp.int32)


# -- bidirectional attention --------------------------------------------------------------------


def test_bidirectional_attention_rows_sum_to_one_and_see_both_sides():
    rng = np.random.default_rng(1)
    q = rng.normal(size=(2, 7, 4, 8))
    k = rng.normal(size=(2, 7, 4, 8))
    weights = np.asarray(attention_weights(jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32),
                                           mask=None))
    # float64: softmax_j(q_i . k_j / sqrt(d)) over every key j, before and after i
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(8)
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(weights, expected, atol=1e-5)
    assert (weights[0, 0][np.triu_indices(7, 1)] > 0).all()  # keys after the query are seen


@pytest.mark.parametrize("objective", ["mlm", "span"])
def test_encoder_without_positions_is_permutation_equivariant(objective):
    cfg = small(pos_encoding="none", objective=objective)
    model = init_and_merge(cfg)
    x = tokens((2, 12))
    perm = np.random.default_rng(3).permutation(12)
    if objective == "mlm":
        out, out_perm = model(x), model(x[:, perm])
    else:  # the encoder stack of the encoder-decoder
        out, out_perm = model.encode(x), model.encode(x[:, perm])
    np.testing.assert_allclose(np.asarray(out_perm), np.asarray(out)[:, perm], atol=2e-5)


def test_causal_decoder_is_not_permutation_equivariant():
    """The check above has teeth: a causal model without positions still sees order."""
    model = init_and_merge(small(pos_encoding="none"))
    x = tokens((1, 12))
    perm = np.arange(12)[::-1]
    assert not np.allclose(np.asarray(model(x[:, perm])), np.asarray(model(x))[:, perm],
                           atol=1e-4)


def test_encoder_t5_bias_uses_the_bidirectional_buckets():
    cfg = small(pos_encoding="t5", objective="mlm")
    arch = resolve(cfg)
    encoder, decoder = arch.stack.encoding, arch.encoding
    positions = jnp.arange(6)[None]
    table = jnp.asarray(np.random.default_rng(0).normal(size=(32, 4)), jnp.float32)
    enc_bias = np.asarray(encoder.bias(positions, positions, params=table))
    dec_bias = np.asarray(decoder.bias(positions, positions, params=table))
    buckets = t5_bucket_table(32, 128, bidirectional=True)
    # query 0, key 3: n = i - j = -3 -> the bucket of keys after the query
    np.testing.assert_allclose(enc_bias[0, :, 0, 3], np.asarray(table)[buckets[-3 + 128]])
    assert buckets[-3 + 128] >= 16 and not np.allclose(enc_bias[0, :, 0, 3], enc_bias[0, :, 3, 0])
    np.testing.assert_allclose(dec_bias[0, :, 0, 3], dec_bias[0, :, 0, 1])  # causal: all n <= 0
    assert isinstance(init_and_merge(cfg).encoding, type(encoder))


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "alibi", "t5", "none"])
def test_every_bidirectional_encoding_builds_an_encoder(pos):
    cfg = small(pos_encoding=pos, objective="mlm")
    logits = init_and_merge(cfg)(tokens((2, 10)))
    assert logits.shape == (2, 10, VOCAB) and np.isfinite(np.asarray(logits)).all()


# -- cross-attention ----------------------------------------------------------------------------


@pytest.mark.parametrize("kv_heads, scale", [(4, "rsqrt"), (2, "rsqrt"), (4, "none"),
                                             (2, "mup")])
def test_cross_attention_equals_float64_reference(kv_heads, scale):
    """Cross-attention scales its scores as ``model.attention_scale`` says (T5: unscaled)."""
    cfg = small(n_kv_heads=kv_heads, attention_scale=scale)
    layer = CrossAttention(cfg, score_scale=resolve(cfg).score_scale, rngs=nnx.Rngs(params=0))
    rng = np.random.default_rng(5)
    x, memory = rng.normal(size=(2, 5, 32)), rng.normal(size=(2, 9, 32))
    out = layer(jnp.asarray(x, jnp.float32),
                layer.keys_values(jnp.asarray(memory, jnp.float32)))
    w = {name: np.asarray(getattr(layer, name).kernel[...], np.float64)
         for name in ("q_proj", "k_proj", "v_proj", "o_proj")}
    hd, g = 8, 4 // kv_heads
    q = (x @ w["q_proj"]).reshape(2, 5, 4, hd)
    k = np.repeat((memory @ w["k_proj"]).reshape(2, 9, kv_heads, hd), g, axis=2)
    v = np.repeat((memory @ w["v_proj"]).reshape(2, 9, kv_heads, hd), g, axis=2)
    # out_i = W_o sum_j softmax_j(c q_i . k_j) v_j, every memory position j
    c = {"rsqrt": 1 / math.sqrt(hd), "none": 1.0, "mup": 1 / hd}[scale]
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * c
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    expected = np.einsum("bhqk,bkhd->bqhd", p, v).reshape(2, 5, 32) @ w["o_proj"]
    np.testing.assert_allclose(np.asarray(out), expected, atol=2e-5, rtol=1e-4)


# -- the encoder-decoder ------------------------------------------------------------------------


def init_and_merge(cfg):
    graphdef, state = init_model(cfg, 0)
    return nnx.merge(graphdef, state)


@pytest.mark.parametrize("pos", ["rope", "t5", "learned", "alibi"])
def test_encoder_decoder_cached_decoding_equals_the_full_forward(pos):
    cfg = small(objective="span", pos_encoding=pos)
    model = init_and_merge(cfg)
    assert isinstance(model, EncoderDecoderLM)
    source, target = tokens((2, 11), 1), tokens((2, 7), 2)
    full = np.asarray(model(source, target))
    cache = init_encdec_state(model, source, 7)
    steps = []
    for t in range(7):  # one token at a time through the decoder's KV cache
        logits, cache = model.decode(target[:, t:t + 1], t, cache)
        steps.append(np.asarray(logits[:, 0]))
    np.testing.assert_allclose(np.stack(steps, 1), full, atol=2e-5, rtol=1e-4)
    # and two tokens then five: the cache holds what the first call wrote
    cache = init_encdec_state(model, source, 7)
    first, cache = model.decode(target[:, :2], 0, cache)
    rest, cache = model.decode(target[:, 2:], 2, cache)
    np.testing.assert_allclose(np.concatenate([first, rest], 1), full, atol=2e-5, rtol=1e-4)


def test_encoder_decoder_parameters_are_counted_exactly():
    for kw in (dict(), dict(pos_encoding="t5", tie_embeddings=False), dict(n_kv_heads=2,
                                                                           ffn="swiglu")):
        cfg = small(objective="span", **kw)
        counted, built = param_counts(cfg), count_state_params(init_model(cfg, 0)[1])
        assert counted["total"] == built["total"]
        assert counted["non_embedding"] == built["non_embedding"]


def test_decode_spans_and_fill_masks_need_a_mask_and_run():
    span_cfg = small(objective="span")
    graphdef, state = init_model(span_cfg, 0)
    source = np.array([[5, 6, MASK, 7, 8]], np.int32)
    out = decode_spans(graphdef, state, span_cfg, source, 4)
    assert out.shape == (1, 4) and out.dtype == jnp.int32
    with pytest.raises(NoMaskError, match="holds no \\[MASK\\]"):
        decode_spans(graphdef, state, span_cfg, source[:, :2], 4)
    mlm_cfg = small(objective="mlm")
    graphdef, state = init_model(mlm_cfg, 0)
    filled = np.asarray(fill_masks(graphdef, state, mlm_cfg, source))
    assert (filled[:, [0, 1, 3, 4]] == source[:, [0, 1, 3, 4]]).all()
    assert 0 <= filled[0, 2] < MASK
    with pytest.raises(NoMaskError):
        fill_masks(graphdef, state, mlm_cfg, source[:, :2])


# -- masking ------------------------------------------------------------------------------------


def test_bert_masking_statistics_over_many_batches():
    x = tokens((64, 128), 7)
    selected_n = masked = randomised = kept = changed_kept = 0
    for i in range(40):  # 40 batches x 8192 positions
        inputs, selected = jax.device_get(bert_mask(x, masking_key(0, i), MASK))
        xs = np.asarray(x)
        selected_n += selected.sum()
        masked += (selected & (inputs == MASK)).sum()
        other = selected & (inputs != MASK)
        kept += (other & (inputs == xs)).sum()
        randomised += (other & (inputs != xs)).sum()
        changed_kept += (~selected & (inputs != xs)).sum()
    total = 40 * x.size
    assert changed_kept == 0  # unselected positions are never touched
    assert abs(selected_n / total - 0.15) < 0.003
    assert abs(masked / selected_n - 0.8) < 0.01
    # random replacements draw the original token 1 in 256 times: counted as kept here
    assert abs(randomised / selected_n - 0.1 * 255 / 256) < 0.006
    assert abs(kept / selected_n - (0.1 + 0.1 / 256)) < 0.006


def test_masking_is_a_pure_function_of_seed_and_batch_index():
    x = tokens((8, 64), 2)
    jitted = jax.jit(lambda t, seed, i: bert_mask(t, masking_key(seed, i), MASK))
    a = jax.device_get(bert_mask(x, masking_key(0, 5), MASK))
    b = jax.device_get(jitted(x, 0, 5))  # another program, traced indices: the same draw
    for left, right in zip(a, b):
        np.testing.assert_array_equal(left, right)
    other = jax.device_get(bert_mask(x, masking_key(0, 6), MASK))
    assert not np.array_equal(a[1], other[1])
    assert not np.array_equal(a[1], jax.device_get(bert_mask(x, masking_key(1, 5), MASK))[1])


@pytest.mark.parametrize("length", [16, 32, 100])
def test_span_corruption_is_invertible_and_has_t5_statistics(length):
    x = tokens((32, length), 4)
    encoder, target = jax.device_get(corrupt_spans(x, masking_key(0, 0), MASK))
    noise, spans = span_counts(length)
    assert (encoder.shape[1], target.shape[1]) == span_lengths(length)
    assert noise == max(1, round(0.15 * length)) and spans == max(1, round(noise / 3))
    for row in range(32):
        assert (encoder[row] == MASK).sum() == spans and (target[row] == MASK).sum() == spans
        assert target[row, 0] == MASK
        # put each span back after its sentinel: the original row
        pieces = np.split(target[row], np.flatnonzero(target[row] == MASK))[1:]
        rebuilt = []
        for token in encoder[row]:
            rebuilt.extend(pieces.pop(0)[1:] if token == MASK else [token])
        np.testing.assert_array_equal(rebuilt, np.asarray(x)[row])
    # decoder input: teacher forcing from the start token
    shifted = np.asarray(decoder_inputs(jnp.asarray(target), MASK))
    assert (shifted[:, 0] == MASK).all() and (shifted[:, 1:] == target[:, :-1]).all()


def test_span_positions_vary_and_are_deterministic():
    x = tokens((1, 64), 4)
    draws = [np.asarray(corrupt_spans(x, masking_key(0, i), MASK)[0]) for i in range(6)]
    again = np.asarray(corrupt_spans(x, masking_key(0, 3), MASK)[0])
    np.testing.assert_array_equal(draws[3], again)
    assert len({d.tobytes() for d in draws}) > 1


# -- bad combinations ---------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, field, words", [
    (dict(objective="mlm", mixer="linear"), "model.objective", "causal-only"),
    (dict(objective="span", mixer="mamba", pos_encoding="none"), "model.objective",
     "causal-only"),
    (dict(objective="mlm", attention_window=8), "model.objective", "sliding window"),
    (dict(objective="span", norm_position="post"), "model.norm_position", "pre-LN"),
    (dict(objective="span", attention_scale="learned"), "model.attention_scale",
     "cross-attention"),
    (dict(objective="span", attention_scale="cosine"), "model.attention_scale",
     "cross-attention"),
    (dict(objective="span", qk_norm=True), "model.qk_norm", "cross-attention"),
    (dict(objective="bert"), "model.objective", "valid values are clm, mlm, span"),
])
def test_bad_combinations_name_the_field(overrides, field, words):
    with pytest.raises(ConfigError) as err:
        small(**overrides)
    assert err.value.field == field and words in str(err.value)


def test_a_tokenizer_without_room_for_mask_is_refused():
    with pytest.raises(ConfigError, match=r"model.vocab_size.*\[MASK\].*>= 257"):
        check(from_config_dict({"model": {"objective": "mlm", "vocab_size": 256}}))
    with pytest.raises(ConfigError, match=r"model.vocab_size.*>= 1025"):
        check(from_config_dict({"model": {"objective": "span", "vocab_size": 1024},
                                "data": {"tokenizer": "bpe", "bpe_vocab_size": 1024}}))
    check(from_config_dict({"model": {"objective": "mlm", "vocab_size": 257}}))


def test_encoder_has_no_kv_cache_decoding():
    cfg = small(objective="mlm")
    model = init_and_merge(cfg)
    assert isinstance(model, TransformerLM)
    with pytest.raises(ValueError, match="bidirectional encoder"):
        model.decode(tokens((1, 3)), 0, init_state(cfg, 1, 8))


def test_the_common_measure_scores_the_same_tokens_for_every_objective():
    x = tokens((4, 33), 9)
    key = masking_key(3, 1)
    noise = np.asarray(span_noise(x[:, 1:], key))
    encoder, target = corrupt_spans(x[:, 1:], key, MASK)
    # the spans that span_noise marks are the ones corrupt_spans hides, token for token
    for row in range(4):
        np.testing.assert_array_equal(np.asarray(target[row])[np.asarray(target[row]) != MASK],
                                      np.asarray(x[row, 1:])[noise[row]])
    counts = set()
    for objective in ("clm", "mlm", "span"):
        cfg = small(objective=objective)
        scores = resolve(cfg).objective.span_scores(init_and_merge(cfg), x, key)
        counts.add(float(scores.count))
        # untrained: about ln(vocab) nats per token
        assert abs(float(scores.loss / scores.count) - math.log(VOCAB)) < 0.5
    assert counts == {float(noise.sum())}
