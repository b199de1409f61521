"""Ensembles (attnlab/train/ensemble.py): k runs of one shape stepped by one vmapped program.

The invariant: an ensemble member is the run trained alone. One vmapped step equals the lone
steps to float32 rounding (the batched matmuls sum in another order); whole ensembles follow
their lone runs to a tolerance measured here; an interrupted ensemble resumes bitwise; faults
stay per member.
"""

import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
from attnlab.errors import ConfigError
from attnlab.train import load_params, run
from attnlab.ensembles import check_members, groups
from attnlab.train.ensemble import make_ensemble_step, member, run_ensemble, stack
from attnlab.train.optimizer import optimizer_for
from attnlab.train.state import init_train_state
from attnlab.train.step import make_train_step

VARIANTS = {
    "softmax": {},
    "gqa": dict(n_heads=4, n_kv_heads=2),
    "mamba": dict(mixer="mamba", pos_encoding="none"),
    "linear": dict(mixer="linear", mixer_chunk=4),
    "mlm": dict(objective="mlm", vocab_size=257),
    "span": dict(objective="span", vocab_size=257),
    "dropout": dict(dropout=0.1),
    "ngpt": dict(ngpt=True, ffn="swiglu"),
    # muP at twice its base width: the optimizer scales each parameter's update by its own
    # learning-rate multiplier (1/m on hidden matrices), a step the lone run has too.
    "mup": dict(parameterization="mup", mup_base_d_model=16, attention_scale="mup"),
}


# Losses, gradient norms and learning rates agree to 1e-6 relative, gradients to 1e-5. Adam's
# first update is lr g / (|g| + eps), whose derivative in g reaches lr / eps at g = 0: with the
# default eps = 1e-8 a gradient's rounding (~1e-10) can move an entry by ~3e-5 (measured: up to
# 3.9e-6 on one entry in 4,096). The step tests use eps = 1e-6, which bounds that by ~3e-7, and
# compare parameters to 1e-6 relative or 1e-3 of the learning rate absolute (so every test's
# configs use it).
ADAM_ATOL = 3e-6
STEP_EPS = 1e-6


def cfg_of(cache_dir="unused", model=None, data=None, **train) -> Config:
    model = {"vocab_size": 256, "d_model": 32, "n_layers": 2, "n_heads": 2, "max_len": 32,
             **(model or {})}
    train = {"steps": 6, "warmup_steps": 2, "log_every": 2, "eval_every": 3, "eval_batches": 1,
             "checkpoint_every": 3, "keep_checkpoints": 5, "eps": STEP_EPS, **train}
    if model.get("ngpt"):
        train.update(warmup_steps=0, weight_decay=0.0)
    data = {"source": "markov", "markov_tokens": 20_000, "seq_len": 16, "batch_size": 4,
            "cache_dir": str(cache_dir), **(data or {})}
    return Config(model=ModelConfig(**model), data=DataConfig(**data),
                  train=TrainConfig(**train))


def lone_and_ensemble_step(cfgs, batches, members="vmap"):
    """One update of each member alone, and of the ensemble: ``(lone states, metrics), (stacked
    states, metrics)``."""
    lone_states, lone_metrics, initial = [], [], []
    graphdef = None
    for cfg, batch in zip(cfgs, batches):
        tx, schedule = optimizer_for(cfg)
        from attnlab.model import init_model
        graphdef, _ = init_model(cfg.model, 0)
        state = jax.jit(lambda key, cfg=cfg, tx=tx: init_train_state(cfg, tx, key))(
            jax.random.key(cfg.train.seed))
        initial.append(state)
        step = jax.jit(make_train_step(cfg, graphdef, tx, schedule))
        new, metrics = step(state, batch)
        lone_states.append(new)
        lone_metrics.append(metrics)
    step = jax.jit(make_ensemble_step(cfgs, graphdef, members=members))
    stacked, metrics = step(stack(initial), jnp.stack(batches), jnp.ones(len(cfgs), bool))
    return (lone_states, lone_metrics), (stacked, metrics)


def random_batches(cfgs, accum=1):
    rng = np.random.default_rng(0)
    return [jnp.asarray(rng.integers(0, 256, (accum, 4 // accum, 17)), jnp.int32) for _ in cfgs]


def assert_close(a, b, rtol, atol=1e-7):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64),
                                   rtol=rtol, atol=atol)


# The default lane runs each way of stacking members (vmap, map) once; the variants run in the
# slow lane.
FAST = {("softmax", "vmap"), ("softmax", "map")}


@pytest.mark.parametrize("name, members", [
    pytest.param(name, members, marks=() if (name, members) in FAST else pytest.mark.slow)
    for name in VARIANTS for members in ("vmap", "map")])
def test_one_ensemble_step_equals_the_lone_steps(name, members):
    # Members differ in seed, data seed, learning rate and warmup: the unrolled optimizers.
    cfgs = [cfg_of(model=VARIANTS[name], seed=0),
            cfg_of(model=VARIANTS[name], data={"seed": 5}, seed=1, learning_rate=1e-3,
                   warmup_steps=1 if not VARIANTS[name].get("ngpt") else 0)]
    (lone, lone_metrics), (stacked, metrics) = lone_and_ensemble_step(
        cfgs, random_batches(cfgs), members)
    for i in range(2):
        assert_close(member(stacked, i), lone[i], rtol=1e-6, atol=ADAM_ATOL)
        for key in ("loss", "grad_norm", "lr"):
            np.testing.assert_allclose(metrics[key][i], lone_metrics[i][key], rtol=1e-6)


@pytest.mark.parametrize("name", ["softmax", pytest.param("mamba", marks=pytest.mark.slow),
                                  pytest.param("mlm", marks=pytest.mark.slow)])
def test_vmapped_gradients_equal_the_lone_gradients(name):
    from attnlab.model import init_model
    from attnlab.train.step import accumulated_grads, loss_grad_fn

    cfgs = [cfg_of(model=VARIANTS[name], seed=0),
            cfg_of(model=VARIANTS[name], seed=1, data={"seed": 4})]
    graphdef, _ = init_model(cfgs[0].model, 0)
    grad_fn = loss_grad_fn(graphdef)
    params = [init_model(c.model, c.train.seed)[1] for c in cfgs]
    batches = random_batches(cfgs)

    def grads(p, b, seed, data_seed):
        return accumulated_grads(grad_fn, p, b, 0, seed=seed, data_seed=data_seed,
                                 use_dropout=False)

    loss, together = jax.jit(jax.vmap(grads))(stack(params), jnp.stack(batches),
                                              jnp.asarray([0, 1]), jnp.asarray([0, 4]))
    for i, cfg in enumerate(cfgs):
        lone_loss, alone = jax.jit(grads, static_argnums=(2, 3))(params[i], batches[i],
                                                                  cfg.train.seed, cfg.data.seed)
        np.testing.assert_allclose(loss["loss"][i], lone_loss["loss"], rtol=1e-6)
        # Each leaf to float32 rounding of its largest entry (entries that are sums which
        # nearly cancel differ more in relative terms).
        for a, b in zip(jax.tree.leaves(member(together, i)), jax.tree.leaves(alone)):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * np.abs(b).max())


@pytest.mark.slow
def test_members_with_one_optimizer_share_a_vmapped_update_and_accumulate():
    cfgs = [cfg_of(seed=s, grad_accum=2) for s in range(3)]
    (lone, lone_metrics), (stacked, metrics) = lone_and_ensemble_step(
        cfgs, random_batches(cfgs, accum=2))
    for i in range(3):
        assert_close(member(stacked, i), lone[i], rtol=1e-6, atol=ADAM_ATOL)
        np.testing.assert_allclose(metrics["loss"][i], lone_metrics[i]["loss"], rtol=1e-6)


@pytest.mark.slow
def test_bf16_members_follow_their_lone_steps_to_bf16_rounding():
    cfgs = [cfg_of(model={"dtype": "bfloat16"}, seed=s) for s in range(2)]
    (lone, lone_metrics), (stacked, metrics) = lone_and_ensemble_step(cfgs, random_batches(cfgs))
    for i in range(2):
        np.testing.assert_allclose(metrics["loss"][i], lone_metrics[i]["loss"], rtol=1e-2)
        assert_close(member(stacked, i).params, lone[i].params, rtol=0, atol=2e-3)


def test_an_inactive_member_keeps_its_state():
    cfgs = [cfg_of(seed=s) for s in range(2)]
    (lone, _), _ = lone_and_ensemble_step(cfgs, random_batches(cfgs))
    from attnlab.model import init_model
    graphdef, _ = init_model(cfgs[0].model, 0)
    tx, _ = optimizer_for(cfgs[0])
    initial = stack([init_train_state(c, tx, jax.random.key(c.train.seed)) for c in cfgs])
    step = jax.jit(make_ensemble_step(cfgs, graphdef))
    out, _ = step(initial, jnp.stack(random_batches(cfgs)), jnp.asarray([True, False]))
    assert_close(member(out, 0), lone[0], rtol=1e-6, atol=ADAM_ATOL)
    for a, b in zip(jax.tree.leaves(member(out, 1)), jax.tree.leaves(member(initial, 1))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_members_must_share_what_shapes_the_program():
    with pytest.raises(ConfigError) as error:
        check_members([cfg_of(), cfg_of(model={"d_model": 64})])
    assert error.value.field == "model.d_model" and "member 1" in str(error.value)
    with pytest.raises(ConfigError, match="data.batch_size"):
        check_members([cfg_of(), cfg_of(data={"batch_size": 8})])
    check_members([cfg_of(seed=0), cfg_of(seed=1, learning_rate=1e-2, steps=9,
                                          weight_decay=0.0, data={"seed": 3})])


def test_runs_are_grouped_by_what_they_share_in_order_and_capped():
    runs = {"a0": cfg_of(seed=0), "b0": cfg_of(model={"d_model": 64}), "a1": cfg_of(seed=1),
            "a2": cfg_of(seed=2, learning_rate=1e-2), "b1": cfg_of(model={"d_model": 64}, seed=1),
            "a3": cfg_of(seed=3, steps=9)}
    assert groups(runs, runs.get, 8) == [["a0", "a1", "a2", "a3"], ["b0", "b1"]]
    assert groups(runs, runs.get, 3) == [["a0", "a1", "a2"], ["b0", "b1"], ["a3"]]
    assert groups(runs, runs.get, 1) == [[name] for name in runs]


def final_params(workdir):
    _, _, params = load_params(workdir)
    return jax.tree.leaves(params)


def test_an_ensemble_trains_each_member_as_its_own_run(tmp_path):
    # Seeds, learning rates and lengths differ; the 4-step member stops and is written out
    # while the others go on.
    cfgs = [cfg_of(tmp_path / "data", seed=0), cfg_of(tmp_path / "data", seed=1, steps=4),
            cfg_of(tmp_path / "data", seed=2, learning_rate=1e-3, data={"seed": 7})]
    cfgs = [dataclasses.replace(c, name=f"m{i}") for i, c in enumerate(cfgs)]
    dirs = [tmp_path / f"e{i}" for i in range(3)]
    summaries = run_ensemble(cfgs, dirs)
    assert [s["status"] for s in summaries] == ["completed"] * 3
    assert [s["step"] for s in summaries] == [6, 4, 6]
    for cfg, workdir, summary in zip(cfgs, dirs, summaries):
        alone = run(cfg, tmp_path / f"alone-{cfg.name}", progress=False)
        assert json.loads((workdir / "config.json").read_text()) == cfg.to_dict()
        lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
        assert [x["step"] for x in lines if "loss" in x][-1] == cfg.total_steps
        # Measured after 6 updates: validation losses equal to the last bit, parameters within
        # 2.2e-6 absolute (7e-4 of the learning rate).
        np.testing.assert_allclose(summary["final_val_loss"], alone["final_val_loss"], rtol=1e-6)
        for a, b in zip(final_params(workdir), final_params(tmp_path / f"alone-{cfg.name}")):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
        # The member's directory is a finished run: a lone rerun is a no-op.
        assert run(cfg, workdir, progress=False)["status"] == "completed"


@pytest.mark.slow
def test_an_interrupted_ensemble_resumes_bitwise(tmp_path):
    cfgs = [dataclasses.replace(cfg_of(tmp_path / "data", seed=s, steps=6), name=f"m{s}")
            for s in range(2)]
    whole = [tmp_path / f"whole{i}" for i in range(2)]
    run_ensemble(cfgs, whole)
    # What a kill right after the step-3 checkpoints leaves: newer checkpoints gone, the
    # summary still running.
    cut = [tmp_path / f"cut{i}" for i in range(2)]
    for a, b in zip(whole, cut):
        shutil.copytree(a, b)
        shutil.rmtree(b / "checkpoints" / "6")
        summary = json.loads((b / "summary.json").read_text())
        (b / "summary.json").write_text(json.dumps({**summary, "status": "running", "step": 3}))
    summaries = run_ensemble(cfgs, cut)
    assert [s["status"] for s in summaries] == ["completed"] * 2
    for a, b in zip(whole, cut):
        for x, y in zip(final_params(a), final_params(b), strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow
def test_a_member_killed_after_its_last_checkpoint_is_completed(tmp_path):
    """Killed between its final checkpoint and its summary (or recorded failed and retried):
    resumed at its last step, the member has no step left, and the ensemble completes it
    rather than leaving it partial forever."""
    cfgs = [dataclasses.replace(cfg_of(tmp_path / "data", seed=s, steps=6), name=f"m{s}")
            for s in range(2)]
    whole = [tmp_path / f"whole{i}" for i in range(2)]
    first = run_ensemble(cfgs, whole)
    summary = json.loads((whole[0] / "summary.json").read_text())
    (whole[0] / "summary.json").write_text(json.dumps({**summary, "status": "running"}))
    summaries = run_ensemble(cfgs, whole)
    assert [s["status"] for s in summaries] == ["completed"] * 2
    assert summaries[0]["final_val_loss"] == first[0]["final_val_loss"]


def test_a_diverging_member_is_frozen_and_the_others_go_on(tmp_path):
    cfgs = [dataclasses.replace(cfg_of(tmp_path / "data", seed=0), name="ok"),
            dataclasses.replace(cfg_of(tmp_path / "data", seed=1, learning_rate=1e30,
                                       grad_clip=0.0, warmup_steps=0), name="bad")]
    with pytest.raises(ConfigError, match="train.grad_clip"):
        run_ensemble(cfgs, [tmp_path / "ok", tmp_path / "bad"])  # another optimizer structure
    cfgs[1] = dataclasses.replace(cfgs[1], train=dataclasses.replace(cfgs[1].train,
                                                                     grad_clip=1.0))
    summaries = run_ensemble(cfgs, [tmp_path / "ok", tmp_path / "bad"])
    assert summaries[0]["status"] == "completed"
    assert summaries[1]["status"] == "diverged" and summaries[1]["diverged_at_step"] <= 3
    alone = run(cfgs[0], tmp_path / "alone", progress=False)
    np.testing.assert_allclose(summaries[0]["final_val_loss"], alone["final_val_loss"],
                               rtol=1e-5)
