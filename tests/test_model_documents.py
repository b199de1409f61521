"""Document masks (``data.document_mask``, ``data.reset_positions``): packed windows whose
documents never see each other, through every attention implementation and sequence mixer.

Contracts: a token's output is independent of every token of another document in the window
(perturbed: equal to 1e-6, and NOT equal without the mask, so the check can fail); the packed
window equals each document run alone (with positions restarted); the attention, linear
attention and Mamba layers equal float64 NumPy references with the document restriction written
from the equations; KV-cache / recurrent decoding equals the full forward pass with the mask; a
window holding one document has the same loss with the mask on."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab.config import DataConfig, ModelConfig
from attnlab.data import sources
from attnlab.data.sources import separator_id
from attnlab.data.tokenizer import ByteTokenizer
from attnlab.errors import ConfigError
from attnlab.model import resolve
from attnlab.model.attention import CAUSAL_HALVES_MIN_LEN, dot_product_attention
from attnlab.model.decoding import init_state
from attnlab.model.linear_attention import causal_linear_attention
from attnlab.model.masks import (Causal, Packing, SlidingWindow, continued_documents,
                                 documents_from_segments, segment_ids)
from attnlab.model.objectives import masking_key
from attnlab.model.transformer import init_model
from test_model_mixers import elu_plus_one, layer_params, mamba_reference

SEP = 0  # the byte tokenizer's end-of-document id
T = 16
# row 0: documents [0, 4], [5, 9], [10, 15]; row 1: [0, 9], [10, 15] (each ends with SEP but
# the last)
SEPARATORS = ((4, 9), (9,))
PACKING = Packing(SEP, reset_positions=True)


def window(seed=0, batch_rows=SEPARATORS, length=T):
    """int32 ``[len(batch_rows), length]`` of ids 1..31 with SEP at the given places."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 32, (len(batch_rows), length))
    for row, places in enumerate(batch_rows):
        tokens[row, list(places)] = SEP
    return jnp.asarray(tokens, jnp.int32)


def documents_of(row):
    """``[(first, stop)]`` of row ``row`` of :func:`window`."""
    edges = [0] + [p + 1 for p in SEPARATORS[row]] + [T]
    return list(zip(edges[:-1], edges[1:]))


def tiny(**overrides) -> ModelConfig:
    # init_std 0.2: tokens influence each other strongly enough for the controls to see it
    base = dict(vocab_size=33, d_model=16, n_layers=2, n_heads=2, max_len=32, init_std=0.2)
    cfg = ModelConfig(**{**base, **overrides})
    resolve(cfg)
    return cfg


# Every attention implementation and mixer; "alone" False: the packed window does not equal
# the documents run alone (global tokens are the window's first, not each document's).
VARIANTS = {
    "einsum": dict(),
    "xla": dict(attention_impl="xla"),
    "query-blocks": dict(attention_chunk=4),
    "sliding-window": dict(attention_window=3),
    "sliding-window-blocks": dict(attention_window=3, attention_chunk=4),
    "global-tokens": dict(attention_window=3, attention_global_tokens=2, attention_chunk=4),
    "gqa-alibi": dict(n_heads=4, n_kv_heads=2, pos_encoding="alibi"),
    "t5": dict(pos_encoding="t5"),
    "learned": dict(pos_encoding="learned"),
    "sinusoidal-post-ln": dict(pos_encoding="sinusoidal", norm_position="post"),
    "ngpt": dict(ngpt=True, ffn="swiglu"),
    "scan-remat": dict(scan_layers=True, remat="full"),
    "linear": dict(mixer="linear", mixer_chunk=3),
    "performer": dict(mixer="performer", mixer_features=8, mixer_chunk=4),
    "mamba": dict(mixer="mamba", pos_encoding="none"),
    "hybrid": dict(mixer="mamba", attention_every=2),
    "mlm-encoder": dict(objective="mlm"),
}
NOT_ALONE = {"global-tokens"}
# The default lane runs one case of each implementation path; the rest run with the slow lane.
DEFAULT_LANE = {"einsum", "sliding-window-blocks", "linear", "mamba", "mlm-encoder"}


def lanes(names, default_lane=DEFAULT_LANE):
    return [pytest.param(n, marks=() if n in default_lane else pytest.mark.slow) for n in names]


def forward(cfg, params, tokens, packing=PACKING):
    graphdef, state = params
    model = nnx.merge(graphdef, state)
    if packing is None:
        return np.asarray(model(tokens))
    segments, positions = packing.inputs(tokens)
    return np.asarray(model(tokens, positions, segments=segments))


def perturbed(tokens):
    """Row 0's middle document and row 1's first, changed (separators kept)."""
    return tokens.at[0, 5:9].set(jnp.asarray([7, 8, 9, 10])).at[1, 2:8].set(3)


UNTOUCHED = ((0, 0, 5), (0, 10, 16), (1, 10, 16))  # (row, first, stop) of the other documents


@pytest.mark.parametrize("name", lanes(VARIANTS))
def test_no_token_sees_another_document(name):
    cfg = tiny(**VARIANTS[name])
    params = init_model(cfg, 0)
    tokens = window()
    packed = forward(cfg, params, tokens)
    moved = forward(cfg, params, perturbed(tokens))
    for row, first, stop in UNTOUCHED:
        np.testing.assert_allclose(moved[row, first:stop], packed[row, first:stop], rtol=0,
                                   atol=1e-6, err_msg=f"row {row} [{first}, {stop})")
    if name in NOT_ALONE:
        return
    # The packed window = each document run alone (positions restarted); documents of one
    # length run as one batch.
    by_length = {}
    for row in range(tokens.shape[0]):
        for first, stop in documents_of(row):
            by_length.setdefault(stop - first, []).append((row, first, stop))
    for places in by_length.values():
        alone = forward(cfg, params, jnp.stack([tokens[r, a:b] for r, a, b in places]), None)
        for (row, first, stop), expected in zip(places, alone):
            np.testing.assert_allclose(packed[row, first:stop], expected, rtol=1e-4, atol=2e-5,
                                       err_msg=f"row {row} [{first}, {stop})")


@pytest.mark.parametrize("name", lanes(["einsum", "linear", "mamba", "mlm-encoder"],
                                       {"einsum", "mlm-encoder"}))
def test_without_the_mask_the_perturbation_reaches_the_other_documents(name):
    """The control of the test above: the same perturbation, no document mask."""
    cfg = tiny(**VARIANTS[name])
    params = init_model(cfg, 0)
    tokens = window()
    plain = forward(cfg, params, tokens, None)
    moved = forward(cfg, params, perturbed(tokens), None)
    for row, first, stop in UNTOUCHED[1:] + ((0, 0, 5),) * (name == "mlm-encoder"):
        assert np.abs(moved[row, first:stop] - plain[row, first:stop]).max() > 1e-3


@pytest.mark.parametrize("name", lanes(["sliding-window-blocks", "einsum", "gqa-alibi", "t5",
                                        "linear", "performer", "mamba", "hybrid", "ngpt"],
                                       {"sliding-window-blocks", "mamba"}))
def test_decoding_with_documents_equals_the_full_forward_pass(name):
    """Prefill with a separator inside, a step that crosses a document start, then one token
    at a time: every logit equals the masked full forward pass. Positions restart, so the
    learned / sinusoidal encodings are covered by the "learned" case below."""
    cfg = tiny(**VARIANTS[name])
    check_decoding(cfg)


@pytest.mark.parametrize("reset", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_decoding_restarts_learned_positions(reset):
    check_decoding(tiny(pos_encoding="learned"), Packing(SEP, reset))


def check_decoding(cfg, packing=PACKING):
    graphdef, state = init_model(cfg, 0)
    model = nnx.merge(graphdef, state)
    tokens = window(1)
    full = forward(cfg, (graphdef, state), tokens, packing)
    segments = segment_ids(tokens, SEP)
    cache = init_state(cfg, tokens.shape[0], T)
    logits = []
    for first, stop in [(0, 6), (6, 12)] + [(i, i + 1) for i in range(12, T)]:
        out, cache = model.decode(tokens[:, first:stop], first, cache,
                                  segments=segments[:, first:stop],
                                  reset_positions=packing.reset_positions)
        logits.append(np.asarray(out))
    np.testing.assert_allclose(np.concatenate(logits, axis=1), full, rtol=1e-4, atol=2e-5)


# --------------------------------------------------------------------------------------------
# Float64 references, written from the equations with the document restriction: key j counts
# for query i only if segment_j == segment_i.
# --------------------------------------------------------------------------------------------


def reference_attention(q, k, v, scale, allowed):
    """softmax(scale q k^T, -inf where not allowed [b, q, k]) v in float64, GQA by head groups."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) * scale
    s = np.where(allowed[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhij,bjhd->bihd", p, v)


ATTENTION_DEFAULT_LANE = {("einsum", 0, "causal"), ("xla", 4, "window"),
                          ("einsum", 4, "bidirectional"), ("xla", 0, "causal")}


@pytest.mark.parametrize("impl, chunk, mask", [
    pytest.param(i, c, m, marks=() if (i, c, m) in ATTENTION_DEFAULT_LANE else pytest.mark.slow)
    for i in ("einsum", "xla") for c in (0, 4) for m in ("causal", "window", "bidirectional")])
def test_attention_with_documents_equals_the_float64_reference(impl, chunk, mask):
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, T, 4, 8)).astype(np.float32)
    k, v = rng.standard_normal((2, 2, T, 2, 8)).astype(np.float32)
    segments = np.asarray(segment_ids(window(), SEP))
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    masks = {"causal": (Causal(), j <= i),
             "window": (SlidingWindow(tiny(attention_window=3)), (j <= i) & (i - j < 3)),
             "bidirectional": (None, np.ones((T, T), bool))}
    mask_part, allowed = masks[mask]
    allowed = allowed[None] & (segments[:, :, None] == segments[:, None, :])
    out = dot_product_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), scale=0.3,
                                mask=mask_part, impl=impl, chunk=chunk,
                                documents=documents_from_segments(jnp.asarray(segments)))
    np.testing.assert_allclose(out, reference_attention(q, k, v, 0.3, allowed), rtol=1e-5,
                               atol=1e-6)


def test_long_causal_attention_in_halves_keeps_documents():
    """From CAUSAL_HALVES_MIN_LEN queries the einsum path computes causal attention in two
    halves; with documents too."""
    length = CAUSAL_HALVES_MIN_LEN
    rng = np.random.default_rng(7)
    q, k, v = rng.standard_normal((3, 2, length, 2, 8)).astype(np.float32)
    tokens = jnp.asarray(rng.integers(0, 12, (2, length)), jnp.int32)  # ~1 in 12 separators
    segments = np.asarray(segment_ids(tokens, SEP))
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    allowed = (j <= i)[None] & (segments[:, :, None] == segments[:, None, :])
    out = dot_product_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), scale=0.3,
                                documents=documents_from_segments(jnp.asarray(segments)))
    np.testing.assert_allclose(out, reference_attention(q, k, v, 0.3, allowed), rtol=1e-5,
                               atol=1e-6)


def reference_linear_attention(phi_q, phi_k, v, segments):
    """Katharopoulos et al. 2020, eq. 6 with the causal sum restricted to the query's document:
    out_i = sum_{j<=i, seg_j = seg_i} (phi_q_i . phi_k_j) v_j / sum_{same j} phi_q_i . phi_k_j."""
    phi_q, phi_k, v = (np.asarray(a, np.float64) for a in (phi_q, phi_k, v))
    t = phi_q.shape[1]
    same = segments[:, :, None] == segments[:, None, :]
    a = np.einsum("bihm,bjhm->bhij", phi_q, phi_k) * (np.tril(np.ones((t, t))) * same)[:, None]
    return np.einsum("bhij,bjhd->bihd", a, v) / a.sum(-1).transpose(0, 2, 1)[..., None]


@pytest.mark.parametrize("chunk", [3] + [pytest.param(c, marks=pytest.mark.slow)
                                         for c in (1, 5, 16)])
def test_linear_attention_restarts_at_each_document(chunk):
    rng = np.random.default_rng(3)
    phi_q, phi_k = rng.uniform(0.1, 2.0, (2, 2, T, 3, 6)).astype(np.float32)
    v = rng.standard_normal((2, T, 3, 5)).astype(np.float32)
    segments = segment_ids(window(), SEP)
    expected = reference_linear_attention(phi_q, phi_k, v, np.asarray(segments))
    out, _ = causal_linear_attention(jnp.asarray(phi_q), jnp.asarray(phi_k), jnp.asarray(v),
                                     chunk=chunk, documents=documents_from_segments(segments))
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-6)
    # In two calls (the state carried across a document start, as decoding does).
    zeros = jnp.zeros((2,), jnp.int32)
    first = continued_documents(segments[:, :7], 0, zeros, zeros)
    out_a, state = causal_linear_attention(jnp.asarray(phi_q[:, :7]), jnp.asarray(phi_k[:, :7]),
                                           jnp.asarray(v[:, :7]), chunk=chunk, documents=first)
    second = continued_documents(segments[:, 7:], 7, segments[:, 6], first.start[:, -1])
    out_b, _ = causal_linear_attention(jnp.asarray(phi_q[:, 7:]), jnp.asarray(phi_k[:, 7:]),
                                       jnp.asarray(v[:, 7:]), state, chunk=chunk,
                                       documents=second, start=7)
    np.testing.assert_allclose(np.concatenate([out_a, out_b], 1), expected, rtol=2e-5,
                               atol=2e-6)


def test_linear_attention_layer_with_documents_equals_its_reference():
    cfg = tiny(mixer="linear", pos_encoding="none", mixer_chunk=4, d_model=32)
    module = resolve(cfg).stack.mixers[0].build(nnx.Rngs(params=0))
    x = np.random.default_rng(4).standard_normal((2, T, cfg.d_model))
    segments = segment_ids(window(), SEP)
    y, _ = module(jnp.asarray(x, jnp.float32), jnp.arange(T)[None],
                  documents=documents_from_segments(segments))
    p = layer_params(module)
    h, d = cfg.n_heads, cfg.head_dim
    q, k, v = ((x @ p[name]).reshape(2, T, h, d) for name in ("q_proj", "k_proj", "v_proj"))
    out = reference_linear_attention(elu_plus_one(q), elu_plus_one(k), v, np.asarray(segments))
    np.testing.assert_allclose(y, out.reshape(2, T, h * d) @ p["o_proj"], rtol=1e-4, atol=1e-6)


def test_mamba_layer_with_documents_equals_the_sequential_reference_per_document():
    """Gu & Dao 2023, Algorithm 2 restarted at each document (zero conv history, h = 0): the
    float64 loop run on each document alone."""
    cfg = tiny(mixer="mamba", pos_encoding="none", d_model=32)
    module = resolve(cfg).stack.mixers[0].build(nnx.Rngs(params=0))
    p = layer_params(module)
    x = np.random.default_rng(5).standard_normal((2, T, cfg.d_model))
    segments = segment_ids(window(), SEP)
    y, _ = module(jnp.asarray(x, jnp.float32), jnp.arange(T)[None],
                  documents=documents_from_segments(segments))
    for row in range(2):
        for first, stop in documents_of(row):
            expected = mamba_reference(x[row:row + 1, first:stop], p, cfg)[0]
            np.testing.assert_allclose(y[row, first:stop], expected, rtol=1e-4,
                                       atol=1e-4 * np.abs(expected).max())


# --------------------------------------------------------------------------------------------
# Segment ids, the loss of one document, the rules
# --------------------------------------------------------------------------------------------


def test_segment_ids_and_spans():
    tokens = jnp.asarray([[5, 0, 6, 7, 0, 0, 8]])
    segments = segment_ids(tokens, 0)
    assert segments.tolist() == [[0, 0, 1, 1, 1, 2, 3]]  # a separator ends its document
    spans = documents_from_segments(segments)
    assert spans.start.tolist() == [[0, 0, 2, 2, 2, 5, 6]]
    assert spans.end.tolist() == [[2, 2, 5, 5, 5, 6, 7]]
    _, positions = Packing(0, reset_positions=True).inputs(tokens)
    assert positions.tolist() == [[0, 1, 0, 1, 2, 0, 0]]
    # The ids the corpora end their documents with.
    assert separator_id(DataConfig()) == ByteTokenizer.eos_id
    assert separator_id(DataConfig(source="markov")) is None


@pytest.mark.parametrize("name", lanes(["einsum", "xla", "linear", "mamba", "learned",
                                        "mlm-encoder"], {"einsum", "mamba"}))
def test_a_window_of_one_document_has_the_same_loss_with_the_mask(name):
    cfg = tiny(**VARIANTS[name])
    graphdef, state = init_model(cfg, 0)
    model = nnx.merge(graphdef, state)
    tokens = jnp.asarray(np.random.default_rng(6).integers(1, 32, (2, T + 1)), jnp.int32)
    key = masking_key(0, 0)
    plain = model.arch.objective.scores(model, tokens, key)
    masked = model.arch.objective.scores(model, tokens, key, packing=PACKING)
    np.testing.assert_allclose(masked.loss, plain.loss, rtol=1e-6)
    assert masked.count == plain.count


@pytest.mark.parametrize("overrides, field", [
    (dict(source="markov", document_mask=True), "data.document_mask"),
    (dict(source="induction", document_mask=True), "data.document_mask"),
    (dict(reset_positions=True), "data.reset_positions"),
])
def test_sources_without_documents_refuse_the_mask(overrides, field):
    with pytest.raises(ConfigError, match=field):
        sources.validate(DataConfig(**overrides))
