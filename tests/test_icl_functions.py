"""Function classes of in-context regression (Garg et al. 2022): linear prompts drawn exactly as
before the classes existed, sparse weights and ReLU networks against independent float64
references and their scale E[f(x)^2] = d, sparse regression's support oracle, the config's
refusals, and ``attnlab icl`` on a run of each class."""

import json

import numpy as np
import pytest

from attnlab.config import DataConfig, ModelConfig, TrainConfig, Config
from attnlab.data import icl_regression, prepare, sources
from attnlab.data.icl_functions import FUNCTIONS, ReluNet, SparseLinear
from attnlab.errors import ConfigError


def _data(**fields) -> DataConfig:
    return DataConfig(**{**dict(source="regression", icl_dim=4, icl_examples=8, seq_len=16),
                         **fields})


def test_linear_prompts_are_drawn_as_the_first_release_drew_them():
    # w, then x, then the noise, from the stream (seed, split, batch index): runs made before the
    # function classes existed see the same batches when resumed.
    xs, ys = icl_regression.RegressionTask(dim=3, examples=5, noise=0.5).batch(7, "train", 4, rows=6)
    rng = np.random.default_rng([7, 0, 4])
    w = rng.standard_normal((6, 3))
    want_x = rng.standard_normal((6, 5, 3))
    eps = rng.standard_normal((6, 5))
    np.testing.assert_array_equal(xs, want_x)
    np.testing.assert_array_equal(ys, np.einsum("bkd,bd->bk", want_x, w) + 0.5 * eps)
    assert "function" not in prepare(_data()).manifest  # the manifest of earlier runs


def test_sparse_weights_have_s_nonzeros_and_unit_second_moment():
    task = icl_regression.RegressionTask(dim=6, examples=4, function=SparseLinear(sparsity=2))
    xs, ys, w = task.batch_functions(0, "test", 0, rows=20000)
    assert ((w != 0).sum(axis=1) == 2).all()
    np.testing.assert_allclose(ys, np.einsum("bkd,bd->bk", xs, w), rtol=1e-12)
    # E[w w^T] = I: the support is uniform and each weight N(0, d / s) (each diagonal entry's
    # mean has a standard deviation of sqrt(8 / 20000) = 0.02 here: 5 of them is 0.1).
    np.testing.assert_allclose((w != 0).mean(axis=0), 1 / 3, atol=0.02)
    np.testing.assert_allclose(w.T @ w / len(w), np.eye(6), atol=0.1)
    assert (ys**2).mean() / 6 == pytest.approx(1.0, rel=0.05)


def test_relu_networks_match_a_float64_loop_and_have_e_y2_d():
    task = icl_regression.RegressionTask(dim=3, examples=5, function=ReluNet(hidden=7))
    xs, ys, (w, a) = task.batch_functions(1, "train", 2, rows=4)
    assert w.shape == (4, 7, 3) and a.shape == (4, 7)
    for b in range(4):
        for n in range(5):
            units = [max(0.0, float(np.dot(w[b, i], xs[b, n]))) for i in range(7)]
            assert ys[b, n] == pytest.approx(sum(a[b, i] * units[i] for i in range(7)),
                                             rel=1e-12, abs=1e-12)
    wide = icl_regression.RegressionTask(dim=4, examples=8, function=ReluNet(hidden=100))
    _, ys, _ = wide.batch_functions(0, "test", 0, rows=4000)
    assert (ys**2).mean() / 4 == pytest.approx(1.0, rel=0.08)


def test_the_support_oracle_is_exact_from_s_examples_and_linear_closed_forms_still_hold():
    dim, s, k = 5, 2, 9
    function = SparseLinear(sparsity=s)
    xs, ys, w = icl_regression.RegressionTask(dim, k, function=function).batch_functions(0, "test", 0, 3000)
    errors = icl_regression.regression_baselines(xs, ys, 0.0, function=function, functions=w)
    assert errors["support_oracle"][0] == pytest.approx(1.0, rel=0.1)  # predicts 0: E[y^2] / d
    assert (errors["support_oracle"][s:] < 1e-20).all()
    assert (errors["support_oracle"][1:s] > 0.1).all()
    expected = icl_regression.expected_errors(np.arange(k), dim, 0.0)
    for name in ("least_squares", "one_step_gd", "averaging"):
        np.testing.assert_allclose(errors[name], expected[name], rtol=0.12, atol=0.02,
                                   err_msg=name)
    # The plain baselines take no functions: the linear class adds nothing.
    assert set(icl_regression.regression_baselines(xs, ys, 0.0)) == {
        "least_squares", "ridge", "nearest_neighbours", "averaging", "one_step_gd"}


def test_every_class_is_registered_and_configured_by_its_own_field():
    assert set(FUNCTIONS) == {"linear", "sparse_linear", "relu_net"}
    assert prepare(_data(icl_function="sparse_linear", icl_sparsity=2)).task.function == \
        SparseLinear(sparsity=2)
    assert prepare(_data(icl_function="relu_net")).task.function == ReluNet(hidden=100)
    manifest = prepare(_data(icl_function="relu_net", icl_hidden=5)).manifest
    assert manifest["function"] == "relu_net" and manifest["hidden"] == 5


@pytest.mark.parametrize("fields, field", [
    (dict(icl_function="cubic"), "data.icl_function"),
    (dict(icl_function="sparse_linear", icl_sparsity=5), "data.icl_sparsity"),  # > icl_dim
    (dict(icl_sparsity=2), "data.icl_sparsity"),  # linear has no sparsity
    (dict(icl_function="sparse_linear", icl_hidden=3), "data.icl_hidden"),
    (dict(icl_function="relu_net", icl_sparsity=-1), "data.icl_sparsity"),
])
def test_bad_function_settings_are_refused_naming_the_field(fields, field):
    with pytest.raises(ConfigError, match=f"^config.{field}"):
        prepare(_data(**fields))


def test_a_class_built_directly_checks_its_parameter_too():
    with pytest.raises(ConfigError, match="^config.data.icl_hidden"):
        icl_regression.RegressionTask(dim=4, examples=8, function=ReluNet(hidden=0)).validate()
    with pytest.raises(ConfigError, match="^config.data.icl_sparsity"):
        icl_regression.RegressionTask(dim=4, examples=8, function=SparseLinear(sparsity=0)).validate()


def test_a_function_class_is_refused_where_nothing_reads_it():
    with pytest.raises(ConfigError, match="^config.data.icl_function"):
        sources.validate(DataConfig(source="mqar", icl_function="relu_net"))


@pytest.mark.parametrize("function, extra, claim", [
    ("sparse_linear", {"icl_sparsity": 1}, "below_least_squares_for_k_2_to_3"),
    ("relu_net", {"icl_hidden": 8}, "below_least_squares_at_the_largest_k"),
])
def test_icl_scores_a_run_of_each_class_with_its_baselines_and_claim(tmp_path, function, extra,
                                                                     claim):
    from attnlab import cli
    from attnlab.train import run

    model = ModelConfig(inputs="vectors", objective="regression", input_dim=4, d_model=16,
                        n_layers=1, n_heads=2, pos_encoding="learned", max_len=16)
    data = _data(icl_function=function, batch_size=4, **extra)
    train = TrainConfig(steps=2, warmup_steps=1, eval_every=2, eval_batches=1, log_every=1,
                        checkpoint_every=2, weight_decay=0.0)
    run(Config(model=model, data=data, train=train), tmp_path / "run", progress=False)
    assert cli.main(["icl", f"--run={tmp_path / 'run'}", "--batches=2"]) == 0
    result = json.loads((tmp_path / "run" / "icl.json").read_text())
    assert result["function"]["function"] == function
    assert set(result["matches"]) == {claim}
    task = prepare(data).task
    xs, ys, functions = task.batch_functions(0, "test", 0, 8)  # --batches x batch_size
    want = icl_regression.regression_baselines(xs, ys, 0.0, function=task.function, functions=functions)
    assert set(result["baselines"]) == set(want)
    for name, curve in want.items():
        np.testing.assert_allclose(result["baselines"][name], curve, rtol=1e-12)
    assert ("support_oracle" in want) == (function == "sparse_linear")
    assert result["expected"] if function == "sparse_linear" else not result["expected"]
