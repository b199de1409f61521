"""model.linear_bias (issue #19): one block against a float64 NumPy reference, parameter counts
against the real state, and training through the CLI; the norms' custom VJPs against float64
autodiff of the textbook formulas."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab import cli
from attnlab.config import ModelConfig
from attnlab.model import NORMS, count_state_params, init_model, layers, param_counts, resolve

TINY = dict(vocab_size=32, d_model=16, n_layers=2, n_heads=4, max_len=8, linear_bias=True)


def numpy_block(p, x, heads, eps):
    """Pre-LN GPT-2 block in float64: ``x + W_o MHA(LN(x)) + b_o``, then ``x + FFN(LN(x))``
    (Vaswani et al. 2017 eq. 1-2; tanh GELU, Radford et al. 2019), every projection ``x W + b``."""
    def layer_norm(x, g, b):
        mean = x.mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(x.var(-1, keepdims=True) + eps) * g + b

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    batch, t, d = x.shape
    hd = d // heads
    h = layer_norm(x, *p["attn_norm"])
    q, k, v = ((h @ p[n][0] + p[n][1]).reshape(batch, t, heads, hd) for n in ("q", "k", "v"))
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    attn = np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, t, d)
    x = x + attn @ p["o"][0] + p["o"][1]
    h = layer_norm(x, *p["ffn_norm"])
    return x + gelu(h @ p["w_in"][0] + p["w_in"][1]) @ p["w_out"][0] + p["w_out"][1]


def test_a_biased_block_matches_a_float64_reference():
    cfg = ModelConfig(**TINY, pos_encoding="learned")
    block = resolve(cfg).stack.layers[0].build(nnx.Rngs(0))
    # Biases start at zero: give every parameter random values so that each one matters.
    rng = np.random.default_rng(1)
    for _, param in nnx.iter_graph(block):
        if isinstance(param, nnx.Param):
            param[...] = jnp.asarray(0.3 * rng.standard_normal(param.shape), jnp.float32)
    x = rng.standard_normal((2, 8, cfg.d_model)).astype(np.float32)
    y, _ = block(jnp.asarray(x), jnp.arange(8)[None])

    def pair(linear):
        return np.float64(linear.kernel[...]), np.float64(linear.bias[...])

    p = {"q": pair(block.attn.q_proj), "k": pair(block.attn.k_proj),
         "v": pair(block.attn.v_proj), "o": pair(block.attn.o_proj),
         "w_in": pair(block.ffn.w_in), "w_out": pair(block.ffn.w_out),
         "attn_norm": (np.float64(block.attn_norm.scale[...]),
                       np.float64(block.attn_norm.bias[...])),
         "ffn_norm": (np.float64(block.ffn_norm.scale[...]),
                      np.float64(block.ffn_norm.bias[...]))}
    expected = numpy_block(p, np.float64(x), cfg.n_heads, cfg.norm_eps)
    np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-4, atol=1e-4)


def test_biases_start_at_zero_and_leave_the_initial_function_unchanged():
    plain, biased = ModelConfig(**{**TINY, "linear_bias": False}), ModelConfig(**TINY)
    gd_plain, state_plain = init_model(plain, seed=0)
    gd_biased, state_biased = init_model(biased, seed=0)
    biases = [v for path, v in nnx.to_flat_state(state_biased) if path[-1] == "bias"
              and "norm" not in "".join(map(str, path))]
    assert biases and all(not np.asarray(b[...]).any() for b in biases)
    tokens = jnp.arange(16).reshape(2, 8) % 32
    np.testing.assert_allclose(nnx.merge(gd_biased, state_biased)(tokens),
                               nnx.merge(gd_plain, state_plain)(tokens), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("overrides", [
    dict(),  # softmax MHA, GELU
    dict(n_kv_heads=2),  # GQA
    dict(n_kv_heads=1, ffn="swiglu"),
    dict(ffn="relu", norm="rmsnorm", norm_position="post", tie_embeddings=False),
    dict(mixer="linear"),  # its own projections stay bias-free; the FFN has biases
    dict(mixer="mamba", attention_every=2, pos_encoding="none"),  # hybrid
    dict(objective="span", n_kv_heads=2),  # encoder-decoder: self- and cross-attention
], ids=["mha", "gqa", "mqa_swiglu", "relu_rms_post", "linear", "hybrid", "span"])
def test_counts_with_biases_equal_the_real_state(overrides):
    cfg = ModelConfig(**{**TINY, **overrides})
    _, state = init_model(cfg, seed=0)
    counts = param_counts(cfg)
    assert count_state_params(state) == {k: counts[k] for k in
                                         ("total", "embedding", "non_embedding")}
    without = param_counts(ModelConfig(**{**TINY, **overrides, "linear_bias": False}))
    assert counts["non_embedding"] > without["non_embedding"]


def test_hand_worked_bias_count():
    d, ff = 16, 64
    counts = param_counts(ModelConfig(**TINY))
    plain = param_counts(ModelConfig(**{**TINY, "linear_bias": False}))
    assert counts["attention"] - plain["attention"] == 4 * d  # b_q, b_k, b_v, b_o
    assert counts["ffn"] - plain["ffn"] == ff + d  # b_in, b_out


def test_linear_bias_trains_through_the_cli(tmp_path):
    workdir = tmp_path / "bias"
    argv = ["train", "--config=configs/tiny.py", f"--run={workdir}",
            "--config.model.linear_bias=True", "--config.train.steps=3",
            "--config.train.eval_every=3", "--config.train.checkpoint_every=3",
            "--config.train.log_every=1"]
    assert cli.main(argv) == 0
    assert json.loads((workdir / "summary.json").read_text())["status"] == "completed"
    assert json.loads((workdir / "config.json").read_text())["model"]["linear_bias"] is True


def textbook_layer_norm(x, scale, bias, eps):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(jnp.square(x - mean).mean(-1, keepdims=True) + eps) * scale + bias


def textbook_rms_norm(x, scale, eps):
    return x / jnp.sqrt(jnp.square(x).mean(-1, keepdims=True) + eps) * scale


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_norm_custom_vjp_matches_float64_autodiff(norm):
    """The norms' hand-written backward (layers.standardize / rms_normalize) against autodiff of
    the textbook formula in float64, for the input, scale and bias gradients."""
    rng = np.random.default_rng(0)
    dim, eps = 24, 1e-5
    x = 3.0 + 2.0 * rng.standard_normal((3, 5, dim))  # a mean off zero, as a residual stream
    scale = 1.0 + 0.5 * rng.standard_normal(dim)
    bias = 0.5 * rng.standard_normal(dim)
    cotangent = rng.standard_normal((3, 5, dim))
    module = NORMS[norm](dim, eps)
    module.scale[...] = jnp.asarray(scale, jnp.float32)
    params = (scale,)
    if norm == "layernorm":
        module.bias[...] = jnp.asarray(bias, jnp.float32)
        params = (scale, bias)
    graphdef, state = nnx.split(module)

    textbook = textbook_layer_norm if norm == "layernorm" else textbook_rms_norm
    with jax.enable_x64(True):
        args64 = [jnp.asarray(a, jnp.float64) for a in (x, *params)]
        y64, vjp64 = jax.vjp(lambda *a: textbook(*a, eps), *args64)
        grads64 = vjp64(jnp.asarray(cotangent, jnp.float64))
    y32, vjp32 = jax.vjp(lambda x, st: nnx.merge(graphdef, st)(x),
                         jnp.asarray(x, jnp.float32), state)
    dx, dstate = vjp32(jnp.asarray(cotangent, jnp.float32))
    grads32 = (dx, dstate["scale"][...]) + ((dstate["bias"][...],) if norm == "layernorm" else ())
    np.testing.assert_allclose(np.asarray(y32), np.asarray(y64), rtol=1e-5, atol=1e-5)
    for got, want in zip(grads32, grads64):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_norm_custom_vjp_in_float64_is_exact_and_works_under_jit_and_vmap(norm):
    fn = layers.standardize if norm == "layernorm" else layers.rms_normalize
    textbook = ((lambda x: textbook_layer_norm(x, 1.0, 0.0, 1e-6)) if norm == "layernorm"
                else (lambda x: textbook_rms_norm(x, 1.0, 1e-6)))
    with jax.enable_x64(True):
        x = jnp.asarray(np.random.default_rng(2).standard_normal((4, 16)), jnp.float64)
        weights = jnp.asarray(np.random.default_rng(3).standard_normal((4, 16)), jnp.float64)
        got = jax.jit(jax.vmap(jax.grad(lambda r, w: (fn(r, 1e-6) * w).sum())))(x, weights)
        want = jax.vmap(jax.grad(lambda r, w: (textbook(r) * w).sum()))(x, weights)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("d_in, d_out", [(6, 24), (24, 6), (8, 8)])
def test_projection_backward_matches_float64_numpy(d_in, d_out):
    """layers.project's hand-ordered backward (the narrower operand transposed) against the
    matrix calculus in float64 NumPy: dx = g W^T, dW = sum over tokens of x^T g; both orders
    of the weight-gradient matmul are exercised (d_in < d_out, d_in > d_out)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 5, d_in))
    kernel = rng.standard_normal((d_in, d_out))
    g = rng.standard_normal((3, 5, d_out))
    y, vjp = jax.vjp(layers.project, jnp.asarray(x, jnp.float32), jnp.asarray(kernel, jnp.float32))
    dx, dkernel = vjp(jnp.asarray(g, jnp.float32))
    np.testing.assert_allclose(np.asarray(y), x @ kernel, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dx), g @ kernel.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dkernel),
                               x.reshape(-1, d_in).T @ g.reshape(-1, d_out), rtol=1e-5, atol=1e-4)
    assert dkernel.shape == (d_in, d_out)


def test_projection_keeps_dtypes_like_autodiff():
    """bfloat16 operands with a float32 result (the output head): the cotangents come back in
    the operands' dtypes and agree with autodiff of the plain dot."""
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((2, 4, 8)), jnp.bfloat16)
    kernel = jnp.asarray(rng.standard_normal((8, 12)), jnp.bfloat16)
    plain = lambda x, k: jnp.einsum("btd,dv->btv", x, k,  # noqa: E731
                                    preferred_element_type=jnp.float32)
    y, vjp = jax.vjp(lambda x, k: layers.project(x, k, jnp.float32), x, kernel)
    y_ref, vjp_ref = jax.vjp(plain, x, kernel)
    assert y.dtype == jnp.float32
    g = jnp.asarray(rng.standard_normal(y.shape), jnp.float32)
    for got, want, operand in zip(vjp(g), vjp_ref(g), (x, kernel)):
        assert got.dtype == operand.dtype
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                                   rtol=2e-2, atol=2e-2)


def test_linear_layers_use_the_hand_ordered_projection():
    """dense() wires layers.project in as nnx.Linear's dot_general, and the model's gradient
    equals autodiff's through the plain dot (same products up to rounding)."""
    cfg = ModelConfig(**{**TINY, "linear_bias": False})
    graphdef, state = init_model(cfg, 0)
    tokens = jnp.asarray(np.random.default_rng(6).integers(0, 32, (2, 8)), jnp.int32)

    def loss(state):
        logits = nnx.merge(graphdef, state)(tokens)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    got = jax.grad(loss)(state)
    with pytest.MonkeyPatch.context() as patch:  # the same model through jax.lax.dot_general
        patch.setattr(layers, "project",
                      lambda x, k, t=None: jax.lax.dot_general(
                          x, k, (((x.ndim - 1,), (0,)), ((), ())), preferred_element_type=t))
        patch.setattr("attnlab.model.transformer.project", layers.project)
        want = jax.grad(loss)(state)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    block = nnx.merge(graphdef, state).blocks[0]
    assert block.ffn.w_in.dot_general is layers._projection_dot_general


def test_projection_dot_general_leaves_other_contractions_to_jax():
    """nnx.Linear's dot_general hook hands anything but a plain ``x W`` (another contraction,
    an explicit precision) to jax.lax.dot_general unchanged."""
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.standard_normal((3, 4, 5)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((4, 6)), jnp.float32)
    dims = (((1,), (0,)), ((), ()))  # contracts x's middle axis: not project's contraction
    np.testing.assert_allclose(np.asarray(layers._projection_dot_general(x, w, dims)),
                               np.einsum("adb,de->abe", np.asarray(x), np.asarray(w)),
                               rtol=1e-5, atol=1e-5)
    square = jnp.asarray(rng.standard_normal((5, 5)), jnp.float32)
    plain = (((2,), (0,)), ((), ()))
    got = layers._projection_dot_general(x, square, plain, precision=jax.lax.Precision.HIGHEST)
    np.testing.assert_allclose(np.asarray(got), np.asarray(x) @ np.asarray(square),
                               rtol=1e-5, atol=1e-5)
