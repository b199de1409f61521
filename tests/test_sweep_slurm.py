"""Sweeps through a real single-node Slurm cluster (Debian's slurmctld, slurmd and munge, started
here; skipped with the reason where they are missing or cannot start): a sweep submitted with
--launcher=slurm gives the local launcher's results, and a job cancelled mid-run (scancel, as a
preemption or a user stops it) resumes, on the next invocation, to the same final losses."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from attnlab import results

ROOT = Path(__file__).resolve().parents[1]
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo", "squeue", "scancel")
SLURM_CONF = """\
ClusterName=attnlab-test
SlurmctldHost={host}
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmdSpoolDir={d}/spool
StateSaveLocation={d}/state
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
SlurmUser=root
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
KillWait=60
NodeName={host} CPUs={cpus} RealMemory=4000 State=UNKNOWN
PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def _start_munge() -> None:
    if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode == 0:
        return
    if not Path("/etc/munge/munge.key").exists():
        subprocess.run(["mungekey", "--create"], check=True, capture_output=True)
        shutil.chown("/etc/munge/munge.key", "munge", "munge")
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    # --force: a fresh CI image may fail munged's ownership checks on system folders (/run,
    # /var/log) that a one-node test cluster has no reason to care about.
    started = subprocess.run(["runuser", "-u", "munge", "--", "munged", "--force"],
                             capture_output=True, text=True)
    if started.returncode != 0:
        raise OSError(f"munged exited {started.returncode}: {started.stderr.strip()[-400:]}")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A one-node cluster of this machine's cores; yields the environment its commands need."""
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        pytest.skip(f"Slurm is not installed here ({', '.join(missing)} missing): apt-get install "
                    f"slurmctld slurmd munge (.ci/run installs them)")
    if os.geteuid() != 0:
        pytest.skip("slurmd needs root to start its jobs")
    directory = tmp_path_factory.mktemp("slurm")
    for sub in ("spool", "state"):
        (directory / sub).mkdir()
    conf = directory / "slurm.conf"
    conf.write_text(SLURM_CONF.format(host=socket.gethostname().split(".")[0], d=directory,
                                      cpus=os.cpu_count()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    try:
        _start_munge()
        subprocess.run(["slurmctld", "-f", str(conf)], check=True, env=env, capture_output=True)
        subprocess.run(["slurmd", "-f", str(conf)], check=True, env=env, capture_output=True)
    except (subprocess.CalledProcessError, OSError) as e:
        pytest.skip(f"Slurm's daemons did not start here: {e}")
    deadline = time.time() + 60
    while time.time() < deadline:
        state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True,
                               text=True).stdout.strip()
        if state == "idle":
            break
        time.sleep(0.5)
    else:
        pytest.skip(f"the Slurm node did not become idle (state {state!r}; "
                    f"{(directory / 'slurmctld.log').read_text()[-500:]})")
    yield env
    for daemon in ("slurmd", "slurmctld"):
        pid = directory / f"{daemon}.pid"
        if pid.exists():
            subprocess.run(["kill", pid.read_text().strip()], capture_output=True)


def _sweep(directory: Path, env: dict, launcher: str, steps: int, **popen):
    argv = [sys.executable, "-m", "attnlab.cli", "sweep", "--config=experiments/tiny_grid.py",
            f"--sweep={directory}", f"--launcher={launcher}", "--noprogress",
            f"--config.base.train.steps={steps}", f"--config.base.train.checkpoint_every=8"]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **popen)


def _finished(proc) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=900)
    return proc.returncode, out


def _losses(directory: Path):
    table = results.load(directory).sort_values("run_id").reset_index(drop=True)
    assert set(table["status"]) == {"completed"}, table[["run_id", "status", "error"]]
    return table


@pytest.mark.slow
def test_a_sweep_through_slurm_equals_the_local_one_and_a_cancelled_job_resumes(slurm, tmp_path):
    code, out = _finished(_sweep(tmp_path / "local", slurm, "local", 24))
    assert code == 0, out
    code, out = _finished(_sweep(tmp_path / "slurm", slurm, "slurm", 24))
    assert code == 0, out
    local, through = _losses(tmp_path / "local"), _losses(tmp_path / "slurm")
    assert list(local["run_id"]) == list(through["run_id"])
    np.testing.assert_allclose(through["final_val_loss"], local["final_val_loss"], rtol=1e-6)
    assert list((tmp_path / "slurm" / "logs" / "slurm").glob("*_log.out"))  # the jobs' logs

    # Longer runs, one cancelled once its run has logged steps: the sweep reports it partial,
    # and the same command again resumes it to the uninterrupted local sweep's losses.
    code, out = _finished(_sweep(tmp_path / "local_long", slurm, "local", 160))
    assert code == 0, out
    proc = _sweep(tmp_path / "cancelled", slurm, "slurm", 160)
    deadline = time.time() + 600
    while time.time() < deadline:
        logged = sum(p.read_text().count('"loss"')
                     for p in (tmp_path / "cancelled").glob("runs/*/metrics.jsonl"))
        if logged >= 12:
            break
        time.sleep(0.2)
    jobs = subprocess.run(["squeue", "-h", "-o", "%i"], env=slurm, capture_output=True,
                          text=True).stdout.split()
    assert jobs, "no job was running"
    subprocess.run(["scancel", *jobs], env=slurm, check=True)
    code, out = _finished(proc)
    assert code != 0 and "partial" in out, out
    code, out = _finished(_sweep(tmp_path / "cancelled", slurm, "slurm", 160))
    assert code == 0, out
    resumed, straight = _losses(tmp_path / "cancelled"), _losses(tmp_path / "local_long")
    np.testing.assert_allclose(resumed["final_val_loss"], straight["final_val_loss"], rtol=1e-6)
    np.testing.assert_allclose(resumed["final_train_loss"], straight["final_train_loss"],
                               rtol=1e-6)
