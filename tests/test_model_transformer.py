"""The whole LM: a float64 NumPy re-implementation of the forward pass, causality, translation
(in)variance of the position encodings, range errors, dtype policy, dropout and init."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab.config import ModelConfig
from attnlab.model import PositionOutOfRangeError, apply, init_model, token_losses

VOCAB = 32


def tiny_cfg(**overrides) -> ModelConfig:
    base = dict(vocab_size=VOCAB, d_model=16, n_layers=2, n_heads=4, max_len=64)
    base.update(overrides)
    return ModelConfig(**base)


def jitted_apply(graphdef):
    return jax.jit(lambda state, tokens, positions=None: apply(graphdef, state, tokens, positions))


def random_tokens(seed, batch=2, seq=12):
    return jnp.asarray(np.random.default_rng(seed).integers(0, VOCAB, size=(batch, seq)), jnp.int32)


# --------------------------------------------------------------------- float64 reference model


def ref_norm(cfg, params, x):
    if cfg.norm == "layernorm":
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + cfg.norm_eps) * params["scale"] + params["bias"]
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + cfg.norm_eps) * params["scale"]


def ref_rope(x, positions, theta):
    half = x.shape[-1] // 2
    angle = positions[:, None] * theta ** (-np.arange(half) * 2.0 / x.shape[-1])  # [s, d/2]
    cos, sin = np.cos(angle)[:, None], np.sin(angle)[:, None]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


def ref_slopes(n):
    # Press et al.: power-of-two heads 2^(-8i/n); otherwise interleave (written independently).
    def geometric(k):
        return [2.0 ** (-8.0 * (i + 1) / k) for i in range(k)]

    c = 2 ** int(np.log2(n))
    return np.array(geometric(c) + geometric(2 * c)[::2][: n - c])


def ref_attention(cfg, p, x, positions):
    s, d = x.shape
    h, kvh, hd = cfg.n_heads, cfg.kv_heads, cfg.head_dim
    q = (x @ p["q_proj"]["kernel"]).reshape(s, h, hd)
    k = (x @ p["k_proj"]["kernel"]).reshape(s, kvh, hd)
    v = (x @ p["v_proj"]["kernel"]).reshape(s, kvh, hd)
    if cfg.qk_norm:
        q, k = ref_norm(cfg, p["q_norm"], q), ref_norm(cfg, p["k_norm"], k)
    if cfg.pos_encoding == "rope":
        q, k = ref_rope(q, positions, cfg.rope_theta), ref_rope(k, positions, cfg.rope_theta)
    k, v = np.repeat(k, h // kvh, axis=1), np.repeat(v, h // kvh, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
    if cfg.pos_encoding == "alibi":
        distance = positions[:, None] - positions[None, :]
        scores = scores - ref_slopes(h)[:, None, None] * distance
    scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", w, v).reshape(s, h * hd) @ p["o_proj"]["kernel"]


def ref_ffn(cfg, p, x):
    a = x @ p["w_in"]["kernel"]
    if cfg.ffn == "relu":
        hidden = np.maximum(a, 0)
    elif cfg.ffn == "gelu":
        hidden = 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a**3)))
    else:
        g = x @ p["w_gate"]["kernel"]
        hidden = g / (1 + np.exp(-g)) * a
    return hidden @ p["w_out"]["kernel"]


def reference_logits(cfg, state, tokens, positions):
    """float64 forward of one sequence: tokens [seq], positions [seq] -> logits [seq, vocab]."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), nnx.to_pure_dict(state))
    positions = np.asarray(positions, np.float64)
    x = p["token_embedding"][tokens]
    if cfg.pos_encoding == "learned":
        x = x + p["position_embedding"][positions.astype(int)]
    elif cfg.pos_encoding == "sinusoidal":
        i = np.arange(cfg.d_model // 2)
        angle = positions[:, None] / 10000.0 ** (2 * i / cfg.d_model)
        table = np.stack([np.sin(angle), np.cos(angle)], -1).reshape(len(positions), -1)
        x = x * np.sqrt(cfg.d_model) + table
    for layer in range(cfg.n_layers):
        b = p["blocks"][layer]
        if cfg.norm_position == "pre":
            x = x + ref_attention(cfg, b["attn"], ref_norm(cfg, b["attn_norm"], x), positions)
            x = x + ref_ffn(cfg, b["ffn"], ref_norm(cfg, b["ffn_norm"], x))
        else:
            x = ref_norm(cfg, b["attn_norm"], x + ref_attention(cfg, b["attn"], x, positions))
            x = ref_norm(cfg, b["ffn_norm"], x + ref_ffn(cfg, b["ffn"], x))
    if cfg.norm_position == "pre":
        x = ref_norm(cfg, p["final_norm"], x)
    head = p["token_embedding"].T if cfg.tie_embeddings else p["lm_head"]
    return x @ head


VARIANTS = {
    "pre_layernorm_gelu_rope_tied": dict(),
    "post_rmsnorm_relu_learned_untied": dict(
        norm_position="post", norm="rmsnorm", ffn="relu", pos_encoding="learned",
        tie_embeddings=False,
    ),
    "pre_rmsnorm_swiglu_alibi_gqa_qknorm_chunked": dict(
        norm="rmsnorm", ffn="swiglu", pos_encoding="alibi", n_kv_heads=2, qk_norm=True,
        attention_chunk=5,
    ),
    "pre_layernorm_sinusoidal_xla_6heads": dict(
        pos_encoding="sinusoidal", attention_impl="xla", d_model=24, n_heads=6, n_kv_heads=3,
    ),
    "post_layernorm_nope_mqa_swiglu": dict(
        norm_position="post", pos_encoding="none", n_kv_heads=1, ffn="swiglu", init_std=0.2,
    ),
    "pre_alibi_6heads_qknorm_layernorm_xla": dict(
        pos_encoding="alibi", d_model=24, n_heads=6, qk_norm=True, attention_impl="xla",
        init_std=0.2, attention_chunk=4,
    ),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_forward_equals_float64_reference(name):
    cfg = tiny_cfg(**VARIANTS[name])
    graphdef, state = init_model(cfg, seed=3)
    tokens = random_tokens(0)
    positions = np.stack([np.arange(12), np.arange(12) + 5])
    logits = jitted_apply(graphdef)(state, tokens, positions)
    assert logits.shape == (2, 12, VOCAB) and logits.dtype == jnp.float32
    for b in range(2):
        expected = reference_logits(cfg, state, np.asarray(tokens[b]), positions[b])
        scale = np.abs(expected).max()
        np.testing.assert_allclose(np.asarray(logits[b]), expected, atol=2e-5 * max(scale, 1))


# ------------------------------------------------------------------------------ causality


@pytest.mark.parametrize(
    "overrides",
    [
        dict(pos_encoding="rope"),
        dict(pos_encoding="alibi", attention_impl="xla", norm_position="post"),
        dict(pos_encoding="learned", attention_chunk=3),
    ],
    ids=["rope", "alibi_xla_post", "learned_chunked"],
)
def test_changing_token_t_leaves_earlier_logits_bit_identical(overrides):
    cfg = tiny_cfg(n_layers=1, **overrides)
    graphdef, state = init_model(cfg, seed=0)
    forward = jitted_apply(graphdef)
    tokens = random_tokens(1)
    t = 7
    changed = tokens.at[:, t].set((tokens[:, t] + 1) % VOCAB)
    before, after = np.asarray(forward(state, tokens)), np.asarray(forward(state, changed))
    np.testing.assert_array_equal(before[:, :t], after[:, :t])
    assert not np.allclose(before[:, t:], after[:, t:])


# ----------------------------------------------------------------- translation (in)variance


@pytest.mark.parametrize(
    "encoding, invariant",
    [("rope", True), ("alibi", True), ("none", True), ("sinusoidal", False), ("learned", False)],
)
def test_offsetting_all_positions(encoding, invariant):
    # Larger init_std so that the position signal visibly moves the logits.
    cfg = tiny_cfg(pos_encoding=encoding, init_std=0.2, max_len=128, n_layers=1)
    graphdef, state = init_model(cfg, seed=1)
    forward = jitted_apply(graphdef)
    tokens = random_tokens(2)
    base = np.asarray(forward(state, tokens))
    shifted = np.asarray(forward(state, tokens, np.arange(12) + 101))
    scale = np.abs(base).max()
    if invariant:
        np.testing.assert_allclose(shifted, base, atol=1e-4 * scale)
    else:
        assert np.abs(shifted - base).max() > 1e-2 * scale


def test_batch_specific_positions_equal_separate_calls():
    cfg = tiny_cfg(pos_encoding="learned", n_layers=1)
    graphdef, state = init_model(cfg, seed=0)
    forward = jitted_apply(graphdef)
    tokens = random_tokens(3)
    positions = np.stack([np.arange(12), np.arange(12) + 30])
    together = np.asarray(forward(state, tokens, positions))
    for b in range(2):
        alone = np.asarray(forward(state, tokens[b : b + 1], positions[b]))
        np.testing.assert_allclose(together[b : b + 1], alone, atol=1e-6)


# ----------------------------------------------------------------------------- range errors


def test_learned_positions_beyond_max_len_raise():
    cfg = tiny_cfg(pos_encoding="learned", max_len=8, n_layers=1)
    graphdef, state = init_model(cfg, seed=0)
    forward = jitted_apply(graphdef)
    forward(state, random_tokens(0, seq=8))  # exactly max_len is fine
    with pytest.raises(PositionOutOfRangeError, match=r"model\.max_len"):
        forward(state, random_tokens(0, seq=9))  # default positions: caught while tracing
    with pytest.raises(PositionOutOfRangeError, match=r"positions 3\.\.10"):
        apply(graphdef, state, random_tokens(0, seq=8), np.arange(3, 11))
    # Positions that are traced inside jit are checked when the computation runs.
    traced = jax.jit(lambda s, t, p: apply(graphdef, s, t, p))
    with pytest.raises(Exception, match="outside the learned position table"):
        jax.block_until_ready(traced(state, random_tokens(0, seq=4), jnp.arange(6, 10)))


def test_position_shape_is_checked():
    graphdef, state = init_model(tiny_cfg(), seed=0)
    with pytest.raises(ValueError, match=r"positions must have shape"):
        apply(graphdef, state, random_tokens(0, seq=6), np.arange(5))


# --------------------------------------------------------------------------- dtype policy


def test_bfloat16_compute_gives_float32_logits_close_to_float32():
    tokens = random_tokens(4)
    outputs = {}
    for dtype in ("float32", "bfloat16"):
        cfg = tiny_cfg(dtype=dtype, pos_encoding="rope", ffn="swiglu", n_kv_heads=2, n_layers=1)
        graphdef, state = init_model(cfg, seed=5)
        assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(state))
        outputs[dtype] = jitted_apply(graphdef)(state, tokens)
    assert outputs["bfloat16"].dtype == jnp.float32
    full, half = np.asarray(outputs["float32"]), np.asarray(outputs["bfloat16"])
    assert np.all(np.isfinite(half))
    np.testing.assert_allclose(half, full, atol=0.03 * np.abs(full).max())
    assert not np.array_equal(half, full)  # the bf16 path really ran in bf16


# ------------------------------------------------------------------------------- dropout


def test_dropout_is_keyed_and_off_without_a_key():
    cfg = tiny_cfg(dropout=0.5, n_layers=1)
    graphdef, state = init_model(cfg, seed=0)
    forward = jax.jit(lambda s, t, key: apply(graphdef, s, t, dropout_rng=key))
    tokens = random_tokens(5)
    plain = np.asarray(jitted_apply(graphdef)(state, tokens))
    a = np.asarray(forward(state, tokens, jax.random.key(0)))
    b = np.asarray(forward(state, tokens, jax.random.key(0)))
    c = np.asarray(forward(state, tokens, jax.random.key(1)))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c) and not np.allclose(a, plain)


def test_dropout_without_key_raises():
    graphdef, state = init_model(tiny_cfg(dropout=0.1), seed=0)
    model = nnx.merge(graphdef, state)
    with pytest.raises(ValueError, match="dropout_rng"):
        model(random_tokens(0), deterministic=False)


# ------------------------------------------------------------------------------------ init


def test_gpt2_initialisation():
    cfg = tiny_cfg(d_model=32, n_layers=4, n_heads=4, init_std=0.02, tie_embeddings=False)
    _, state = init_model(cfg, seed=0)
    p = nnx.to_pure_dict(state)
    residual_std = 0.02 / math.sqrt(2 * 4)
    stds = {"q": [], "o": [], "w_in": [], "w_out": []}
    for layer in range(4):
        block = p["blocks"][layer]
        stds["q"].append(np.std(block["attn"]["q_proj"]["kernel"]))
        stds["o"].append(np.std(block["attn"]["o_proj"]["kernel"]))
        stds["w_in"].append(np.std(block["ffn"]["w_in"]["kernel"]))
        stds["w_out"].append(np.std(block["ffn"]["w_out"]["kernel"]))
        np.testing.assert_array_equal(block["attn_norm"]["scale"], 1.0)
        np.testing.assert_array_equal(block["attn_norm"]["bias"], 0.0)
    np.testing.assert_allclose(np.mean(stds["q"]), 0.02, rtol=0.05)
    np.testing.assert_allclose(np.mean(stds["w_in"]), 0.02, rtol=0.05)
    np.testing.assert_allclose(np.mean(stds["o"]), residual_std, rtol=0.05)
    np.testing.assert_allclose(np.mean(stds["w_out"]), residual_std, rtol=0.05)
    np.testing.assert_allclose(np.std(p["token_embedding"]), 0.02, rtol=0.1)
    np.testing.assert_allclose(np.std(p["lm_head"]), 0.02, rtol=0.1)


# ---------------------------------------------------------------------------------- losses


def test_token_losses_equal_float64_cross_entropy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 7)).astype(np.float32) * 3
    targets = rng.integers(0, 7, size=(2, 5))
    losses = np.asarray(token_losses(jnp.asarray(logits), jnp.asarray(targets)))
    z = logits.astype(np.float64)
    log_probs = z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(
        -1, keepdims=True
    )
    expected = -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    assert losses.shape == (2, 5) and losses.dtype == np.float32
    np.testing.assert_allclose(losses, expected, rtol=1e-6)


def test_attention_implementations_and_chunking_agree_in_the_full_model():
    tokens = random_tokens(7, seq=11)
    logits = {}
    for impl, chunk in [("einsum", 0), ("xla", 0), ("einsum", 4)]:
        cfg = tiny_cfg(
            pos_encoding="alibi", n_kv_heads=2, attention_impl=impl, attention_chunk=chunk
        )
        graphdef, state = init_model(cfg, seed=0)  # same seed, same shapes: same parameters
        logits[impl, chunk] = np.asarray(jitted_apply(graphdef)(state, tokens))
    reference = logits["einsum", 0]
    for key, value in logits.items():
        np.testing.assert_allclose(value, reference, atol=1e-5, err_msg=str(key))
