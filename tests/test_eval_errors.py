"""``attnlab eval`` refuses bad input in one line naming the file and line (or the field), with
exit 2, before the run's parameters are read: the runs here have a config and no checkpoint,
so reaching the parameters would be an error about checkpoints instead."""

import importlib
import json
import sys

import pytest

from attnlab import cli
from attnlab.data import prepare
from attnlab.errors import AttnlabError
from eval_runs import tiny_config


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run directory holding only its config (and its corpus, prepared)."""
    directory = tmp_path_factory.mktemp("eval_errors") / "run"
    directory.mkdir()
    cfg = tiny_config(directory.parent / "data")
    (directory / "config.json").write_text(json.dumps(cfg.to_dict()))
    prepare(cfg.data)
    return directory


def _task(tmp_path, *records) -> str:
    path = tmp_path / "task.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in records))
    return str(path)


def _refusal(capsys, *argv) -> str:
    assert cli.main(["eval", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    return err


GOOD = {"context": "x = ", "choices": ["1", "2"], "answer": 0}


@pytest.mark.parametrize("record, message", [
    ({"context": "x = ", "answer": 0}, ":2: no 'choices'"),
    ({**GOOD, "answer": 2}, ":2: 'answer' must be an index into the 2 choices, got 2"),
    ({**GOOD, "answer": -1}, ":2: 'answer' must be an index"),
    ({**GOOD, "choices": ["1"]}, ":2: 'choices' must be a list of two or more"),
    ({**GOOD, "choices": ["1", ""]}, ":2: 'choices' must be a list of two or more non-empty"),
    ({**GOOD, "context": 3}, ":2: 'context' must be a string"),
    ("{not json", ":2: not a JSON object"),
    ({**GOOD, "choices": ["1", "y" * 40]}, ":2: a choice is 40 tokens, longer than the run's "
                                          "window (data.seq_len=32)"),
])
def test_a_bad_line_is_named_by_file_and_line(run, tmp_path, capsys, record, message):
    task = _task(tmp_path, GOOD, record)
    err = _refusal(capsys, f"--run={run}", f"--tasks={task}")
    assert f"{task}{message}" in err


def test_a_missing_task_file_or_unknown_task_is_named(run, tmp_path, capsys):
    missing = tmp_path / "nope.jsonl"
    assert str(missing) in _refusal(capsys, f"--run={run}", f"--tasks={missing}")
    err = _refusal(capsys, f"--run={run}", "--tasks=stdlib_next_lines")
    assert "'stdlib_next_lines' is neither a task" in err and "stdlib_line_end" in err


def test_an_empty_task_file_and_two_tasks_of_one_name_are_refused(run, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert "holds no example" in _refusal(capsys, f"--run={run}", f"--tasks={empty}")
    task = _task(tmp_path, GOOD)
    assert "two tasks are named 'task'" in _refusal(capsys, f"--run={run}",
                                                    f"--tasks={task},{task}")


@pytest.mark.parametrize("objective, vocab", [("mlm", 257), ("span", 257)])
def test_a_masked_or_encoder_decoder_run_is_refused_naming_the_field(tmp_path, capsys,
                                                                     objective, vocab):
    directory = tmp_path / "run"
    directory.mkdir()
    cfg = tiny_config(tmp_path / "data", objective=objective, vocab_size=vocab)
    (directory / "config.json").write_text(json.dumps(cfg.to_dict()))
    err = _refusal(capsys, f"--run={directory}", "--tasks=stdlib_line_end")
    assert f"config.model.objective: {objective}: the tasks are scored by a causal decoder" in err


@pytest.mark.parametrize("argv, message", [
    (["--tasks=stdlib_line_end"], "--run"),
    (["--run=RUN", "--tasks=,"], "--tasks names no task"),
    (["--run=RUN", "--tasks=stdlib_line_end", "--examples=0"], "--examples must be >= 1"),
    (["--run=RUN", "--tasks=stdlib_line_end", "--config.train.steps=3"],
     "uses the run's own config"),
])
def test_bad_flags_are_refused(run, capsys, argv, message):
    assert message in _refusal(capsys, *(a.replace("RUN", str(run)) for a in argv))


def test_a_directory_that_is_no_run_is_named(tmp_path, capsys):
    assert f"{tmp_path} is not a run directory" in _refusal(
        capsys, f"--run={tmp_path}", "--tasks=stdlib_line_end")


def test_the_harness_adapter_without_lm_eval_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval raises ImportError
    monkeypatch.delitem(sys.modules, "attnlab.eval.harness", raising=False)
    with pytest.raises(AttnlabError, match=r"needs lm-evaluation-harness: pip install "
                                           r"'attnlab\[eval\]'"):
        importlib.import_module("attnlab.eval.harness")
