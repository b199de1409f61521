"""BERT's parts as options: the exact (erf) GELU FFN (``model.ffn=gelu_erf``) and the masked-LM
head (``model.head=bert``: ``Norm(act(x W_t + b_t)) W_head + b_out``), each against a float64
NumPy reference written from its equation, counted exactly, and refused where it is not built."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab import model as lm
from attnlab.config import ModelConfig
from attnlab.errors import ConfigError

_erf = np.vectorize(math.erf)


def gelu_erf(x):
    """Hendrycks & Gimpel 2016, eq. 1: ``x Phi(x)``."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def layer_norm(x, scale, bias, eps):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * scale + bias


def randomize(module, rng):
    """Every parameter drawn anew (biases and norms start at 0 / 1: make each one matter)."""
    for _, param in nnx.iter_graph(module):
        if isinstance(param, nnx.Param):
            param[...] = jnp.asarray(0.5 * rng.standard_normal(param.shape) + 0.3, jnp.float32)


def f64(param):
    return np.asarray(param[...], np.float64)


def tiny(**overrides) -> ModelConfig:
    base = dict(vocab_size=40, d_model=16, n_layers=1, n_heads=2, max_len=16, ffn="gelu_erf",
                linear_bias=True, pos_encoding="learned")
    cfg = ModelConfig(**{**base, **overrides})
    lm.resolve(cfg)
    return cfg


def test_the_erf_gelu_ffn_equals_its_float64_reference():
    cfg = tiny()
    ffn = lm.resolve(cfg).ffn.build(nnx.Rngs(params=0))
    rng = np.random.default_rng(0)
    randomize(ffn, rng)
    x = 2.0 * rng.standard_normal((2, 5, 16))
    y = np.asarray(ffn(jnp.asarray(x, jnp.float32)))
    hidden = gelu_erf(x @ f64(ffn.w_in.kernel) + f64(ffn.w_in.bias))
    want = hidden @ f64(ffn.w_out.kernel) + f64(ffn.w_out.bias)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    # Not the tanh form: the two differ by up to ~1e-3 per activation at these inputs.
    tanh_form = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    assert np.abs(gelu_erf(x) - tanh_form).max() > 1e-4


@pytest.mark.parametrize("objective, norm_position, tie", [("mlm", "post", True),
                                                           ("clm", "pre", False)])
def test_the_bert_head_equals_its_float64_reference(objective, norm_position, tie):
    cfg = tiny(head="bert", objective=objective, norm_position=norm_position,
               tie_embeddings=tie, norm_eps=1e-12 if objective == "mlm" else 1e-5)
    model = lm.build_model(cfg, nnx.Rngs(params=0))
    rng = np.random.default_rng(1)
    randomize(model, rng)
    x = rng.standard_normal((1, 5, 16))
    logits = np.asarray(model.logits(jnp.asarray(x, jnp.float32)))
    h = x
    if model.final_norm is not None:  # pre-LN's final norm comes before the head
        h = layer_norm(h, f64(model.final_norm.scale), f64(model.final_norm.bias), cfg.norm_eps)
    head = model.head
    h = gelu_erf(h @ f64(head.transform.kernel) + f64(head.transform.bias))
    h = layer_norm(h, f64(head.norm.scale), f64(head.norm.bias), cfg.norm_eps)
    w = f64(model.token_embedding).T if tie else f64(model.lm_head)
    np.testing.assert_allclose(logits, h @ w + f64(head.bias), rtol=1e-4, atol=1e-4)
    # Counted exactly (in N, with the norms), and the FLOPs count its transform.
    _, state = lm.init_model(cfg, seed=0)
    counts = lm.param_counts(cfg)
    assert lm.count_state_params(state) == {k: counts[k]
                                            for k in ("total", "embedding", "non_embedding")}
    plain = lm.flops_per_token(tiny(objective=objective, norm_position=norm_position,
                                    tie_embeddings=tie), 8)
    assert lm.flops_per_token(cfg, 8)["chinchilla_forward"] - plain["chinchilla_forward"] \
        == 2 * 16 * 16


def test_the_linear_head_is_the_default_and_builds_nothing():
    model = lm.build_model(tiny(), nnx.Rngs(params=0))
    assert model.head is None
    assert all(path[0] != "head" for path, _ in
                   nnx.to_flat_state(nnx.state(model, nnx.Param)))


@pytest.mark.parametrize("overrides, field, words", [
    (dict(ffn="swiglu"), "model.head", "has none"),
    (dict(moe="token_choice"), "model.head", "has none"),
    (dict(objective="span", vocab_size=300, pos_encoding="t5"), "model.head",
     "not by the encoder-decoder"),
    (dict(inputs="vectors", input_dim=3), "model.head", "vector read-in"),
    (dict(head="bert_typo"), "model.head", "unknown value"),
])
def test_the_bert_head_is_refused_where_it_is_not_built(overrides, field, words):
    with pytest.raises(ConfigError, match=words) as e:
        tiny(**{"head": "bert", **overrides})
    assert e.value.field == field


def test_the_t5_head_rescales_the_hidden_state_of_the_tied_head():
    cfg = tiny(head="t5", norm="rmsnorm", ffn="relu", linear_bias=False)
    model = lm.build_model(cfg, nnx.Rngs(params=0))
    rng = np.random.default_rng(2)
    randomize(model, rng)
    x = rng.standard_normal((1, 5, 16))
    logits = np.asarray(model.logits(jnp.asarray(x, jnp.float32)))
    h = x / np.sqrt((x**2).mean(-1, keepdims=True) + cfg.norm_eps) * f64(model.final_norm.scale)
    want = (h * 16**-0.5) @ f64(model.token_embedding).T
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)
    assert model.head is None  # no parameters
    with pytest.raises(ConfigError, match="t5 rescales the hidden state") as e:
        tiny(head="t5", tie_embeddings=False)
    assert e.value.field == "model.head"
