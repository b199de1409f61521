"""``train.eval_tasks``: the tasks scored at every evaluation, in metrics.jsonl, the summary
and a sweep's results table, equal to ``attnlab eval`` of the same checkpoint; a run resumed
after a crash logs the uninterrupted run's task scores; bad tasks are refused before training."""

import dataclasses
import json
import shutil

import pytest

from attnlab import cli, results
from attnlab.errors import ConfigError
from attnlab.train import run
from eval_runs import tiny_config

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
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if k.startswith("eval/")}
            for r in records if "val_loss" in r}


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
