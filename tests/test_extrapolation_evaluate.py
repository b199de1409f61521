"""Evaluation of real tiny trained runs against float64 NumPy references, protocol invariants,
not-applicable lengths, report files, and bad input (library and command line)."""

import dataclasses
import json
import math

import jax
import numpy as np
import pytest

import configs.tiny
from attnlab import cli
from attnlab import model as lm
from attnlab.config import from_config_dict
from attnlab.data import prepare
from attnlab.extrapolation import EvalSettings, EvaluationError, evaluate_model, evaluate_run
from attnlab.extrapolation import cli as extrapolation_cli
from attnlab.extrapolation import evaluate as ev
from attnlab.model import PositionOutOfRangeError
from attnlab.train import load_params, run

TRAIN_LENGTH = 32  # configs/tiny.py: seq_len 32, max_len 64


def tiny_config(cache_dir, pos_encoding):
    config = configs.tiny.get_config()
    config.data.cache_dir = str(cache_dir)
    config.data.max_bytes = 200_000
    config.model.pos_encoding = pos_encoding
    config.train.steps = 12
    config.train.checkpoint_every = 12
    config.train.eval_every = 12
    return from_config_dict(config)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{pos_encoding: run_dir} of two 12-step tiny runs (RoPE, learned table of 64 rows)."""
    data_dir = tmp_path_factory.mktemp("data")
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for pos_encoding in ("rope", "learned"):
        out[pos_encoding] = root / pos_encoding
        run(tiny_config(data_dir, pos_encoding), out[pos_encoding], progress=False)
    return out


@pytest.fixture(scope="module")
def rope(runs):
    cfg, graphdef, state = load_params(runs["rope"])
    stream = prepare(cfg.data).tokens("validation")
    return cfg, graphdef, state, stream


def reference_losses(graphdef, state, inputs, targets):
    """Cross-entropy per token from the model's logits with a float64 NumPy log-softmax."""
    logits = np.asarray(jax.jit(lm.apply, static_argnums=0)(graphdef, state, inputs), np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return -np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]


def row(report, protocol, length):
    return next(r for r in report["results"] if r["protocol"] == protocol and r["length"] == length)


def test_nonoverlapping_losses_match_float64_reference(rope):
    cfg, graphdef, state, stream = rope
    stream = stream[: 4 * 64 + 7]  # a short stream: 4 windows of 64, plus a remainder dropped
    settings = EvalSettings(lengths=(32, 64), batch_tokens=96)  # uneven last batch at L=32
    report = evaluate_model(cfg, state, stream, settings)
    assert report["n_targets"] == 256
    for length in (32, 64):
        n = 256 // length
        windows = np.stack([stream[i * length: (i + 1) * length + 1] for i in range(n)])
        reference = reference_losses(graphdef, state, windows[:, :-1], windows[:, 1:])
        result = row(report, "nonoverlapping", length)
        assert result["n_scored"] == 256
        np.testing.assert_allclose(result["loss"], reference.mean(), rtol=1e-6)
        assert result["perplexity"] == pytest.approx(math.exp(reference.mean()), rel=1e-6)
        assert result["bits_per_byte"] == pytest.approx(reference.mean() / math.log(2), rel=1e-6)
        if length == 64:  # the longest: its per-position curve averages the 4 windows
            np.testing.assert_allclose(report["per_position"]["loss"], reference.mean(axis=0),
                                       rtol=1e-5)
    r64, r32 = row(report, "nonoverlapping", 64), row(report, "nonoverlapping", 32)
    assert r64["ppl_ratio"] == pytest.approx(r64["perplexity"] / r32["perplexity"], rel=1e-9)
    assert r32["ppl_ratio"] == 1.0


def test_sliding_with_stride_equal_to_window_is_nonoverlapping_exactly(rope):
    cfg, _, state, stream = rope
    settings = EvalSettings(lengths=(32,), protocols=("nonoverlapping", "sliding"), stride=32,
                            max_tokens=2001)
    report = evaluate_model(cfg, state, stream, settings)
    assert row(report, "sliding", 32)["loss"] == row(report, "nonoverlapping", 32)["loss"]
    assert row(report, "sliding", 32)["n_scored"] == row(report, "nonoverlapping", 32)["n_scored"]


def test_sliding_scores_each_target_in_the_window_that_ends_after_it(rope):
    cfg, graphdef, state, stream = rope
    length, stride, n_targets = 32, 12, 128
    stream = stream[: n_targets + 1]
    report = evaluate_model(cfg, state, stream, EvalSettings(
        lengths=(32,), protocols=("sliding",), stride=stride))
    # Independent of the plan code: target index j (predicting stream[j + 1]) is scored by the
    # first window [end - L, end) with end in {L, L + S, ..., n_targets} and end > j.
    ends = [e for e in range(length, n_targets + 1, stride)]
    ends += [n_targets] if ends[-1] != n_targets else []
    windows = np.stack([stream[end - length: end + 1] for end in ends])
    losses = reference_losses(graphdef, state, windows[:, :-1], windows[:, 1:])
    total = 0.0
    for j in range(n_targets):
        w = next(i for i, end in enumerate(ends) if end > j)
        total += losses[w, j - (ends[w] - length)]
    assert row(report, "sliding", 32)["loss"] == pytest.approx(total / n_targets, rel=1e-6)


def test_query_block_attention_gives_the_same_losses(rope):
    cfg, _, state, stream = rope
    common = dict(lengths=(128,), max_tokens=4 * 128 + 1)
    chunked = evaluate_model(cfg, state, stream, EvalSettings(attention_chunk=32, **common))
    full = evaluate_model(cfg, state, stream, EvalSettings(attention_chunk=0, **common))
    np.testing.assert_allclose(row(chunked, "nonoverlapping", 128)["loss"],
                               row(full, "nonoverlapping", 128)["loss"], rtol=1e-5)
    np.testing.assert_allclose(chunked["per_position"]["loss"], full["per_position"]["loss"],
                               rtol=1e-4)


def test_every_length_scores_the_same_tokens(rope):
    cfg, _, state, stream = rope
    report = evaluate_model(cfg, state, stream, EvalSettings(
        multipliers=(1, 2, 4), protocols=("nonoverlapping", "sliding"), max_tokens=3000))
    assert report["n_targets"] == 2944  # 2999 predictions truncated to a multiple of 128
    assert {r["n_scored"] for r in report["results"]} == {2944}
    assert report["lengths"] == [32, 64, 128] and report["stride"] == 16
    assert all(math.isfinite(r["loss"]) for r in report["results"]) and not report["warnings"]


def test_learned_positions_beyond_the_table_are_not_applicable(runs, tmp_path):
    report = evaluate_run(runs["learned"], EvalSettings(multipliers=(1, 2, 4)), progress=False)
    ok = row(report, "nonoverlapping", 64)
    beyond = row(report, "nonoverlapping", 128)
    assert ok["status"] == "ok" and math.isfinite(ok["loss"])
    assert beyond["status"] == "not_applicable"
    assert "model.max_len=64" in beyond["reason"] and "not clamped" in beyond["reason"]
    assert beyond["loss"] is None and beyond["ppl_ratio"] is None  # never NaN
    assert report["per_position"]["length"] == 64 and "128" in report["per_position"]["note"]
    # The same tokens as any other encoding: the stream is cut for 128 too, though 128 is not run.
    n_tokens = prepare(load_params(runs["learned"])[0].data).num_tokens("validation")
    assert ok["n_scored"] == report["n_targets"] == (n_tokens - 1) // 128 * 128
    text = (runs["learned"] / "extrapolation.json").read_text()
    assert "NaN" not in text and json.loads(text)["results"][2]["loss"] is None
    # Only the refusal keeps the number honest: the model itself must refuse, not clamp.
    cfg, graphdef, state = load_params(runs["learned"])
    with pytest.raises(PositionOutOfRangeError, match="0..63"):
        lm.apply(graphdef, state, np.zeros((1, 128), np.int32))


def test_report_files_are_written_and_reused_while_current(runs):
    run_dir = runs["rope"]
    settings = EvalSettings(multipliers=(1, 2), max_tokens=2000)
    first = evaluate_run(run_dir, settings, progress=False)
    paths = ev.report_paths(run_dir)
    stamp = paths["json"].stat().st_mtime_ns
    assert ev.is_current(run_dir, settings)
    assert evaluate_run(run_dir, settings, progress=False) == first
    assert paths["json"].stat().st_mtime_ns == stamp  # not re-evaluated
    table = paths["csv"].read_text().splitlines()
    assert table[0].startswith("name,pos_encoding,seed,protocol,stride,length") and len(table) == 3
    assert len(paths["positions"].read_text().splitlines()) == 1 + 64
    assert not ev.is_current(run_dir, dataclasses.replace(settings, max_tokens=1000))
    saved = json.loads(paths["json"].read_text())
    paths["json"].write_text(json.dumps({**saved, "checkpoint_step": 6}))  # an older checkpoint
    assert not ev.is_current(run_dir, settings)


def test_ntk_rope_scaling_is_labelled_and_stretches_the_lowest_frequency(runs):
    theta, head_dim, factor = 10000.0, 16, 4.0
    scaled = ev.ntk_rope_theta(theta, head_dim, factor)
    lowest = (head_dim - 2) / head_dim
    assert scaled ** -lowest == pytest.approx(theta ** -lowest / factor, rel=1e-12)
    report = evaluate_run(runs["rope"], EvalSettings(multipliers=(1, 4), max_tokens=2000,
                                                     rope_scaling="ntk"), progress=False)
    assert report["rope_scaling"]["method"] == "ntk" and report["rope_scaling"]["factor"] == 4.0
    assert (runs["rope"] / "extrapolation-rope_ntk_x4.json").exists()
    plain = evaluate_run(runs["rope"], EvalSettings(multipliers=(1, 4), max_tokens=2000),
                         progress=False)
    assert row(report, "nonoverlapping", 128)["loss"] != row(plain, "nonoverlapping", 128)["loss"]
    with pytest.raises(EvaluationError, match="rope_scaling: ntk applies to RoPE models"):
        evaluate_run(runs["learned"], EvalSettings(rope_scaling="ntk"), progress=False)


@pytest.mark.parametrize("method", ["pi", "yarn"])
def test_pi_and_yarn_are_evaluation_settings_of_rope_runs(runs, method):
    settings = EvalSettings(multipliers=(1, 4), max_tokens=2000, rope_scaling=method)
    report = evaluate_run(runs["rope"], settings, progress=False)
    record = report["rope_scaling"]
    assert (record["method"], record["eval_rope_scaling"], record["eval_rope_factor"]) == (
        method, method, 4.0)
    assert record["eval_rope_original_len"] == (32 if method == "yarn" else 0)  # L_train
    assert (runs["rope"] / f"extrapolation-rope_{method}_x4.json").exists()
    plain = evaluate_run(runs["rope"], EvalSettings(multipliers=(1, 4), max_tokens=2000),
                         progress=False)
    assert row(report, "nonoverlapping", 128)["loss"] != row(plain, "nonoverlapping", 128)["loss"]
    with pytest.raises(EvaluationError, match=f"rope_scaling: {method} applies to RoPE models"):
        evaluate_run(runs["learned"], EvalSettings(rope_scaling=method), progress=False)
    with pytest.raises(EvaluationError, match="rope_scaling: all evaluates a study"):
        evaluate_run(runs["rope"], EvalSettings(rope_scaling="all"), progress=False)


def test_the_command_offers_every_rope_rescaling():
    flag = {f.name: f for f in extrapolation_cli.FLAGS}["rope-scaling"]
    assert tuple(flag.enum_values) == (*ev.ROPE_SCALINGS, "all")
    assert set(ev.ROPE_SCALINGS) == {"none", "ntk", "pi", "yarn"}


def test_bad_input_raises_one_clear_error(runs, rope, tmp_path):
    cfg, _, state, stream = rope
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "config.json").write_text(cfg.to_json())
    with pytest.raises(EvaluationError, match="has no finished checkpoint"):
        evaluate_run(tmp_path / "fresh")
    with pytest.raises(EvaluationError, match="is not a run directory"):
        evaluate_run(tmp_path)
    with pytest.raises(EvaluationError, match="lengths: every length must be >= 1, got 0"):
        evaluate_run(runs["rope"], EvalSettings(lengths=(0, 32)))
    with pytest.raises(EvaluationError, match="multipliers: every length must be >= 1, got -2"):
        evaluate_run(runs["rope"], EvalSettings(multipliers=(1, -2)))
    with pytest.raises(EvaluationError, match="stride: 40 is larger than the window length 32"):
        evaluate_model(cfg, state, stream, EvalSettings(protocols=("sliding",), stride=40))
    with pytest.raises(EvaluationError, match="none of the requested lengths \\[128, 256\\] can be represented"):
        evaluate_run(runs["learned"], EvalSettings(lengths=(128, 256)))
    with pytest.raises(EvaluationError, match="validation split has 1000 tokens"):
        evaluate_model(cfg, state, stream, EvalSettings(lengths=(32, 1024), max_tokens=1000))


@pytest.mark.parametrize("argv,message", [
    (["--run={fresh}"], "has no finished checkpoint"),
    (["--run={rope}", "--lengths=0,32"], "lengths: every length must be >= 1"),
    (["--run={rope}", "--protocol=sliding", "--stride=99"], "stride: 99 is larger than"),
    (["--run={learned}", "--lengths=4096"], "none of the requested lengths [4096] can be represented"),
    (["--run={rope}", "--lengths=a,b"], "--lengths: expected comma-separated integers"),
    (["--multipliers=1,2"], "give exactly one of --run"),
    (["--run={rope}", "--config=experiments/tiny_pe.py"], "give exactly one of --run"),
    (["--config=experiments/tiny_pe.py"], "--sweep is required with --config"),
    (["--run={rope}", "--sweep={fresh}"], "--sweep is the sweep directory of --config"),
    (["--run={rope}", "--parallel=2"], "--parallel runs the sweep of --config"),
    (["--run={rope}", "--launcher=ray"], "--launcher runs the sweep of --config"),
    (["--sweep={fresh}"], "name the experiment with --config"),
    (["--run={rope}", "--config.sweep.mode=curves"], "spec overrides need --config"),
])
def test_command_line_bad_input_exits_2_without_traceback(runs, rope, tmp_path, capsys, argv,
                                                           message):
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "config.json").write_text(rope[0].to_json())
    argv = [a.format(fresh=fresh, rope=runs["rope"], learned=runs["learned"]) for a in argv]
    assert cli.main(["extrapolate", *argv, "--noprogress"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_command_line_evaluates_a_run(runs, capsys):
    code = cli.main(["extrapolate", f"--run={runs['rope']}", "--multipliers=1,2",
                     "--max-tokens=2000", "--noprogress"])
    out = capsys.readouterr().out
    assert code == 0
    assert "nonoverlapping" in out and "ppl_ratio" in out and "extrapolation.json" in out



def test_command_line_help_lists_the_flags(capsys):
    assert cli.main(["extrapolate", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--protocol (nonoverlapping|sliding|both)" in out and "--rope-scaling" in out


def test_bytes_per_token_of_a_bpe_corpus_is_its_decoded_length(tmp_path):
    from attnlab.config import DataConfig

    corpus = prepare(DataConfig(max_bytes=200_000, tokenizer="bpe", bpe_vocab_size=300,
                                cache_dir=str(tmp_path)))
    tokens = corpus.tokens("validation")
    decoded = corpus.tokenizer.decode(tokens)  # separators decode to the byte 0x00
    assert ev.bytes_per_token(corpus) == pytest.approx(len(decoded) / len(tokens))
    assert ev.bytes_per_token(prepare(DataConfig(max_bytes=200_000,
                                                 cache_dir=str(tmp_path)))) == 1.0


def test_a_document_masked_run_is_evaluated_with_its_documents_apart(rope):
    """A run trained with data.document_mask is scored as it was trained: a token's loss does
    not depend on the tokens of the earlier document in its window (here the byte separator 0
    ends one at input position 10 of every window), and without the mask it does."""
    cfg, _, state, _ = rope
    rng = np.random.default_rng(0)
    a = rng.integers(1, 256, 4 * TRAIN_LENGTH + 1).astype(np.int32)
    a[10::TRAIN_LENGTH] = 0  # a separator at input 10 of each 32-token window
    b = a.copy()
    for start in range(0, 4 * TRAIN_LENGTH, TRAIN_LENGTH):  # the first document's inputs 1..9
        b[start + 1:start + 10] = rng.integers(1, 256, 9)
    settings = EvalSettings(lengths=(TRAIN_LENGTH,), batch_tokens=64)

    def curve(stream, document_mask):
        data = dataclasses.replace(cfg.data, document_mask=document_mask)
        report = evaluate_model(dataclasses.replace(cfg, data=data), state, stream, settings)
        assert report["document_mask"] is document_mask
        return np.asarray(report["per_position"]["loss"])

    masked_a, masked_b = curve(a, True), curve(b, True)
    np.testing.assert_allclose(masked_a[11:], masked_b[11:], rtol=1e-6)
    assert np.abs(masked_a[:9] - masked_b[:9]).max() > 1e-3  # the changed document itself
    unmasked_a, unmasked_b = curve(a, False), curve(b, False)
    assert np.abs(unmasked_a[11:] - unmasked_b[11:]).max() > 1e-4
