"""In-context linear regression as a data source of ``attnlab train`` (Garg et al. 2022): the
prompts' layout, determinism and curriculum, the squared-error objective recomputed in float64, a resumed run ending bitwise where an uninterrupted one does, and ``attnlab icl``'s
curve against every baseline on the same prompts."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attnlab import model as lm
from attnlab.checks import check
from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
from attnlab.data import icl_regression, prepare
from attnlab.errors import ConfigError
from test_data_icl import assert_crash_resume_ends_as_uninterrupted


def _data(**fields) -> DataConfig:
    base = dict(source="regression", icl_dim=3, icl_examples=5, seq_len=10)
    return DataConfig(**{**base, **fields})


def _model(**fields) -> ModelConfig:
    base = dict(inputs="vectors", objective="regression", input_dim=3, d_model=16, n_layers=2,
                n_heads=2, pos_encoding="learned", max_len=16, init_std=0.2)
    return ModelConfig(**{**base, **fields})


def _labels_are_linear(windows: np.ndarray, dims: int) -> None:
    """Every prompt's y_j = w.x_j for one w over the first ``dims`` coordinates."""
    xs, ys = windows[:, 0::2, :dims].astype(np.float64), windows[:, 1::2, 0].astype(np.float64)
    for x, y in zip(xs, ys):
        w = np.linalg.lstsq(x, y, rcond=None)[0]
        np.testing.assert_allclose(x @ w, y, atol=1e-4)


def test_batch_i_is_a_pure_function_of_seed_and_index_and_holds_prompts_and_weights():
    corpus = prepare(_data())
    a = corpus.train_batches(10, 6, seed=3)
    b = corpus.train_batches(10, 6, seed=3)  # a restarted run
    assert a[7].shape == (6, 10, 4) and a[7].dtype == np.float32
    np.testing.assert_array_equal(a[7], b[7])
    assert not np.array_equal(a[7], a[8])
    assert not np.array_equal(a[7], corpus.train_batches(10, 6, seed=4)[7])
    halves = [corpus.train_batches(10, 6, 3, process_index=p, process_count=2)[7] for p in (0, 1)]
    np.testing.assert_array_equal(np.concatenate(halves), a[7])
    window = a[7]
    assert (window[:, 1::2, 1:3] == 0).all()  # (y_j, 0, 0)
    np.testing.assert_array_equal(window[:, 0::2, 3], 1.0)  # every x_j scored
    np.testing.assert_array_equal(window[:, 1::2, 3], 0.0)  # never a y position
    _labels_are_linear(window, 3)
    xs, ys = icl_regression.RegressionTask(3, 5).batch(3, "train", 7, 6)
    np.testing.assert_allclose(window[..., :3], icl_regression.interleave(xs, ys), rtol=1e-6, atol=1e-6)
    val = corpus.validation_set(10, 6, 2)
    assert val.shape == (2, 6, 10, 4)
    np.testing.assert_array_equal(val, prepare(_data(icl_curriculum_every=1, icl_dim_start=1,
                                                     icl_examples_start=1)
                                               ).validation_set(10, 6, 2))


def test_the_curriculum_grows_dimensions_and_scored_examples_then_is_the_full_task():
    """Garg et al.: d_s = min(d, d_0 + s) live coordinates, k_s = min(k, k_0 + 2 s) scored
    examples at stage s = i // every."""
    task = icl_regression.regression_task(_data(icl_dim=6, icl_examples=8, seq_len=16,
                                     icl_curriculum_every=3, icl_dim_start=2,
                                     icl_examples_start=3))
    full = icl_regression.RegressionTask(6, 8)
    for i in (0, 2, 3, 7, 11, 12, 40):
        s = i // 3
        dims, examples = min(6, 2 + s), min(8, 3 + 2 * s)
        assert task.stage(i) == (dims, examples)
        window = task.window(5, "train", i, 4)
        assert (window[:, 0::2, dims:6] == 0).all() and (window[:, 0::2, :dims] != 0).all()
        np.testing.assert_array_equal(window[:, 0::2, 6].sum(axis=1), examples)
        _labels_are_linear(window, dims)
        if (dims, examples) == (6, 8):  # the same draws: the full task's batch
            np.testing.assert_array_equal(window, full.window(5, "train", i, 4))


def test_the_squared_error_objective_sums_the_weighted_x_positions_in_float64():
    """``sum_j m_j (yhat_j - y_j)^2`` recomputed in float64 from the read-out (itself tested
    against a float64 forward in tests/test_model_icl.py), over the curriculum's scored x_j."""
    cfg = _model()
    graphdef, state = lm.init_model(cfg, seed=1)
    window = icl_regression.regression_task(_data(icl_curriculum_every=1, icl_examples_start=3)
                                 ).window(0, "train", 0, 4)  # 3 of 5 examples scored
    model = nnx.merge(graphdef, state)
    scores = model.arch.objective.scores(model, jnp.asarray(window), key=None)
    predictions = np.asarray(lm.apply(graphdef, state, jnp.asarray(window[..., :3])),
                             np.float64)[:, 0::2]
    ys = window[:, 1::2, 0].astype(np.float64)
    want = ((predictions[:, :3] - ys[:, :3]) ** 2).sum()
    assert float(scores.count) == 12
    np.testing.assert_allclose(float(scores.loss), want, rtol=1e-5)
    # Causal: the prompt after the last scored example does not move the loss.
    changed = window.copy()
    changed[:, 6:, :3] = 7.0
    again = model.arch.objective.scores(model, jnp.asarray(changed), key=None)
    np.testing.assert_allclose(float(again.loss), float(scores.loss), rtol=1e-6)


@pytest.mark.parametrize("model, data, field", [
    (dict(inputs="tokens", input_dim=0), {}, "model.inputs"),
    (dict(objective="clm"), {}, "model.objective"),
    (dict(input_dim=4), {}, "model.input_dim"),
    ({}, dict(seq_len=12), "data.seq_len"),
    ({}, dict(icl_examples_start=6, icl_curriculum_every=1), "data.icl_examples_start"),
    ({}, dict(icl_dim_start=2), "data.icl_dim_start"),  # a start with no stages
    ({}, dict(icl_noise=-1.0), "data.icl_noise"),
    (dict(d_model=16), dict(source="mqar", seq_len=32, icl_dim=3), "data.icl_dim"),
])
def test_bad_regression_settings_are_refused_naming_the_field(model, data, field):
    with pytest.raises(ConfigError, match=f"^config.{field}"):
        check(Config(model=_model(**model), data=_data(**data)))


def _train(workdir, steps=4, examples=5, **train):
    from attnlab.train import run

    cfg = Config(model=_model(), data=_data(batch_size=4, icl_curriculum_every=1,
                                            icl_dim_start=1, icl_examples_start=1,
                                            icl_examples=examples, seq_len=2 * examples),
                 train=TrainConfig(**{**dict(steps=steps, warmup_steps=1, eval_every=steps,
                                             eval_batches=1, log_every=1, checkpoint_every=2,
                                             keep_checkpoints=3, weight_decay=0.0), **train}))
    return cfg, run(cfg, workdir, progress=False)


def test_a_regression_run_resumed_from_a_checkpoint_ends_where_an_uninterrupted_one_does(
        tmp_path, capfd):
    """Batch i (and its curriculum stage) is a pure function of (seed, i): a run that lost its
    last checkpoint and resumed from the one before ends with the same parameters."""
    cfg, summary = _train(tmp_path / "run")
    assert summary["status"] == "completed" and np.isfinite(summary["final_val_loss"])
    assert summary["dataset"]["source"] == "regression"
    assert_crash_resume_ends_as_uninterrupted(cfg, tmp_path / "run", capfd)


def test_icl_scores_a_regression_run_against_every_baseline_on_the_same_prompts(tmp_path):
    from attnlab import cli
    from attnlab.train import load_params

    _train(tmp_path / "run", steps=2, examples=6)
    assert cli.main(["icl", f"--run={tmp_path / 'run'}", "--batches=3"]) == 0
    result = json.loads((tmp_path / "run" / "icl.json").read_text())
    assert (tmp_path / "run" / "icl.png").stat().st_size > 0
    assert result["task"] == "regression" and result["k"] == list(range(6))
    rows = 3 * 4  # --batches x data.batch_size test prompts
    xs, ys = icl_regression.RegressionTask(3, 6).batch(0, "test", 0, rows)
    baselines = icl_regression.regression_baselines(xs, ys, 0.0)
    assert set(result["baselines"]) == {"least_squares", "ridge", "nearest_neighbours",
                                        "averaging", "one_step_gd"}
    for name, curve in baselines.items():
        np.testing.assert_allclose(result["baselines"][name], curve, rtol=1e-12)
    _, graphdef, params = load_params(tmp_path / "run")
    prompts = jnp.asarray(icl_regression.interleave(xs, ys), jnp.float32)
    yhat = np.asarray(lm.apply(graphdef, params, prompts), np.float64)[:, 0::2]
    np.testing.assert_allclose(result["error"], ((yhat - ys) ** 2).mean(axis=0) / 3, rtol=1e-5)
    np.testing.assert_allclose(result["gap_to_least_squares"],
                               np.asarray(result["error"]) - baselines["least_squares"])
    assert set(result["matches"]) == {"within_0.05_of_least_squares_from_k_5",
                                      "below_one_step_gd_from_k_3"}


def test_attention_draws_a_regression_runs_maps_on_a_validation_prompt(tmp_path):
    from attnlab import cli
    from attnlab.model import inspect
    from attnlab.train import load_params

    _train(tmp_path / "run", steps=2, examples=6)
    assert cli.main(["attention", f"--run={tmp_path / 'run'}", "--task-example",
                     "--example=2"]) == 0
    result = json.loads((tmp_path / "run" / "attention.json").read_text())
    assert (tmp_path / "run" / "attention.png").stat().st_size > 0
    task = icl_regression.RegressionTask(3, 6)
    prompt = icl_regression.RegressionCorpus(task).validation_set(12, 3, 1)[0, 2:3, :, :3]
    np.testing.assert_array_equal(np.asarray(result["tokens"], np.float32), prompt[0])
    _, graphdef, params = load_params(tmp_path / "run")
    maps = inspect.attention_maps(graphdef, params, prompt)
    np.testing.assert_allclose(result["previous_token"],
                               [inspect.previous_token_scores(m) for m in maps], rtol=1e-6)
    assert "induction" not in result
