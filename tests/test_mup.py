"""muP (``model.parameterization=mup``) against float64 NumPy references written from Tensor
Programs V (Yang et al. 2022, Table 3 / Table 8), and its invariants: at the base width it is the
standard model to the last bit (at init and after Adam steps); the score scale, the logits'
multiplier, the init stds and Adam's per-parameter learning rates follow the table at other
widths; every part without a muP rule is refused naming the field."""

import dataclasses
import math

import jax
import numpy as np
import optax
import pytest

from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
from attnlab.errors import ConfigError
from attnlab.identity import identity
from attnlab.model import apply, init_model, param_shapes, resolve
from attnlab.model.parameterization import path_name
from attnlab.train.optimizer import optimizer_for

SMALL = dict(vocab_size=256, n_layers=2, n_heads=2, max_len=64)


def mup(d_model, base, **kw):
    return ModelConfig(**{**SMALL, **kw}, d_model=d_model, parameterization="mup",
                       mup_base_d_model=base, attention_scale="mup")


def sp(d_model, **kw):
    return ModelConfig(**{**SMALL, **kw}, d_model=d_model)


def flat(params) -> dict[str, np.ndarray]:
    return {path_name(p): np.asarray(x, np.float64)
            for p, x in jax.tree_util.tree_leaves_with_path(params)}


def hidden_fan_in(name: str, cfg: ModelConfig, d_ff: int) -> int | None:
    """The fan-in of a hidden weight (Table 3's "hidden weights": both dimensions grow with
    width), None for the input/output weights, norms and biases, from the model's layout."""
    if name.endswith("kernel"):
        return d_ff if "w_out" in name else cfg.d_model  # o_proj: n_heads * hd = d_model
    return None


def reference_std(name: str, cfg: ModelConfig, base: int, d_ff: int, base_d_ff: int) -> float:
    """Table 3 with the SP stds of the base model as constants: hidden weights
    ``sigma_0 sqrt(base_fan_in / fan_in)``, input and output weights ``sigma_0``."""
    sigma = cfg.init_std
    if "o_proj" in name or "w_out" in name:  # GPT-2's residual projections
        sigma = sigma / math.sqrt(2 * cfg.n_layers)
    fan_in = hidden_fan_in(name, cfg, d_ff)
    if fan_in is None:
        return sigma
    base_fan_in = base_d_ff if "w_out" in name else base
    return sigma * math.sqrt(base_fan_in / fan_in)


@pytest.mark.parametrize("width, base", [(96, 32), (64, 64)])
def test_init_stds_follow_table_3(width, base):
    """Every matrix: its muP draw is the SP draw (same seed) times Table 3's factor exactly, and
    its sample std matches ``reference_std`` within sampling error."""
    cfg, ref = mup(width, base, tie_embeddings=False), sp(width, tie_embeddings=False)
    _, got = init_model(cfg, 3)
    _, standard = init_model(ref, 3)
    got, standard = flat(got), flat(standard)
    assert got.keys() == standard.keys()
    d_ff, base_d_ff = 4 * width, 4 * base
    for name, value in got.items():
        std = reference_std(name, cfg, base, d_ff, base_d_ff)
        sp_std = reference_std(name, cfg, width, d_ff, d_ff)  # width == base: SP
        if value.ndim < 2:  # norms and biases: as SP
            np.testing.assert_array_equal(value, standard[name])
            continue
        np.testing.assert_allclose(value, standard[name] * (std / sp_std), rtol=1e-6, atol=0)
        assert abs(value.std() / std - 1) < 6 / math.sqrt(value.size), name


def reference_lr_multipliers(cfg: ModelConfig, base: int) -> dict[str, float]:
    """Table 3's Adam learning rates relative to the base model's: ``base_fan_in / fan_in``
    for the hidden weights (q, k, v, o, FFN), 1 for embeddings, the head, norms, biases."""
    d, d_ff = cfg.d_model, resolve(cfg).ffn.width
    base_d_ff = (cfg.d_ff * base // d if cfg.d_ff is not None
                 else resolve(dataclasses.replace(cfg, d_model=base)).ffn.width)
    out = {}
    for name in flat(init_model(cfg, 0)[1]):
        is_matrix = name.endswith("kernel")
        if not is_matrix:
            out[name] = 1.0
        elif "w_out" in name:
            out[name] = base_d_ff / d_ff
        else:
            out[name] = base / d
    return out


@pytest.mark.parametrize("kw", [dict(), dict(tie_embeddings=False, linear_bias=True),
                                dict(n_kv_heads=1, ffn="swiglu", d_ff=192),
                                dict(scan_layers=True)])
def test_lr_multipliers_follow_table_3(kw):
    cfg = mup(96, 32, **kw)
    _, params = init_model(cfg, 0)
    got = {path_name(p): m for p, m in jax.tree_util.tree_leaves_with_path(
        resolve(cfg).parameterization.lr_multipliers(params, param_shapes))}
    want = reference_lr_multipliers(cfg, 32)
    assert got.keys() == want.keys()
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-12), name


def adamw_reference(params, grads, mults, decayed, lr, b1, b2, eps, wd):
    """One AdamW step in float64 from its equations (Loshchilov & Hutter 2019, Alg. 2; optax's
    bias correction), muP's factor ``m`` on the Adam direction only (``MuAdamW``: lr / m with
    wd * m keeps the decay ``lr wd W``):  W - lr (m u / (sqrt(v) + eps) + wd W)."""
    out = {}
    for name, w in params.items():
        g = grads[name]
        m_hat = (1 - b1) * g / (1 - b1)
        v_hat = (1 - b2) * g * g / (1 - b2)
        direction = mults[name] * m_hat / (np.sqrt(v_hat) + eps)
        out[name] = w - lr * (direction + (wd * w if decayed(name, w) else 0.0))
    return out


def test_one_adam_step_matches_the_float64_reference():
    cfg = Config(model=mup(96, 32), train=TrainConfig(
        learning_rate=1e-2, schedule="constant", warmup_steps=0, grad_clip=0.0,
        weight_decay=0.1, steps=1))
    _, params = init_model(cfg.model, 0)
    grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(p.size), p.shape), params)
    # (one update, eagerly: no compilation of a whole train step)
    optimizer, _ = optimizer_for(cfg)
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    got = flat(optax.apply_updates(params, updates))
    mults = reference_lr_multipliers(cfg.model, 32)
    decayed = lambda name, w: w.ndim >= 2 and "embed" not in name  # noqa: E731
    want = adamw_reference(flat(params), flat(grads), mults, decayed, 1e-2, cfg.train.b1,
                           cfg.train.b2, cfg.train.eps, 0.1)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_score_scale_and_logit_multiplier():
    """``sqrt(d_0) / d_k`` on the scores (1/d_k anchored at the base head width ``d_0``) and
    ``d_base / d`` on the logits."""
    arch = resolve(mup(128, 32))  # n_heads 2: d_k 64, d_0 16
    assert arch.score_scale.scale() == pytest.approx(math.sqrt(16) / 64, rel=1e-15)
    assert arch.parameterization.logit_multiplier() == pytest.approx(32 / 128, rel=1e-15)
    assert resolve(mup(32, 32)).score_scale.scale() == 1 / math.sqrt(16)  # bitwise the SP scale
    assert resolve(sp(128, attention_scale="mup")).score_scale.scale() == 1 / 64  # as before


def test_logits_are_the_standard_logits_times_the_multiplier():
    """At width 128 (base 32) with the same weights, muP's logits are SP's with the anchored
    score scale, times 1/4: the forward adds exactly the multiplier."""
    cfg = mup(128, 32)
    graphdef, params = init_model(cfg, 0)
    ref_cfg = dataclasses.replace(cfg, parameterization="sp", mup_base_d_model=0,
                                  attention_scale="rsqrt")
    ref_graphdef, _ = init_model(ref_cfg, 0)
    tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 256)
    got = np.asarray(jax.jit(lambda p: apply(graphdef, p, tokens))(params), np.float64)
    # SP's model reading muP's weights with its score scale changed to muP's: q scaled by
    # (sqrt(d_0)/d_k) / (1/sqrt(d_k)) = sqrt(16/64) = 1/2 folds the score scale into W_q.
    folded = jax.tree_util.tree_map_with_path(
        lambda p, x: x * 0.5 if "q_proj" in path_name(p) else x, params)
    want = np.asarray(jax.jit(lambda p: apply(ref_graphdef, p, tokens))(folded),
                      np.float64) * (32 / 128)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


def _train(cfg: Config, steps: int):
    graphdef, params = init_model(cfg.model, cfg.train.seed)
    optimizer, _ = optimizer_for(cfg)
    from attnlab.train.step import mean_loss

    batch = jax.random.randint(jax.random.key(7), (4, 17), 0, 256)

    @jax.jit
    def step(params, opt_state):
        grads = jax.grad(lambda p: mean_loss(graphdef, p, batch))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    opt_state = optimizer.init(params)
    for _ in range(steps):
        params, opt_state = step(params, opt_state)
    return graphdef, params, batch


def test_mup_at_the_base_width_is_the_standard_model():
    """Same parameters at init and after two AdamW steps (clipped, decayed), same logits: the
    property that lets muP reuse SP's tuned settings at the base width."""
    train = TrainConfig(learning_rate=3e-3, schedule="constant", warmup_steps=0, steps=2)
    a = Config(model=mup(32, 32, n_layers=1), train=train)
    b = Config(model=sp(32, n_layers=1), train=train)
    for name, value in flat(init_model(a.model, 0)[1]).items():
        np.testing.assert_array_equal(value, flat(init_model(b.model, 0)[1])[name], err_msg=name)
    graph_a, params_a, batch = _train(a, 2)
    graph_b, params_b, _ = _train(b, 2)
    for name, value in flat(params_a).items():
        np.testing.assert_array_equal(value, flat(params_b)[name], err_msg=name)
    forward = lambda graphdef, params: jax.jit(  # noqa: E731
        lambda p: apply(graphdef, p, batch[:, :-1]))(params)
    np.testing.assert_array_equal(forward(graph_a, params_a), forward(graph_b, params_b))


def test_scan_layers_is_the_unrolled_mup_model():
    _, unrolled = init_model(mup(96, 32), 0)
    _, stacked = init_model(mup(96, 32, scan_layers=True), 0)
    q = flat(unrolled)["blocks/1/attn/q_proj/kernel"]
    np.testing.assert_array_equal(flat(stacked)["blocks/attn/q_proj/kernel"][1], q)


def test_decode_equals_the_full_forward_under_mup():
    from attnlab.model import decode_step, init_state

    cfg = mup(64, 32, n_layers=1)
    graphdef, params = init_model(cfg, 0)
    tokens = jax.random.randint(jax.random.key(2), (1, 8), 0, 256)
    full = np.asarray(jax.jit(lambda p: apply(graphdef, p, tokens))(params))
    state = init_state(cfg, 1, 8)
    step = jax.jit(lambda p, s, x, t: decode_step(graphdef, p, s, x, t))
    steps = []
    for t in range(8):
        logits, state = step(params, state, tokens[:, t:t + 1], t)
        steps.append(np.asarray(logits)[:, 0])
    np.testing.assert_allclose(np.stack(steps, 1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw, field, words", [
    (dict(mup_base_d_model=0), "model.mup_base_d_model", "base width"),
    (dict(attention_scale="rsqrt"), "model.attention_scale", "attention_scale=mup"),
    (dict(mixer="mamba", attention_scale="rsqrt", pos_encoding="none"), "model.mixer",
     "no published muP rule"),
    (dict(mixer="linear", attention_scale="rsqrt"), "model.mixer", "no published muP rule"),
    (dict(ngpt=True, ffn="swiglu", pos_encoding="rope"), "model.ngpt", "no published muP rule"),
    (dict(objective="span", vocab_size=257), "model.objective", "encoder-decoder"),
    (dict(mup_base_d_model=33), "model.mup_base_d_model", "not divisible by model.n_heads"),
    (dict(d_ff=99), "model.d_ff", "not an integer"),
    (dict(moe="token_choice", moe_experts=4, moe_top_k=1), "model.moe", "not built for"),
    (dict(inputs="vectors", input_dim=3), "model.inputs", "not built for"),
])
def test_refusals_name_the_field(kw, field, words):
    cfg = dataclasses.replace(mup(64, 32), **kw)
    with pytest.raises(ConfigError) as e:
        resolve(cfg)
    assert e.value.field == field and words in str(e.value)


def test_base_width_under_sp_is_refused():
    with pytest.raises(ConfigError) as e:
        resolve(sp(64, mup_base_d_model=32))
    assert e.value.field == "model.mup_base_d_model" and "muP" in str(e.value)


def test_checkpoint_of_the_other_parameterization_is_refused():
    from attnlab.train.checkpoint import CheckpointError, check_compatible, param_shapes

    saved, current = sp(64), mup(64, 32)
    shapes = param_shapes(init_model(current, 0)[1])
    meta = {"format": 1, "param_shapes": shapes, "model": dataclasses.asdict(saved)}
    with pytest.raises(CheckpointError, match="model.parameterization: checkpoint 'sp', config "
                                              "'mup'"):
        check_compatible(meta, current, shapes, "the checkpoint")


def test_default_identity_is_unchanged():
    """The new fields at their defaults leave every run's identity (ids, saved configs) as it
    was; set, they enter it."""
    assert "parameterization" not in identity(Config())["model"]
    cfg = Config(model=mup(64, 32), data=DataConfig())
    assert identity(cfg)["model"]["parameterization"] == "mup"
