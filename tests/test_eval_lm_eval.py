"""lm-evaluation-harness through :class:`attnlab.eval.harness.AttnlabLM`: ``simple_evaluate`` on a
local task (YAML + JSON lines, no download) gives what ``attnlab eval`` gives on the same
examples; rolling log-likelihoods predict each token once; generation is the greedy
continuation cut at the stop string."""

import json

import jax
import numpy as np
import pytest

from attnlab import cli
from attnlab.data.tasks import TASKS, write_examples
from attnlab.model import generate
from eval_runs import reference_loglikelihood, train

pytest.importorskip("lm_eval")

TASK_YAML = """task: attnlab_line_end
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: multiple_choice
test_split: test
doc_to_text: context
doc_to_choice: choices
doc_to_target: answer
target_delimiter: ""
metric_list:
  - {{metric: acc, aggregation: mean, higher_is_better: true}}
  - {{metric: acc_bytes, aggregation: mean, higher_is_better: true}}
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm_eval")
    return train(tmp / "tiny", tmp / "data", steps=8)


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """Hugging Face datasets and hub kept off the network, their caches in a temporary
    directory."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
            patch.setenv(name, "1")
        patch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf_home")))
        yield


@pytest.fixture(scope="module")
def model(run, offline):
    from attnlab.eval.harness import AttnlabLM

    return AttnlabLM(str(run), batch_size=32)


def test_simple_evaluate_on_a_local_task_equals_attnlab_eval(run, model, tmp_path):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    data = tmp_path / "tasks" / "line_end.jsonl"
    data.parent.mkdir()
    write_examples(TASKS["stdlib_line_end"](size=24, seed=4).examples(), data)
    (data.parent / "line_end.yaml").write_text(TASK_YAML.format(data=data))
    out = simple_evaluate(model=model, tasks=["attnlab_line_end"], bootstrap_iters=0,
                          task_manager=TaskManager(include_path=str(data.parent),
                                                   include_defaults=False))
    harness = out["results"]["attnlab_line_end"]
    samples = sorted(out["samples"]["attnlab_line_end"], key=lambda s: s["doc_id"])

    report = tmp_path / "eval.json"
    assert cli.main(["eval", f"--run={run}", f"--tasks={data}", f"--json={report}"]) == 0
    ours = json.loads(report.read_text())["tasks"]["line_end"]
    assert len(samples) == ours["examples"] == 24
    for sample, record in zip(samples, ours["per_example"]):
        np.testing.assert_allclose([ll for ll, _ in sample["filtered_resps"]],
                                   record["loglikelihoods"], rtol=0, atol=1e-6)
    assert harness["acc_bytes,none"] == pytest.approx(ours["accuracy"])
    assert harness["acc,none"] == pytest.approx(ours["accuracy_unnormalised"])


def _instance(kind, *arguments):
    from lm_eval.api.instance import Instance

    return Instance(request_type=kind, doc={}, arguments=tuple(arguments), idx=0)


def test_rolling_log_likelihood_predicts_each_token_once_from_its_window(run, model):
    """A text of two windows (32 + 32 bytes): the first from the separator, the second from
    the first window's last byte onward (lm-eval's windows with one token of context)."""
    text = "import os\nimport sys\n\ndef main(argv):\n    return len(argv) > 1\n\nx = 1\n"[:64]
    short = text[:20]
    [rolling, rolling_short] = model.loglikelihood_rolling(
        [_instance("loglikelihood_rolling", text), _instance("loglikelihood_rolling", short)])
    cfg, graphdef, params = model.cfg, model.graphdef, model.params
    assert rolling_short == pytest.approx(
        reference_loglikelihood(graphdef, params, cfg.data.seq_len, "", short), abs=1e-5)
    [(first, _), (second, _)] = model.loglikelihood(
        [_instance("loglikelihood", "", text[:32]),
         _instance("loglikelihood", text[31], text[32:])])
    assert rolling == pytest.approx(first + second, abs=1e-5)


def test_generate_until_is_the_greedy_continuation_cut_at_the_stop(model):
    context = "def f(x):\n    "
    prompt = np.frombuffer(b"\0" + context.encode(), np.uint8).astype(np.int32)
    greedy = generate(model.graphdef, model.params, model.cfg.model, [prompt], 12,
                      rng=jax.random.key(0))[0]
    text = bytes(np.asarray(greedy[len(prompt):], np.uint8)).decode("utf-8", "replace")
    stop = text[3:5]  # a stop string the greedy text holds
    [full, cut] = model.generate_until(
        [_instance("generate_until", context, {"until": [], "max_gen_toks": 12}),
         _instance("generate_until", context, {"until": [stop], "max_gen_toks": 12})])
    assert full == text.split("\0")[0]
    assert cut == text[:text.index(stop)] and len(cut) <= 3
