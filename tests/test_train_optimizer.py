"""Schedules and AdamW against float64 NumPy references; the weight-decay mask; the train step's
gradient accumulation and mixed precision."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
from attnlab.errors import ConfigError
from attnlab import model as lm
from attnlab.model import init_model
from attnlab.train.optimizer import decay_mask, make_optimizer, make_schedule, optimizer_for
from attnlab.train.state import init_train_state
from attnlab.train.step import make_train_step, mean_loss

PEAK, WARMUP, TOTAL, FLOOR = 2e-3, 5, 40, 0.1


def reference_lr(schedule: str, t: int, *, d_model: int = 64, decay_fraction: float = 0.25):
    """The schedules written out directly, float64, for update t = 0, 1, ..."""
    if schedule == "noam":
        s = t + 1
        return 1.0 * d_model**-0.5 * min(s**-0.5, s * WARMUP**-1.5)
    if t < WARMUP:
        return PEAK * (t + 1) / WARMUP
    floor = PEAK * FLOOR
    if schedule == "constant":
        return PEAK
    if schedule == "cosine":
        p = min(1.0, (t - WARMUP + 1) / (TOTAL - WARMUP + 1))
        return floor + (PEAK - floor) * 0.5 * (1 + math.cos(math.pi * p))
    if schedule == "wsd":
        decay_steps = round(decay_fraction * TOTAL)
        start = TOTAL - decay_steps
        if t < start:
            return PEAK
        return PEAK + (floor - PEAK) * min(1.0, (t - start + 1) / (decay_steps + 1))
    raise ValueError(schedule)


@pytest.mark.parametrize("name", ["cosine", "noam", "wsd", "constant"])
def test_schedule_matches_reference(name):
    lr = 1.0 if name == "noam" else PEAK
    train = TrainConfig(schedule=name, learning_rate=lr, warmup_steps=WARMUP,
                        min_lr_ratio=FLOOR, decay_fraction=0.25, cooldown="linear")
    schedule = make_schedule(train, TOTAL, d_model=64)
    steps = np.arange(TOTAL + 5)
    got = np.asarray(jax.vmap(schedule)(steps), np.float64)
    want = np.array([reference_lr(name, int(t)) for t in steps])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-12)


def test_schedule_shapes():
    cosine = make_schedule(TrainConfig(learning_rate=PEAK, warmup_steps=WARMUP,
                                       min_lr_ratio=FLOOR), TOTAL, 64)
    assert float(cosine(0)) > 0  # the first update is not wasted
    assert float(cosine(WARMUP - 1)) == pytest.approx(PEAK)
    # the floor one update after the last: with a zero floor the last update still moves
    assert float(cosine(TOTAL)) == pytest.approx(PEAK * FLOOR)
    assert float(cosine(TOTAL - 1)) > PEAK * FLOOR * 1.001
    noam = make_schedule(TrainConfig(schedule="noam", learning_rate=1.0, warmup_steps=4000),
                         100_000, 512)
    # Vaswani et al.: peak d^-0.5 warmup^-0.5 at step 4000 (~7.0e-4 for the base model)
    assert float(noam(3999)) == pytest.approx(512**-0.5 * 4000**-0.5, rel=1e-6)
    assert float(noam(3999)) > float(noam(3998)) and float(noam(3999)) > float(noam(4000))


def test_schedule_bad_settings():
    with pytest.raises(ConfigError, match="train.warmup_steps"):
        make_schedule(TrainConfig(schedule="noam", warmup_steps=0), 100, 64)
    with pytest.raises(ConfigError, match="longer than the run"):
        make_schedule(TrainConfig(warmup_steps=200), 100, 64)


def tiny_model(**overrides):
    return ModelConfig(d_model=32, n_layers=2, n_heads=2, max_len=32, **overrides)


def test_decay_mask_skips_norms_biases_embeddings():
    _, params = init_model(tiny_model(pos_encoding="learned", tie_embeddings=False,
                                      qk_norm=True), 0)
    flat = {jax.tree_util.keystr(p): bool(m)
            for p, m in jax.tree_util.tree_leaves_with_path(decay_mask(params))}
    decayed = {k for k, v in flat.items() if v}
    assert decayed, "some parameters must be decayed"
    assert all("kernel" in k or "lm_head" in k for k in decayed)
    for key, value in flat.items():
        if "norm" in key or "embedding" in key:
            assert not value, key
        if "proj" in key or "w_in" in key or "w_out" in key:
            assert value, key


@pytest.mark.parametrize("overrides", [
    dict(mixer="mamba", pos_encoding="none"),
    dict(mixer="mamba", attention_every=2),  # a hybrid: layer 1 is softmax attention
    dict(mixer="mamba", pos_encoding="none", scan_layers=True),  # A_log, D [n_layers, ...]
])
def test_mamba_a_log_and_d_are_not_decayed(overrides):
    """Mamba holds A_log and D out of weight decay (its ``_no_weight_decay``) whatever their
    rank; the projections are decayed; a scanned stack's norms (``[n_layers, d]``) are not."""
    cfg = Config(model=tiny_model(**overrides))
    _, params = init_model(cfg.model, 0)
    tx, _ = optimizer_for(cfg)
    mask = decay_mask(params, lm.resolve(cfg.model))
    flat = {jax.tree_util.keystr(p): bool(m)
            for p, m in jax.tree_util.tree_leaves_with_path(mask)}
    a_log = [k for k in flat if "a_log" in k]
    assert a_log and len([k for k in flat if "d_skip" in k]) == len(a_log)
    for key, value in flat.items():
        if "a_log" in key or "d_skip" in key or "norm" in key or "bias" in key:
            assert not value, key
        if "proj" in key or "w_in" in key or "w_out" in key or "conv_kernel" in key:
            assert value, key
    # The optimizer applies that mask: one update with zero gradients moves only decayed leaves.
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = jax.jit(tx.update)(zeros, tx.init(params), params)
    for (path, u), (_, m) in zip(jax.tree_util.tree_leaves_with_path(updates),
                                 jax.tree_util.tree_leaves_with_path(mask)):
        assert bool(jnp.any(u != 0)) == bool(m), jax.tree_util.keystr(path)


def test_adamw_matches_numpy_reference():
    """Three updates of clip + AdamW (masked decoupled decay) on the real model's param tree."""
    train = TrainConfig(learning_rate=PEAK, warmup_steps=2, weight_decay=0.1, grad_clip=0.5,
                        b1=0.9, b2=0.95, eps=1e-8)
    total = 10
    tx, _ = make_optimizer(train, total, d_model=32)
    _, params = init_model(tiny_model(), 0)
    mask = [bool(m) for m in jax.tree.leaves(decay_mask(params))]
    rng = np.random.default_rng(0)
    grads_seq = [jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape) * 0.05, jnp.float32),
                              params) for _ in range(3)]

    ref_p = [np.asarray(x, np.float64) for x in jax.tree.leaves(params)]
    ref_m = [np.zeros_like(x) for x in ref_p]
    ref_v = [np.zeros_like(x) for x in ref_p]
    opt_state = tx.init(params)
    tx_update = jax.jit(tx.update)
    for t, grads in enumerate(grads_seq):
        updates, opt_state = tx_update(grads, opt_state, params)
        params = jax.tree.map(lambda p, u: p + u, params, updates)
        g = [np.asarray(x, np.float64) for x in jax.tree.leaves(grads)]
        norm = math.sqrt(sum(float((x**2).sum()) for x in g))
        g = [x * train.grad_clip / max(norm, train.grad_clip) for x in g]
        # cosine with warmup 2 over 10 steps, floor 0.1 (default min_lr_ratio)
        floor = PEAK * train.decay().min_lr_ratio
        lr = (PEAK * (t + 1) / 2 if t < 2 else
              floor + (PEAK - floor) * 0.5 * (1 + math.cos(math.pi * (t - 1) / (total - 1))))
        for i, (gi, decay) in enumerate(zip(g, mask)):
            ref_m[i] = 0.9 * ref_m[i] + 0.1 * gi
            ref_v[i] = 0.95 * ref_v[i] + 0.05 * gi**2
            m_hat = ref_m[i] / (1 - 0.9 ** (t + 1))
            v_hat = ref_v[i] / (1 - 0.95 ** (t + 1))
            update = m_hat / (np.sqrt(v_hat) + 1e-8) + (0.1 * ref_p[i] if decay else 0.0)
            ref_p[i] = ref_p[i] - lr * update
    for got, want in zip(jax.tree.leaves(params), ref_p):
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-7)


def tiny_config(**train) -> Config:
    return Config(model=tiny_model(), data=DataConfig(seq_len=16, batch_size=8),
                  train=TrainConfig(steps=10, warmup_steps=2, **train))


def one_step(cfg: Config, batch: np.ndarray):
    tx, schedule = make_optimizer(cfg.train, cfg.total_steps, cfg.model.d_model)
    graphdef, _ = init_model(cfg.model, cfg.train.seed)
    state = init_train_state(cfg, tx)
    step = jax.jit(make_train_step(cfg, graphdef, tx, schedule))
    accum = cfg.train.grad_accum
    micro = batch.reshape(-1, accum, batch.shape[-1]).transpose(1, 0, 2)
    before = float(jax.jit(lambda p, b: mean_loss(graphdef, p, b))(state.params, batch))
    new_state, metrics = step(state, jnp.asarray(micro))
    return before, new_state, jax.device_get(metrics), schedule


def test_train_step_gradient_accumulation_equals_full_batch():
    batch = np.random.default_rng(1).integers(0, 256, size=(8, 17), dtype=np.int32)
    loss_full, state_full, m_full, schedule = one_step(tiny_config(grad_accum=1), batch)
    loss_acc, state_acc, m_acc, _ = one_step(tiny_config(grad_accum=4), batch)
    # the reported loss is the loss before the update, over the whole batch
    assert m_full["loss"] == pytest.approx(loss_full, rel=1e-6)
    assert m_acc["loss"] == pytest.approx(loss_full, rel=1e-5)
    assert m_acc["grad_norm"] == pytest.approx(m_full["grad_norm"], rel=1e-4)
    assert m_full["lr"] == pytest.approx(float(schedule(0)))
    assert int(state_full.step) == int(state_acc.step) == 1
    # Adam's first update is ~lr * sign(g) (lr = 1.5e-3 here): fp32 sums in another order move
    # it by far less than lr, except where |g| ~ eps.
    for a, b in zip(jax.tree.leaves(state_full.params), jax.tree.leaves(state_acc.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)
    _, initial = init_model(tiny_model(), 0)
    moved = max(float(jnp.abs(a - b).max()) for a, b in
                zip(jax.tree.leaves(state_full.params), jax.tree.leaves(initial)))
    assert moved > 1e-4  # the step did move the parameters


def test_train_step_bfloat16_compute_keeps_float32_params():
    cfg = tiny_config()
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype="bfloat16"))
    batch = np.random.default_rng(2).integers(0, 256, size=(8, 17), dtype=np.int32)
    loss_bf16, state, metrics, _ = one_step(cfg, batch)
    graphdef, params = init_model(tiny_config().model, 0)  # the same weights, fp32 compute
    loss_fp32 = float(jax.jit(lambda p, b: mean_loss(graphdef, p, b))(params, batch))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.opt_state)
               if jnp.issubdtype(x.dtype, jnp.floating))
    assert math.isfinite(metrics["loss"])
    assert loss_bf16 == pytest.approx(loss_fp32, rel=2e-2)  # bf16 has ~3 significant digits


def reference_cooldown(shape: str, t: int, total: int, warmup: int, fraction: float) -> float:
    """wsd with a cooldown of the given shape (Hägele et al. 2024, eq. 1), float64: warmup,
    PEAK until the last round(fraction * total) updates, then floor + (PEAK - floor) g(p)."""
    if t < warmup:
        return PEAK * (t + 1) / warmup
    length = max(1, round(fraction * total))
    start = max(warmup, total - length)
    if t < start:
        return PEAK
    p = min(1.0, (t - start + 1) / (total - start + 1))
    g = {"linear": 1 - p, "1-sqrt": 1 - math.sqrt(p),
         "cosine": 0.5 * (1 + math.cos(math.pi * p))}[shape]
    floor = PEAK * FLOOR
    return floor + (PEAK - floor) * g


@pytest.mark.parametrize("shape", ["linear", "1-sqrt", "cosine"])
@pytest.mark.parametrize("total,fraction", [(40, 0.25), (37, 0.2), (12, 0.9)])
def test_wsd_cooldown_shapes_match_reference(shape, total, fraction):
    train = TrainConfig(schedule="wsd", learning_rate=PEAK, warmup_steps=WARMUP,
                        min_lr_ratio=FLOOR, decay_fraction=fraction, cooldown=shape)
    steps = np.arange(total + 3)
    got = np.asarray(jax.vmap(make_schedule(train, total, d_model=64))(steps), np.float64)
    want = np.array([reference_cooldown(shape, int(t), total, WARMUP, fraction) for t in steps])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-12)
    assert got[total] == pytest.approx(PEAK * FLOOR, rel=1e-6)  # the floor after the last
    assert got[total - 1] > PEAK * FLOOR * 1.001


def test_branch_schedule_equals_constant_trunk_before_its_cooldown():
    """A cooldown branch continues a constant-LR trunk: their schedules agree bitwise on every
    update before the cooldown starts, so the branch is the run it would be from scratch."""
    trunk = make_schedule(TrainConfig(schedule="constant", learning_rate=PEAK,
                                      warmup_steps=WARMUP), 60, 64)
    for shape in ("linear", "1-sqrt", "cosine"):
        branch = make_schedule(TrainConfig(schedule="wsd", learning_rate=PEAK,
                                           warmup_steps=WARMUP, decay_fraction=0.2,
                                           cooldown=shape, min_lr_ratio=FLOOR), 50, 64)
        steps = np.arange(40)  # the cooldown is updates 40..49
        np.testing.assert_array_equal(np.asarray(jax.vmap(branch)(steps)),
                                      np.asarray(jax.vmap(trunk)(steps)))
        assert float(branch(40)) < PEAK


def test_wsd_left_unset_is_hagele_et_al_and_its_last_update_moves():
    """schedule=wsd alone: a 1 - sqrt cooldown over the last 20% of the steps to zero (Hägele
    et al. 2024); cosine alone keeps its floor of 10%. The floor comes one update after the
    last, so no update runs at lr = 0."""
    wsd = TrainConfig(schedule="wsd").decay()
    assert (wsd.cooldown, wsd.decay_fraction, wsd.min_lr_ratio) == ("1-sqrt", 0.2, 0.0)
    assert TrainConfig().decay().min_lr_ratio == 0.1
    schedule = make_schedule(TrainConfig(schedule="wsd", learning_rate=PEAK,
                                         warmup_steps=WARMUP), TOTAL, 64)
    lr = np.asarray(jax.vmap(schedule)(np.arange(TOTAL + 1)), np.float64)
    start = TOTAL - round(0.2 * TOTAL)
    p = (np.arange(start, TOTAL + 1) - start + 1) / (TOTAL - start + 1)
    np.testing.assert_allclose(lr[start:], PEAK * (1 - np.sqrt(np.minimum(p, 1))), atol=1e-9)
    assert lr[TOTAL - 1] > 0 and lr[TOTAL] == 0
    # set explicitly, a value wins over the schedule's
    assert TrainConfig(schedule="wsd", min_lr_ratio=0.1).decay().min_lr_ratio == 0.1
