"""``attnlab icl`` and ``attnlab attention`` end to end on tiny trained task runs: the files they
write and what those files must hold (contracts, not the outcome of a 4-step run)."""

import json
import math

import matplotlib.image
import numpy as np
import pytest

from attnlab import cli
from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
from attnlab.data import icl


def _train(tmp_path, data: DataConfig, name: str, **model):
    from attnlab.train import run

    cfg = Config(model=ModelConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, max_len=32,
                                   ffn="none", **model),
                 data=data,
                 train=TrainConfig(steps=4, warmup_steps=1, eval_every=4, eval_batches=1,
                                   log_every=2, checkpoint_every=4))
    assert run(cfg, tmp_path / name, progress=False)["status"] == "completed"
    return tmp_path / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("icl_runs")
    return {"induction": _train(tmp, DataConfig(source="induction", task_vocab=32, seq_len=20,
                                                batch_size=4), "induction"),
            "mqar": _train(tmp, DataConfig(source="mqar", task_vocab=32, mqar_pairs=4,
                                           seq_len=20, batch_size=4), "mqar")}


def test_icl_on_an_induction_run_writes_the_repeat_loss_and_head_scores(runs, capsys):
    run = runs["induction"]
    assert cli.main(["icl", f"--run={run}", "--batches=2"]) == 0
    result = json.loads((run / "icl.json").read_text())
    task = icl.InductionTask(seq_len=20, vocab=32)
    assert result["ln_vocab"] == pytest.approx(math.log(32))
    assert len(result["loss_per_position"]) == 20 and result["windows"] == 8
    np.testing.assert_allclose(result["optimal_loss_per_position"], task.optimal_losses())
    assert result["repeat_loss_over_ln_vocab"] == pytest.approx(
        result["repeat_loss"] / math.log(32))
    scores = result["head_scores"]
    assert np.shape(scores["induction"]) == (2, 2) and np.shape(scores["previous_token"]) == (2, 2)
    layer, head = result["best_induction_head"]
    assert result["induction_score"] == scores["induction"][layer][head] == max(
        max(row) for row in scores["induction"])
    assert 0 <= result["induction_score"] <= 1
    assert matplotlib.image.imread(run / "icl.png").shape[0] > 100
    assert "repeat loss" in capsys.readouterr().out


def test_icl_on_an_mqar_run_writes_accuracy_per_number_of_pairs(runs):
    run = runs["mqar"]
    out = run / "custom.json"
    assert cli.main(["icl", f"--run={run}", "--batches=2", "--pairs=1,3", f"--json={out}"]) == 0
    result = json.loads(out.read_text())
    assert result["pairs"] == [1, 3, 4] and len(result["accuracy"]) == 3
    assert all(0 <= a <= 1 for a in result["accuracy"])
    assert len(result["accuracy_per_query"]) == 4
    assert result["accuracy_at_trained_pairs"] == pytest.approx(
        np.mean(result["accuracy_per_query"]))


def test_attention_draws_every_head_and_scores_the_task_example(runs):
    run = runs["induction"]
    out, scores = run / "maps.png", run / "maps.json"
    assert cli.main(["attention", f"--run={run}", "--task-example", "--example=3",
                     f"--plot={out}", f"--json={scores}"]) == 0
    image = matplotlib.image.imread(out)
    assert image.shape[0] > 200 and image.shape[1] > 200
    result = json.loads(scores.read_text())
    corpus = icl.TaskCorpus(icl.InductionTask(seq_len=20, vocab=32))
    assert result["tokens"] == corpus.validation_set(20, 4, 1)[0, 3, :-1].tolist()
    assert np.shape(result["previous_token"]) == (2, 2)
    assert np.shape(result["induction"]) == (2, 2)


def test_attention_draws_a_hybrids_mamba_and_softmax_layers(tmp_path):
    """Every mixer has a map; the heads' scores are kept for the maps that are distributions
    (softmax), not for Mamba's signed per-channel maps."""
    run = _train(tmp_path, DataConfig(source="induction", task_vocab=32, seq_len=20,
                                      batch_size=4), "hybrid", mixer="mamba", attention_every=2,
                 pos_encoding="none", ssm_scan="sequential")
    out, scores = run / "maps.png", run / "maps.json"
    assert cli.main(["attention", f"--run={run}", "--task-example", f"--plot={out}",
                     f"--json={scores}"]) == 0
    assert matplotlib.image.imread(out).shape[1] > 8 * 100  # 8 columns: Mamba's channel groups
    result = json.loads(scores.read_text())
    assert result["mixers"] == ["mamba", "softmax"]
    assert result["previous_token"][0] is None and len(result["previous_token"][1]) == 2
    assert result["induction"][0] is None and result["best_induction_head"][0] == 1


@pytest.mark.parametrize("scale, mixers, widths", [
    ("cpu", {"softmax_rope", "linear", "mamba"}, {32, 64}),
    ("gpu", {"softmax_rope", "softmax_nope", "softmax_alibi", "window", "linear", "performer",
             "mamba", "hybrid"}, {64, 128, 256, 512}),
])
def test_the_icl_study_plans_every_mixer_at_every_width(scale, mixers, widths):
    from attnlab.data import prepare
    from attnlab.checks import check
    from attnlab.sweep import load_spec, plan

    runs = plan(load_spec(f"experiments/icl.py:{scale}"))
    assert {r.axes["mixer_variant"] for r in runs} == mixers
    for name in mixers:
        assert {r.cfg.model.d_model for r in runs if r.axes["mixer_variant"] == name} == widths
    for run in runs:
        check(run.cfg)  # every run's architecture resolves
        assert run.cfg.data.source == "mqar"
        prepare(run.cfg.data)  # and its task settings make windows


@pytest.mark.parametrize("scale, mixers, widths, dim", [
    ("cpu", {"softmax", "linear", "mamba"}, {32, 64}, 4),
    ("gpu", {"softmax", "softmax_nope", "window", "linear", "performer", "mamba", "hybrid"},
     {64, 128, 256}, 8),
])
def test_the_regression_study_plans_every_mixer_at_every_width(scale, mixers, widths, dim):
    from attnlab.data import prepare
    from attnlab.checks import check
    from attnlab.sweep import load_spec, plan

    runs = plan(load_spec(f"experiments/icl_regression_mixers.py:{scale}"))
    assert {r.axes["mixer_variant"] for r in runs} == mixers
    for name in mixers:
        assert {r.cfg.model.d_model for r in runs if r.axes["mixer_variant"] == name} == widths
    for run in runs:
        check(run.cfg)  # every run's vector model resolves with its mixer
        assert run.cfg.data.icl_dim == run.cfg.model.input_dim == dim
        assert prepare(run.cfg.data).task.dim == dim


@pytest.mark.parametrize("config", ["configs/induction.py", "configs/mqar.py"])
def test_the_task_configs_are_valid(config):
    from attnlab.cli_flags import parse
    from attnlab.config import from_config_dict
    from attnlab.data import prepare
    from attnlab.checks import check

    cfg = from_config_dict(parse([f"--config={config}"]).config)
    check(cfg)
    assert prepare(cfg.data).vocab_size <= cfg.model.vocab_size


def test_attention_on_text_draws_the_maps_of_a_text_run(tmp_path):
    from attnlab.train import run as train

    cfg = Config(model=ModelConfig(d_model=16, n_layers=1, n_heads=2, max_len=32),
                 data=DataConfig(source="markov", markov_tokens=20_000, seq_len=16,
                                 batch_size=4, cache_dir=str(tmp_path / "data")),
                 train=TrainConfig(steps=2, warmup_steps=1, eval_every=2, eval_batches=1,
                                   log_every=1, checkpoint_every=2))
    assert train(cfg, tmp_path / "run", progress=False)["status"] == "completed"
    assert cli.main(["attention", f"--run={tmp_path / 'run'}", "--text=abcab"]) == 0
    result = json.loads((tmp_path / "run" / "attention.json").read_text())
    assert result["tokens"] == list(b"abcab")
    assert np.shape(result["previous_token"]) == (1, 2)
    assert "induction" not in result  # no known repeat in free text
    assert matplotlib.image.imread(tmp_path / "run" / "attention.png").shape[0] > 100
    assert cli.main(["attention", f"--run={tmp_path / 'run'}", "--text=" + "x" * 17]) == 2
