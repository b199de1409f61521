"""Attention against a float64 NumPy reference of softmax(QK^T / sqrt(d_k) + B) V, and the
equalities between its implementations (einsum / xla, chunked / unchunked, GQA / MHA)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab.config import ModelConfig
from attnlab.model import (
    Bidirectional,
    Causal,
    Mask,
    alibi_bias,
    alibi_slopes,
    attention_weights,
    dot_product_attention,
    resolve,
)

causal = Causal()


def reference_attention(q, k, v, *, causal=True, q_offset=0, slopes=None, q_pos=None, k_pos=None):
    """float64: out[b, i, h] = sum_j softmax_j(q_i . k_j / sqrt(d) - m_h |p_i - p_j|) v_j."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    batch, q_len, heads, d = q.shape
    k_len, kv_heads = k.shape[1], k.shape[2]
    group = heads // kv_heads
    k = np.repeat(k, group, axis=2)  # query head h reads kv head h // group
    v = np.repeat(v, group, axis=2)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
    if slopes is not None:
        q_pos = q_offset + np.arange(q_len) if q_pos is None else q_pos
        k_pos = np.arange(k_len) if k_pos is None else k_pos
        distance = np.abs(np.asarray(q_pos)[:, None] - np.asarray(k_pos)[None, :])
        scores = scores - np.asarray(slopes)[None, :, None, None] * distance
    if causal:
        allowed = np.arange(k_len)[None, :] <= q_offset + np.arange(q_len)[:, None]
        scores = np.where(allowed, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", weights, v)


# Jitted once per static combination: one compilation is much cheaper than eager op-by-op.
attention = jax.jit(
    dot_product_attention, static_argnames=("mask", "bias", "q_offset", "impl", "chunk")
)


def alibi(slopes):
    """The ALiBi bias function of positions, as the layer gets it from its encoding."""
    return functools.partial(alibi_bias, slopes)


def call(module, *args, **kwargs):
    """Runs an attention layer the way the model does: split once, a jitted pure function;
    returns its output (the layer returns ``(output, state)``, None without a cache)."""
    graphdef, state = nnx.split(module)

    def forward(state, *args):
        out, kv = nnx.merge(graphdef, state)(*args, **kwargs)
        assert kv is None
        return out

    return jax.jit(forward)(state, *args)


def random_qkv(seed, batch=2, q_len=7, k_len=7, heads=4, kv_heads=4, d=8):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(batch, q_len, heads, d)).astype(np.float32)
    k = rng.normal(size=(batch, k_len, kv_heads, d)).astype(np.float32)
    v = rng.normal(size=(batch, k_len, kv_heads, d)).astype(np.float32)
    return q, k, v


CASES = {
    "mha_causal": dict(kv_heads=4),
    "gqa_causal": dict(kv_heads=2),
    "mqa_causal": dict(kv_heads=1),
    "non_causal": dict(kv_heads=2, causal=False),
    "alibi": dict(kv_heads=4, alibi=True),
    "cache_offset": dict(kv_heads=2, q_len=3, k_len=9, q_offset=5),
    "cache_offset_alibi": dict(kv_heads=4, q_len=3, k_len=9, q_offset=5, alibi=True),
    # Query blocks of 2 (7 queries: the last block is padded).
    "chunked_gqa_alibi": dict(kv_heads=2, alibi=True, chunk=2),
    "chunked_non_causal": dict(kv_heads=1, causal=False, chunk=2),
    "chunked_cache_offset_alibi": dict(
        kv_heads=2, q_len=5, k_len=9, q_offset=3, alibi=True, chunk=2
    ),
    # Long enough for the einsum path's two causal query halves.
    "causal_halves_gqa_alibi": dict(kv_heads=2, q_len=128, k_len=128, alibi=True),
}


@pytest.mark.parametrize("impl", ["einsum", "xla"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_equals_float64_formula(case, impl):
    spec = dict(CASES[case])
    is_causal, q_offset = spec.pop("causal", True), spec.pop("q_offset", 0)
    chunk = spec.pop("chunk", 0)
    slopes = alibi_slopes(4) if spec.pop("alibi", False) else None
    q, k, v = random_qkv(0, **spec)
    out = attention(
        jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), mask=causal if is_causal else None,
        q_offset=q_offset, bias=None if slopes is None else alibi(slopes), impl=impl, chunk=chunk,
    )
    assert out.shape == q.shape and out.dtype == jnp.float32
    expected = reference_attention(q, k, v, causal=is_causal, q_offset=q_offset, slopes=slopes)
    np.testing.assert_allclose(np.asarray(out), expected, atol=2e-5, rtol=1e-5)


def test_causal_weights_rows_sum_to_one_with_zeros_above_the_diagonal():
    q, k, _ = random_qkv(1, kv_heads=2, q_len=6, k_len=6)
    weights = np.asarray(jax.jit(attention_weights)(jnp.asarray(q), jnp.asarray(k)))
    assert weights.shape == (2, 4, 6, 6)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    above = np.triu(np.ones((6, 6), bool), k=1)
    assert np.all(weights[..., above] == 0.0)
    assert np.all(weights[..., ~above] > 0.0)


def test_alibi_positions_may_be_offset_or_per_batch():
    q, k, v = random_qkv(2)
    slopes = alibi_slopes(4)
    positions = np.stack([np.arange(7) + 100, np.arange(7) * 2])  # [batch, seq]
    out = attention(
        jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), q_positions=positions,
        k_positions=positions, bias=alibi(slopes), chunk=3,
    )
    for b in range(2):
        expected = reference_attention(
            q[b : b + 1], k[b : b + 1], v[b : b + 1], slopes=slopes,
            q_pos=positions[b], k_pos=positions[b],
        )
        np.testing.assert_allclose(np.asarray(out[b : b + 1]), expected, atol=2e-5)


@pytest.mark.parametrize("q_len, chunk", [
    (10, 4),  # query blocks of 4 against one block
    # 128 causal queries run in two halves (the all-masked quarter skipped); query blocks of 64
    # compute every score
    (128, 64),
], ids=["chunked", "causal_halves"])
def test_gradients_equal_across_query_blockings(q_len, chunk):
    q, k, v = (jnp.asarray(a) for a in random_qkv(3, kv_heads=2, q_len=q_len, k_len=q_len))
    slopes = alibi_slopes(4)

    def loss(q, k, v, chunk):
        out = dot_product_attention(q, k, v, bias=alibi(slopes), chunk=chunk)
        return jnp.sum(jnp.sin(out))

    gradient = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)
    for a, b in zip(gradient(q, k, v, 0), gradient(q, k, v, chunk), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def tiny_cfg(**overrides) -> ModelConfig:
    base = dict(vocab_size=32, d_model=16, n_layers=2, n_heads=4, pos_encoding="none")
    base.update(overrides)
    return ModelConfig(**base)


def attention_layer(cfg: ModelConfig, seed: int, mask: Mask | None = None):
    """Layer 0's softmax attention as the model builds it (its mask replaced if given)."""
    mixer = resolve(cfg).stack.mixers[0]
    if mask is not None:
        mixer = dataclasses.replace(mixer, mask=mask)
    return mixer.build(nnx.Rngs(seed))


def test_attention_without_position_or_mask_is_permutation_equivariant():
    layer = attention_layer(tiny_cfg(), 0, mask=Bidirectional())
    x = jax.random.normal(jax.random.key(1), (2, 9, 16))
    positions = jnp.arange(9)[None]
    perm = np.random.default_rng(0).permutation(9)
    out = call(layer, x, positions)
    out_permuted = call(layer, x[:, perm], positions)
    np.testing.assert_allclose(np.asarray(out_permuted), np.asarray(out[:, perm]), atol=1e-6)
    # With the causal mask (same parameters) it is not: the mask does something.
    causal = call(attention_layer(tiny_cfg(), 0), x[:, perm], positions)
    assert not np.allclose(np.asarray(causal), np.asarray(out[:, perm]), atol=1e-4)


def test_gqa_equals_mha_with_repeated_key_value_heads():
    x = jax.random.normal(jax.random.key(2), (2, 8, 16))
    positions = jnp.arange(8)[None]
    gqa = attention_layer(tiny_cfg(n_kv_heads=2, pos_encoding="rope"), 0)
    mha = attention_layer(tiny_cfg(pos_encoding="rope"), 1)
    head_dim, group = 4, 2
    mha.q_proj.kernel[...] = gqa.q_proj.kernel[...]
    mha.o_proj.kernel[...] = gqa.o_proj.kernel[...]
    for name in ("k_proj", "v_proj"):
        kernel = getattr(gqa, name).kernel[...].reshape(16, 2, head_dim)
        getattr(mha, name).kernel[...] = jnp.repeat(kernel, group, axis=1).reshape(16, 16)
    np.testing.assert_allclose(
        np.asarray(call(gqa, x, positions)), np.asarray(call(mha, x, positions)), atol=1e-6
    )


def test_n_kv_heads_equal_to_n_heads_is_mha():
    x = jax.random.normal(jax.random.key(3), (1, 5, 16))
    positions = jnp.arange(5)[None]
    explicit = attention_layer(tiny_cfg(n_kv_heads=4), 0)
    default = attention_layer(tiny_cfg(), 0)
    np.testing.assert_array_equal(
        np.asarray(call(explicit, x, positions)), np.asarray(call(default, x, positions))
    )


@dataclasses.dataclass(frozen=True)
class Banded(Mask):
    """A test-local mask (a sliding window of ``window`` keys): the seam a new mask plugs
    into."""

    window: int = 0

    def __call__(self, q_index, k_index):
        return causal(q_index, k_index) & (q_index[:, None] - k_index[None, :] < self.window)


@pytest.mark.parametrize("impl, chunk", [("einsum", 0), ("xla", 0), ("einsum", 3), ("xla", 3)])
def test_scale_bias_and_mask_are_arguments_of_the_one_score_function(impl, chunk):
    q, k, v = random_qkv(4, kv_heads=2, q_len=4, k_len=9)
    slopes, scale, window, offset = alibi_slopes(4), 0.1, 3, 5
    out = attention(
        jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), scale=scale, bias=alibi(slopes),
        mask=Banded(window=window), q_offset=offset, impl=impl, chunk=chunk,
    )
    # float64: s = scale q.k - m_h |i - j|, keys offset + i - window < j <= offset + i.
    q64 = np.asarray(q, np.float64)
    # Query head h reads key/value head h // 2.
    k64, v64 = (np.repeat(np.asarray(a, np.float64), 2, axis=2) for a in (k, v))
    i, j = offset + np.arange(4)[:, None], np.arange(9)[None, :]
    scores = scale * np.einsum("bqhd,bkhd->bhqk", q64, k64) - slopes[:, None, None] * np.abs(i - j)
    scores = np.where((j <= i) & (i - j < window), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    expected = np.einsum("bhqk,bkhd->bqhd", weights, v64)
    np.testing.assert_allclose(np.asarray(out), expected, atol=2e-5, rtol=1e-5)
