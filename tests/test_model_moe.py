"""Mixture of experts (attnlab/model/moe.py) against float64 NumPy references written from the
papers' equations (Switch, ST-MoE, Mixtral, GShard's capacity), and against invariants: dropless
dispatch = every expert run and masked; decode = full forward; scan and remat = the plain loop;
router gradients = finite differences."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError
from attnlab.model import (apply, count_state_params, decode_step, flops_per_token, init_model,
                           init_state, moe, moe_dispatch, param_counts, resolve)
from attnlab.train.step import mean_loss, training_loss

VOCAB = 64


def moe_cfg(**overrides) -> ModelConfig:
    base = dict(vocab_size=VOCAB, d_model=16, n_layers=2, n_heads=2, max_len=32, init_std=0.1,
                moe="token_choice", moe_experts=4, moe_top_k=2, d_ff=24, moe_dispatch="dropless")
    base.update(overrides)
    return ModelConfig(**base)


# -- float64 NumPy references ------------------------------------------------------------------


def np_softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def np_route(logits, k):
    """Top-k by logit; Mixtral's softmax over the chosen logits, Switch's p for k = 1."""
    probs = np_softmax(logits)
    experts = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    chosen = np.take_along_axis(logits, experts, -1)
    weights = np.take_along_axis(probs, experts, -1) if k == 1 else np_softmax(chosen)
    return probs, experts, weights


def np_slots(experts, n_experts, c):
    """GShard/Switch priority: every token's first choice in token order, then the second..."""
    tokens, k = experts.shape
    filled = np.zeros(n_experts, int)
    slot = np.full((tokens, k), c)
    for rank in range(k):
        for t in range(tokens):
            e = experts[t, rank]
            if filled[e] < c:
                slot[t, rank] = filled[e]
                filled[e] += 1
    return slot


def np_gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def np_expert(x, p, e, gated):
    """Expert ``e``'s FFN on rows ``x [T, d]`` (Vaswani eq. 2; SwiGLU, Shazeer 2020)."""
    def lin(h, w):
        b = p.get("bias" + w[1:])
        return h @ p[w][e] + (0 if b is None else b[e])

    if gated:
        silu = lambda v: v / (1 + np.exp(-v))  # noqa: E731
        return lin(silu(lin(x, "w_gate")) * lin(x, "w_in"), "w_out")
    return lin(np_gelu(lin(x, "w_in")), "w_out")


def np_moe(x, p, k, gated, c=None):
    """Every expert on every token, masked to the routed (and, with capacity c, kept) ones."""
    probs, experts, weights = np_route(x @ p["router"], k)
    n = p["router"].shape[1]
    kept = np.ones_like(weights) if c is None else (np_slots(experts, n, c) < c)
    y = np.zeros_like(x)
    for e in range(n):
        gate = np.sum(weights * kept * (experts == e), axis=-1)  # [T]
        y += gate[:, None] * np_expert(x, p, e, gated)
    return y, probs, experts, kept


def module_params(module):
    return {name: np.asarray(getattr(module, name)[...], np.float64)
            for name in ("router", "w_in", "w_gate", "w_out", "bias_in", "bias_gate", "bias_out")
            if getattr(module, name) is not None}


# -- routing, capacity, losses -----------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3])
def test_router_top_k_and_combine_weights_match_numpy(k):
    logits = np.random.default_rng(k).normal(size=(50, 6)).astype(np.float32)
    probs, experts, weights = jax.jit(moe.route, static_argnums=1)(logits, k)
    ref_probs, ref_experts, ref_weights = np_route(logits.astype(np.float64), k)
    np.testing.assert_array_equal(np.asarray(experts), ref_experts)
    np.testing.assert_allclose(probs, ref_probs, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(weights, ref_weights, rtol=1e-6, atol=1e-7)
    if k > 1:  # Mixtral: the chosen experts' weights sum to one
        np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("factor, k", [(1.0, 1), (1.25, 2), (0.5, 2), (2.0, 3)])
def test_capacity_slots_match_the_priority_rule(factor, k):
    rng = np.random.default_rng(7)
    # skewed routing so that some experts overflow
    experts = np.stack([rng.choice(5, size=k, replace=False, p=[.4, .3, .1, .1, .1])
                        for _ in range(40)])
    c = moe_dispatch.capacity(40, k, 5, factor)
    assert c == max(1, math.ceil(factor * 40 * k / 5))
    got = np.asarray(jax.jit(moe_dispatch.slots, static_argnums=(1, 2))(jnp.asarray(experts), 5, c))
    np.testing.assert_array_equal(got, np_slots(experts, 5, c))


def test_balance_and_z_losses_match_their_formulas():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(64, 8)) * 2
    probs, experts, _ = np_route(logits, 2)
    f = np.bincount(experts.ravel(), minlength=8) / experts.size  # fraction of assignments
    balance = 8 * np.sum(f * probs.mean(0))  # Switch eq. 4 (alpha left out)
    lse = np.log(np.exp(logits).sum(-1))
    z = np.mean(lse**2)  # ST-MoE eq. 5
    jp, je, _ = moe.route(jnp.asarray(logits, jnp.float32), 2)
    np.testing.assert_allclose(moe.balance_loss(jp, je), balance, rtol=1e-5)
    np.testing.assert_allclose(moe.z_loss(jnp.asarray(logits, jnp.float32)), z, rtol=1e-5)
    entropy = -np.mean(np.sum(probs * np.log(probs), -1))
    np.testing.assert_allclose(moe.router_entropy(jp), entropy, rtol=1e-5)
    # A uniform router over evenly loaded experts is the balance loss's minimum, 1.
    even = jnp.asarray(np.arange(64 * 2).reshape(64, 2) % 8)
    np.testing.assert_allclose(moe.balance_loss(jnp.full((64, 8), 1 / 8), even), 1.0, rtol=1e-6)


# -- the layer against the dense masked reference ----------------------------------------------

LAYERS = {
    "dropless_gelu": dict(),
    "dropless_swiglu_bias_top1": dict(ffn="swiglu", linear_bias=True, moe_top_k=1),
    "capacity_drops": dict(moe_dispatch="capacity", moe_capacity_factor=0.5),
    "capacity_swiglu_top3": dict(moe_dispatch="capacity", ffn="swiglu", moe_top_k=3,
                                 moe_capacity_factor=1.0),
}


@pytest.mark.parametrize("name", LAYERS)
def test_layer_equals_every_expert_run_and_masked(name):
    cfg = moe_cfg(**LAYERS[name])
    part = resolve(cfg).ffn
    module = part.build(nnx.Rngs(params=1))
    x = np.random.default_rng(2).normal(size=(2, 12, cfg.d_model)).astype(np.float32)
    y = np.asarray(jax.jit(lambda x: module(x))(x))
    c = (moe_dispatch.capacity(24, cfg.moe_top_k, cfg.moe_experts, cfg.moe_capacity_factor)
         if cfg.moe_dispatch == "capacity" else None)
    ref, *_, kept = np_moe(x.reshape(24, -1).astype(np.float64), module_params(module),
                           cfg.moe_top_k, part.inputs == 2, c)
    if name == "capacity_drops":
        assert 0 < kept.mean() < 1  # the case drops some assignments and keeps others
    np.testing.assert_allclose(y.reshape(24, -1), ref, atol=2e-5, rtol=1e-4)


def test_shared_experts_add_one_dense_ffn():
    cfg = moe_cfg(moe_shared_experts=2)
    part = resolve(cfg).ffn
    module = part.build(nnx.Rngs(params=0))
    x = np.random.default_rng(0).normal(size=(1, 8, cfg.d_model)).astype(np.float32)
    p = module_params(module)
    shared = {"w_in": np.asarray(module.shared.w_in.kernel[...], np.float64)[None],
              "w_out": np.asarray(module.shared.w_out.kernel[...], np.float64)[None]}
    assert shared["w_in"].shape[-1] == 2 * cfg.d_ff
    x64 = x.reshape(8, -1).astype(np.float64)
    ref = np_moe(x64, p, 2, False)[0] + np_expert(x64, shared, 0, False)
    np.testing.assert_allclose(np.asarray(module(x)).reshape(8, -1), ref, atol=2e-5)


def test_router_gradients_match_finite_differences():
    """d/dW_r of (a fixed projection of the output + the balance and z-losses), float64."""
    cfg = moe_cfg(ffn="swiglu")
    module = resolve(cfg).ffn.build(nnx.Rngs(params=3))
    with jax.enable_x64(True):
        p = {name: jnp.asarray(v) for name, v in module_params(module).items()}
        rng = np.random.default_rng(4)
        x = jnp.asarray(rng.normal(size=(20, cfg.d_model)))
        probe = jnp.asarray(rng.normal(size=(20, cfg.d_model)))

        def objective(router):
            logits = x @ router
            probs, experts, weights = moe.route(logits, 2)
            y, _ = moe_dispatch.dropless(x, experts, weights, p, None, True)
            return (jnp.sum(y * probe) + 0.3 * moe.balance_loss(probs, experts)
                    + 0.2 * moe.z_loss(logits))

        grad = np.asarray(jax.grad(objective)(p["router"]))
        eps = 1e-6
        for i, j in [(0, 0), (3, 1), (7, 2), (15, 3), (9, 0)]:
            step = jnp.zeros_like(p["router"]).at[i, j].set(eps)
            fd = (objective(p["router"] + step) - objective(p["router"] - step)) / (2 * eps)
            np.testing.assert_allclose(grad[i, j], fd, rtol=1e-6, atol=1e-9)


# -- the model ---------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides", [dict(), dict(moe_dispatch="capacity",
                                                     moe_capacity_factor=2.0)],
                         ids=["dropless", "capacity_none_dropped"])
def test_kv_cache_decoding_equals_full_forward(overrides):
    cfg = moe_cfg(**overrides)  # capacity 2 = E / k: a full buffer per expert, nothing dropped
    graphdef, state = init_model(cfg, seed=0)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, VOCAB, (2, 8)), jnp.int32)
    full = np.asarray(jax.jit(lambda s, t: apply(graphdef, s, t))(state, tokens))
    step = jax.jit(decode_step, static_argnums=0)
    cache = init_state(cfg, batch=2, max_len=8)
    logits, cache = step(graphdef, state, cache, tokens[:, :3], 0)
    pieces = [np.asarray(logits)]
    for i in range(3, 8):
        logits, cache = step(graphdef, state, cache, tokens[:, i:i + 1], i)
        pieces.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=3e-5)


def test_scan_and_remat_equal_the_layer_loop():
    """Loss, auxiliary statistics and gradients of the stacked and rematerialised models are the
    unrolled model's (their statistics leave jax.checkpoint and jax.lax.scan)."""
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, VOCAB, (2, 13)), jnp.int32)
    results = []
    for overrides in (dict(), dict(scan_layers=True), dict(remat="full")):
        cfg = moe_cfg(moe_dispatch="capacity", **overrides)
        graphdef, state = init_model(cfg, seed=0)
        fn = jax.value_and_grad(lambda p: training_loss(graphdef, p, tokens), has_aux=True)
        (total, metrics), grads = jax.jit(fn)(state)
        flat = {"/".join(map(str, k)): np.asarray(v) for k, v in
                nnx.to_flat_state(grads)}
        if overrides.get("scan_layers"):  # unstack [n_layers, ...] into the loop's names
            flat = {k.replace("blocks/", f"blocks/{i}/"): v[i] for k, v in flat.items()
                    for i in range(2) if k.startswith("blocks/")} | {
                k: v for k, v in flat.items() if not k.startswith("blocks/")}
        results.append((float(total), jax.device_get(metrics), flat))
    (total, metrics, grads), *others = results
    assert metrics["moe_aux_loss"] > 0 and metrics["moe_load"].shape == (2, 4)
    for other_total, other_metrics, other_grads in others:
        np.testing.assert_allclose(other_total, total, rtol=1e-6)
        for key in metrics:
            np.testing.assert_allclose(other_metrics[key], metrics[key], rtol=1e-5, atol=1e-7)
        assert set(other_grads) == set(grads)
        for key in grads:
            np.testing.assert_allclose(other_grads[key], grads[key], rtol=1e-4, atol=1e-7)


def test_training_loss_adds_the_weighted_auxiliary_losses():
    cfg = moe_cfg(moe_balance_coef=0.5, moe_z_coef=0.25)
    graphdef, state = init_model(cfg, seed=0)
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, VOCAB, (2, 9)), jnp.int32)
    total, metrics = jax.jit(lambda p: training_loss(graphdef, p, tokens))(state)
    ce = jax.jit(lambda p: mean_loss(graphdef, p, tokens))(state)
    np.testing.assert_allclose(metrics["loss"], ce, rtol=1e-6)
    aux = 0.5 * metrics["moe_balance_loss"] + 0.25 * metrics["moe_z_loss"]
    np.testing.assert_allclose(total, ce + aux, rtol=1e-6)
    np.testing.assert_allclose(metrics["moe_load"].sum(-1), 1.0, rtol=1e-6)
    dense = ModelConfig(vocab_size=VOCAB, d_model=16, n_layers=2, n_heads=2)
    graphdef, state = init_model(dense, seed=0)
    total, metrics = jax.jit(lambda p: training_loss(graphdef, p, tokens))(state)
    assert set(metrics) == {"loss"} and float(total) == float(metrics["loss"])


# -- counting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides", [dict(), dict(ffn="swiglu", moe_shared_experts=1,
                                                     linear_bias=True, moe_top_k=1)])
def test_counts_total_and_active(overrides):
    cfg = moe_cfg(**overrides)
    counts = param_counts(cfg)
    _, state = init_model(cfg, seed=0)
    assert count_state_params(state)["total"] == counts["total"]
    d, f, n, k = cfg.d_model, cfg.d_ff, cfg.moe_experts, cfg.moe_top_k
    matrices = 3 if cfg.ffn == "swiglu" else 2
    expert = matrices * d * f + ((matrices - 1) * f + d if cfg.linear_bias else 0)
    shared = cfg.moe_shared_experts * matrices * d * f + (
        ((matrices - 1) * cfg.moe_shared_experts * f + d) if cfg.moe_shared_experts and
        cfg.linear_bias else 0)
    assert counts["ffn"] == n * expert + d * n + shared
    assert counts["active_ffn"] == k * expert + d * n + shared
    assert counts["total"] - counts["active"] == cfg.n_layers * (n - k) * expert
    flops = flops_per_token(cfg, 32)
    dense_ffn = 2.0 * matrices * d * f
    ffn_flops = 2 * d * n + k * dense_ffn + 2 * k * d + (cfg.moe_shared_experts * dense_ffn)
    dense = flops_per_token(ModelConfig(**{**cfg.__dict__, "moe": "none", **{
        f: getattr(ModelConfig, f) for f in moe.TokenChoice.fields}}), 32)
    np.testing.assert_allclose(flops["chinchilla_forward"] - dense["chinchilla_forward"],
                               cfg.n_layers * (ffn_flops - dense_ffn))


# -- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, field", [
    (dict(moe_top_k=3, moe_experts=2), "model.moe_top_k"),
    (dict(moe_top_k=2, moe_experts=1), "model.moe_top_k"),
    (dict(moe_dispatch="capacity", moe_capacity_factor=0.0), "model.moe_capacity_factor"),
    (dict(moe_dispatch="capacity", moe_capacity_factor=-1.0), "model.moe_capacity_factor"),
    (dict(moe_capacity_factor=2.0), "model.moe_capacity_factor"),  # dropless reads no capacity
    (dict(moe_dispatch="sorted"), "model.moe_dispatch"),
    (dict(moe="expert_choice"), "model.moe"),
    (dict(ngpt=True, ffn="swiglu", norm="rmsnorm"), "model.moe"),
    (dict(moe="none"), "model.moe_experts"),  # a field of an MoE set on a dense model
])
def test_bad_combinations_are_refused_naming_the_field(overrides, field):
    with pytest.raises(ConfigError) as error:
        resolve(moe_cfg(**overrides))
    assert error.value.field == field


def test_weight_decay_reaches_expert_matrices_and_router_not_biases():
    from attnlab.train.optimizer import decay_mask

    cfg = moe_cfg(ffn="swiglu", linear_bias=True)
    _, state = init_model(cfg, seed=0)
    mask = {"/".join(map(str, k)): bool(getattr(v, "value", v))
            for k, v in nnx.to_flat_state(decay_mask(state, resolve(cfg)))}
    ffn = {k.split("ffn/")[1]: v for k, v in mask.items() if k.startswith("blocks/0/ffn/")}
    assert ffn == {"router": True, "w_in": True, "w_gate": True, "w_out": True,
                   "bias_in": False, "bias_gate": False, "bias_out": False}


def test_scaling_fits_say_whether_n_counts_all_experts_or_the_active_ones():
    import pandas as pd

    from attnlab.scaling.laws.registry import law_named
    from attnlab.scaling.tables.prepare import prepare_points

    frame = pd.DataFrame({"params": [4e4, 8e4, 1.6e5], "active_params": [2e4, 4e4, 8e4],
                          "non_embedding_params": [3e4, 6e4, 1.2e5],
                          "active_non_embedding_params": [1e4, 2e4, 4e4],
                          "tokens": [1e6, 2e6, 4e6], "final_val_loss": [3.0, 2.8, 2.7]})
    total = prepare_points(frame, law=law_named("chinchilla"))
    assert total.frame["params"].tolist() == [4e4, 8e4, 1.6e5]
    assert any("every expert" in note for note in total.notes)
    active = prepare_points(frame, law=law_named("kaplan"),
                            columns={"params": "active_non_embedding_params"})
    assert active.frame["params"].tolist() == [1e4, 2e4, 4e4]
    assert any(note.startswith("N = active_non_embedding_params") for note in active.notes)
