"""Ensembles split over devices: the member axis of an
``('ensemble', 'data', 'fsdp', 'expert')`` mesh.

The invariant: sharded = unsharded. On 8 simulated CPU devices (a subprocess: XLA_FLAGS must be
set before JAX starts) 4 members are split into 4 groups of 2 devices (each group a lone run's
data-parallel mesh); one step equals the unsharded ensemble's to float32 rounding, and a whole
sharded ensemble follows the runs trained alone on one device to the tolerances of
tests/test_train_parallel.py (the batch and the gradients are summed in another order).
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from attnlab.train import load_params, run

# A 90-second subprocess on 8 simulated devices: sharded = unsharded for plain runs is checked in
# the default lane by tests/test_train_parallel.py; the sharded ensemble runs in the slow lane.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import dataclasses, json, sys
    import jax, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    sys.path.insert(0, {tests!r})
    from test_train_ensemble import assert_close, cfg_of, random_batches
    from attnlab.model import init_model
    from attnlab.train.ensemble import make_ensemble_step, run_ensemble, stack
    from attnlab.train.optimizer import optimizer_for
    from attnlab.train.sharding import ensemble_mesh
    from attnlab.train.state import init_train_state

    assert jax.device_count() == 8
    # Two learning rates: the members' updates are not one vmapped optimizer.
    cfgs = [cfg_of(seed=s, learning_rate=1e-3 * (1 + s % 2)) for s in range(4)]
    graphdef, _ = init_model(cfgs[0].model, 0)
    initial = stack([init_train_state(c, optimizer_for(c)[0], jax.random.key(c.train.seed))
                     for c in cfgs])
    batches = jnp.stack(random_batches(cfgs))
    mesh = ensemble_mesh(cfgs[0], len(cfgs))
    layout = {{"mesh": dict(mesh.shape)}}
    for members in ("vmap", "map"):
        want = jax.jit(make_ensemble_step(cfgs, graphdef, members=members))(
            initial, batches, jnp.ones(4, bool))
        on = lambda *spec: NamedSharding(mesh, P(*spec))
        got = jax.jit(make_ensemble_step(cfgs, graphdef, members=members, mesh=mesh))(
            jax.device_put(initial, on("ensemble")),
            jax.device_put(batches, on("ensemble", None, ("data", "fsdp"))), jnp.ones(4, bool))
        assert_close(want[1], got[1], 1e-6)
        assert_close(want[0].params, got[0].params, 1e-6, 3e-6)
        leaf = jax.tree.leaves(got[0].params)[0]
        layout[members] = [leaf.shape[0], leaf.addressable_shards[0].data.shape[0]]

    data, out = sys.argv[1], sys.argv[2]
    cfgs = [dataclasses.replace(cfg_of(data, seed=s), name=f"m{{s}}") for s in range(4)]
    summaries = run_ensemble(cfgs, [f"{{out}}/m{{s}}" for s in range(4)])
    layout["status"] = [s["status"] for s in summaries]
    print("LAYOUT", json.dumps(layout))
""")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """Runs the script on 8 devices; returns (its layout report, the members' directory)."""
    tmp = tmp_path_factory.mktemp("sharded")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu", ATTNLAB_CACHE_DIR=str(tmp / "cache"))
    script = SCRIPT.format(tests=str(ROOT / "tests"))
    done = subprocess.run([sys.executable, "-c", script, str(tmp / "data"), str(tmp / "runs")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("LAYOUT "))
    return json.loads(line.split(" ", 1)[1]), tmp


def test_the_members_are_split_over_device_groups(sharded):
    layout, _ = sharded
    assert layout["mesh"] == {"ensemble": 4, "data": 2, "fsdp": 1, "expert": 1}
    # Each device holds one member's parameters ([4, ...] split 4 ways), for either member loop;
    # both steps equal the unsharded ensemble's (asserted in the script).
    assert layout["vmap"] == [4, 1] and layout["map"] == [4, 1]
    assert layout["status"] == ["completed"] * 4


def test_a_sharded_ensemble_member_is_the_run_trained_alone(sharded, tmp_path):
    from test_train_ensemble import cfg_of

    _, tmp = sharded
    for s in (0, 3):
        cfg = cfg_of(tmp / "data", seed=s)
        alone = run(cfg, tmp_path / f"alone{s}", progress=False)
        summary = json.loads((tmp / "runs" / f"m{s}" / "summary.json").read_text())
        np.testing.assert_allclose(summary["final_val_loss"], alone["final_val_loss"],
                                   rtol=1e-5)
        _, _, want = load_params(tmp_path / f"alone{s}")
        _, _, got = load_params(tmp / "runs" / f"m{s}")
        for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-4)
