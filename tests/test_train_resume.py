"""kill -9 at an arbitrary step, rerun the same command: the final parameters equal those of an
uninterrupted run bit for bit, and no checkpoint is left corrupt.

Bitwise holds on CPU because the resumed process restores the exact float32 state (orbax stores
the bytes), batch i is a pure function of i, dropout keys derive from (seed, step), and XLA:CPU
runs the same compiled program deterministically. (On GPUs, non-deterministic reductions would
make this approximate unless XLA's determinism flags are set.)
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from attnlab.train import load_params
from attnlab.train.checkpoint import Checkpoints

# Signals, timings or a machine-wide resource: the slow lane runs these one at a time.
pytestmark = pytest.mark.uncached

ROOT = Path(__file__).resolve().parents[1]
STEPS = 60


def train_command(data_dir, workdir):
    # A checkpoint every 3 steps: a kill very likely lands during an asynchronous save.
    return [sys.executable, "-m", "attnlab.cli", "train", "--config=configs/tiny.py",
            f"--config.data.cache_dir={data_dir}", "--config.data.max_bytes=200000",
            f"--config.train.steps={STEPS}", "--config.train.log_every=1",
            "--config.train.eval_every=30", "--config.train.eval_batches=2",
            "--config.train.checkpoint_every=3", "--config.train.keep_checkpoints=2",
            f"--run={workdir}"]


def start(command, log: Path, env) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait(proc, timeout=300) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def logged_step(workdir: Path) -> int:
    try:
        lines = (workdir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    steps = [json.loads(line)["step"] for line in lines if line.endswith("}")]
    return max(steps, default=0)


def assert_checkpoints_readable(directory: Path):
    with Checkpoints(directory, keep=2, read_only=True) as checkpoints:
        steps = checkpoints.all_steps()
        for step in steps:
            meta = checkpoints.read_meta(step)
            assert meta["step"] == step
            params = checkpoints.restore_params(step, *_abstract(directory.parent))
            assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))
    return steps


def _abstract(workdir: Path):
    from attnlab.train.load import load_config
    from attnlab.train.state import abstract_model

    _, abstract = abstract_model(load_config(workdir))
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return abstract, jax.tree.map(lambda _: sharding, abstract)


@pytest.mark.slow
def test_kill_9_then_rerun_equals_uninterrupted(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", ATTNLAB_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("XLA_FLAGS", None)
    data_dir = tmp_path / "data"
    reference, victim = tmp_path / "reference", tmp_path / "victim"

    # The reference run also builds the data cache; the victim starts once it has.
    ref = start(train_command(data_dir, reference), tmp_path / "reference.log", env)
    while logged_step(reference) == 0 and ref.poll() is None:
        time.sleep(0.2)
    seed = int(time.time())
    kill_at = random.Random(seed).randint(5, STEPS - 10)
    proc = start(train_command(data_dir, victim), tmp_path / "victim.log", env)
    while logged_step(victim) < kill_at and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_after = logged_step(victim)
    partial = sorted(p.name for p in (victim / "checkpoints").iterdir() if not p.name.isdigit())
    context = (f"seed {seed}: killed at step {killed_after} (asked {kill_at}); unfinished "
               f"checkpoint directories at the kill: {partial}")
    assert proc.returncode == -signal.SIGKILL, context
    assert killed_after < STEPS, context

    survivors = assert_checkpoints_readable(victim / "checkpoints")
    assert json.loads((victim / "summary.json").read_text())["status"] == "running", context

    rerun = start(train_command(data_dir, victim), tmp_path / "rerun.log", env)
    assert wait(rerun) == 0, (tmp_path / "rerun.log").read_text()[-3000:]
    assert wait(ref) == 0
    log = (tmp_path / "rerun.log").read_text()
    if survivors:
        assert f"resuming {victim} from step {max(survivors)}/{STEPS}" in log, context

    _, _, want = load_params(reference)
    _, _, got = load_params(victim)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=context)
    summary = json.loads((victim / "summary.json").read_text())
    want_summary = json.loads((reference / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["final_val_loss"] == want_summary["final_val_loss"], context
    assert assert_checkpoints_readable(victim / "checkpoints") == [57, 60]
    leftovers = [p.name for p in (victim / "checkpoints").iterdir()
                 if not p.name.isdigit()]
    assert leftovers == [], f"{context}: temporary checkpoint directories left: {leftovers}"
    lines = [json.loads(x) for x in (victim / "metrics.jsonl").read_text().splitlines()]
    keys = [(r["step"], "val_loss" in r) for r in lines]
    assert len(keys) == len(set(keys)), f"{context}: a step was logged twice"
