"""The positional-encoding interface and registry: what each encoding answers, config validation
through the registry, rescaling for longer contexts, and a toy encoding added by one class and
one registry entry that trains, decodes with the KV cache and generates."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab import model as lm
from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
from attnlab.errors import ConfigError
from attnlab.model import positions as pe


def tiny(**overrides) -> ModelConfig:
    """A small model config, resolved (a bad combination raises here)."""
    base = dict(vocab_size=32, d_model=16, n_layers=2, n_heads=2, max_len=24)
    cfg = ModelConfig(**{**base, **overrides})
    lm.resolve(cfg)
    return cfg


def encoding_of(cfg: ModelConfig) -> pe.PositionalEncoding:
    return lm.resolve(cfg).encoding


def random_heads(seed, shape=(2, 5, 2, 8)):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def test_the_registry_is_what_the_config_accepts():
    assert list(lm.ENCODINGS) == ["none", "sinusoidal", "learned", "rope", "alibi", "t5"]
    for name, cls in lm.ENCODINGS.items():
        assert cls.name == name
        assert type(encoding_of(tiny(pos_encoding=name))) is cls
    with pytest.raises(ConfigError, match="valid values are none, sinusoidal, learned, rope, alib"):
        tiny(pos_encoding="xpos")


@pytest.mark.parametrize("name", list(lm.ENCODINGS))
def test_what_each_encoding_answers(name):
    cfg = tiny(pos_encoding=name)
    encoding = encoding_of(cfg)
    positions = jnp.arange(5)[None] + 3
    q, k = random_heads(0), random_heads(1)
    x = random_heads(2, (2, 5, 16))
    limits = {"learned": 24}
    assert encoding.max_positions() == limits.get(name)
    table = lm.build_model(cfg, nnx.Rngs(params=0)).position_embedding
    assert (table is None) == (name not in ("learned", "t5"))
    assert encoding.param_count() == (0 if table is None else table[...].size) == (
        lm.param_counts(cfg)["position_embedding"])
    assert encoding.flops_per_token(64) == 0.0

    embedded = np.asarray(encoding.embed(x, positions, table), np.float64)
    x64, p64 = np.asarray(x, np.float64), np.arange(3, 8)
    if name == "learned":
        expected = x64 + np.asarray(table[...], np.float64)[p64]
    elif name == "sinusoidal":  # Vaswani et al. 3.4-3.5: E sqrt(d) + PE, sin/cos interleaved
        i = np.arange(8)
        angles = p64[:, None] / 10000.0 ** (2 * i / 16)
        table64 = np.stack([np.sin(angles), np.cos(angles)], -1).reshape(5, 16)
        expected = x64 * 4.0 + table64
    else:
        expected = x64
    np.testing.assert_allclose(embedded, expected, rtol=1e-6, atol=1e-6)

    q2, k2 = encoding.transform_qk(q, k, positions)
    if name == "rope":
        np.testing.assert_allclose(q2, lm.apply_rope(q, positions), rtol=0, atol=0)
        np.testing.assert_allclose(k2, lm.apply_rope(k, positions), rtol=0, atol=0)
    else:
        assert q2 is q and k2 is k

    layer_bias = encoding.layer_bias(table, 0)
    bias = None if layer_bias is None else layer_bias(positions, jnp.arange(8)[None])
    if name == "alibi":  # -m_h |i - j|
        distance = np.abs(p64[:, None] - np.arange(8)[None, :])
        expected = -lm.alibi_slopes(2)[:, None, None] * distance
        np.testing.assert_allclose(np.asarray(bias)[0], expected, rtol=1e-6)
    elif name == "t5":  # b[h, bucket(i - j)]: 16 exact buckets cover these distances
        distance = np.maximum(p64[:, None] - np.arange(8)[None, :], 0)
        expected = np.asarray(table[...])[distance].transpose(2, 0, 1)
        np.testing.assert_allclose(np.asarray(bias)[0], expected, rtol=0)
    else:
        assert bias is None


def test_range_checks_are_asked_of_the_encoding():
    encoding_of(tiny(pos_encoding="learned")).check_range(np.array([0, 23]))
    with pytest.raises(lm.PositionOutOfRangeError, match="learned position table"):
        encoding_of(tiny(pos_encoding="learned")).check_range(np.array([0, 24]))
    encoding_of(tiny(pos_encoding="rope")).check_range(np.array([0, 10**6]))
    learned = encoding_of(tiny(pos_encoding="learned"))
    assert learned.unrepresentable(24) is None
    assert "model.max_len=24" in learned.unrepresentable(25)
    assert encoding_of(tiny(pos_encoding="alibi")).unrepresentable(10**6) is None


def test_encodings_validate_their_own_constraints():
    with pytest.raises(ConfigError, match="even head_dim") as info:
        tiny(pos_encoding="rope", d_model=18, n_heads=2)  # head_dim 9
    assert info.value.field == "model.pos_encoding"
    with pytest.raises(ConfigError, match="even d_model") as info:
        tiny(pos_encoding="sinusoidal", d_model=9, n_heads=1)
    assert info.value.field == "model.d_model"
    tiny(pos_encoding="alibi", d_model=18, n_heads=2)  # odd head_dim is fine without RoPE
    with pytest.raises(ConfigError, match="even head_dim"):  # resolving the replaced config
        lm.resolve(dataclasses.replace(tiny(pos_encoding="alibi", d_model=18, n_heads=2),
                                       pos_encoding="rope"))


def test_rescaling_is_asked_of_the_encoding():
    for name in lm.ENCODINGS:
        cfg = tiny(pos_encoding=name)
        assert lm.rescaled(cfg, pe.UNSCALED, 4.0) is cfg
    rope = tiny(pos_encoding="rope", rope_theta=500.0)
    scaled = lm.rescaled(rope, "ntk", 4.0)
    assert scaled == dataclasses.replace(rope, rope_theta=scaled.rope_theta)
    assert scaled.rope_theta == pytest.approx(500.0 * 4.0 ** (8 / 6), rel=1e-12)
    with pytest.raises(pe.RescalingError, match="ntk applies to RoPE models; this run uses "
                                                "pos_encoding=alibi"):
        lm.rescaled(tiny(pos_encoding="alibi"), "ntk", 4.0)
    with pytest.raises(pe.RescalingError, match="longrope applies to no encoding"):
        lm.rescaled(rope, "longrope", 4.0)


# --------------------------------------------------------------------------------------------
# The worked example of docs/design.md: a new encoding is one class plus one registry entry.
# --------------------------------------------------------------------------------------------


class LogDistance(pe.PositionalEncoding):
    """KERPLE-log with fixed parameters (Chi et al. 2022): adds ``-log(1 + |i - j|)`` to every
    head's scores; float32 ``[pbatch, heads, q_len, k_len]``."""

    name = "log_distance"

    def bias(self, q_positions, k_positions):
        distance = jnp.abs(jnp.asarray(q_positions, jnp.float32)[:, :, None]
                           - jnp.asarray(k_positions, jnp.float32)[:, None, :])
        return jnp.broadcast_to(-jnp.log1p(distance)[:, None],
                                (distance.shape[0], self.cfg.n_heads, *distance.shape[1:]))


@pytest.fixture
def log_distance(register):
    return register(lm.ENCODINGS, LogDistance)  # the one registry line


def test_an_unregistered_encoding_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown value 'log_distance'"):
        tiny(pos_encoding="log_distance")


def test_a_new_encoding_reaches_the_scores(log_distance):
    cfg = tiny(pos_encoding=log_distance)
    graphdef, state = lm.init_model(cfg, 0)
    nope_graphdef, nope_state = lm.init_model(dataclasses.replace(cfg, pos_encoding="none"), 0)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, 12)), jnp.int32)
    logits = np.asarray(lm.apply(graphdef, state, tokens), np.float64)
    nope = np.asarray(lm.apply(nope_graphdef, nope_state, tokens), np.float64)
    np.testing.assert_array_equal(logits[:, 0], nope[:, 0])  # one key: the bias cancels
    assert np.abs(logits[:, 1:] - nope[:, 1:]).max() > 1e-4
    # Same parameters as NoPE (the bias has none); the first layer's attention equals a float64
    # softmax(q.k / sqrt(d) - log(1 + |i - j|)) V W_o.
    assert lm.count_state_params(state) == lm.count_state_params(nope_state)
    model = nnx.merge(graphdef, state)
    positions = jnp.arange(12)[None]
    h = model.blocks[0].attn_norm(model.embed(tokens, positions))
    attn = model.blocks[0].attn
    q, k, v = (np.asarray(proj(h), np.float64).reshape(2, 12, 2, 8)
               for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    i = np.arange(12)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(8) - np.log1p(np.abs(i[:, None] - i))
    scores = np.where(i[None, :] <= i[:, None], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    heads = np.einsum("bhqk,bkhd->bqhd", weights, v).reshape(2, 12, 16)
    expected = heads @ np.asarray(attn.o_proj.kernel[...], np.float64)
    out, state = attn(h, positions, bias=model.bias(0))
    assert state is None
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-6)


def test_a_new_encoding_trains_and_generates_with_the_kv_cache(log_distance, tmp_path):
    from attnlab.train import load_params, run

    cfg = Config(
        model=tiny(pos_encoding=log_distance, vocab_size=256),
        data=DataConfig(source="markov", markov_tokens=20_000, seq_len=16, batch_size=4,
                        cache_dir=str(tmp_path / "data")),
        train=TrainConfig(steps=2, warmup_steps=1, eval_every=2, eval_batches=1, log_every=1,
                          checkpoint_every=2),
        name="log_distance",
    )
    summary = run(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed"
    loaded, graphdef, state = load_params(tmp_path / "run")
    assert loaded == cfg
    prompt = jnp.asarray([[1, 2, 3, 4, 5]], jnp.int32)
    out = np.asarray(lm.generate(graphdef, state, loaded.model, prompt, 6))
    # Greedy decoding with the cache equals the argmax of full forward passes.
    full = jax.jit(lambda tokens: lm.apply(graphdef, state, tokens))
    for t in range(5, 11):
        assert out[0, t] == int(jnp.argmax(full(jnp.asarray(out[:, :t]))[0, -1]))
