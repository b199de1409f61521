"""A disk that fills while `attnlab train` runs: nothing is lost.

The run trains into a tiny tmpfs until a write fails (a checkpoint, the metrics, the summary:
whichever comes first). Then: one line naming the path and the OS's reason, exit 2, no
traceback; the latest complete checkpoint restores and equals an uninterrupted run's at that
step; and once space is freed (the tmpfs grown), the same command resumes and finishes with an
uninterrupted run's result. Needs root and a kernel that lets this process mount a tmpfs;
skipped otherwise."""

import errno
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from attnlab import results, rundir

# Signals, timings or a machine-wide resource: the slow lane runs these one at a time.
pytestmark = pytest.mark.uncached

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
    done = _attnlab(*TRAIN, f"--run={reference}")
    assert done.returncode == 0, done.stderr

    workdir = mount / "run"
    full = _attnlab(*TRAIN, f"--run={workdir}")
    # what a run logs first (attnlab.train.environment.run_lines), then the one error line
    lines = [line for line in full.stderr.strip().splitlines()
             if not line.startswith(("python ", "backend ", "MFU peak: "))]
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
    rerun = _attnlab(*[a for a in TRAIN if a != "--noprogress"], f"--run={workdir}")
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


def test_write_failure_names_the_path_and_the_reason():
    """What the full-disk test relies on, without a disk to fill: an OS write error, or
    tensorstore's report of one from inside orbax (a checkpoint named by its step's directory),
    becomes one WriteError line; anything else is not one."""
    enospc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/runs/a/metrics.jsonl")
    assert str(rundir.write_failure(enospc)) == (
        "cannot write /runs/a/metrics.jsonl: No space left on device")
    unnamed = OSError(errno.EROFS, os.strerror(errno.EROFS))
    assert str(rundir.write_failure(unnamed, "/runs/a")) == (
        "cannot write /runs/a: Read-only file system")
    orbax = ValueError(
        'RESOURCE_EXHAUSTED: Error writing "opt_state.1.0.mu.kernel/0.0" in OCDBT database at '
        'local file "/runs/a/checkpoints/30.orbax-checkpoint-tmp/opt_state.orbax-checkpoint-tmp'
        '/ocdbt.process_0/": Failed writing: "/runs/a/checkpoints/30.orbax-checkpoint-tmp/d/'
        'de6e": Failed to write 69320 bytes to file 14: No space left on device '
        "[os_error_code='28']")
    try:
        try:
            raise orbax
        except ValueError as e:
            raise RuntimeError("a save failed") from e
    except RuntimeError as wrapped:
        assert str(rundir.write_failure(wrapped)) == (
            "cannot write /runs/a/checkpoints/30: No space left on device")
    assert rundir.write_failure(OSError(errno.ENOENT, "No such file or directory")) is None
    assert rundir.write_failure(ValueError("OUT_OF_RANGE: [os_error_code='2']")) is None
    assert rundir.write_failure(KeyboardInterrupt()) is None


def _sweep(workdir, cache_dir) -> subprocess.CompletedProcess:
    return _attnlab("sweep", "--config=experiments/tiny_grid.py", f"--sweep={workdir}",
                    f"--cache-dir={cache_dir}", "--parallel=1", "--noprogress")


@pytest.mark.slow
def test_a_full_disk_stops_a_sweep_in_one_line_and_the_rerun_completes_it(tiny_disk, tmp_path):
    """tiny_grid (4 runs, ~3.5 MB) into the 1.4 MB disk: it stops at the first write refused,
    in one line, with no run marked failed; grown, the same command completes every run with an
    uninterrupted sweep's results."""
    mount, grow = tiny_disk
    cache_dir = tmp_path / "jax_cache"  # off the tiny disk, as a shared cache would be
    reference = tmp_path / "reference"
    assert _sweep(reference, cache_dir).returncode == 0

    workdir = mount / "sweep"
    full = _sweep(workdir, cache_dir)
    lines = full.stderr.strip().splitlines()
    assert full.returncode == 2, full.stderr
    assert "Traceback" not in full.stderr and "ERROR" not in full.stderr, full.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot write {mount}/"), lines
    assert lines[0].endswith(": No space left on device"), lines
    statuses = [rundir.run_status(d) for d in (workdir / rundir.RUNS_DIR).iterdir()]
    assert rundir.FAILED not in statuses and "partial" in statuses, statuses

    grow()
    rerun = _sweep(workdir, cache_dir)
    assert rerun.returncode == 0, rerun.stderr
    table, want = results.load(workdir), results.load(reference)
    assert set(table["status"]) == {"completed"} and len(table) == len(want) == 4
    assert not list(workdir.glob("runs/*/failure*.json"))
    merged = table.merge(want, on="run_id", suffixes=("", "_ref"))
    for column in ("final_val_loss", "tokens", "steps"):
        np.testing.assert_allclose(merged[column].astype(float),
                                   merged[f"{column}_ref"].astype(float), rtol=1e-6)


# A tensorstore future awaited on a loop that closes before the future completes: what the
# step's other writes do once orbax's commit has ended on the first failed one. Then an
# unrelated unraisable exception, which must still be reported.
_LATE_CALLBACK = """
import asyncio, sys, threading
import tensorstore as ts
if sys.argv[1] == "attnlab":
    import attnlab.train.checkpoint
promise, future = ts.Promise.new()
async def wait_a_little():
    task = asyncio.ensure_future(future)
    await asyncio.wait([task], timeout=0.01)
    return task
loop = asyncio.new_event_loop()
task = loop.run_until_complete(wait_a_little())
loop.close()
writer = threading.Thread(target=lambda: promise.set_result(1))
writer.start()
writer.join()
class Broken:
    def __del__(self):
        raise ValueError("an unrelated report")
Broken()
"""


@pytest.mark.parametrize("imported", ["attnlab", "bare"])
def test_late_storage_callbacks_are_not_printed_and_other_reports_are(imported):
    done = subprocess.run([sys.executable, "-c", _LATE_CALLBACK, imported], env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "an unrelated report" in done.stderr
    assert ("Event loop is closed" in done.stderr) == (imported == "bare"), done.stderr
