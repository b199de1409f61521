"""Concurrent writers: two sweeps started on one directory at once. One runs, the other stops
with one line naming the holder's pid (exit 2), and the directory ends consistent; a lock left
by a killed sweep is taken over."""

import fcntl
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

from attnlab import results, rundir
from attnlab.sweep import runner


ROOT = pathlib.Path(__file__).resolve().parents[1]
GRID = str(ROOT / "experiments" / "tiny_grid.py")
ENV = dict(os.environ, JAX_PLATFORMS="cpu")


def _sweep(workdir, *extra):
    return subprocess.Popen([sys.executable, "-m", "attnlab.cli", "sweep", f"--config={GRID}",
                             f"--sweep={workdir}", "--noprogress", *extra], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_refused_sweep_waits_for_the_holder_to_write_its_pid(tmp_path):
    """The holder writes its record just after taking the lock; a sweep refused in between names
    the holder once it has written, not 'no one'."""
    lock = tmp_path / rundir.SWEEP_LOCK_FILE
    with open(lock, "a+") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        late = threading.Timer(0.3, lambda: (holder.write("pid 4242 on host\n"), holder.flush()))
        late.start()
        with pytest.raises(runner.SweepDirError, match="in use by another sweep \\(pid 4242 "):
            with runner.sweep_lock(tmp_path):
                pass
        late.join()


@pytest.mark.slow
@pytest.mark.uncached
def test_two_sweeps_at_once_one_runs_the_other_is_refused(tmp_path):
    workdir = tmp_path / "sweep"
    first, second = _sweep(workdir), _sweep(workdir)
    outcomes = [(p.pid, *p.communicate(timeout=900)) for p in (first, second)]
    codes = sorted(p.returncode for p in (first, second))
    assert codes in ([0, 2], [0, 0]), outcomes  # [0, 0]: one finished before the other began
    for (pid, out, err), proc in zip(outcomes, (first, second)):
        if proc.returncode == 2:
            other = first.pid if proc is second else second.pid
            lines = [line for line in err.splitlines() if line.strip()]
            assert len(lines) == 1 and f"in use by another sweep (pid {other} " in lines[0], err
    table = results.load(workdir)
    assert len(table) == 4 and set(table["status"]) == {"completed"}
    assert len(set(table["run_id"])) == 4
    assert not (workdir / ".sweep.lock").read_text().strip()  # released, holder cleared


@pytest.mark.slow
@pytest.mark.uncached
def test_a_lock_left_by_a_killed_sweep_is_taken_over(tmp_path):
    workdir = tmp_path / "sweep"
    victim = _sweep(workdir)
    deadline = time.time() + 300
    while not (workdir / ".sweep.lock").exists() or not (workdir / ".sweep.lock").read_text():
        assert victim.poll() is None and time.time() < deadline, victim.communicate()
        time.sleep(0.05)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert f"pid {victim.pid} " in (workdir / ".sweep.lock").read_text()  # stale record left
    rerun = _sweep(workdir)
    out, err = rerun.communicate(timeout=900)
    assert rerun.returncode == 0, err
    assert set(results.load(workdir)["status"]) == {"completed"}
