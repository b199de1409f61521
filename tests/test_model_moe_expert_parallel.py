"""Expert parallelism: a mixture of experts with its experts split over the mesh's ``expert``
axis (attnlab.model.moe_dispatch.expert_parallel) computes what it computes on one device.

On 8 simulated CPU devices (a subprocess: XLA_FLAGS must be set before JAX starts), a
('data' 2, 'fsdp' 2, 'expert' 2) mesh, the experts' [E, ...] tensors split over 'expert' and
FSDP beside it:

* with a capacity that can drop nothing (``capacity_factor = E / k``: every device's buffers
  hold all its tokens), the loss, the routing statistics, the gradients and two Adam steps
  equal the single-device ones (bounds of tests/test_model_moe_sharded.py: the batch and the
  gradients are summed in another order);
* with dropping, each device's capacity covers its own tokens (GShard's groups): the layer's
  output equals the single-device layer run on each device's block of the batch in turn;
* the compiled train step exchanges tokens by all-to-all: two per MoE layer forward, two back.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import re, sys
    import jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec as P
    from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
    from attnlab.model import init_model
    from attnlab.checks import check
    from attnlab.train.optimizer import optimizer_for
    from attnlab.train.programs import traced_on
    from attnlab.train.sharding import TRAIN_BATCH_SPEC, make_mesh, state_shardings
    from attnlab.train.state import init_train_state
    from attnlab.train.step import loss_grad_fn, make_train_step
    from attnlab.model.objectives import masking_key

    assert jax.device_count() == 8
    E, K = 4, 2
    scan, with_steps = sys.argv[1] == "scan", sys.argv[2] == "steps"

    def config(capacity_factor, **train):  # 16 x 16 tokens, 32 on each device
        model = ModelConfig(vocab_size=256, d_model=32, n_layers=1 + scan, n_heads=2,
                            ffn="swiglu",
                            d_ff=32, moe="token_choice", moe_experts=E, moe_top_k=K,
                            moe_shared_experts=1, moe_capacity_factor=capacity_factor,
                            linear_bias=True, scan_layers=scan)
        return Config(model=model, data=DataConfig(seq_len=16, batch_size=16),
                      train=TrainConfig(steps=10, warmup_steps=1, **train))

    cfg = config(E / K, mesh_fsdp=2, mesh_expert=2)  # no token can be dropped
    check(cfg)
    mesh = make_mesh(cfg)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "expert": 2}
    tx, schedule = optimizer_for(cfg)
    graphdef, _ = init_model(cfg.model, 0)
    state = init_train_state(cfg, tx, jax.random.key(0))
    shardings = state_shardings(jax.eval_shape(lambda: state), mesh)
    specs = {jax.tree_util.keystr(p): x.spec
             for p, x in jax.tree_util.tree_leaves_with_path(shardings.params)}
    for name in ("w_in", "w_gate", "w_out", "bias_in", "bias_out"):
        spec = [s for p, s in specs.items() if f"['ffn']['{name}']" in p][0]
        assert spec[int(scan)] == "expert", (name, spec)
    assert any("fsdp" in str(s) for p, s in specs.items() if "['ffn']['w_in']" in p)
    batch_sharding = NamedSharding(mesh, TRAIN_BATCH_SPEC)
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 256, (1, 16, 17), dtype=np.int32) for _ in range(2)]

    # loss, routing statistics and gradients
    grads = loss_grad_fn(graphdef)
    key = masking_key(0, 0)
    want_m, want_g = jax.jit(grads)(state.params, jnp.asarray(batches[0][0]), None, key)
    tokens = NamedSharding(mesh, P(("data", "fsdp", "expert")))
    sharded_grads = jax.jit(traced_on(mesh, grads),
                            in_shardings=(shardings.params, tokens, None, None))
    placed = (jax.device_put(state.params, shardings.params),
              jax.device_put(batches[0][0], tokens), None, key)
    hlo = sharded_grads.lower(*placed).compile().as_text()
    # the buffers there and back, forward and backward: in each layer, or in the scan's bodies
    assert len(re.findall(r"all-to-all\\(", hlo)) == 4 * (1 if scan else cfg.model.n_layers)
    got_m, got_g = sharded_grads(*placed)
    for k in want_m:
        np.testing.assert_allclose(got_m[k], want_m[k], rtol=1e-5, atol=1e-6, err_msg=k)
    for w, g in zip(jax.tree.leaves(want_g), jax.tree.leaves(got_g)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)

    # with dropping: each device's capacity covers its own tokens (the grads run only)
    if not with_steps:
        dropping = config(1.0, mesh_fsdp=2, mesh_expert=2)
        d_graphdef, d_params = init_model(dropping.model, 0)
        layer = nnx.merge(d_graphdef, d_params).blocks[0].ffn
        x = jax.random.normal(jax.random.key(1), (16, 16, 32))
        x = x.at[:, :, 0].add(3.0 * jnp.arange(16)[:, None] / 16)  # devices route differently
        rows = NamedSharding(mesh, P(("data", "fsdp", "expert")))
        run = jax.jit(traced_on(mesh, lambda x: layer(x)), in_shardings=rows)
        got = run(jax.device_put(x, rows))
        per_device = jnp.concatenate([layer(x[i:i + 2]) for i in range(0, 16, 2)])
        np.testing.assert_allclose(got, per_device, rtol=1e-5, atol=1e-6)
        assert float(jnp.max(jnp.abs(layer(x) - per_device))) > 1e-3  # the groups matter here

    # two train steps (Adam: the gradients' rounding matters more)
    if not with_steps:
        print("OK")
        sys.exit()
    step = make_train_step(cfg, graphdef, tx, schedule)

    def two_steps(step_fn, state, put):
        out = []
        for b in batches:
            state, metrics = step_fn(state, put(b))
            out.append(jax.device_get(metrics))
        return jax.device_get(state.params), out

    want_params, want = two_steps(jax.jit(step), state, jnp.asarray)
    sharded = jax.jit(traced_on(mesh, step), in_shardings=(shardings, batch_sharding),
                      out_shardings=(shardings, None))
    placed = jax.device_put(state, shardings)
    got_params, got = two_steps(sharded, placed, lambda b: jax.device_put(b, batch_sharding))
    assert want[0]["moe_dropped"].max() == 0
    for w, g in zip(want, got):
        for k in w:
            np.testing.assert_allclose(g[k], w[k], rtol=1e-5, atol=1e-6, err_msg=k)
    for w, g in zip(jax.tree.leaves(want_params), jax.tree.leaves(got_params)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)

    print("OK")
""")


# An ensemble's members step inside a shard_map over the member axis; there the MoE takes the
# unsplit dispatch (attnlab.model.moe_dispatch.expert_mesh) on the experts laid out split.
ENSEMBLE = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
    from attnlab.model import init_model
    from attnlab.train.ensemble import make_ensemble_step, stack
    from attnlab.train.optimizer import optimizer_for
    from attnlab.train.sharding import ensemble_mesh
    from attnlab.train.state import init_train_state

    model = ModelConfig(vocab_size=256, d_model=32, n_layers=1, n_heads=2, moe="token_choice",
                        moe_experts=4, moe_top_k=2, moe_capacity_factor=1.0)
    cfgs = [Config(model=model, data=DataConfig(seq_len=16, batch_size=8),
                   train=TrainConfig(steps=10, warmup_steps=1, seed=s, mesh_expert=2))
            for s in range(2)]
    graphdef, _ = init_model(model, 0)
    initial = stack([init_train_state(c, optimizer_for(c)[0], jax.random.key(s))
                     for s, c in enumerate(cfgs)])
    batches = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 1, 8, 17), np.int32))
    mesh = ensemble_mesh(cfgs[0], 2)
    assert dict(mesh.shape) == {"ensemble": 2, "data": 2, "fsdp": 1, "expert": 2}
    want = jax.jit(make_ensemble_step(cfgs, graphdef, members="map"))(
        initial, batches, jnp.ones(2, bool))
    on = lambda *spec: NamedSharding(mesh, P(*spec))
    got = jax.jit(make_ensemble_step(cfgs, graphdef, members="map", mesh=mesh))(
        jax.device_put(initial, on("ensemble")),
        jax.device_put(batches, on("ensemble", None, ("data", "fsdp", "expert"))),
        jnp.ones(2, bool))
    for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    print("OK")
""")


def run_script(tmp_path, *args, script=SCRIPT):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu", ATTNLAB_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().endswith("OK")


@pytest.mark.slow
def test_expert_parallel_equals_one_device(tmp_path):
    """Loss, routing statistics, gradients; dropping per device; all-to-all in the program."""
    run_script(tmp_path, "unrolled", "grads")


@pytest.mark.slow
@pytest.mark.parametrize("layers", ["unrolled", "scan"])
def test_expert_parallel_train_steps_equal_one_device(tmp_path, layers):
    run_script(tmp_path, layers, "steps")


@pytest.mark.slow
def test_an_ensemble_of_moe_members_with_an_expert_axis_equals_one_device(tmp_path):
    run_script(tmp_path, script=ENSEMBLE)


# Dropless dispatch with the experts split (attnlab.model.moe_dispatch.dropless_expert_parallel): nothing
# is dropped, so the sharded layer, loss, statistics and gradients equal one device's on the
# whole batch, however unevenly the devices route.
DROPLESS = textwrap.dedent("""
    import re
    import jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec as P
    from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
    from attnlab.model import init_model
    from attnlab.checks import check
    from attnlab.model.objectives import masking_key
    from attnlab.train.optimizer import optimizer_for
    from attnlab.train.programs import traced_on
    from attnlab.train.sharding import make_mesh, state_shardings
    from attnlab.train.state import init_train_state
    from attnlab.train.step import loss_grad_fn

    model = ModelConfig(vocab_size=256, d_model=32, n_layers=2, n_heads=2, ffn="swiglu", d_ff=32,
                        moe="token_choice", moe_experts=8, moe_top_k=2, moe_shared_experts=1,
                        moe_dispatch="dropless", linear_bias=True)
    cfg = Config(model=model, data=DataConfig(seq_len=16, batch_size=16),
                 train=TrainConfig(steps=10, warmup_steps=1, mesh_expert=4))
    check(cfg)
    mesh = make_mesh(cfg)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 1, "expert": 4}
    rows = NamedSharding(mesh, P(("data", "fsdp", "expert")))

    # the layer, with devices routing very differently (a shift growing along the batch)
    graphdef, params = init_model(model, 0)
    layer = nnx.merge(graphdef, params).blocks[0].ffn
    x = jax.random.normal(jax.random.key(1), (16, 16, 32))
    x = x.at[:, :, 0].add(4.0 * jnp.arange(16)[:, None] / 16)
    run = jax.jit(traced_on(mesh, lambda x: layer(x)), in_shardings=rows)
    hlo = run.lower(jax.device_put(x, rows)).compile().as_text()
    assert re.findall(r"all-to-all\\(", hlo), "no all-to-all in the sharded layer"
    np.testing.assert_allclose(run(jax.device_put(x, rows)), layer(x), rtol=1e-5, atol=1e-6)

    # loss, routing statistics and gradients of the whole model
    tx, _ = optimizer_for(cfg)
    state = init_train_state(cfg, tx, jax.random.key(0))
    shardings = state_shardings(jax.eval_shape(lambda: state), mesh)
    batch = np.random.default_rng(0).integers(0, 256, (16, 17), dtype=np.int32)
    grads = loss_grad_fn(graphdef)
    key = masking_key(0, 0)
    want_m, want_g = jax.jit(grads)(state.params, jnp.asarray(batch), None, key)
    sharded = jax.jit(traced_on(mesh, grads), in_shardings=(shardings.params, rows, None, None))
    got_m, got_g = sharded(jax.device_put(state.params, shardings.params),
                           jax.device_put(batch, rows), None, key)
    for k in want_m:
        np.testing.assert_allclose(got_m[k], want_m[k], rtol=1e-5, atol=1e-6, err_msg=k)
    for w, g in zip(jax.tree.leaves(want_g), jax.tree.leaves(got_g)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
    print("OK")
""")


def test_dropless_expert_parallel_equals_one_device(tmp_path):
    run_script(tmp_path, script=DROPLESS)
