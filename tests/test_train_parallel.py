"""Data parallel + FSDP on 8 simulated CPU devices, and 2 processes with gloo collectives, each
against a single-device run of the same config.

XLA_FLAGS must be set before JAX is imported, so every run here is a subprocess. Tolerance: the
sharded and multi-process steps sum the batch and the gradients in another order, so they agree
to float32 rounding amplified by Adam, not bitwise. Measured after 6 steps: parameters differ by
at most 1.3e-5 (8-device FSDP) and 3.4e-6 (2 processes), per-step losses by 3e-7 relative; the
asserted bounds are 1e-4 absolute (3% of one step's lr of 3e-3) and 1e-5 relative.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from attnlab.train import load_params

ROOT = Path(__file__).resolve().parents[1]
STEPS = 6
PARAM_ATOL = 1e-4
LOSS_RTOL = 1e-5


def train_args(data_dir, workdir, *extra):
    return ["-m", "attnlab.cli", "train", "--config=configs/tiny.py",
            f"--config.data.cache_dir={data_dir}", "--config.data.max_bytes=200000",
            f"--config.train.steps={STEPS}", "--config.train.log_every=1",
            "--config.train.eval_every=6", "--config.train.checkpoint_every=6",
            "--config.train.eval_batches=2", f"--run={workdir}", *extra]


def env_with_devices(n: int, tmp_path) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n}"
    env["JAX_PLATFORMS"] = "cpu"
    env["ATTNLAB_CACHE_DIR"] = str(tmp_path / "cache")  # the MFU probe's cache
    return env


def start(args, env, log: Path):
    """Starts a run whose output goes to a file (two processes writing into pipes that are read
    one after the other could block each other)."""
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, text=True,
                                stdout=out, stderr=subprocess.STDOUT)
    proc.log = log
    return proc


def finish(proc, timeout=300, expect=0) -> str:
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = proc.log.read_text()
    assert proc.returncode == expect, out[-3000:]
    return out


def losses(workdir: Path) -> np.ndarray:
    lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return np.array([r["loss"] for r in lines if "loss" in r])


def assert_same_run(reference: Path, other: Path):
    np.testing.assert_allclose(losses(other), losses(reference), rtol=LOSS_RTOL)
    _, _, want = load_params(reference)
    _, _, got = load_params(other)
    worst = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)))
    assert worst < PARAM_ATOL, worst


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir):
    """A single-device run (built first: it also prepares the shared data cache)."""
    tmp = tmp_path_factory.mktemp("reference")
    finish(start(train_args(data_dir, tmp / "run"), env_with_devices(1, tmp), tmp / "log"))
    return tmp / "run"


# A check run inside the 8-device process: the FSDP specs really split the tensors.
SHARDING_CHECK = textwrap.dedent("""
    import sys, jax
    from attnlab import cli
    from attnlab.train.load import load_config
    from attnlab.train.optimizer import make_optimizer
    from attnlab.train.sharding import make_mesh, state_shardings
    from attnlab.train.state import init_train_state, abstract_train_state
    assert jax.device_count() == 8
    code = cli.main(sys.argv[1:])
    workdir = next(a for a in sys.argv if a.startswith("--run=")).split("=", 1)[1]
    cfg = load_config(workdir)
    tx, _ = make_optimizer(cfg.train, cfg.total_steps, cfg.model.d_model)
    mesh = make_mesh(cfg)
    shardings = state_shardings(abstract_train_state(cfg, tx), mesh)
    state = jax.jit(lambda: init_train_state(cfg, tx), out_shardings=shardings)()
    table = state.params["token_embedding"][...]
    print("MESH", dict(mesh.shape), "TABLE", table.shape,
          "SHARD", table.addressable_shards[0].data.shape)
    sys.exit(code)
""")


def test_sharded_step_matches_single_device(reference, data_dir, tmp_path):
    """8 devices as a (data=2, fsdp=4) mesh: parameters and Adam moments split 4 ways, batch
    rows 8 ways."""
    args = ["-c", SHARDING_CHECK, *train_args(data_dir, tmp_path / "run",
                                              "--config.train.mesh_fsdp=4")[2:]]
    out = finish(start(args, env_with_devices(8, tmp_path), tmp_path / "log"))
    assert "MESH {'data': 2, 'fsdp': 4, 'expert': 1} TABLE (256, 32) SHARD (64, 32)" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["device"]["count"] == 8
    assert summary["device"]["mesh"] == {"data": 2, "fsdp": 4, "expert": 1}
    assert_same_run(reference, tmp_path / "run")


def test_batch_that_does_not_divide_over_devices_is_refused(data_dir, tmp_path):
    proc = start(train_args(data_dir, tmp_path / "run", "--config.data.batch_size=12"),
                 env_with_devices(8, tmp_path), tmp_path / "log")
    out = finish(proc, expect=2)
    assert ("error: config.data.batch_size: the micro-batch batch_size / grad_accum = 12 / 1 = 12 "
            "does not divide over 8 devices") in out
    assert not (tmp_path / "run").exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one(reference, data_dir, tmp_path):
    """Two CPU processes (one device each, gloo collectives) share one workdir; process 0 writes
    the files, both write their shards of the checkpoint."""
    workdir = tmp_path / "run"
    coordinator = f"127.0.0.1:{free_port()}"
    procs = [start(train_args(data_dir, workdir, "--config.train.distributed=true",
                              f"--config.train.coordinator_address={coordinator}",
                              "--config.train.num_processes=2",
                              f"--config.train.process_id={i}", "--progress=false"),
                   env_with_devices(1, tmp_path), tmp_path / f"log{i}")
             for i in range(2)]
    for proc in procs:
        finish(proc)
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["device"]["processes"] == 2 and summary["device"]["count"] == 2
    assert_same_run(reference, workdir)
