"""The attention variants (T5 relative bias, PI / YaRN, the score scale, cosine attention, sliding
windows) against float64 NumPy references written from the papers' equations, the invariants the
papers promise, KV-cache decoding, counting, config refusals and training through `attnlab
train`."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab import cli
from attnlab import model as lm
from attnlab.config import Config, DataConfig
from attnlab.errors import ConfigError
from attnlab.model import attention as attention_module
from attnlab.model import positions as pe
from attnlab.config import ModelConfig
from attnlab.model import rope
from attnlab.model.attention import attention_scores, dot_product_attention
from attnlab.model.counting import count_state_params, flops_per_token, param_counts
from attnlab.model.decoding import init_state
from attnlab.model.relative import T5Bias
from attnlab.train import load_params


def tiny(**overrides) -> ModelConfig:
    """A small model config, resolved (a bad combination raises here)."""
    base = dict(vocab_size=40, d_model=16, n_layers=2, n_heads=2, max_len=64)
    cfg = ModelConfig(**{**base, **overrides})
    lm.resolve(cfg)
    return cfg


def table_of(model, layer: int):
    """The T5 bias table layer ``layer`` reads (None for encodings without one)."""
    table = model.position_embedding
    if table is None:
        return None
    return table[layer] if model.cfg.t5_per_layer else table[...]


# --------------------------------------------------------------------------------------------
# T5 bucketing (Raffel et al. 2020, section 2.1; mesh-tensorflow's _relative_position_bucket),
# rewritten per distance with Python's math module.
# --------------------------------------------------------------------------------------------


def reference_bucket(i: int, j: int, num_buckets: int, max_distance: int,
                     bidirectional: bool) -> int:
    n = i - j  # > 0: the key is in the past
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            bucket = num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    large = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact)
                            * (num_buckets - max_exact))
    return bucket + min(large, num_buckets - 1)


@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 20), (16, 64)])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_t5_buckets_equal_raffel_et_al(num_buckets, max_distance, bidirectional):
    positions = np.arange(0, 400, 3)[None]
    got = np.asarray(lm.t5_buckets(positions, positions, num_buckets, max_distance,
                                   bidirectional=bidirectional))[0]
    want = np.array([[reference_bucket(i, j, num_buckets, max_distance, bidirectional)
                      for j in positions[0]] for i in positions[0]])
    np.testing.assert_array_equal(got, want)
    assert got.max() == num_buckets - 1 and got.min() == 0
    if not bidirectional:  # keys at or after the query all share bucket 0
        assert (got[np.triu_indices(len(positions[0]))] == 0).all()


def test_t5_bucket_spacing_is_exact_then_logarithmic():
    table = lm.t5_bucket_table(32, 128, bidirectional=False)[128:]  # n = 0 .. 128
    np.testing.assert_array_equal(table[:16], np.arange(16))  # 16 exact buckets
    assert table[16] == 16 and table[128] == 31 and (np.diff(table) >= 0).all()
    widths = np.bincount(table)[16:31]  # distances per log-spaced bucket (the last is open)
    assert widths[-1] > 4 * widths[0]  # geometric: the 15th log bucket is much wider


class BidirectionalT5(T5Bias):
    """The encoder's bucketing (for the encoder issue that follows)."""

    bidirectional = True


def test_bidirectional_t5_bias_reads_both_halves_of_the_table():
    cfg = tiny(pos_encoding="t5", t5_num_buckets=8, t5_max_distance=20)
    encoding = BidirectionalT5(cfg)
    table = np.random.default_rng(0).normal(size=(8, 2))
    positions = np.arange(25)[None]
    bias = np.asarray(encoding.bias(positions, positions, params=jnp.asarray(table)))[0]
    buckets = np.array([[reference_bucket(i, j, 8, 20, True) for j in range(25)]
                        for i in range(25)])
    np.testing.assert_allclose(bias, table[buckets].transpose(2, 0, 1), rtol=1e-6)
    assert set(buckets[np.tril_indices(25)].ravel()) <= set(range(4))  # past and present
    assert set(buckets[np.triu_indices(25, 1)].ravel()) <= set(range(4, 8))  # future
    assert not (bias[:, 3, 5] == bias[:, 5, 3]).all()  # i - j = +-2 read different buckets


@pytest.mark.parametrize("cfg", [tiny(pos_encoding="t5", t5_num_buckets=8, t5_max_distance=20),
                                 tiny(pos_encoding="alibi")], ids=["t5", "alibi"])
def test_relative_biases_depend_only_on_i_minus_j(cfg):
    model = nnx.merge(*lm.init_model(cfg, 0))
    layer_bias = model.bias(0)
    q = np.arange(30)[None]
    bias = np.asarray(layer_bias(q, q))
    shifted = np.asarray(layer_bias(q + 1000, q + 1000))
    np.testing.assert_array_equal(bias, shifted)
    for offset in range(-29, 30):  # constant along every diagonal
        diagonal = np.diagonal(bias, offset=offset, axis1=2, axis2=3)
        assert (diagonal == diagonal[..., :1]).all()


# --------------------------------------------------------------------------------------------
# PI and YaRN frequencies (Chen et al. 2023, eq. 4; Peng et al. 2023, eqs. 17-22)
# --------------------------------------------------------------------------------------------


def yarn_reference(d, theta, s, L, beta_fast=32.0, beta_slow=1.0):
    """YaRN's frequencies as the authors' code computes them, from its description (Peng et al.
    2023, eqs. 17-19; Hugging Face's ``rope_type="yarn"``), in float64: the pair index at which
    a wavelength fits ``beta`` times into ``L`` solves ``L / (2 pi theta^(2i/d)) = beta``; the
    fast boundary is rounded down, the slow one up, both clipped to ``[0, d - 1]``; the share
    interpolated by ``s`` rises linearly in the pair index between them."""
    base = np.array([theta ** (-2.0 * i / d) for i in range(d // 2)], np.float64)
    fast = (d / 2) * math.log(L / (2 * math.pi * beta_fast)) / math.log(theta)
    slow = (d / 2) * math.log(L / (2 * math.pi * beta_slow)) / math.log(theta)
    low, high = max(math.floor(fast), 0), min(math.ceil(slow), d - 1)
    high = high + 0.001 if high == low else high
    out = []
    for i, b in enumerate(base):
        share = min(1.0, max(0.0, (i - low) / (high - low)))  # of b / s
        out.append(share * b / s + (1 - share) * b)
    return base, np.array(out)


@pytest.mark.parametrize("d, theta, s, L", [(32, 10000.0, 4.0, 1024), (64, 10000.0, 4.0, 256),
                                            (128, 500000.0, 8.0, 8192), (16, 10000.0, 2.0, 64)])
def test_pi_and_yarn_frequencies_equal_the_reference(d, theta, s, L):
    base, want = yarn_reference(d, theta, s, L)
    np.testing.assert_allclose(rope.pi_frequencies(base, s), base / s, rtol=1e-15)
    got = rope.yarn_frequencies(d, theta, s, L)
    np.testing.assert_allclose(got, want, rtol=1e-14)
    assert got[0] == base[0] and got[-1] == pytest.approx(base[-1] / s, rel=1e-14)
    assert rope.yarn_attention_factor(s) == pytest.approx(0.1 * math.log(s) + 1, rel=1e-15)


def test_yarn_ramps_in_the_pair_index_not_in_turns():
    """At head_dim 64, L = 256, s = 4 the reference gives pair 5 the frequency 1.687e-1 (a
    transformers YaRN model's); the ramp linear in r = L / lambda would give 1.090e-1."""
    got = rope.yarn_frequencies(64, 10000.0, 4.0, 256)
    assert got[5] == pytest.approx(1.687e-1, rel=1e-3)
    base = rope.rope_inverse_frequencies(64)
    r = 256 * base[5] / (2 * math.pi)
    paper = (1 - (r - 1) / 31) * base[5] / 4 + (r - 1) / 31 * base[5]
    assert paper == pytest.approx(1.090e-1, rel=1e-3)


def test_rope_rescalings_give_model_configs():
    rope_cfg = tiny(pos_encoding="rope")
    pi = lm.rescaled(rope_cfg, "pi", 4.0, 32)
    assert (pi.rope_scaling, pi.rope_factor) == ("pi", 4.0)
    yarn = lm.rescaled(rope_cfg, "yarn", 4.0, 32)
    assert (yarn.rope_scaling, yarn.rope_factor, yarn.rope_original_len) == ("yarn", 4.0, 32)
    inv_freq, factor = lm.resolve(yarn).encoding.frequencies()
    np.testing.assert_array_equal(
        inv_freq, rope.yarn_frequencies(8, 10000.0, 4.0, 32))
    assert factor == rope.yarn_attention_factor(4.0)
    with pytest.raises(pe.RescalingError, match="yarn needs the training context"):
        lm.rescaled(rope_cfg, "yarn", 4.0)
    with pytest.raises(pe.RescalingError, match="pi applies to RoPE models"):
        lm.rescaled(tiny(pos_encoding="learned"), "pi", 2.0, 32)


# --------------------------------------------------------------------------------------------
# One float64 reference of the attention layer, from the equations (Vaswani eq. 1; T5 bias;
# Henry et al. cosine attention; PI/YaRN-rotated RoPE; banded mask)
# --------------------------------------------------------------------------------------------


def reference_rope(x, positions, inv_freq):
    """RoFormer eq. 34 in the rotate-half layout; x float64 [t, heads, d]."""
    half = x.shape[-1] // 2
    angles = positions[:, None, None] * inv_freq[None, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * np.cos(angles) - x2 * np.sin(angles),
                           x1 * np.sin(angles) + x2 * np.cos(angles)], axis=-1)


def reference_attention(cfg, layer_state, bias_table, x):
    """float64 output of one attention layer for x [t, d_model] (batch of one)."""
    w = {name: np.asarray(layer_state[name]["kernel"][...], np.float64)
         for name in ("q_proj", "k_proj", "v_proj", "o_proj")}
    t, heads, hd = x.shape[0], cfg.n_heads, cfg.head_dim
    q = (x @ w["q_proj"]).reshape(t, heads, hd)
    k = (x @ w["k_proj"]).reshape(t, heads, hd)
    v = (x @ w["v_proj"]).reshape(t, heads, hd)
    scale = {"rsqrt": 1 / math.sqrt(hd), "mup": 1 / hd, "none": 1.0}.get(cfg.attention_scale)
    if cfg.attention_scale in ("learned", "cosine"):
        tau = np.asarray(layer_state["temperature"][...], np.float64)
        if cfg.attention_scale == "cosine":
            q = q / np.linalg.norm(q, axis=-1, keepdims=True)
            k = k / np.linalg.norm(k, axis=-1, keepdims=True)
        q, scale = q * tau[None, :, None], 1.0
    positions = np.arange(t, dtype=np.float64)
    if cfg.pos_encoding == "rope":
        inv_freq = np.array([cfg.rope_theta ** (-2 * i / hd) for i in range(hd // 2)])
        factor = 1.0
        if cfg.rope_scaling == "pi":
            inv_freq = inv_freq / cfg.rope_factor
        elif cfg.rope_scaling == "yarn":
            _, inv_freq = yarn_reference(hd, cfg.rope_theta, cfg.rope_factor,
                                         cfg.rope_original_len)
            factor = 0.1 * math.log(cfg.rope_factor) + 1
        q = reference_rope(q, positions, inv_freq) * factor
        k = reference_rope(k, positions, inv_freq) * factor
    scores = np.einsum("qhd,khd->hqk", q, k) * scale
    if cfg.pos_encoding == "t5":
        buckets = np.array([[reference_bucket(i, j, cfg.t5_num_buckets, cfg.t5_max_distance,
                                              False) for j in range(t)] for i in range(t)])
        scores = scores + np.asarray(bias_table, np.float64)[buckets].transpose(2, 0, 1)
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    if cfg.pos_encoding == "alibi":  # Press et al.: slopes 2^(-8h/H) for H a power of two
        slopes = np.array([2.0 ** (-8 * (h + 1) / heads) for h in range(heads)])
        scores = scores - slopes[:, None, None] * np.abs(i - j)[None]
    visible = j <= i
    if cfg.attention_window:
        visible &= (i - j < cfg.attention_window) | (j < cfg.attention_global_tokens)
    scores = np.where(visible, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.einsum("hqk,khd->qhd", probs, v).reshape(t, heads * hd)
    return out @ w["o_proj"]


VARIANTS = {
    "t5": dict(pos_encoding="t5", t5_num_buckets=8, t5_max_distance=12),
    "t5_per_layer": dict(pos_encoding="t5", t5_per_layer=True, t5_num_buckets=8,
                         t5_max_distance=12),
    "pi": dict(rope_scaling="pi", rope_factor=4.0),
    "yarn": dict(rope_scaling="yarn", rope_factor=4.0, rope_original_len=8),
    "mup": dict(attention_scale="mup"),
    "unscaled": dict(attention_scale="none"),
    "learned_temperature": dict(attention_scale="learned"),
    "cosine": dict(attention_scale="cosine"),
    "cosine_t5": dict(attention_scale="cosine", pos_encoding="t5", t5_num_buckets=8,
                      t5_max_distance=12),
    "window": dict(attention_window=4),
    "window_global": dict(attention_window=3, attention_global_tokens=2, pos_encoding="t5",
                          t5_num_buckets=8, t5_max_distance=12),
    "window_alibi_chunked": dict(attention_window=5, pos_encoding="alibi", attention_chunk=4),
    "window_xla": dict(attention_window=4, attention_impl="xla"),
    "window_global_chunked": dict(attention_window=3, attention_global_tokens=2, pos_encoding="t5",
                                  t5_num_buckets=8, t5_max_distance=12, attention_chunk=4),
    "window_xla_chunked": dict(attention_window=2, attention_impl="xla", attention_chunk=3),
    "t5_xla_chunked": dict(pos_encoding="t5", t5_num_buckets=8, t5_max_distance=12,
                           attention_impl="xla", attention_chunk=5),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_attention_layer_equals_the_float64_reference(name):
    cfg = tiny(**VARIANTS[name])
    model = nnx.merge(*lm.init_model(cfg, 0))
    state = nnx.state(model)
    if cfg.attention_scale in ("learned", "cosine"):  # not at their init values: a real test
        for block in model.blocks:
            block.attn.temperature[...] = jnp.asarray([0.7, 3.0])
    x = np.random.default_rng(1).normal(size=(1, 13, cfg.d_model))
    for layer in range(cfg.n_layers):
        attn = model.blocks[layer].attn
        out, _ = attn(jnp.asarray(x, jnp.float32), jnp.arange(13)[None], bias=model.bias(layer))
        layer_state = nnx.state(attn)
        want = reference_attention(cfg, layer_state, table_of(model, layer), x[0])
        np.testing.assert_allclose(np.asarray(out[0]), want, atol=2e-5, rtol=1e-4)
    assert state is not None


def test_cosine_scores_lie_in_minus_tau_tau():
    cfg = tiny(attention_scale="cosine", pos_encoding="rope")
    scaler = lm.resolve(cfg).score_scale
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(2, 9, 2, 8)) * 50, jnp.float32)
    k = jnp.asarray(rng.normal(size=(2, 9, 2, 8)) * 0.01, jnp.float32)
    tau = jnp.asarray([2.5, 7.0])
    q, k, scale = scaler.apply(q, k, nnx.Param(tau))
    q, k = lm.resolve(cfg).encoding.transform_qk(q, k, jnp.arange(9)[None])
    scores = np.asarray(attention_scores(q, k, scale=scale))  # [b, h, q, k]
    bound = np.asarray(tau)[None, :, None, None]
    assert (np.abs(scores) <= bound * (1 + 1e-5)).all()
    assert (np.abs(scores).max(axis=(0, 2, 3)) > 0.5 * np.asarray(tau)).all()  # not trivial
    # q = k gives the maximum tau exactly
    same, _, _ = scaler.apply(k, k, nnx.Param(jnp.ones(2)))
    np.testing.assert_allclose(np.sum(np.asarray(same) ** 2, -1), 1.0, rtol=1e-5)


def test_learned_temperature_starts_at_the_default_scale():
    learned, default = tiny(attention_scale="learned"), tiny()
    x = jax.random.normal(jax.random.key(0), (1, 7, 16))
    a = lm.resolve(learned).stack.mixers[0].build(nnx.Rngs(params=0))
    b = lm.resolve(default).stack.mixers[0].build(nnx.Rngs(params=0))
    np.testing.assert_allclose(np.asarray(a(x, jnp.arange(7)[None])[0]),
                               np.asarray(b(x, jnp.arange(7)[None])[0]), atol=1e-6)


# --------------------------------------------------------------------------------------------
# Sliding window: receptive field and the rolling KV cache
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("window, n_layers", [(3, 2), (5, 3)])
def test_window_output_ignores_tokens_beyond_its_receptive_field(window, n_layers):
    cfg = tiny(attention_window=window, n_layers=n_layers, pos_encoding="rope")
    graphdef, state = lm.init_model(cfg, 0)
    forward = jax.jit(lambda tokens: lm.apply(graphdef, state, tokens))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 40, size=(1, 30))
    t = 29
    reach = n_layers * (window - 1)  # the output at t reads tokens t - reach .. t
    changed = tokens.copy()
    changed[0, : t - reach] = rng.integers(0, 40, size=t - reach)
    changed[0, : t - reach] = (changed[0, : t - reach] + 1) % 40  # surely different
    base = np.asarray(forward(jnp.asarray(tokens)))[0, t]
    np.testing.assert_array_equal(np.asarray(forward(jnp.asarray(changed)))[0, t], base)
    # ... and the bound is tight: the token at t - reach does change it.
    edge = tokens.copy()
    edge[0, t - reach] = (edge[0, t - reach] + 1) % 40
    assert np.abs(np.asarray(forward(jnp.asarray(edge)))[0, t] - base).max() > 1e-6


@pytest.mark.parametrize("window, n_global, chunk", [(3, 0, 4), (5, 2, 4), (2, 3, 5), (4, 1, 1),
                                                     (7, 0, 8)])
def test_banded_query_blocks_equal_the_full_band(window, n_global, chunk, monkeypatch):
    """Query blocks that read only the keys in reach compute the same attention, and each block
    sees at most ``chunk + window - 1`` keys (plus the global ones): memory O(T (chunk + w))."""
    rng = np.random.default_rng(window)
    q = jnp.asarray(rng.normal(size=(2, 19, 4, 8)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(2, 19, 2, 8)), jnp.float32) for _ in range(2))
    mask = lm.SlidingWindow(tiny(attention_window=window, attention_global_tokens=n_global))
    bias = lm.resolve(tiny(pos_encoding="alibi", n_heads=4)).encoding.bias
    full = dot_product_attention(q, k, v, mask=mask, bias=bias)
    banded = dot_product_attention(q, k, v, mask=mask, bias=bias, chunk=chunk)
    np.testing.assert_allclose(np.asarray(banded), np.asarray(full), atol=1e-6)
    key_counts = []
    reference = attention_module.IMPLEMENTATIONS["einsum"]

    def spy(q, k, v, **kwargs):
        key_counts.append(k.shape[1])
        return reference(q, k, v, **kwargs)

    monkeypatch.setitem(attention_module.IMPLEMENTATIONS, "einsum", spy)
    dot_product_attention(q, k, v, mask=mask, chunk=chunk)
    assert key_counts and max(key_counts) <= min(19, chunk + window - 1) + n_global


def test_window_cache_is_a_rolling_buffer():
    cfg = tiny(attention_window=4, attention_global_tokens=2)
    state = init_state(cfg, batch=3, max_len=1000)
    keys, values = state.layers[0]
    assert keys.shape == values.shape == (3, 6, cfg.kv_heads, cfg.head_dim)


DECODE_VARIANTS = {**VARIANTS, "plain": {}, "alibi": dict(pos_encoding="alibi"),
                   "window_gqa": dict(attention_window=3, n_heads=4, n_kv_heads=2),
                   "window_bf16": dict(attention_window=4, dtype="bfloat16"),
                   "t5_gqa": dict(pos_encoding="t5", n_heads=4, n_kv_heads=2),
                   "cosine_bf16": dict(attention_scale="cosine", dtype="bfloat16")}


# One variant of each decoding path in the default lane; the rest run with the slow lane.
DECODE_DEFAULT_LANE = ("plain", "t5", "yarn", "window_global", "window_alibi_chunked",
                       "window_xla_chunked", "t5_gqa", "cosine_bf16")


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in DECODE_DEFAULT_LANE
                                               else pytest.mark.slow) for n in DECODE_VARIANTS])
def test_kv_cache_decoding_equals_the_forward_pass(name):
    cfg = tiny(**DECODE_VARIANTS[name])
    graphdef, state = lm.init_model(cfg, 0)
    model = nnx.merge(graphdef, state)
    tokens = jax.random.randint(jax.random.key(1), (2, 23), 0, cfg.vocab_size)
    full = model(tokens)
    cache = init_state(cfg, 2, 23)
    step = jax.jit(lambda tokens, start, cache: model.decode(tokens, start, cache,
                                                             check_range=False))
    logits, cache = model.decode(tokens[:, :7], 0, cache)  # a prefill longer than the window
    outs = [logits]
    for i in range(7, 23):  # traced start, far past the window
        logits, cache = step(tokens[:, i:i + 1], jnp.int32(i), cache)
        outs.append(logits)
    tolerance = 3e-2 if cfg.dtype == "bfloat16" else 2e-5
    np.testing.assert_allclose(np.asarray(jnp.concatenate(outs, 1)), np.asarray(full),
                               atol=tolerance)


def test_generate_runs_past_the_window():
    cfg = tiny(attention_window=3, pos_encoding="t5")
    graphdef, state = lm.init_model(cfg, 0)
    prompt = jnp.asarray([[1, 2, 3, 4, 5]], jnp.int32)
    out = np.asarray(lm.generate(graphdef, state, cfg, prompt, 8))
    full = jax.jit(lambda tokens: lm.apply(graphdef, state, tokens))
    for t in range(5, 13):
        assert out[0, t] == int(jnp.argmax(full(jnp.asarray(out[:, :t]))[0, -1]))


# --------------------------------------------------------------------------------------------
# Counting, config refusals, training
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(DECODE_VARIANTS))
def test_parameter_counts_equal_the_state(name):
    cfg = tiny(**DECODE_VARIANTS[name])
    counts = param_counts(cfg)
    actual = count_state_params(lm.init_model(cfg, 0)[1])
    assert {k: counts[k] for k in actual} == actual


def test_counts_of_the_variants():
    base = param_counts(tiny())
    t5 = param_counts(tiny(pos_encoding="t5"))
    assert t5["position_embedding"] == 32 * 2 and t5["non_embedding"] == base["non_embedding"]
    per_layer = param_counts(tiny(pos_encoding="t5", t5_per_layer=True))
    assert per_layer["position_embedding"] == 2 * 32 * 2
    for scale in ("learned", "cosine"):  # one temperature per head and layer, in N
        assert (param_counts(tiny(attention_scale=scale))["non_embedding"]
                == base["non_embedding"] + 2 * 2)
    # A window of w keys: the scores and P V cost w, not T, per query.
    T, w = 256, 32
    full, local = flops_per_token(tiny(), T), flops_per_token(tiny(attention_window=w), T)
    d_attn, L = 16, 2
    assert full["chinchilla_forward"] - local["chinchilla_forward"] == pytest.approx(
        L * (4 * (T - w) * d_attn + 3 * 2 * (T - w)))
    assert full["kaplan_attention"] - local["kaplan_attention"] == pytest.approx(
        6 * L * (T - w) * d_attn)
    assert flops_per_token(tiny(attention_window=1000), T) == full  # a window past T is full


@pytest.mark.parametrize("overrides, field", [
    (dict(pos_encoding="learned", rope_scaling="yarn", rope_factor=2.0, rope_original_len=8),
     "model.rope_scaling"),
    (dict(pos_encoding="alibi", rope_scaling="pi", rope_factor=2.0), "model.rope_scaling"),
    (dict(pos_encoding="t5", rope_scaling="pi", rope_factor=2.0), "model.rope_scaling"),
    (dict(rope_scaling="yarn", rope_factor=2.0), "model.rope_original_len"),
    (dict(rope_scaling="pi", rope_factor=0.5), "model.rope_factor"),
    (dict(rope_scaling="longrope"), "model.rope_scaling"),
    (dict(attention_scale="cosine", qk_norm=True), "model.attention_scale"),
    (dict(attention_scale="cosine", cosine_tau_init=0.0), "model.cosine_tau_init"),
    (dict(attention_scale="sqrt"), "model.attention_scale"),
    (dict(attention_window=-1), "model.attention_window"),
    (dict(attention_global_tokens=2), "model.attention_global_tokens"),
    (dict(pos_encoding="t5", t5_num_buckets=7), "model.t5_num_buckets"),
    (dict(pos_encoding="t5", t5_num_buckets=32, t5_max_distance=16), "model.t5_max_distance"),
    (dict(mixer="linear", attention_window=4), "model.attention_window"),
    (dict(mixer="mamba", pos_encoding="none", attention_scale="cosine"), "model.attention_scale"),
])
def test_bad_combinations_are_refused_naming_the_fields(overrides, field):
    with pytest.raises(ConfigError) as info:
        tiny(**overrides)
    assert info.value.field == field
    assert "\n" not in str(info.value)


def test_a_hybrids_attention_layers_take_the_variants():
    cfg = tiny(mixer="linear", attention_every=2, attention_window=4, attention_scale="cosine")
    graphdef, state = lm.init_model(cfg, 0)
    model = nnx.merge(graphdef, state)
    tokens = jax.random.randint(jax.random.key(1), (1, 12), 0, cfg.vocab_size)
    cache = init_state(cfg, 1, 12)
    outs = []
    for i in range(12):
        logits, cache = model.decode(tokens[:, i:i + 1], i, cache)
        outs.append(logits)
    np.testing.assert_allclose(np.asarray(jnp.concatenate(outs, 1)), np.asarray(model(tokens)),
                               atol=2e-5)
    assert param_counts(cfg)["total"] == count_state_params(state)["total"]


def test_window_longer_than_the_training_context_is_refused():
    with pytest.raises(ConfigError, match="model.attention_window") as info:
        lm.check(Config(model=tiny(attention_window=65, vocab_size=256),
                        data=DataConfig(seq_len=64)))
    assert info.value.field == "model.attention_window"
    lm.check(Config(model=tiny(attention_window=64, vocab_size=256), data=DataConfig(seq_len=64)))


def test_defaults_reproduce_the_models_before_the_variants():
    cfg = tiny()
    scale = lm.resolve(cfg).score_scale
    assert cfg.attention_scale in lm.SCORE_SCALES and scale.scale() == 1 / math.sqrt(8)
    paths = {path for path, _ in nnx.to_flat_state(lm.init_model(cfg, 0)[1])}
    assert not any("temperature" in "/".join(map(str, p)) for p in paths)
    assert dataclasses.replace(cfg) == cfg


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


@pytest.mark.parametrize("overrides", [
    ["--config.model.pos_encoding=t5"],
    ["--config.model.pos_encoding=t5", "--config.model.t5_per_layer=True"],
    ["--config.model.attention_scale=cosine"],
    ["--config.model.attention_scale=learned"],
    ["--config.model.attention_scale=mup"],
    ["--config.model.attention_window=8", "--config.model.attention_global_tokens=1"],
], ids=["t5", "t5_per_layer", "cosine", "learned", "mup", "window"])
def test_each_variant_trains_through_attnlab_train(overrides, data_dir, tmp_path, capsys):
    workdir = tmp_path / "run"
    code = cli.main(["train", "--config=configs/tiny.py", f"--config.data.cache_dir={data_dir}",
                     "--config.train.steps=2", "--config.train.warmup_steps=1",
                     "--config.train.eval_every=2", "--config.train.checkpoint_every=2",
                     "--config.train.log_every=1", *overrides, f"--run={workdir}"])
    assert code == 0, capsys.readouterr().err
    cfg, graphdef, state = load_params(workdir)
    prompt = jnp.asarray([[100, 101, 102]], jnp.int32)
    assert lm.generate(graphdef, state, cfg.model, prompt, 4).shape == (1, 7)


# --------------------------------------------------------------------------------------------
# Gated FFNs (Shazeer 2020): SwiGLU and T5 v1.1's GELU-gated GeGLU
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["swiglu", "geglu"])
def test_gated_ffns_equal_the_float64_reference(name):
    cfg = ModelConfig(d_model=16, n_layers=2, n_heads=2, ffn=name, linear_bias=True)
    ffn = lm.resolve(cfg).ffn
    module = ffn.build(nnx.Rngs(params=0))
    for part in (module.w_in, module.w_gate, module.w_out):  # non-zero biases
        part.bias[...] = jax.random.normal(jax.random.key(3), part.bias.shape)
    x = np.random.default_rng(0).standard_normal((2, 3, 16))

    def affine(part, h):
        return h @ np.float64(part.kernel[...]) + np.float64(part.bias[...])

    gate = affine(module.w_gate, x)
    if name == "swiglu":
        act = gate / (1 + np.exp(-gate))
    else:  # GELU, tanh approximation (Hendrycks & Gimpel 2016)
        act = 0.5 * gate * (1 + np.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)))
    want = affine(module.w_out, act * affine(module.w_in, x))
    got = module(jnp.asarray(x, jnp.float32))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert ffn.width == 48 and count_state_params(nnx.state(module))["total"] == ffn.param_count()


# --------------------------------------------------------------------------------------------
# The embedding norm (BERT, Bloom): Norm(E[x] + P[p]) before the first layer
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides", [dict(pos_encoding="learned"),
                                       dict(pos_encoding="alibi", norm_position="post")])
def test_embedding_norm_equals_the_reference_and_decodes_like_the_forward_pass(overrides):
    cfg = ModelConfig(vocab_size=40, d_model=16, n_layers=2, n_heads=2, max_len=16,
                      embedding_norm=True, **overrides)
    graphdef, state = lm.init_model(cfg, 0)
    model = nnx.merge(graphdef, state)
    model.embedding_norm.scale[...] = 1 + jax.random.normal(jax.random.key(1), (16,))
    model.embedding_norm.bias[...] = jax.random.normal(jax.random.key(2), (16,))
    tokens = np.array([[3, 1, 4, 1, 5, 9]])
    x = np.float64(model.token_embedding[...])[tokens[0]]
    if model.position_embedding is not None:
        x = x + np.float64(model.position_embedding[...])[:6]
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    want = ((x - mu) / np.sqrt(var + cfg.norm_eps) * np.float64(model.embedding_norm.scale[...])
            + np.float64(model.embedding_norm.bias[...]))
    got = model.embed(jnp.asarray(tokens), jnp.arange(6)[None])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    graphdef, state = nnx.split(model)
    full = lm.apply(graphdef, state, jnp.asarray(tokens))
    cache = init_state(cfg, batch=1, max_len=8)
    first, cache = lm.decode_step(graphdef, state, cache, jnp.asarray(tokens[:, :4]), 0)
    rest, _ = lm.decode_step(graphdef, state, cache, jnp.asarray(tokens[:, 4:]), 4)
    np.testing.assert_allclose(jnp.concatenate([first, rest], 1), full, rtol=1e-5, atol=1e-5)
    for refused in (dict(objective="span", vocab_size=300), dict(inputs="vectors", input_dim=4)):
        with pytest.raises(ConfigError, match="model.embedding_norm"):
            lm.resolve(ModelConfig(embedding_norm=True, **refused))
