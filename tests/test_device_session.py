"""benchmarks/device_session.sh, the one command a lent accelerator session runs: its --smoke
mode on the CPU goes through every stage (environment, the quickstart at each point's best rate
and untuned, benchmarks/gpu.py, the regression seeds and their scores, the hyperparameter grid,
the architecture study, device checks) and brings back every table, a lease's default stages in
at most 8 files, and a second call redoes nothing it finished."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
DEFAULT = {"env.json", "quickstart_tuned.csv", "quickstart_tuned_report.txt", "gpu.md",
           "hparams.csv", "session.log", "runs.tar.gz"}
ALL = "quickstart_tuned quickstart regression gpu hparams architectures checks"


def session(tmp_path, *extra):
    corpus = tmp_path / "corpus.tar.xz"  # the studies' corpus, carried: attnlab's own source
    if not corpus.exists():
        subprocess.run([sys.executable, str(REPO / "benchmarks" / "device_corpus.py"),
                        f"--out={corpus}", f"--root={REPO / 'attnlab'}"], check=True,
                       capture_output=True, timeout=300)
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("OUT", None)
    return subprocess.run(["bash", str(REPO / "benchmarks" / "device_session.sh"), "--smoke",
                           f"--work={tmp_path / 'work'}", f"--out={tmp_path / 'out'}",
                           f"--corpus={corpus}", *extra],
                          capture_output=True, text=True, timeout=1500, env=env, cwd=REPO)


@pytest.mark.slow
def test_the_device_session_smoke_runs_every_stage_and_resumes(tmp_path):
    first = session(tmp_path, "--budget=1200")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    out = tmp_path / "out"
    assert {p.name for p in out.iterdir()} == DEFAULT  # what the device tool brings back: <= 8
    assert json.loads((out / "env.json").read_text())["versions"]["jax"]
    assert "| cuDNN on (xla) |" in (out / "gpu.md").read_text()
    assert len((out / "hparams.csv").read_text().splitlines()) == 5  # tiny_grid's 4 runs
    log = (out / "session.log").read_text()
    assert f"data.path={tmp_path / 'work' / 'corpus' / 'pystdlib'}" in log
    assert "quickstart_tuned: exit 0" in log
    tuned = (out / "quickstart_tuned_report.txt").read_text()
    assert "fitted at its best train.learning_rate" in tuned  # each point at its best rate
    assert len((out / "quickstart_tuned.csv").read_text().splitlines()) > 3 * 6
    # The finished runs a fresh machine's next call starts from (benchmarks/device_runs.py).
    with tarfile.open(out / "runs.tar.gz") as tar:
        carried = {Path(m.name).parent for m in tar.getmembers()}
    completed = pd.read_csv(out / "quickstart_tuned.csv").query("status == 'completed'")
    assert {f"quickstart_tuned/runs/{run}" for run in completed["run_id"]} <= {
        str(run) for run in carried}
    second = session(tmp_path, "--budget=1200", f"--stages={ALL}")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    # env, quickstart_tuned, gpu, hparams
    assert second.stdout.count("done in an earlier call") == 4
    scores = json.loads((out / "regression_icl.json").read_text())  # per run: error per k
    assert len(scores) == 2 and all(len(run["error"]) == 16 for run in scores.values())
    assert "stages not done: none" in second.stdout
    checks = (out / "checks.md").read_text()
    assert checks.count("| pass |") == 9 and "FAIL" not in checks
    for study in ("quickstart", "architectures"):
        assert len((out / f"{study}.csv").read_text().splitlines()) > 3
        assert "fitted law" in (out / f"{study}_report.txt").read_text()


def test_the_device_session_refuses_an_unknown_argument(tmp_path):
    out = subprocess.run(["bash", str(REPO / "benchmarks" / "device_session.sh"), "--nosuch"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--nosuch" in out.stderr


def test_an_override_reaches_its_stage_alone(tmp_path):
    """--override STAGE:KEY=VALUE goes to that stage's attnlab command (a study's and a grid's)
    and no other; a field that does not exist fails the stage with attnlab's own line."""
    out = session(tmp_path, "--stages=quickstart_tuned hparams",
                  "--override=quickstart_tuned:sweep.budgets=(1e13,2e13)",
                  "--override", "quickstart_tuned:sweep.nosuch=1",
                  "--override=hparams:sweep.other=2")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-2000:]
    log = (tmp_path / "out" / "session.log").read_text()
    assert "quickstart_tuned: exit 2" in log and "hparams: exit 2" in log
    assert "no such field 'nosuch'" in log and "no such field 'other'" in log
    commands = {line.split()[2]: line for line in log.splitlines() if "attnlab.cli" in line}
    assert "sweep.budgets=" in commands["quickstart_tuned:"]
    assert "nosuch" not in commands["hparams:"] and "other" not in commands["quickstart_tuned:"]


@pytest.mark.parametrize("bad", ["gpu:x=1", "quickstart:x", "sweep.budgets=(1e13,)"])
def test_a_malformed_override_exits_2(bad):
    out = subprocess.run(["bash", str(REPO / "benchmarks" / "device_session.sh"),
                          f"--override={bad}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and f"--override {bad}:" in out.stderr


def test_a_lease_restricted_to_some_budgets_plans_the_same_runs():
    """What lets a lease finish another's study when its runs did not come back: the gpu
    quickstart's plan restricted to two budgets is exactly the full plan's runs at those budgets
    (same ids), so the two tables fit as one."""
    from attnlab.sweep import load_spec, plan

    full = plan(load_spec("experiments/quickstart.py:gpu_tuned"))
    part = plan(load_spec("experiments/quickstart.py:gpu_tuned", ["sweep.budgets=(1e13,2e13)"]))
    assert [r.run_id for r in part] == [r.run_id for r in full if r.budget in (1e13, 2e13)]
    assert len(part) < len(full)
