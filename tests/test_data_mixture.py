"""data.mixture: a markov chain, a slice of pystdlib and JSON-lines shards written here, mixed
by weight. Every row's source found by its content (each source's windows looked up), so the
shares over 1,000 batches are measured, not read back from the interleave; batches a pure
function of (corpus, seed, i) and a resumed run ending as an uninterrupted one; the summary and
the results table's unique_tokens and epochs; bad mixtures refused in one line naming the
field, exit 2, nothing written."""

import hashlib
import json
import shutil

import numpy as np
import pandas as pd
import pytest

from attnlab import cli, results
from attnlab.checks import check
from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
from attnlab.data import mixture, prepare
from attnlab.errors import ConfigError
from attnlab.train import run
from test_data_icl import assert_crash_resume_ends_as_uninterrupted

SEQ_LEN, BATCH = 16, 16
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("web")
    rng = np.random.default_rng(0)
    for k in range(2):
        lines = [json.dumps({"text": " ".join(rng.choice(WORDS, 30)) + f" {k}.{i}"})
                 for i in range(60)]
        (root / f"{k}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def data(cache, spec, **fields) -> DataConfig:
    return DataConfig(mixture=spec, max_bytes=100_000, markov_tokens=40_000, seq_len=SEQ_LEN,
                      batch_size=BATCH, cache_dir=str(cache), **fields)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def mixed(cache, shard_dir):
    """The data section of a three-source mixture and its prepared corpus."""
    d = data(cache, f"web@shards:{shard_dir}=2,markov=5,pystdlib=3", workers=1)
    return d, prepare(d)


def source_of_rows(corpus, rows: np.ndarray) -> np.ndarray:
    """Each row's source, found by looking its tokens up among every window of every source."""
    where = {}
    for k, part in enumerate(corpus.corpora):
        stream = part.tokens("train")
        starts = np.arange((len(stream) - 1) // SEQ_LEN) * SEQ_LEN
        for window in stream[starts[:, None] + np.arange(SEQ_LEN + 1)]:
            where.setdefault(window.tobytes(), set()).add(k)
    found = [where[row.tobytes()] for row in rows]
    assert all(len(f) == 1 for f in found)  # every window is one source's
    return np.array([next(iter(f)) for f in found])


def test_token_shares_match_the_weights_over_1000_batches(mixed):
    d, corpus = mixed
    batches = corpus.train_batches(SEQ_LEN, BATCH, seed=0)
    rows = np.concatenate([batches[i] for i in range(1000)])
    counts = np.bincount(source_of_rows(corpus, rows), minlength=3)
    shares = counts / counts.sum()
    np.testing.assert_allclose(shares, [0.2, 0.5, 0.3], rtol=0.01, atol=0)
    # The counts the metrics report are the rows read: every source's, exactly.
    consumed = batches.consumed(1000)
    assert [consumed[f"tokens/{n}"] for n in ("web", "markov", "pystdlib")] == list(
        counts * SEQ_LEN)
    assert consumed["epochs/web"] > 1  # the small source is repeated, the others are not
    assert consumed["epochs/pystdlib"] < 1


def test_the_manifest_records_every_source_with_its_files(mixed, shard_dir):
    _, corpus = mixed
    sources = corpus.manifest["sources"]
    assert [(s["name"], s["source"], s["weight"]) for s in sources] == [
        ("web", "shards", 0.2), ("markov", "markov", 0.5), ("pystdlib", "pystdlib", 0.3)]
    shards = sources[0]["manifest"]["files"]
    assert [f["sha256"] for f in shards] == [
        hashlib.sha256((shard_dir / f"{k}.jsonl").read_bytes()).hexdigest() for k in range(2)]
    assert [f["bytes"] for f in shards] == [(shard_dir / f"{k}.jsonl").stat().st_size
                                            for k in range(2)]
    assert sources[2]["manifest"]["bytes"] <= 100_000  # the pystdlib slice, as alone
    assert corpus.manifest["tokens"]["train"] == sum(
        c.num_tokens("train") for c in corpus.corpora)


def test_batches_are_a_pure_function_of_corpus_seed_and_i(mixed):
    d, corpus = mixed
    first = corpus.train_batches(SEQ_LEN, BATCH, seed=0)
    indices = [0, 7, 999, 123_456]
    want = [first[i] for i in indices]
    again = prepare(d).train_batches(SEQ_LEN, BATCH, seed=0)  # loaded from the cache
    for i, batch in reversed(list(zip(indices, want))):
        np.testing.assert_array_equal(again[i], batch)
    other = corpus.train_batches(SEQ_LEN, BATCH, seed=1)
    assert not np.array_equal(other[7], want[1])
    # The seed orders each source's windows; which source a row reads is the weights' alone.
    np.testing.assert_array_equal(source_of_rows(corpus, other[7]),
                                  source_of_rows(corpus, want[1]))
    # Two processes' rows are the halves of the batch.
    halves = [corpus.train_batches(SEQ_LEN, BATCH, 0, process_index=p, process_count=2)[7]
              for p in (0, 1)]
    np.testing.assert_array_equal(np.concatenate(halves), want[1])


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache):
    """A 4-step run on a two-source mixture, checkpointed at 2 and 4."""
    cfg = Config(model=ModelConfig(d_model=16, n_layers=1, n_heads=2, max_len=32),
                 data=data(cache, "markov=1,pystdlib=3"),
                 train=TrainConfig(steps=4, warmup_steps=1, log_every=1, eval_every=4,
                                   eval_batches=1, checkpoint_every=2, keep_checkpoints=3))
    workdir = tmp_path_factory.mktemp("runs") / "mix"
    return cfg, workdir, run(cfg, workdir, progress=False)


def test_a_resumed_mixture_run_ends_as_an_uninterrupted_one(trained, capfd):
    cfg, workdir, summary = trained
    assert summary["status"] == "completed"
    assert_crash_resume_ends_as_uninterrupted(cfg, workdir, capfd)


def test_summary_metrics_and_table_carry_unique_tokens_and_epochs(trained, tmp_path):
    cfg, workdir, summary = trained
    corpus = prepare(cfg.data)
    unique = {e.name: c.num_tokens("train") for e, c in zip(corpus.entries, corpus.corpora)}
    assert summary["unique_tokens"] == sum(unique.values())
    assert summary["epochs"] == summary["tokens"] / summary["unique_tokens"]
    assert summary["tokens/markov"] + summary["tokens/pystdlib"] == summary["tokens"]
    assert abs(summary["tokens/markov"] - BATCH * SEQ_LEN) <= SEQ_LEN  # 1/4 of 4 batches
    for name, tokens in unique.items():
        assert summary[f"unique_tokens/{name}"] == tokens
        assert summary[f"epochs/{name}"] == summary[f"tokens/{name}"] / tokens
    lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    last = [x for x in lines if "loss" in x][-1]
    assert last["epochs"] == summary["epochs"]
    assert last["tokens/pystdlib"] == summary["tokens/pystdlib"]
    # The run as one row of a sweep's results table.
    run_dir = tmp_path / "sweep" / "runs" / "mix"
    shutil.copytree(workdir, run_dir)
    (run_dir / "run.json").write_text(json.dumps({"run_id": "mix", "sweep": "t"}))
    results.write_table(tmp_path / "sweep")
    row = pd.read_csv(tmp_path / "sweep" / "results.csv").iloc[0]
    assert row["unique_tokens"] == summary["unique_tokens"]
    assert row["epochs"] == pytest.approx(row["tokens"] / row["unique_tokens"], rel=1e-12)
    assert row["epochs/markov"] == pytest.approx(summary["epochs/markov"], rel=1e-12)
    assert row["tokens/pystdlib"] == summary["tokens/pystdlib"]
    curve = results.curves(tmp_path / "sweep")
    assert curve["epochs/markov"].is_monotonic_increasing


BAD = [
    ("pystdlib=0,markov=1", "weights must be positive"),
    ("pystdlib=-1,markov=1", "weights must be positive"),
    ("pystdlib=nan,markov=1", "weights must be positive"),
    ("pystdlib=x,markov=1", "not a number"),
    ("pystdlib,markov=1", "not <source>=<weight>"),
    ("pystdlib=1,,markov=1", "an empty source"),
    ("=1,markov=1", "not <source>=<weight>"),
    ("wiki=1,markov=1", "unknown source 'wiki'"),
    ("shards=1,markov=1", "needs a directory"),
    ("shards:=1,markov=1", "an empty path"),
    ("induction=1,markov=1", "induction is not one"),  # a task: sampled as it is read
    ("mixture=1,markov=1", "mixture is not one"),
    ("markov=1", "two or more sources"),
    ("markov=1,markov=2", "two sources named 'markov'"),
    ("a@markov=1,a@pystdlib=1", "two sources named 'a': give each a name of its own"),
    ("markov=1e308,pystdlib=1e308", "the weights sum to more than a number holds"),
    ("markov=1e-6,pystdlib=1", "'markov=1e-6': its weight is below 1/65536 of the sum"),
]


@pytest.mark.parametrize("spec, says", BAD)
def test_a_bad_mixture_exits_2_in_one_line_naming_the_field(spec, says, tmp_path, capsys):
    code = cli.main(["train", "--config=configs/tiny.py", f"--run={tmp_path / 'run'}",
                     f"--config.data.mixture={spec}", f"--config.data.cache_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "data.mixture:" in err and says in err, err
    assert not (tmp_path / "run").exists() and not (tmp_path / "prepared").exists()


@pytest.mark.parametrize("fields, field", [
    (dict(tokenizer="bpe"), "data.tokenizer"),  # each source would train its own vocabulary
    (dict(tokenizer="/x/tokenizer.json"), "data.tokenizer"),  # pystdlib is byte or bpe
    (dict(path="/data"), "data.path"),  # the paths are the entries'
    (dict(source="markov"), "data.mixture"),  # data.source names one source
    (dict(document_mask=True), "data.document_mask"),  # markov has no documents
    (dict(mqar_pairs=4), "data.mqar_pairs"),  # a field no source of the mixture reads
])
def test_mixture_settings_are_checked_naming_the_field(fields, field, tmp_path):
    with pytest.raises(ConfigError) as error:
        check(Config(data=data(tmp_path, "markov=1,pystdlib=1", **fields)))
    assert error.value.field == field
    assert not (tmp_path / "prepared").exists()


def test_a_source_specific_field_goes_to_the_sources_that_read_it(shard_dir, tmp_path):
    """data.text_field and data.workers are the shards'; pystdlib, which refuses them alone,
    reads its section without them."""
    d = data(tmp_path, f"shards:{shard_dir}=1,pystdlib=1", workers=1, text_field="body")
    check(Config(data=d))
    sections = [section for _, _, section in mixture_parts(d)]
    assert [(s.source, s.path, s.text_field, s.workers) for s in sections] == [
        ("shards", str(shard_dir), "body", 1), ("pystdlib", "", "text", 0)]


def mixture_parts(d):
    from attnlab.data.sources import Mixture

    return Mixture().parts(d)


def test_entries_parse_names_paths_and_tfds_names():
    paths = ("shards", "text_files")
    entries = mixture.parse("web@shards:/d/lang=en/*.parquet=0.7,tfds:lm1b/text=0.1,"
                            "code@text_files:/src=0.2", paths)
    assert [(e.name, e.source, e.path, e.weight) for e in entries] == [
        ("web", "shards", "/d/lang=en/*.parquet", 0.7), ("tfds:lm1b/text", "tfds:lm1b/text",
                                                         "", 0.1),
        ("code", "text_files", "/src", 0.2)]
    interleave = mixture.Interleave(np.array([0.7, 0.1, 0.2]))
    source, row = interleave.assign(np.arange(3 * mixture.PERIOD))
    for k in range(3):  # a source's rows are numbered 0, 1, 2, ... in order
        np.testing.assert_array_equal(row[source == k], np.arange((source == k).sum()))
        assert interleave.rows_of(k, 3 * mixture.PERIOD) == (source == k).sum()
