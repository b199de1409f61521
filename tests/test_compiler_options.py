"""The suite compiles its programs without most of XLA's optimizations (tests/conftest.py:
JAX_DISABLE_MOST_OPTIMIZATIONS=1, about half the compile time); users' commands compile them
with all. The two must compute the same: a tiny run trained both ways ends at the same losses,
to float32 rounding amplified by 20 training steps."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _train(workdir: Path, disable_most_optimizations: str) -> dict:
    env = {**os.environ, "JAX_DISABLE_MOST_OPTIMIZATIONS": disable_most_optimizations}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # each way compiles its own programs
    done = subprocess.run([sys.executable, "-m", "attnlab.cli", "train", "--config=configs/tiny.py",
                           f"--run={workdir}", "--noprogress"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((workdir / "summary.json").read_text())


@pytest.mark.slow
def test_the_suites_programs_compute_what_a_users_compile(tmp_path):
    optimized = _train(tmp_path / "optimized", "0")
    unoptimized = _train(tmp_path / "unoptimized", "1")
    for key in ("final_train_loss_smoothed", "final_val_loss", "best_val_loss"):
        np.testing.assert_allclose(unoptimized[key], optimized[key], rtol=1e-4, err_msg=key)
    assert optimized["final_val_loss"] < np.log(256)  # it trained
