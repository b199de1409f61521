"""A disk that fills while `attnlab train` runs: nothing is lost.

The run trains into a tiny tmpfs until a write fails (a checkpoint, the metrics, the summary:
whichever comes first). Then: one line naming the path and the OS's reason, exit 2, no
traceback; the latest complete checkpoint restores and equals an uninterrupted run's at that
step; and once space is freed (the tmpfs grown), the same command resumes and finishes with an
uninterrupted run's result. Needs root and a kernel that lets this process mount a tmpfs;
skipped otherwise."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from attnlab import results, rundir

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, JAX_PLATFORMS="cpu")
# Every checkpoint kept, so that the reference has the step the full disk stopped at; each is
# ~0.55 MB for configs/tiny.py, so 1.4 MB fills at the second or third of four.
TRAIN = ["train", "--config=configs/tiny.py", "--config.train.steps=40",
         "--config.train.checkpoint_every=10", "--config.train.keep_checkpoints=10",
         "--noprogress"]
TINY_DISK = "1400k"


def _attnlab(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnlab.cli", *argv], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture
def tiny_disk(tmp_path):
    """A tmpfs of TINY_DISK at tmp_path/disk; ``grow()`` frees space (remounts it larger)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TINY_DISK}", "tmpfs",
                           str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root and mount rights): "
                    f"{done.stderr.strip()}")

    def grow():
        subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)

    try:
        yield mount, grow
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _steps(workdir: pathlib.Path) -> list[int]:
    return sorted(int(p.name) for p in (workdir / rundir.CHECKPOINT_DIR).iterdir()
                  if p.name.isdigit())


def _params(workdir, step=None):
    import jax

    from attnlab.train import load_params

    return [np.asarray(x) for x in jax.tree.leaves(load_params(workdir, step)[2])]


@pytest.mark.slow
def test_a_full_disk_stops_train_in_one_line_and_the_rerun_finishes(tiny_disk, tmp_path):
    mount, grow = tiny_disk
    reference = tmp_path / "reference"
    done = _attnlab(*TRAIN, f"--workdir={reference}")
    assert done.returncode == 0, done.stderr

    workdir = mount / "run"
    full = _attnlab(*TRAIN, f"--workdir={workdir}")
    lines = full.stderr.strip().splitlines()
    assert full.returncode == 2, full.stderr
    assert "Traceback" not in full.stderr and "ERROR" not in full.stderr, full.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot write {mount}/"), lines
    assert lines[0].endswith(": No space left on device"), lines
    assert results.run_status(workdir) == "partial"  # resumable, not failed

    # The latest complete checkpoint is intact: it restores, and it is the reference's.
    complete = _steps(workdir)
    assert complete and complete[-1] < 40, complete
    for got, want in zip(_params(workdir, complete[-1]), _params(reference, complete[-1])):
        np.testing.assert_array_equal(got, want)

    grow()
    # (with progress lines, which say where it resumes)
    rerun = _attnlab(*[a for a in TRAIN if a != "--noprogress"], f"--workdir={workdir}")
    assert rerun.returncode == 0, rerun.stderr
    assert f"resuming {workdir} from step {complete[-1]}/40" in rerun.stderr, rerun.stderr
    summary = json.loads((workdir / rundir.SUMMARY_FILE).read_text())
    want = json.loads((reference / rundir.SUMMARY_FILE).read_text())
    assert summary["status"] == "completed"
    assert summary["final_val_loss"] == want["final_val_loss"]
    for got, ref in zip(_params(workdir), _params(reference)):
        np.testing.assert_array_equal(got, ref)
    # Every step logged once; no orbax temporary left among the checkpoints.
    steps = [r["step"] for r in rundir.read_metrics(workdir / rundir.METRICS_FILE)
             if "loss" in r]
    assert steps == sorted(set(steps)), steps
    assert _steps(workdir) == _steps(reference)
    assert sorted(p.name for p in (workdir / rundir.CHECKPOINT_DIR).iterdir()) == [
        str(s) for s in _steps(reference)]
