"""The worked examples of docs/design.md: a new sequence mixer, a new block kind and a new mask,
each one class (here, in the test), one registry line (the ``register`` fixture) and its tests.
Nothing else in attnlab changes: the config, the counts, the trainer, checkpoints and KV-cache
decoding take each part from the resolved architecture.

- ``TokenShift``: ``y_t = x_t W_now + x_{t-1} W_before`` (the token shift of RWKV, Peng et al.
  2023, as a whole mixer); decode state: the previous token's input ``[batch, d_model]``.
- ``Sandwich``: sandwich-LN (Ding et al. 2021, CogView sec. 2.4): ``x = x + Norm(Mixer(Norm(x)))``
  and the same around the FFN, so each branch's output is normalised before it is added.
- ``Strided``: the strided pattern of Child et al. 2019 (sec. 4.2) in one mask: query ``i``
  sees key ``j <= i`` when ``i - j < s`` or ``(i - j) mod s = 0``.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab import model as lm
from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
from attnlab.errors import ConfigError
from attnlab.model.blocks import BlockKind, PreNormBlock
from attnlab.model.layers import dense, dropout
from attnlab.model.mixers import SequenceMixer


def tiny(**overrides) -> ModelConfig:
    """A small model config, resolved (a bad combination raises here)."""
    base = dict(vocab_size=32, d_model=16, n_layers=2, n_heads=2, max_len=64)
    cfg = ModelConfig(**{**base, **overrides})
    lm.resolve(cfg)
    return cfg


def train_and_generate(model_cfg: ModelConfig, tmp_path) -> None:
    """Two steps through the real trainer (checkpoint, config.json), reloaded; greedy decoding
    with the decode state equals the argmax of full forward passes."""
    from attnlab.train import load_params, run

    cfg = Config(model=model_cfg, data=DataConfig(source="markov", markov_tokens=20_000,
                                                  seq_len=16, batch_size=4,
                                                  cache_dir=str(tmp_path / "data")),
                 train=TrainConfig(steps=2, warmup_steps=1, eval_every=2, eval_batches=1,
                                   log_every=1, checkpoint_every=2))
    summary = run(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed" and math.isfinite(summary["final_val_loss"])
    loaded, graphdef, state = load_params(tmp_path / "run")
    assert loaded == cfg
    out = np.asarray(lm.generate(graphdef, state, loaded.model,
                                 jnp.asarray([[1, 2, 3, 4, 5]], jnp.int32), 6))
    full = jax.jit(lambda tokens: lm.apply(graphdef, state, tokens))
    for t in range(5, 11):
        assert out[0, t] == int(jnp.argmax(full(jnp.asarray(out[:, :t]))[0, -1]))


def assert_counts_match(cfg: ModelConfig) -> None:
    _, state = lm.init_model(cfg, seed=0)
    counts = lm.param_counts(cfg)
    assert lm.count_state_params(state) == {k: counts[k]
                                            for k in ("total", "embedding", "non_embedding")}


# --------------------------------------------------------------------------------------------
# A sequence mixer
# --------------------------------------------------------------------------------------------


class TokenShiftLayer(nnx.Module):
    """``x [batch, seq, d_model] -> x_t W_now + x_{t-1} W_before`` (``x_{-1} = 0``)."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d = cfg.d_model
        self.now = dense(cfg, d, d, cfg.init_std, rngs)
        self.before = dense(cfg, d, d, cfg.init_std, rngs)

    def __call__(self, x, positions, *, bias=None, documents=None, state=None, start=0):
        previous = jnp.zeros_like(x[:, :1]) if state is None else state[:, None].astype(x.dtype)
        shifted = jnp.concatenate([previous, x[:, :-1]], axis=1)
        if documents is not None:  # a document's first token sees no earlier one
            index = jnp.asarray(start, jnp.int32) + jnp.arange(x.shape[1], dtype=jnp.int32)
            shifted = jnp.where(documents.first(index)[..., None], 0.0, shifted)
        new_state = None if state is None else x[:, -1].astype(state.dtype)
        return self.now(x) + self.before(shifted), new_state


class TokenShift(SequenceMixer):
    """Mixes each token with the one before it; no scores, so no encoding acts on it."""

    name = "token_shift"

    def validate(self):
        if self.encoding.adds_score_bias() or self.encoding.transforms_qk():
            raise ConfigError("model.pos_encoding", "token_shift forms no attention scores")

    def build(self, rngs):
        return TokenShiftLayer(self.cfg, rngs)

    def init_state(self, batch, max_len):
        return jnp.zeros((batch, self.cfg.d_model), jnp.float32)

    def param_count(self):
        return 2 * self.cfg.d_model**2

    def flops_per_token(self, seq_len):
        return {"weights": 4 * self.cfg.d_model**2, "context": self.cfg.d_model}


@pytest.fixture
def token_shift(register):
    return register(lm.MIXERS, TokenShift)  # the one registry line


def test_a_new_mixer_equals_its_float64_reference(token_shift):
    cfg = tiny(mixer=token_shift, pos_encoding="none")
    mixer = lm.resolve(cfg).stack.mixers[0]
    assert isinstance(mixer, TokenShift)
    module = mixer.build(nnx.Rngs(params=0))
    x = np.random.default_rng(0).standard_normal((2, 7, 16))
    y, state = module(jnp.asarray(x, jnp.float32), jnp.arange(7)[None])
    now, before = (np.asarray(m.kernel[...], np.float64) for m in (module.now, module.before))
    shifted = np.concatenate([np.zeros((2, 1, 16)), x[:, :-1]], axis=1)
    np.testing.assert_allclose(np.asarray(y), x @ now + shifted @ before, rtol=1e-5, atol=1e-5)
    assert state is None
    assert_counts_match(cfg)


def test_a_new_mixer_is_refused_where_its_rules_say(token_shift):
    with pytest.raises(ConfigError, match="model.pos_encoding"):
        tiny(mixer=token_shift)  # RoPE rotates q and k, which token_shift has not


def test_a_new_mixer_trains_and_decodes(token_shift, tmp_path):
    train_and_generate(tiny(mixer=token_shift, pos_encoding="none", vocab_size=256), tmp_path)


# --------------------------------------------------------------------------------------------
# A block kind
# --------------------------------------------------------------------------------------------


class SandwichBlock(PreNormBlock):
    """``x = x + Norm(Mixer(Norm(x))); x = x + Norm(FFN(Norm(x)))``."""

    def __init__(self, kind: BlockKind, *, rngs: nnx.Rngs):
        super().__init__(kind, rngs=rngs)
        self.attn_out_norm = kind.norm(kind.cfg.d_model, kind.cfg.norm_eps)
        self.ffn_out_norm = kind.norm(kind.cfg.d_model, kind.cfg.norm_eps)

    def __call__(self, x, positions, *, bias=None, documents=None, state=None, start=0,
                 dropout_key=None):
        keys = (None, None) if dropout_key is None else jax.random.split(dropout_key)
        update, state = self.attn(self.attn_norm(x), positions, bias=bias, documents=documents,
                                  state=state, start=start)
        x = x + dropout(self.attn_out_norm(update), self.dropout_rate, keys[0])
        x = x + dropout(self.ffn_out_norm(self.ffn(self.ffn_norm(x))), self.dropout_rate, keys[1])
        return x, state


class Sandwich(BlockKind):
    """Sandwich-LN: four norms per layer and a final one."""

    name = "sandwich"
    title = "sandwich-LN"

    def build(self, rngs):
        return SandwichBlock(self, rngs=rngs)

    def param_count(self):
        counts = super().param_count()
        return {**counts, "norms": 2 * counts["norms"]}


@pytest.fixture
def sandwich(register):
    return register(lm.BLOCKS, Sandwich)


def layer_norm(x, scale, bias, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def test_a_new_block_kind_equals_its_float64_reference(sandwich):
    cfg = tiny(norm_position=sandwich, pos_encoding="none", ffn="relu", n_layers=1)
    block = lm.resolve(cfg).stack.layers[0].build(nnx.Rngs(params=0))
    rng = np.random.default_rng(1)
    for _, param in nnx.iter_graph(block):  # norms start at 1 / 0: make each one matter
        if isinstance(param, nnx.Param):
            param[...] = jnp.asarray(0.5 * rng.standard_normal(param.shape) + 0.5, jnp.float32)
    x = rng.standard_normal((1, 5, 16))
    y, _ = block(jnp.asarray(x, jnp.float32), jnp.arange(5)[None])

    def norm(module, h):
        return layer_norm(h, np.float64(module.scale[...]), np.float64(module.bias[...]))

    def w(linear):
        return np.asarray(linear.kernel[...], np.float64)

    a = block.attn
    h = norm(block.attn_norm, x)[0]
    q, k, v = (h @ w(p) for p in (a.q_proj, a.k_proj, a.v_proj))
    heads = []
    for head in range(2):
        cols = slice(8 * head, 8 * head + 8)
        scores = q[:, cols] @ k[:, cols].T / math.sqrt(8) + np.triu(np.full((5, 5), -np.inf), 1)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        heads.append(weights / weights.sum(-1, keepdims=True) @ v[:, cols])
    x1 = x[0] + norm(block.attn_out_norm, np.concatenate(heads, -1) @ w(a.o_proj))
    ffn = np.maximum(norm(block.ffn_norm, x1) @ w(block.ffn.w_in), 0) @ w(block.ffn.w_out)
    np.testing.assert_allclose(np.asarray(y[0]), x1 + norm(block.ffn_out_norm, ffn),
                               rtol=1e-4, atol=1e-4)
    assert_counts_match(cfg)


def test_a_new_block_kind_trains_and_decodes(sandwich, tmp_path):
    train_and_generate(tiny(norm_position=sandwich, vocab_size=256), tmp_path)


# --------------------------------------------------------------------------------------------
# A mask
# --------------------------------------------------------------------------------------------


class Strided(lm.Mask):
    """Query ``i`` sees key ``j <= i`` when ``i - j < stride`` or ``(i - j) % stride == 0``."""

    name = "strided"
    stride = 3

    def __call__(self, q_index, k_index):
        distance = q_index[:, None] - k_index[None, :]
        return (distance >= 0) & ((distance < self.stride) | (distance % self.stride == 0))


@pytest.fixture
def strided(register):
    return register(lm.MASKS, Strided)


def strided_reference(t: int, stride: int = 3) -> np.ndarray:
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    return (j <= i) & ((i - j < stride) | ((i - j) % stride == 0))


def test_a_new_mask_equals_its_float64_reference(strided):
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 9, 2, 4)) for _ in range(3))
    got = lm.dot_product_attention(*(jnp.asarray(a, jnp.float32) for a in (q, k, v)),
                                   mask=Strided())
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / 2.0
    scores = np.where(strided_reference(9), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(got), np.einsum("bhqk,bkhd->bqhd", weights, v),
                               rtol=1e-5, atol=1e-6)


def test_a_new_mask_hides_what_it_says_in_the_model(strided):
    cfg = tiny(attention_mask=strided, n_layers=1)
    graphdef, state = lm.init_model(cfg, 0)
    tokens = np.random.default_rng(3).integers(0, 32, (1, 10))
    logits = np.asarray(lm.apply(graphdef, state, jnp.asarray(tokens)))
    changed = tokens.copy()
    changed[0, 5] = (changed[0, 5] + 1) % 32
    moved = np.abs(np.asarray(lm.apply(graphdef, state, jnp.asarray(changed))) - logits).max(-1)[0]
    visible = strided_reference(10)[:, 5]  # the queries that see key 5
    assert (moved[visible] > 1e-5).all() and (moved[~visible] == 0).all()


def test_a_new_mask_trains_and_decodes(strided, tmp_path):
    train_and_generate(tiny(attention_mask=strided, vocab_size=256), tmp_path)
