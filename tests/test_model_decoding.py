"""KV-cache decoding reproduces the full forward pass; generate; range errors while decoding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnlab.config import ModelConfig
from attnlab.model import (
    PositionOutOfRangeError,
    apply,
    decode_step,
    generate,
    init_state,
    init_model,
)

VOCAB = 32


def tiny_cfg(**overrides) -> ModelConfig:
    base = dict(vocab_size=VOCAB, d_model=16, n_layers=2, n_heads=4, max_len=16, init_std=0.1)
    base.update(overrides)
    return ModelConfig(**base)


def random_tokens(seed, batch=2, seq=10):
    return jnp.asarray(np.random.default_rng(seed).integers(0, VOCAB, size=(batch, seq)), jnp.int32)


DECODE_VARIANTS = {
    "nope": dict(pos_encoding="none"),
    "sinusoidal": dict(pos_encoding="sinusoidal"),
    "learned_post": dict(pos_encoding="learned", norm_position="post"),
    "rope_gqa_qknorm": dict(pos_encoding="rope", n_kv_heads=2, qk_norm=True),
    "alibi_mqa_chunked": dict(pos_encoding="alibi", n_kv_heads=1, attention_chunk=2),
    "rope_xla": dict(pos_encoding="rope", attention_impl="xla", n_kv_heads=2, ffn="swiglu"),
}


@pytest.mark.parametrize("name, overrides", DECODE_VARIANTS.items(), ids=list(DECODE_VARIANTS))
def test_kv_cache_decoding_equals_full_forward(name, overrides):
    cfg = tiny_cfg(**overrides)
    graphdef, state = init_model(cfg, seed=0)
    tokens = random_tokens(0)
    full = np.asarray(jax.jit(lambda s, t: apply(graphdef, s, t))(state, tokens))
    step = jax.jit(decode_step, static_argnums=0)  # start traced: one compilation per width
    cache = init_state(cfg, batch=2, max_len=12)  # longer than needed: unused slots are masked
    pieces = []
    # Single tokens; two variants start with a prompt of 4, one then feeds a block of 3.
    schedule = {"alibi_mqa_chunked": [(0, 4), (4, 7)], "rope_gqa_qknorm": [(0, 4)]}.get(name, [])
    start = schedule[-1][1] if schedule else 0
    schedule += [(i, i + 1) for i in range(start, 10)]
    for start, stop in schedule:
        logits, cache = step(graphdef, state, cache, tokens[:, start:stop], start)
        pieces.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=2e-5)


def test_greedy_generation_equals_argmax_of_full_forward():
    cfg = tiny_cfg(pos_encoding="rope", n_kv_heads=2)
    graphdef, state = init_model(cfg, seed=1)
    prompt = random_tokens(1, seq=3)
    out = np.asarray(generate(graphdef, state, cfg, prompt, 5))
    assert out.shape == (2, 8) and out.dtype == np.int32
    np.testing.assert_array_equal(out[:, :3], prompt)
    # Causal: the full forward's logits at t - 1 are those of the prefix out[:, :t].
    logits = np.asarray(jax.jit(lambda s, t: apply(graphdef, s, t))(state, jnp.asarray(out)))
    np.testing.assert_array_equal(out[:, 3:], logits[:, 2:-1].argmax(-1))


def test_temperature_sampling_is_keyed():
    cfg = tiny_cfg(pos_encoding="alibi")
    graphdef, state = init_model(cfg, seed=2)
    prompt = random_tokens(2, seq=2)
    sample = lambda seed: np.asarray(
        generate(graphdef, state, cfg, prompt, 12, rng=jax.random.key(seed), temperature=1.5)
    )
    a, b, c = sample(0), sample(0), sample(1)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.min() >= 0 and a.max() < VOCAB
    with pytest.raises(ValueError, match="needs rng"):
        generate(graphdef, state, cfg, prompt, 3, temperature=1.0)


def test_learned_positions_beyond_max_len_raise_while_decoding():
    cfg = tiny_cfg(pos_encoding="learned", max_len=8)
    graphdef, state = init_model(cfg, seed=0)
    with pytest.raises(PositionOutOfRangeError, match=r"model\.max_len"):
        generate(graphdef, state, cfg, random_tokens(0, seq=4), 5)  # 9 tokens > 8
    assert generate(graphdef, state, cfg, random_tokens(0, seq=4), 4).shape == (2, 8)
    cache = init_state(cfg, batch=2, max_len=12)
    with pytest.raises(PositionOutOfRangeError, match=r"positions 6\.\.8 .*model\.max_len"):
        decode_step(graphdef, state, cache, random_tokens(0, seq=3), 6)
    step = jax.jit(decode_step, static_argnums=0)
    with pytest.raises(Exception, match="outside the learned position table"):
        jax.block_until_ready(step(graphdef, state, cache, random_tokens(0, seq=3), jnp.int32(6)))


def test_overflowing_the_cache_raises():
    cfg = tiny_cfg(pos_encoding="rope")
    graphdef, state = init_model(cfg, seed=0)
    cache = init_state(cfg, batch=2, max_len=4)
    with pytest.raises(PositionOutOfRangeError, match="KV cache"):
        decode_step(graphdef, state, cache, random_tokens(0, seq=2), 3)
