"""A mixture of experts under data parallelism and FSDP: sharded = unsharded.

On 8 simulated CPU devices (a subprocess: XLA_FLAGS must be set before JAX starts), two train
steps of an MoE (capacity dispatch, SwiGLU experts, a shared expert) on a ('data' 4, 'fsdp' 2)
mesh, its parameters and Adam moments split by the FSDP rule (the experts' [E, d, width]
tensors too), equal the same steps on one device: the losses and routing statistics to 1e-5
relative, the parameters to 1e-4 absolute, the bound of tests/test_train_parallel.py (the batch
and the gradients are summed in another order, and Adam's first steps turn a rounding
difference in a near-zero gradient into up to one step's lr). The capacity is over the global
micro-batch either way, so the same tokens are dropped.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding
    from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
    from attnlab.model import init_model
    from attnlab.train.optimizer import optimizer_for
    from attnlab.train.sharding import TRAIN_BATCH_SPEC, make_mesh, state_shardings
    from attnlab.train.state import init_train_state
    from attnlab.train.step import make_train_step

    assert jax.device_count() == 8
    model = ModelConfig(vocab_size=256, d_model=32, n_layers=2, n_heads=2, ffn="swiglu",
                        d_ff=32, moe="token_choice", moe_experts=4, moe_top_k=2,
                        moe_shared_experts=1, moe_capacity_factor=1.0)
    cfg = Config(model=model, data=DataConfig(seq_len=16, batch_size=16),
                 train=TrainConfig(steps=10, warmup_steps=1, mesh_fsdp=2))
    tx, schedule = optimizer_for(cfg)
    graphdef, _ = init_model(cfg.model, 0)
    state = init_train_state(cfg, tx, jax.random.key(0))
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 256, (1, 16, 17), dtype=np.int32) for _ in range(2)]
    step = make_train_step(cfg, graphdef, tx, schedule)

    def two_steps(step_fn, state, put):
        out = []
        for b in batches:
            state, metrics = step_fn(state, put(b))
            out.append(jax.device_get(metrics))
        return jax.device_get(state.params), out

    want_params, want = two_steps(jax.jit(step), state, jnp.asarray)
    mesh = make_mesh(cfg)
    shardings = state_shardings(jax.eval_shape(lambda: state), mesh)
    batch_sharding = NamedSharding(mesh, TRAIN_BATCH_SPEC)
    sharded = jax.jit(step, in_shardings=(shardings, batch_sharding),
                      out_shardings=(shardings, None))
    w_in = [x for p, x in jax.tree_util.tree_leaves_with_path(shardings.params)
            if "w_in" in jax.tree_util.keystr(p) and "ffn" in jax.tree_util.keystr(p)][0]
    assert "fsdp" in str(w_in.spec), w_in.spec  # the experts' tensors are split
    got_params, got = two_steps(sharded, jax.device_put(state, shardings),
                                lambda b: jax.device_put(b, batch_sharding))
    assert dict(mesh.shape) == {"data": 4, "fsdp": 2, "expert": 1}
    assert want[0]["moe_dropped"].max() > 0  # the capacity drops something
    for w, g in zip(want, got):
        for key in w:
            np.testing.assert_allclose(g[key], w[key], rtol=1e-5, atol=1e-6, err_msg=key)
    for w, g in zip(jax.tree.leaves(want_params), jax.tree.leaves(got_params)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    print("OK")
""")


def test_sharded_moe_steps_equal_the_single_device_steps(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu", ATTNLAB_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().endswith("OK")
