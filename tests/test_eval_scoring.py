"""``attnlab eval`` on a tiny trained run: each choice's log-likelihood equals a float64
reference of the model's forward pass, the task's scores follow from them, and the generated
tasks are at chance before training."""

import json
import math

import numpy as np
import pytest

from attnlab import cli
from attnlab.data import ByteTokenizer
from attnlab.data.tasks import TASKS, Example, read_examples, tasks_of, write_examples
from attnlab.model import init_model
from attnlab.train import load_params
from attnlab.train.scoring import Scorer, evaluate
from eval_runs import reference_loglikelihood, tiny_config, train


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval")
    return train(tmp / "tiny", tmp / "data", steps=8)


def _examples() -> list[Example]:
    """Generated examples, a context longer than the window (cut from the left), a choice of
    several UTF-8 bytes per character, an empty context and five choices."""
    made = TASKS["stdlib_line_end"](size=12, seed=3).examples()
    return made + [
        Example("def f(x):\n    return " * 4, ("x + 1", "None", "f(x)"), 0),
        Example("s = 'caf", ("\u00e9'", "e'", "\u00e8s'"), 0),
        Example("", ("import os", "x = 1", "pass", "def", "#"), 3)]


@pytest.fixture(scope="module")
def scored(run, tmp_path_factory):
    """(examples, the eval JSON) of the examples above written as a task file."""
    path = tmp_path_factory.mktemp("tasks") / "mixed.jsonl"
    write_examples(_examples(), path)
    out = path.with_name("eval.json")
    assert cli.main(["eval", f"--run={run}", f"--tasks={path}", f"--json={out}",
                     "--batch-size=16"]) == 0
    return read_examples(path), json.loads(out.read_text())["tasks"]["mixed"]


def test_each_choice_log_likelihood_equals_a_float64_forward_pass(run, scored):
    examples, result = scored
    cfg, graphdef, params = load_params(run)
    for example, record in zip(examples, result["per_example"], strict=True):
        reference = [reference_loglikelihood(graphdef, params, cfg.data.seq_len,
                                             example.context, c) for c in example.choices]
        np.testing.assert_allclose(record["loglikelihoods"], reference, rtol=0, atol=1e-5)
        gold = example.choices[example.answer]
        assert record["gold_nll"] == pytest.approx(-reference[example.answer], abs=1e-5)
        assert record["gold_nll_per_token"] == pytest.approx(
            -reference[example.answer] / len(gold.encode()), abs=1e-5)
        per_byte = np.asarray(reference) / [len(c.encode()) for c in example.choices]
        assert record["predicted"] == int(np.argmax(per_byte))
        assert record["predicted_unnormalised"] == int(np.argmax(reference))


def test_the_task_scores_follow_from_the_examples(scored):
    examples, result = scored
    records = result["per_example"]
    gold_bytes = sum(len(e.choices[e.answer].encode()) for e in examples)
    nll = sum(r["gold_nll"] for r in records)
    assert result["examples"] == len(examples) == 15
    assert result["choices"] == sum(len(e.choices) for e in examples)
    assert result["gold_bytes"] == gold_bytes == result["gold_tokens"]  # byte tokenizer
    assert result["bits_per_byte"] == pytest.approx(nll / math.log(2) / gold_bytes)
    assert result["gold_ce"] == pytest.approx(nll / result["gold_tokens"])
    assert result["gold_nll"] == pytest.approx(nll / len(examples))
    assert result["accuracy"] == np.mean([r["predicted"] == e.answer
                                          for r, e in zip(records, examples)])
    assert result["chance"] == pytest.approx(np.mean([1 / len(e.choices) for e in examples]))


def test_the_report_prints_a_line_per_task(run, capsys):
    assert cli.main(["eval", f"--run={run}", "--tasks=stdlib_line_end,stdlib_call_name",
                     "--examples=8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["task", "examples", "accuracy"]
    assert [line.split()[:2] for line in lines[1:3]] == [["stdlib_line_end", "8"],
                                                         ["stdlib_call_name", "8"]]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_a_generated_task_is_the_same_for_a_seed_and_its_gold_among_other_choices(name):
    first, again = (TASKS[name](size=50, seed=1).examples() for _ in range(2))
    assert first == again != TASKS[name](size=50, seed=2).examples()
    for e in first:
        assert len(e.choices) == len(set(e.choices)) == 4 and e.context
        assert all(c.isascii() and 2 <= len(c) <= 24 for c in e.choices)
    assert len({e.answer for e in first}) == 4  # the gold one's place is drawn


def test_the_easy_task_is_at_chance_at_initialisation(tmp_path):
    """The distractors are drawn as the gold choices are, so untrained weights do not beat a
    guess: 400 examples, chance 0.25 (standard error 0.022)."""
    cfg = tiny_config(tmp_path / "data")
    [task] = tasks_of(["stdlib_line_end"], size=400)
    scorer = Scorer(cfg, ByteTokenizer(), batch_size=128)
    graphdef, params = init_model(cfg.model, 0)
    result = evaluate(scorer, graphdef, params, task.examples())
    assert abs(result["accuracy"] - 0.25) < 0.066
    assert result["bits_per_byte"] == pytest.approx(math.log2(256), rel=0.05)  # uniform
