"""The parts in-context-learning studies need: attention-only blocks (``model.ffn=none``) and the
attention maps / head scores of :mod:`attnlab.model.inspect`, against float64 references and
invariants (decode = full forward; the maps reproduce the layer's output)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab import model as lm
from attnlab.config import ModelConfig
from attnlab.errors import ConfigError
from attnlab.model import inspect


def tiny(**overrides) -> ModelConfig:
    base = dict(vocab_size=32, d_model=16, n_layers=2, n_heads=2, max_len=64, ffn="none",
                init_std=0.2)
    cfg = ModelConfig(**{**base, **overrides})
    lm.resolve(cfg)
    return cfg


def layer_norm(x, scale, bias, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def _f64(p):
    return np.asarray(p[...], np.float64)


def _reference(state, cfg, tokens):
    """Attention-only pre-LN decoder with no positional encoding, in float64:
    ``x += MHA(LN(x))`` per layer, ``logits = LN_f(x) E^T``; also each layer's weights."""
    params = nnx.to_pure_dict(state)
    e = _f64(params["token_embedding"])
    x, maps = _stack_reference(params, cfg, e[np.asarray(tokens)])
    return x @ e.T, maps


def _stack_reference(params, cfg, x):
    """The layers and the final norm: ``(LN_f(x_L) [batch, t, d], each layer's weights)``."""
    t, hd = x.shape[1], cfg.head_dim
    causal = np.triu(np.full((t, t), -np.inf), 1)
    maps = []
    for layer in range(cfg.n_layers):
        p = params["blocks"][layer]
        h = layer_norm(x, _f64(p["attn_norm"]["scale"]), _f64(p["attn_norm"]["bias"]))
        q, k, v = (h @ _f64(p["attn"][n]["kernel"]) for n in ("q_proj", "k_proj", "v_proj"))
        heads, weights = [], []
        for head in range(cfg.n_heads):
            cols = slice(hd * head, hd * (head + 1))
            scores = np.einsum("bqd,bkd->bqk", q[..., cols], k[..., cols]) / math.sqrt(hd)
            a = np.exp(scores + causal - (scores + causal).max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            weights.append(a)
            heads.append(np.einsum("bqk,bkd->bqd", a, v[..., cols]))
        maps.append(np.stack(weights, axis=1))
        x = x + np.concatenate(heads, -1) @ _f64(p["attn"]["o_proj"]["kernel"])
    f = params["final_norm"]
    return layer_norm(x, _f64(f["scale"]), _f64(f["bias"])), maps


def test_attention_only_model_and_its_maps_equal_the_float64_reference():
    cfg = tiny(pos_encoding="none")
    graphdef, state = lm.init_model(cfg, seed=0)
    assert not any("ffn" in "/".join(map(str, path)) for path, _ in nnx.to_flat_state(state))
    tokens = np.random.default_rng(0).integers(0, 32, (2, 9))
    logits_ref, maps_ref = _reference(state, cfg, tokens)
    np.testing.assert_allclose(np.asarray(lm.apply(graphdef, state, jnp.asarray(tokens))),
                               logits_ref, rtol=1e-4, atol=1e-4)
    maps = inspect.attention_maps(graphdef, state, tokens)
    for got, want in zip(maps, maps_ref, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    counts = lm.param_counts(cfg)
    assert lm.count_state_params(state) == {k: counts[k]
                                            for k in ("total", "embedding", "non_embedding")}
    assert counts["ffn"] == 0


@pytest.mark.parametrize("overrides", [dict(pos_encoding="rope"),
                                       dict(pos_encoding="alibi", norm_position="post"),
                                       dict(pos_encoding="learned", scan_layers=True)])
def test_attention_only_decoding_equals_full_forward(overrides):
    cfg = tiny(**overrides)
    graphdef, state = lm.init_model(cfg, seed=1)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 32, (2, 8)), jnp.int32)
    full = np.asarray(lm.apply(graphdef, state, tokens))
    cache = lm.init_state(cfg, batch=2, max_len=8)
    pieces = []
    for i in range(8):
        logits, cache = lm.decode_step(graphdef, state, cache, tokens[:, i:i + 1], i)
        pieces.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=2e-5)


@pytest.mark.parametrize("overrides", [dict(pos_encoding="alibi"), dict(pos_encoding="t5"),
                                       dict(pos_encoding="rope", n_kv_heads=1, qk_norm=True)])
def test_maps_reproduce_each_layers_output(overrides):
    """With no FFN, a pre-LN layer's update is ``W_o concat_h(A_h V_h)``: the maps returned must
    be the very weights the layer mixed with (biases, RoPE, GQA and QK-norm included)."""
    cfg = tiny(n_layers=1, **overrides)
    graphdef, state = lm.init_model(cfg, seed=2)
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, 32, (2, 7)), jnp.int32)
    (weights,) = inspect.attention_maps(graphdef, state, tokens)
    assert weights.shape == (2, 2, 7, 7)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(weights, 1) == 0)  # causal
    model = nnx.merge(graphdef, state)
    positions = jnp.arange(7)[None]
    x = model.embed(tokens, positions)
    block = model.layers()[0]
    v = block.attn.v_proj(block.attn_norm(x)).reshape(2, 7, cfg.kv_heads, cfg.head_dim)
    v = jnp.repeat(v, cfg.n_heads // cfg.kv_heads, axis=2)
    mixed = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(2, 7, cfg.d_model)
    expected = x + block.attn.o_proj(mixed)
    out, _ = block(x, positions, bias=model.bias(0))
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), atol=1e-5)


def _block_input(graphdef, state, tokens):
    """``(model, block 0, its stream x, what its mixer reads, positions)`` of ``tokens``."""
    model = nnx.merge(graphdef, state)
    positions = jnp.arange(tokens.shape[1])[None]
    x = model.embed(tokens, positions)
    block = model.layers()[0]
    return model, block, x, block.mixer_input(x), positions


def _elu1(x):
    return np.where(x > 0, x + 1.0, np.exp(x))


@pytest.mark.parametrize("overrides", [dict(mixer="linear", pos_encoding="none"),
                                       dict(mixer="linear", pos_encoding="rope"),
                                       dict(mixer="performer", pos_encoding="none")])
def test_linear_attention_maps_reproduce_the_layers_output(overrides):
    """Katharopoulos et al. 2020, eq. 6: ``out_i = sum_j A_ij v_j`` with ``A_ij = phi(q_i).
    phi(k_j) / sum_{j' <= i} phi(q_i).phi(k_j')``; against float64 for elu+1 without RoPE."""
    cfg = tiny(n_layers=1, **overrides)
    graphdef, state = lm.init_model(cfg, seed=5)
    tokens = jnp.asarray(np.random.default_rng(5).integers(0, 32, (2, 7)), jnp.int32)
    (weights,) = inspect.attention_maps(graphdef, state, tokens)
    assert weights.shape == (2, 2, 7, 7)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(weights, 1) == 0) and weights.min() >= 0
    model, block, x, h, positions = _block_input(graphdef, state, tokens)
    v = block.attn.v_proj(h).reshape(2, 7, cfg.n_heads, cfg.head_dim)
    mixed = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(2, 7, cfg.d_model)
    out, _ = block(x, positions, bias=model.bias(0))
    np.testing.assert_allclose(np.asarray(out), np.asarray(x + block.attn.o_proj(mixed)),
                               atol=2e-5)
    if overrides == dict(mixer="linear", pos_encoding="none"):
        h64 = np.asarray(h, np.float64)
        q, k = (h64 @ _f64(getattr(block.attn, n).kernel) for n in ("q_proj", "k_proj"))
        q, k = (a.reshape(2, 7, cfg.n_heads, cfg.head_dim) for a in (q, k))
        scores = np.einsum("bqhd,bkhd->bhqk", _elu1(q), _elu1(k)) * np.tril(np.ones((7, 7)))
        np.testing.assert_allclose(weights, scores / scores.sum(-1, keepdims=True), atol=1e-5)


def _softplus(x):
    return np.log1p(np.exp(x))


def _silu(x):
    return x / (1 + np.exp(-x))


def test_mambas_hidden_attention_equals_the_float64_scan_and_reproduces_the_layer():
    """Ali et al. 2024: unrolling ``h_i = A_bar_i h_{i-1} + B_bar_i u_i``, ``y_i = C_i h_i``
    gives ``y_i = sum_{j <= i} C_i (prod_{s=j+1..i} A_bar_s) B_bar_j u_j``: the map, per
    channel, against float64 products of the discretised parameters, and the layer's output
    rebuilt from it (``(alpha u + D u) * SiLU(gate)``, then ``W_out``)."""
    cfg = tiny(n_layers=1, mixer="mamba", pos_encoding="none", ssm_state=4)
    graphdef, state = lm.init_model(cfg, seed=6)
    tokens = jnp.asarray(np.random.default_rng(6).integers(0, 32, (2, 6)), jnp.int32)
    (alpha,) = inspect.attention_maps(graphdef, state, tokens)
    e, t, n = cfg.ssm_expand * cfg.d_model, 6, cfg.ssm_state
    assert alpha.shape == (2, e, t, t) and np.all(np.triu(alpha, 1) == 0)
    assert inspect.attention_maps(graphdef, state, tokens, distributions_only=True) == [None]
    model, block, x, h, positions = _block_input(graphdef, state, tokens)
    ssm = block.attn
    p = {k: _f64(v) for k, v in nnx.to_pure_dict(nnx.state(ssm, nnx.Param)).items()
         if not isinstance(v, dict)}
    dense = {k: _f64(getattr(ssm, k).kernel) for k in ("in_proj", "x_proj", "dt_proj",
                                                        "out_proj")}
    r = -(-cfg.d_model // 16)
    ug = np.asarray(h, np.float64) @ dense["in_proj"]
    u, gate = ug[..., :e], ug[..., e:]
    taps = p["conv_kernel"].shape[0]
    padded = np.concatenate([np.zeros((2, taps - 1, e)), u], axis=1)
    u = _silu(np.stack([(padded[:, i:i + taps] * p["conv_kernel"]).sum(1) for i in range(t)], 1)
              + p["conv_bias"])
    dbc = u @ dense["x_proj"]
    delta = _softplus(dbc[..., :r] @ dense["dt_proj"] + p["dt_bias"])  # [b, t, E]
    bmat, cmat = dbc[..., r:r + n], dbc[..., r + n:]
    a_bar = np.exp(delta[..., None] * -np.exp(p["a_log"]))  # [b, t, E, N]
    want = np.zeros((2, e, t, t))
    for i in range(t):
        for j in range(i + 1):
            decay = np.prod(a_bar[:, j + 1:i + 1], axis=1)  # [b, E, N]
            b_bar = delta[:, j, :, None] * bmat[:, j, None, :]
            want[:, :, i, j] = (cmat[:, i, None, :] * decay * b_bar).sum(-1)
    np.testing.assert_allclose(alpha, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    y = np.einsum("beij,bje->bie", want, u) + p["d_skip"] * u
    rebuilt = np.asarray(x, np.float64) + (y * _silu(gate)) @ dense["out_proj"]
    out, _ = block(x, positions, bias=model.bias(0))
    np.testing.assert_allclose(np.asarray(out), rebuilt, rtol=1e-4, atol=1e-4)


def test_ngpt_maps_reproduce_its_attention():
    cfg = tiny(n_layers=1, ngpt=True, pos_encoding="rope", ffn="swiglu")
    graphdef, state = lm.init_model(cfg, seed=7)
    tokens = jnp.asarray(np.random.default_rng(7).integers(0, 32, (2, 7)), jnp.int32)
    (weights,) = inspect.attention_maps(graphdef, state, tokens)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(weights, 1) == 0)
    model, block, x, h, positions = _block_input(graphdef, state, tokens)
    v = block.attn.v_proj(h).reshape(2, 7, cfg.n_heads, cfg.head_dim)
    mixed = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(2, 7, cfg.d_model)
    update, _ = block.attn(h, positions, bias=model.bias(0))
    np.testing.assert_allclose(np.asarray(update), np.asarray(block.attn.o_proj(mixed)),
                               atol=2e-5)


def test_a_hybrids_maps_are_per_layer():
    cfg = tiny(mixer="mamba", attention_every=2, pos_encoding="none")
    graphdef, state = lm.init_model(cfg, seed=0)
    maps = inspect.attention_maps(graphdef, state, np.zeros((1, 5), np.int32))
    assert maps[0].shape == (1, cfg.ssm_expand * cfg.d_model, 5, 5)
    assert maps[1].shape == (1, 2, 5, 5)
    only = inspect.attention_maps(graphdef, state, np.zeros((1, 5), np.int32),
                                  distributions_only=True)
    assert only[0] is None and only[1].shape == (1, 2, 5, 5)
    drawn = inspect.drawable(maps[0][0])
    assert drawn.shape == (8, 5, 5) and drawn.min() >= 0 and np.allclose(drawn.max(-1), 1)


def test_vector_read_in_and_read_out_equal_the_float64_reference():
    """Garg et al. 2022's read-in ``z W_in + b_in`` and read-out ``x w_out + b_out``."""
    cfg = tiny(pos_encoding="none", inputs="vectors", input_dim=5)
    graphdef, state = lm.init_model(cfg, seed=3)
    params = nnx.to_pure_dict(state)
    rng = np.random.default_rng(3)
    for name in ("read_in", "read_out"):  # zero-initialised biases: make them matter
        params[name]["bias"] = rng.standard_normal(params[name]["bias"].shape).astype(np.float32)
    nnx.replace_by_pure_dict(state, params)
    z = rng.standard_normal((2, 9, 5))
    x0 = z @ _f64(params["read_in"]["kernel"]) + _f64(params["read_in"]["bias"])
    x, _ = _stack_reference(params, cfg, x0)
    want = (x @ _f64(params["read_out"]["kernel"]))[..., 0] + _f64(params["read_out"]["bias"])[0]
    got = np.asarray(lm.apply(graphdef, state, jnp.asarray(z, jnp.float32)))
    assert got.shape == (2, 9) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    counts = lm.param_counts(cfg)
    assert lm.count_state_params(state) == {k: counts[k]
                                            for k in ("total", "embedding", "non_embedding")}
    assert counts["embedding"] == 6 * 16 + 17


def test_vector_model_decoding_equals_full_forward():
    cfg = tiny(inputs="vectors", input_dim=4, ffn="gelu", pos_encoding="rope")
    graphdef, state = lm.init_model(cfg, seed=4)
    z = jnp.asarray(np.random.default_rng(4).standard_normal((2, 6, 4)), jnp.float32)
    full = np.asarray(lm.apply(graphdef, state, z))
    cache = lm.init_state(cfg, batch=2, max_len=6)
    first, cache = lm.decode_step(graphdef, state, cache, z[:, :2], 0)
    pieces = [np.asarray(first)]
    for i in range(2, 6):
        out, cache = lm.decode_step(graphdef, state, cache, z[:, i:i + 1], i)
        pieces.append(np.asarray(out))
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=2e-5)


@pytest.mark.parametrize("fields, field", [
    (dict(inputs="vectors"), "model.input_dim"),
    (dict(input_dim=3), "model.input_dim"),
    (dict(inputs="vectors", input_dim=3, objective="mlm"), "model.inputs"),
    (dict(inputs="pixels"), "model.inputs"),
])
def test_vector_settings_are_refused_naming_the_field(fields, field):
    with pytest.raises(ConfigError, match=f"^config.{field}"):
        lm.resolve(ModelConfig(**fields))


def test_ffn_none_is_refused_for_the_encoder_decoder():
    with pytest.raises(ConfigError, match="model.ffn"):
        lm.resolve(ModelConfig(ffn="none", objective="span", vocab_size=300))


def test_head_scores_of_known_patterns():
    t = 10
    previous = np.eye(t, k=-1)
    previous[0, 0] = 1.0
    uniform = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]

    def induction(period):
        a = np.eye(t)
        for i in range(period, t):
            a[i] = 0.0
            a[i, i - period + 1] = 1.0
        return a

    # Two windows with periods 4 and 6; heads: previous-token, induction, uniform.
    weights = np.stack([np.stack([previous, induction(p), uniform]) for p in (4, 6)])
    prev_scores = inspect.previous_token_scores(weights)
    ind_scores = inspect.induction_scores(weights, np.array([4, 6]))
    np.testing.assert_allclose(prev_scores[:2], [1.0, 0.0])
    np.testing.assert_allclose(ind_scores[:2], [0.0, 1.0])
    queries = np.concatenate([np.arange(4, t), np.arange(6, t)])
    np.testing.assert_allclose(ind_scores[2], np.mean(1 / (queries + 1)))
    # The wrong period finds nothing (a positional head of fixed offset would score 0 too).
    assert inspect.induction_scores(weights[1:], 5)[1] == 0.0
    scores = inspect.head_scores([None, weights], np.array([4, 6]))
    assert scores["induction"][0] is None
    assert scores["best_induction_head"] == [1, 1, pytest.approx(1.0)]


def test_regression_evaluation_scores_every_k_on_shared_prompts():
    """A model with a zero read-out predicts 0: its error at every k is E y^2 / d = |w|^2 / d
    on the same prompts, which is the k = 0 error of every baseline."""
    from attnlab.data import icl_regression
    from attnlab.icl import regression

    task = icl_regression.RegressionTask(dim=4, examples=6)
    cfg = tiny(inputs="vectors", input_dim=4, n_layers=1)
    graphdef, state = lm.init_model(cfg, seed=0)
    params = nnx.to_pure_dict(state)
    params["read_out"]["kernel"] = np.zeros_like(params["read_out"]["kernel"])
    nnx.replace_by_pure_dict(state, params)
    result = regression.evaluate(graphdef, state, task, rows=40, batch_size=16)
    xs, ys = task.batch(0, "test", 0, 40)
    np.testing.assert_allclose(result["error"], (ys**2).mean(axis=0) / 4, rtol=1e-6)
    assert result["k"] == list(range(6))
    for curve in result["baselines"].values():
        assert curve[0] == pytest.approx(result["error"][0])


def test_a_vector_models_maps_equal_the_float64_reference():
    """The maps of a linear read-in model (in-context regression) on float prompts."""
    cfg = tiny(pos_encoding="none", inputs="vectors", objective="regression", input_dim=3)
    graphdef, state = lm.init_model(cfg, seed=0)
    prompt = np.random.default_rng(1).normal(size=(2, 8, 3)).astype(np.float32)
    params = nnx.to_pure_dict(state)
    x = prompt.astype(np.float64) @ _f64(params["read_in"]["kernel"]) + _f64(
        params["read_in"]["bias"])
    _, maps_ref = _stack_reference(params, cfg, x)
    maps = inspect.attention_maps(graphdef, state, prompt)
    for got, want in zip(maps, maps_ref, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
