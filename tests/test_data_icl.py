"""In-context learning tasks: determinism and resumability, the structure of every window, the
exact optimal losses against brute-force enumeration / sampling, and the regression baselines
against their closed-form expected errors (independent float64 references)."""

import dataclasses
import itertools
import math

import numpy as np
import pytest

from attnlab.checks import check
from attnlab.config import Config, DataConfig, ModelConfig
from attnlab.data import icl, icl_regression, prepare, sources
from attnlab.errors import ConfigError


def _task(source, **fields):
    return prepare(DataConfig(source=source, **fields)).task


def test_task_registry_matches_the_config_sources():
    from attnlab.icl.evaluate import REPORTS

    assert set(sources.task_sources()) == set(REPORTS)  # every task has its report
    assert sources.task_of(DataConfig(source="markov")) is None


@pytest.mark.parametrize("source", ["induction", "mqar"])
def test_batch_i_is_a_pure_function_of_seed_and_index(source):
    corpus = prepare(DataConfig(source=source, seq_len=40, task_vocab=64))
    a = corpus.train_batches(40, 6, seed=3)
    b = corpus.train_batches(40, 6, seed=3)  # a restarted run
    assert a[7].shape == (6, 41) and a[7].dtype == np.int32
    np.testing.assert_array_equal(a[7], b[7])
    np.testing.assert_array_equal(a[2], b[2])
    assert not np.array_equal(a[7], a[8])
    assert not np.array_equal(a[7], corpus.train_batches(40, 6, seed=4)[7])
    # Processes take their rows of the same global batch.
    halves = [corpus.train_batches(40, 6, 3, process_index=p, process_count=2)[7] for p in (0, 1)]
    np.testing.assert_array_equal(np.concatenate(halves), a[7])
    val = corpus.validation_set(40, 6, 3)
    assert val.shape == (3, 6, 41)
    np.testing.assert_array_equal(val, prepare(DataConfig(source=source, seq_len=40)
                                               ).validation_set(40, 6, 3))
    assert not any(np.array_equal(val[0], a[i]) for i in range(3))
    assert a[5].min() >= 0 and a[5].max() < 64


def test_induction_windows_repeat_a_prefix_of_distinct_tokens():
    task = _task("induction", seq_len=21, task_vocab=16)
    windows = task.sample(np.random.default_rng(0), 200)
    periods = task.prefixes(windows)
    assert (task.min_prefix, task.max_prefix) == (5, 11)
    assert set(periods.tolist()) == set(range(5, 12))  # every period occurs
    for row, p in zip(windows, periods):
        assert len(set(row[:p].tolist())) == p
        np.testing.assert_array_equal(row[p:], row[: 22 - p])
    repeat = task.repeat_targets(windows)
    np.testing.assert_array_equal(repeat.sum(axis=1), 21 - periods)


def test_mqar_windows_hold_pairs_then_every_key_queried_once():
    task = _task("mqar", seq_len=40, task_vocab=21, mqar_pairs=5)
    k = task.keys
    for row in task.sample(np.random.default_rng(1), 50):
        keys, values = row[0:10:2], row[1:10:2]
        assert len(set(keys.tolist())) == 5 and keys.min() >= 1 and keys.max() <= k
        assert values.min() >= k + 1 and values.max() <= 2 * k
        table = dict(zip(keys.tolist(), values.tolist()))
        queries, answers = row[10:20:2], row[11:20:2]
        assert sorted(queries.tolist()) == sorted(keys.tolist())
        assert [table[q] for q in queries.tolist()] == answers.tolist()
        assert (row[20:] == icl.PAD).all()
    targets = task.answer_targets()
    assert targets.sum() == 5 and np.flatnonzero(targets).tolist() == [10, 12, 14, 16, 18]


def _enumerated_optimal_losses(task, windows):
    """The Bayes-optimal loss at each target, by exact enumeration of every window the task can
    make with its probability (tiny settings): -E log p(x_{t+1} | x_<=t)."""
    windows = np.asarray(windows)
    uniq, counts = np.unique(windows, axis=0, return_counts=True)
    prob = counts / counts.sum()
    out = []
    for t in range(1, windows.shape[1]):
        loss = 0.0
        prefix_mass, joint_mass = {}, {}
        for row, p in zip(uniq, prob):
            prefix_mass[tuple(row[:t])] = prefix_mass.get(tuple(row[:t]), 0) + p
            joint_mass[tuple(row[: t + 1])] = joint_mass.get(tuple(row[: t + 1]), 0) + p
        for row, p in zip(uniq, prob):
            loss -= p * math.log(joint_mass[tuple(row[: t + 1])] / prefix_mass[tuple(row[:t])])
        out.append(loss)
    return np.array(out)


def test_induction_optimal_losses_match_enumeration():
    task = icl.InductionTask(seq_len=7, vocab=5)  # periods 2..4 of distinct tokens from 5
    windows = []
    for period in range(task.min_prefix, task.max_prefix + 1):
        # Each period equally likely, then every ordered choice of distinct tokens: weight each
        # window by its probability through repetition counts (lcm of the choice counts).
        choices = list(itertools.permutations(range(5), period))
        copies = 120 // len(choices)
        assert copies * len(choices) == 120
        windows += [[c[t % period] for t in range(8)] for c in choices for _ in range(copies)]
    np.testing.assert_allclose(task.optimal_losses(), _enumerated_optimal_losses(task, windows),
                               atol=1e-12)
    seen = {tuple(r) for r in task.sample(np.random.default_rng(0), 3000).tolist()}
    assert seen <= {tuple(w) for w in windows}


def test_mqar_optimal_losses_match_enumeration():
    task = icl.MQARTask(seq_len=9, vocab=7, pairs=2)  # K = 3 keys, 3 values; 10-token windows
    k = task.keys
    windows = []
    for keys in itertools.permutations(range(1, k + 1), 2):
        for values in itertools.product(range(k + 1, 2 * k + 1), repeat=2):
            for order in itertools.permutations(range(2)):
                row = [keys[0], values[0], keys[1], values[1]]
                row += [x for i in order for x in (keys[i], values[i])] + [icl.PAD] * 2
                windows.append(row)
    np.testing.assert_allclose(task.optimal_losses(), _enumerated_optimal_losses(task, windows),
                               atol=1e-12)
    # The sampler draws from that distribution: every window is one of the enumerated ones.
    seen = {tuple(r) for r in task.sample(np.random.default_rng(0), 2000).tolist()}
    assert seen <= {tuple(w) for w in windows} and len(seen) > 0.9 * len(windows)


@pytest.mark.parametrize("fields, field", [
    (dict(source="mqar", seq_len=30, mqar_pairs=8), "data.mqar_pairs"),  # 32 tokens > 31
    (dict(source="mqar", seq_len=64, task_vocab=9, mqar_pairs=5), "data.task_vocab"),
    (dict(source="induction", seq_len=200, task_vocab=64), "data.task_vocab"),
    (dict(source="induction", seq_len=2), "data.seq_len"),
])
def test_impossible_task_settings_are_refused_naming_the_field(fields, field):
    with pytest.raises(ConfigError, match=f"^config.{field}"):
        prepare(DataConfig(**fields))


@pytest.mark.parametrize("fields, field", [
    (dict(source="pystdlib", mqar_pairs=4), "data.mqar_pairs"),
    (dict(source="induction", mqar_pairs=4), "data.mqar_pairs"),
    (dict(source="markov", task_vocab=32), "data.task_vocab"),
    (dict(source="mqar", task_vocab=0), "data.task_vocab"),
])
def test_task_fields_are_refused_where_nothing_reads_them(fields, field):
    with pytest.raises(ConfigError, match=f"^config.{field}"):
        sources.validate(DataConfig(**fields))


def test_task_vocab_must_fit_the_model_and_frees_the_byte_rule():
    check(Config(model=ModelConfig(vocab_size=64), data=DataConfig(source="induction")))
    with pytest.raises(ConfigError, match="^config.model.vocab_size"):
        check(Config(model=ModelConfig(vocab_size=32), data=DataConfig(source="induction")))


# ------------------------------------------------------------------------------------------
# In-context regression
# ------------------------------------------------------------------------------------------


def test_regression_prompts_are_deterministic_and_interleaved():
    task = icl_regression.RegressionTask(dim=3, examples=5)
    xs, ys = task.batch(seed=1, split="train", i=4, rows=2)
    xs2, ys2 = task.batch(seed=1, split="train", i=4, rows=2)
    np.testing.assert_array_equal(xs, xs2)
    np.testing.assert_array_equal(ys, ys2)
    prompt = icl_regression.interleave(xs, ys)
    assert prompt.shape == (2, 10, 3)
    np.testing.assert_array_equal(prompt[:, 0::2], xs)
    np.testing.assert_array_equal(prompt[:, 1::2, 0], ys)
    assert (prompt[:, 1::2, 1:] == 0).all()
    # Noiseless labels are an exact linear function: 3 examples recover w.
    w = np.linalg.solve(xs[0, :3], ys[0, :3])
    np.testing.assert_allclose(xs[0] @ w, ys[0], atol=1e-10)


@pytest.mark.parametrize("noise", [0.0, 0.5])
def test_baselines_match_their_closed_form_expected_errors(noise):
    dim, k = 4, 10
    xs, ys = icl_regression.RegressionTask(dim, k, noise).batch(seed=0, split="test", i=0, rows=4000)
    errors = icl_regression.regression_baselines(xs, ys, noise)
    expected = icl_regression.expected_errors(np.arange(k), dim, noise)
    for name in ("one_step_gd", "averaging", "least_squares"):
        got, want = errors[name], expected[name]
        # Noisy least squares has a heavy-tailed error near k = d (infinite variance): skip it.
        ok = np.isfinite(want) & ((noise == 0) | (np.abs(np.arange(k) - dim) > 2))
        # Monte-Carlo error of a mean of 4000 squared errors: a few percent (heavy tails).
        np.testing.assert_allclose(got[ok], want[ok], rtol=0.12, atol=0.02, err_msg=name)
    # Ridge at lambda = sigma^2 is Bayes-optimal: no worse than any other (up to sampling noise).
    for name in ("least_squares", "one_step_gd", "averaging", "nearest_neighbours"):
        assert (errors["ridge"] <= errors[name] + 0.02).all(), name
    assert errors["least_squares"][0] == pytest.approx(1 + noise**2 / dim, rel=0.1)


def test_gd_step_size_minimises_the_sampled_error():
    dim, k = 3, 6
    xs, ys = icl_regression.RegressionTask(dim, k + 1).batch(seed=2, split="test", i=0, rows=20000)
    x, y, xq, yq = xs[:, :k], ys[:, :k], xs[:, k], ys[:, k]
    g = np.einsum("bkd,bk->bd", x, y)
    etas = np.linspace(0.02, 0.25, 47)
    err = [((np.einsum("bd,bd->b", xq, eta * g) - yq) ** 2).mean() for eta in etas]
    assert etas[int(np.argmin(err))] == pytest.approx(icl_regression.gd_step_size(k, dim, 0.0), abs=0.015)


def test_a_task_run_resumed_from_a_checkpoint_ends_where_an_uninterrupted_one_does(tmp_path,
                                                                                  capfd):
    """Through the real trainer: batch i is a pure function of (seed, i), so a run that lost
    its last checkpoint and resumed from the one before ends with the same parameters."""
    from attnlab.config import TrainConfig
    from attnlab.train import run

    cfg = Config(model=ModelConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, max_len=32,
                                   ffn="none"),
                 data=DataConfig(source="mqar", task_vocab=32, mqar_pairs=4, seq_len=24,
                                 batch_size=4),
                 train=TrainConfig(steps=4, warmup_steps=1, eval_every=4, eval_batches=1,
                                   log_every=1, checkpoint_every=2, keep_checkpoints=3))
    summary = run(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed"
    assert summary["dataset"]["source"] == "mqar"
    assert_crash_resume_ends_as_uninterrupted(cfg, tmp_path / "run", capfd)


def assert_crash_resume_ends_as_uninterrupted(cfg, run_dir, capfd):
    """``run_dir``: a finished 4-step run checkpointed at steps 2 and 4. A copy of it as a
    crash after step 3 leaves it (checkpoint 2, no summary of a finished run) resumes from step
    2 and ends with the uninterrupted run's parameters, bit for bit."""
    import shutil

    import jax

    from attnlab.train import load_params, run

    _, _, finished = load_params(run_dir)
    crashed = run_dir.parent / "crashed"
    shutil.copytree(run_dir, crashed)
    shutil.rmtree(crashed / "checkpoints" / "4")
    (crashed / "summary.json").unlink()
    capfd.readouterr()
    resumed = run(cfg, crashed, progress=True)
    assert resumed["status"] == "completed" and resumed["step"] == 4
    assert "from step 2/4" in "".join(capfd.readouterr())
    _, _, again = load_params(crashed)
    for a, b in zip(jax.tree.leaves(finished), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ------------------------------------------------------------------------------------------
# The loss on MQAR's answers (data.loss_on=answers, as Zoology trains)
# ------------------------------------------------------------------------------------------


def test_answer_weights_mark_the_queried_keys_values():
    data = DataConfig(source="mqar", task_vocab=32, mqar_pairs=4, seq_len=20, loss_on="answers")
    weights = sources.target_weights(data)
    assert weights.shape == (20,) and set(np.unique(weights)) == {0.0, 1.0}
    windows = prepare(data).train_batches(20, 8, seed=0)[0]
    keys = (windows >= 1) & (windows <= icl.MQARTask(20, 32, 4).keys)
    # Target t (window token t + 1) is an answer iff its input is a key seen before: a query.
    queried = np.array([[keys[b, t] and windows[b, t] in windows[b, :t] for t in range(20)]
                        for b in range(8)])
    np.testing.assert_array_equal(np.broadcast_to(weights > 0, queried.shape), queried)
    assert sources.target_weights(dataclasses.replace(data, loss_on="all")) is None
    # The optimum of the reported loss: every answer is determined by its context.
    assert prepare(data).manifest["optimal_loss_nats"] == 0.0
    assert prepare(dataclasses.replace(data, loss_on="all")).manifest["optimal_loss_nats"] > 0


def test_the_answer_loss_is_the_cross_entropy_at_the_answers_alone():
    """Against a float64 log-softmax of the model's logits at the answers; the targets outside
    the answers (here the padding) do not move the training loss or its gradient."""
    import jax

    from attnlab.model import apply, init_model
    from attnlab.train.step import loss_grad_fn, make_eval_step, mean_loss

    data = DataConfig(source="mqar", task_vocab=32, mqar_pairs=3, seq_len=16, loss_on="answers")
    cfg = Config(model=ModelConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, max_len=32,
                                   ffn="none"), data=data)
    graphdef, params = init_model(cfg.model, seed=0)
    windows = prepare(data).train_batches(16, 4, seed=0)[0]
    weights = sources.target_weights(data)
    logits = np.asarray(apply(graphdef, params, windows[:, :-1]), np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, windows[:, 1:, None], axis=-1)[..., 0]
    expected = nll[:, weights > 0].mean()
    assert float(mean_loss(graphdef, params, windows, weights=weights)) == pytest.approx(
        expected, rel=1e-5)
    assert float(make_eval_step(graphdef, weights=weights)(params, windows)["loss"]) == \
        pytest.approx(expected, rel=1e-5)
    assert float(mean_loss(graphdef, params, windows)) == pytest.approx(nll.mean(), rel=1e-5)
    # Padding targets (after the last answer) changed: same loss, same gradient.
    changed = windows.copy()
    changed[:, 4 * 3 + 1:] = 5
    grad_fn = jax.jit(loss_grad_fn(graphdef, weights=weights))
    (m1, g1), (m2, g2) = grad_fn(params, windows, None, None), grad_fn(params, changed, None, None)
    assert float(m1["loss"]) == float(m2["loss"])
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("data, model", [
    (dict(source="induction", loss_on="answers"), {}),
    (dict(source="pystdlib", loss_on="answers"), {}),
    (dict(source="mqar", loss_on="queries"), {}),
    (dict(source="mqar", loss_on="answers"), dict(objective="mlm")),
])
def test_the_answer_loss_is_refused_where_there_are_no_answers(data, model):
    with pytest.raises(ConfigError, match="^config.data.loss_on"):
        check(Config(model=ModelConfig(vocab_size=512, **model), data=DataConfig(**data)))
