"""``train.eval_tasks``: the tasks scored at every evaluation, in metrics.jsonl, the summary
and a sweep's results table, equal to ``attnlab eval`` of the same checkpoint; a run resumed
after a crash logs the uninterrupted run's task scores; bad tasks are refused before training."""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnlab import cli, results, rundir
from attnlab.errors import ConfigError
from attnlab.train import run
from eval_runs import tiny_config

ROOT = Path(__file__).resolve().parents[1]
SCORES = ("accuracy", "gold_ce", "gold_nll", "bits_per_byte")
TASK = "stdlib_line_end"


def in_loop_config(cache_dir, **train):
    cfg = tiny_config(cache_dir, steps=8)
    train = {"eval_every": 4, "checkpoint_every": 4, "keep_checkpoints": 3,
             "eval_tasks": (TASK,), "eval_task_examples": 16, **train}
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("in_loop")
    cfg = in_loop_config(tmp / "data")
    summary = run(cfg, tmp / "run", progress=False)
    assert summary["status"] == "completed"
    return cfg, tmp / "run", summary


def _task_records(workdir) -> dict[int, dict]:
    """step -> the task scores logged then (the last record of a step logged twice)."""
    return {r["step"]: {k: v for k, v in r.items() if k.startswith("eval/")}
            for r in rundir.read_metrics(workdir / rundir.METRICS_FILE) if "val_loss" in r}


def test_each_evaluation_logs_the_tasks_and_the_summary_holds_the_last(trained):
    _, workdir, summary = trained
    logged = _task_records(workdir)
    assert sorted(logged) == [4, 8]
    assert set(logged[8]) == {f"eval/{TASK}/{score}" for score in SCORES}
    assert {k: v for k, v in summary.items() if k.startswith("eval/")} == logged[8]
    assert logged[4] != logged[8]  # the weights changed between them


def test_the_last_evaluation_equals_attnlab_eval_of_the_final_checkpoint(trained, tmp_path):
    _, workdir, summary = trained
    out = tmp_path / "eval.json"
    assert cli.main(["eval", f"--run={workdir}", f"--tasks={TASK}", "--examples=16",
                     f"--json={out}"]) == 0
    offline = json.loads(out.read_text())["tasks"][TASK]
    for score in SCORES:
        assert summary[f"eval/{TASK}/{score}"] == pytest.approx(offline[score], rel=1e-6)


def test_a_sweeps_results_table_gains_the_task_columns(trained, tmp_path):
    """Two runs of a sweep directory (the trained run as two seeds): the task columns come
    last, as measurements, and do not split the seeds' point."""
    _, workdir, summary = trained
    for seed in (0, 1):
        shutil.copytree(workdir, tmp_path / results.RUNS_DIR / f"r{seed}")
        (tmp_path / results.RUNS_DIR / f"r{seed}" / results.RUN_FILE).write_text(json.dumps(
            {"run_id": f"r{seed}", "axes": {"train.seed": seed}}))
    table = results.build_table(tmp_path)
    columns = [f"eval/{TASK}/{score}" for score in SCORES]
    assert set(table.columns[-len(columns):]) == set(columns)
    assert table[columns[0]].tolist() == [summary[columns[0]]] * 2
    assert results.seed_spread(table)["seeds"].tolist() == [2]


def test_a_bad_task_is_refused_before_anything_is_written(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"context": "x", "choices": ["a", "b"], "answer": 7}\n')
    cfg = in_loop_config(tmp_path / "data", eval_tasks=(str(bad),))
    with pytest.raises(ConfigError, match=rf"train.eval_tasks: {bad}:1: 'answer' must be"):
        run(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_a_run_resumed_after_a_crash_logs_the_uninterrupted_task_scores(trained, tmp_path):
    """The run's directory as a crash after step 7 leaves it (its checkpoint 8 and summary
    gone): resumed from step 4, its evaluation at step 8 scores the tasks as the uninterrupted
    run did, and so do its summary and results row."""
    cfg, workdir, summary = trained
    crashed = tmp_path / "crashed"
    shutil.copytree(workdir, crashed)
    shutil.rmtree(crashed / "checkpoints" / "8")
    (crashed / "summary.json").unlink()
    resumed = run(cfg, crashed, progress=False)
    assert resumed["status"] == "completed"
    assert _task_records(crashed) == _task_records(workdir)
    assert {k: v for k, v in resumed.items() if k.startswith("eval/")} == {
        k: v for k, v in summary.items() if k.startswith("eval/")}


def test_a_run_resumed_from_its_final_checkpoint_keeps_the_task_scores(trained, tmp_path):
    """A crash after the last checkpoint, before the summary: the scores come from the
    checkpoint's record (nothing is evaluated again)."""
    cfg, workdir, summary = trained
    crashed = tmp_path / "crashed"
    shutil.copytree(workdir, crashed)
    (crashed / "summary.json").unlink()
    resumed = run(cfg, crashed, progress=False)
    assert {k: v for k, v in resumed.items() if k.startswith("eval/")} == {
        k: v for k, v in summary.items() if k.startswith("eval/")}
    metrics = [(d / "metrics.jsonl").read_text() for d in (workdir, crashed)]
    assert metrics[0].count("val_loss") == metrics[1].count("val_loss")  # none logged again


def _train_command(data_dir, workdir) -> list[str]:
    return [sys.executable, "-m", "attnlab.cli", "train", "--config=configs/tiny.py",
            f"--config.data.cache_dir={data_dir}", "--config.data.max_bytes=200000",
            "--config.train.steps=40", "--config.train.log_every=1",
            "--config.train.eval_every=10", "--config.train.eval_batches=1",
            "--config.train.checkpoint_every=5", f"--config.train.eval_tasks=('{TASK}',)",
            "--config.train.eval_task_examples=32", f"--run={workdir}"]


@pytest.mark.slow
@pytest.mark.uncached  # compiled as a user's command is, so the kill lands mid-run
def test_a_sigkilled_run_resumed_logs_the_uninterrupted_task_scores(tmp_path):
    """kill -9 between the evaluations at steps 20 and 30, the same command again: every
    evaluation's task scores equal the uninterrupted run's, bit for bit."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    subprocess.run(_train_command(tmp_path / "data", whole), cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=600)
    proc = subprocess.Popen(_train_command(tmp_path / "data", killed), cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while proc.poll() is None and 22 not in _logged_steps(killed):
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run ended before the kill"
    assert max(_task_records(killed)) == 20
    subprocess.run(_train_command(tmp_path / "data", killed), cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=600)
    assert sorted(_task_records(killed)) == [10, 20, 30, 40]
    assert _task_records(killed) == _task_records(whole)


def _logged_steps(workdir) -> set[int]:
    return {r["step"] for r in rundir.read_metrics(workdir / rundir.METRICS_FILE)}
