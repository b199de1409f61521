"""benchmarks/device_runs.py: a lease's finished runs, carried to the next (fresh) machine, are
not trained again there; unfinished and failed ones are; nothing already there is touched."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from attnlab import results
from repo_files import load_module

REPO = Path(__file__).resolve().parents[1]
GRID = str(REPO / "experiments" / "tiny_grid.py")


def _script():
    return load_module("benchmarks/device_runs.py")


def _sweep(workdir):
    out = subprocess.run([sys.executable, "-m", "attnlab.cli", "sweep", f"--config={GRID}",
                          f"--sweep={workdir}", "--noprogress"], cwd=REPO, capture_output=True,
                         text=True, timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert out.returncode == 0, out.stderr[-2000:]


def test_a_fresh_machine_trains_only_what_the_last_lease_left(tmp_path):
    first = tmp_path / "lease1"
    _sweep(first / "grid")
    runs = sorted((first / "grid" / "runs").iterdir())
    # One run the first lease left failed (out of memory, say): it is tried again.
    failed = runs[0] / "summary.json"
    failed.write_text(json.dumps({**json.loads(failed.read_text()), "status": "failed",
                                  "error": "RESOURCE_EXHAUSTED: out of memory"}))
    script = _script()
    archive = tmp_path / "runs.tar.gz"
    assert script.pack(first, archive) == 3
    with tarfile.open(archive) as tar:
        names = {Path(m.name).name for m in tar.getmembers()}
    assert names == {"run.json", "config.json", "summary.json", "metrics.jsonl"}  # no weights

    second = tmp_path / "lease2"
    assert script.unpack(archive, second) == (3, 0)
    carried = {run.name: (second / "grid" / "runs" / run.name / "summary.json").read_bytes()
               for run in runs[1:]}
    _sweep(second / "grid")
    for name, summary in carried.items():  # not trained again
        assert (second / "grid" / "runs" / name / "summary.json").read_bytes() == summary
        assert not (second / "grid" / "runs" / name / "checkpoints").exists()
    table = results.build_table(second / "grid").set_index("run_id")
    assert (table["status"] == "completed").all()
    assert (second / "grid" / "runs" / runs[0].name / "checkpoints").exists()  # retrained
    before = results.build_table(first / "grid").set_index("run_id")
    for name in carried:
        assert table.loc[name, "final_val_loss"] == before.loc[name, "final_val_loss"]

    # Unpacked again over a folder that has the runs: nothing is replaced.
    assert script.unpack(archive, second) == (0, 3)
    for name, summary in carried.items():
        assert (second / "grid" / "runs" / name / "summary.json").read_bytes() == summary


def test_a_missing_archive_is_one_line_and_exit_2(tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "device_runs.py"), "unpack",
                          str(tmp_path / "nope.tar.gz"), str(tmp_path)], capture_output=True,
                         text=True, timeout=120, cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "nope.tar.gz" in out.stderr
