"""data.source=shards: Parquet, JSON lines (.gz, .zst) and text shards made here, tokenized by
byte or by a tokenizer.json trained here with the tokenizers library; every document's tokens
checked against an independent tokenization, the split rule recomputed, builds across worker
counts and a resumed build byte-identical, errors naming the file or field, and a tiny run
trained on the shards through the command line."""

import gzip
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from attnlab import cli
from attnlab.checks import check
from attnlab.config import Config, DataConfig, ModelConfig
from attnlab.data import DataSourceError, prepare, shards
from attnlab.errors import ConfigError

WORDS = "the of and to in is was for on that with as by at from his it an were are".split()


def make_documents(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 60)))) + f" ({seed}.{i}) é"
            for i in range(n)]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> tuple[Path, list[list[str]]]:
    """Four shards, one per format, and the documents of each in order."""
    root = tmp_path_factory.mktemp("shards")
    docs = [make_documents(120, s) for s in range(4)]
    pq.write_table(pa.table({"id": list(range(120)), "text": docs[0]}), root / "a.parquet",
                   row_group_size=50)
    with gzip.open(root / "b.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": d, "url": "x"}) + "\n" for d in docs[1])
    with pa.output_stream(str(root / "c.jsonl.zst"), compression="zstd") as f:
        f.write("".join(json.dumps({"text": d}) + "\n" for d in docs[2]).encode())
    (root / "d.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[3]))
    (root / "notes.md").write_text("not a shard: a directory takes only shard formats")
    return root, docs


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory, corpus_dir) -> Path:
    hub = Tokenizer(models.BPE())
    hub.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hub.train_from_iterator([d for docs in corpus_dir[1] for d in docs], trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    hub.save(str(path))
    return path


def split_of(text: str) -> str:
    """The split rule, recomputed: sha256 of the text, first 8 bytes mod 100, 90/5/5."""
    bucket = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % 100
    return "train" if bucket < 90 else "validation" if bucket < 95 else "test"


def expected_streams(docs: list[list[str]], encode, eos: int) -> dict[str, list[int]]:
    out = {"train": [], "validation": [], "test": []}
    for shard in docs:
        for text in shard:
            out[split_of(text)] += [*encode(text), eos]
    return out


def test_tokenizer_json_tokens_equal_an_independent_tokenization(corpus_dir, tokenizer_file,
                                                                 tmp_path):
    root, docs = corpus_dir
    corpus = prepare(DataConfig(source="shards", path=str(root), tokenizer=str(tokenizer_file),
                                cache_dir=str(tmp_path), workers=2))
    hub = Tokenizer.from_file(str(tokenizer_file))
    eos = hub.token_to_id("<|endoftext|>")
    expected = expected_streams(docs, lambda t: hub.encode(t, add_special_tokens=False).ids, eos)
    for split, tokens in expected.items():
        assert corpus.stream(split).dtype == np.uint16  # 400 ids fit
        assert corpus.tokens(split).tolist() == tokens
    assert corpus.tokenizer.eos_id == eos
    manifest = corpus.manifest
    assert manifest["tokenizer"]["sha256"] == hashlib.sha256(
        tokenizer_file.read_bytes()).hexdigest()
    assert [Path(f["file"]).name for f in manifest["files"]] == [
        "a.parquet", "b.jsonl.gz", "c.jsonl.zst", "d.jsonl"]
    assert manifest["documents"] == 480


def test_byte_shards_are_the_documents_bytes_and_worker_counts_agree(corpus_dir, tmp_path):
    root, docs = corpus_dir
    built = []
    for workers in (1, 2):
        cfg = DataConfig(source="shards", path=f"{root}/*.parquet,{root}/*.jsonl*",
                         cache_dir=str(tmp_path / f"w{workers}"), workers=workers)
        built.append(prepare(cfg))
    expected = expected_streams(docs, lambda t: list(t.encode()), 0)
    for split, tokens in expected.items():
        assert built[0].tokens(split).tolist() == tokens
        assert built[0].stream(split).dtype == np.uint8
        assert (built[0].directory / f"{split}.npy").read_bytes() == (
            built[1].directory / f"{split}.npy").read_bytes()


def test_an_interrupted_build_resumes_from_its_finished_shards(corpus_dir, tmp_path,
                                                                monkeypatch):
    root, _ = corpus_dir
    whole = prepare(DataConfig(source="shards", path=str(root), cache_dir=str(tmp_path / "a"),
                               workers=1))
    # What a build killed after its second shard leaves: two records, a half-written file.
    cfg = DataConfig(source="shards", path=str(root), cache_dir=str(tmp_path / "b"), workers=1)
    files = shards.shard_files(cfg.path)
    tokenizer = shards.tokenizer_record("byte")
    directory = tmp_path / "b" / "prepared" / shards.corpus_key(files, cfg, tokenizer)
    partial = directory.with_name(directory.name + ".partial")
    partial.mkdir(parents=True)
    for index in (0, 1):
        shards.tokenize_shard({"index": index, "path": str(files[index]), "out": str(partial),
                               "text_field": "text", "tokenizer": "byte", "eos_id": 0,
                               "dtype": "uint8"})
    (partial / "00002.train.bin.tmp").write_bytes(b"half a shard")
    redone = []
    tokenize = shards.tokenize_shard
    monkeypatch.setattr(shards, "tokenize_shard", lambda job: redone.append(job["index"])
                        or tokenize(job))
    resumed = prepare(cfg)
    assert redone == [2, 3]  # the finished shards were kept
    assert not partial.exists()
    for name in ("train.npy", "validation.npy", "test.npy"):
        assert (resumed.directory / name).read_bytes() == (whole.directory / name).read_bytes()


def test_a_sigkilled_build_reruns_to_the_same_bytes(tmp_path):
    shard_dir = tmp_path / "in"
    shard_dir.mkdir()
    for i in range(24):
        texts = make_documents(400, 100 + i)
        pq.write_table(pa.table({"text": texts}), shard_dir / f"{i:02d}.parquet")
    whole = prepare(DataConfig(source="shards", path=str(shard_dir), workers=1,
                               cache_dir=str(tmp_path / "a")))
    cache = tmp_path / "b"
    code = ("from attnlab.config import DataConfig; from attnlab.data import prepare; "
            f"prepare(DataConfig(source='shards', path={str(shard_dir)!r}, workers=1, "
            f"cache_dir={str(cache)!r}))")
    build = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(cache.rglob("*.partial/00000.json")) and time.monotonic() < deadline:
        if build.poll() is not None:
            break
        time.sleep(0.005)
    build.kill()
    build.wait()
    assert list(cache.rglob("*.partial/00000.json"))  # killed with a shard finished
    assert not list((cache / "prepared").rglob("manifest.json"))  # and the build not
    rebuilt = prepare(DataConfig(source="shards", path=str(shard_dir), workers=1,
                                 cache_dir=str(cache)))
    for name in ("train.npy", "validation.npy", "test.npy", "manifest.json"):
        assert (rebuilt.directory / name).read_bytes() == (whole.directory / name).read_bytes()


def test_two_processes_building_the_same_shards_build_them_once(corpus_dir, tmp_path):
    root, _ = corpus_dir
    code = ("from attnlab.config import DataConfig; from attnlab.data import prepare; "
            f"prepare(DataConfig(source='shards', path={str(root)!r}, workers=1, "
            f"cache_dir={str(tmp_path)!r}))")
    builds = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
              for _ in range(2)]
    errors = [b.communicate(timeout=300)[1] for b in builds]
    assert [b.returncode for b in builds] == [0, 0]
    assert sum(e.count("shards: ") for e in errors) == 4  # each of the 4 shards once


def test_shard_errors_name_the_file_or_field(tmp_path, corpus_dir, tokenizer_file):
    root, _ = corpus_dir
    pq.write_table(pa.table({"body": ["a document"]}), tmp_path / "x.parquet")
    with pytest.raises(DataSourceError, match=r"x.parquet: no column 'text' \(data.text_field\)"):
        prepare(DataConfig(source="shards", path=str(tmp_path / "x.parquet"),
                           cache_dir=str(tmp_path / "c")))
    data = (root / "b.jsonl.gz").read_bytes()
    (tmp_path / "cut.jsonl.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataSourceError, match=r"cut.jsonl.gz: unreadable or truncated shard"):
        prepare(DataConfig(source="shards", path=str(tmp_path / "cut.jsonl.gz"),
                           cache_dir=str(tmp_path / "c")))
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "0.jsonl.gz").write_bytes(data)
    (mixed / "1.jsonl.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataSourceError, match=r"1.jsonl.gz: unreadable or truncated shard"):
        prepare(DataConfig(source="shards", path=str(mixed), cache_dir=str(tmp_path / "m"),
                           workers=1))
    kept = list((tmp_path / "m").rglob("*.partial/*"))
    assert sorted(p.name for p in kept if not p.name.endswith(".tmp")) == [
        "00000.json", "00000.test.bin", "00000.train.bin", "00000.validation.bin"]
    (tmp_path / "empty.jsonl").write_text('{"text": ""}\n')
    with pytest.raises(DataSourceError, match=r"data.path: the train split .* is empty"):
        prepare(DataConfig(source="shards", path=str(tmp_path / "empty.jsonl"),
                           cache_dir=str(tmp_path / "c")))
    with pytest.raises(DataSourceError, match=r"data.path: .*nothing\*' names no shard"):
        prepare(DataConfig(source="shards", path=str(tmp_path / "nothing*"),
                           cache_dir=str(tmp_path / "c")))


@pytest.mark.parametrize("data, model, field", [
    (dict(source="shards"), {}, "data.path"),
    (dict(source="shards", path="x", tokenizer="bpe"), {}, "data.tokenizer"),
    (dict(source="shards", path="x", tokenizer="/no/such/tokenizer.json"), {}, "data.tokenizer"),
    (dict(source="shards", path="x", tokenizer="TOKENIZER"), dict(vocab_size=256),
     "model.vocab_size"),
    (dict(source="pystdlib", tokenizer="TOKENIZER"), {}, "data.tokenizer"),
    (dict(source="pystdlib", text_field="body"), {}, "data.text_field"),
])
def test_shard_settings_are_checked_naming_the_field(data, model, field, tokenizer_file):
    if data.get("tokenizer") == "TOKENIZER":
        data["tokenizer"] = str(tokenizer_file)
    with pytest.raises(ConfigError) as error:
        check(Config(model=ModelConfig(**model), data=DataConfig(**data)))
    assert error.value.field == field


def test_attnlab_prepare_builds_the_corpus_once(corpus_dir, tmp_path, capsys):
    root, _ = corpus_dir
    argv = ["prepare", "--config=configs/tiny.py", "--config.data.source=shards",
            f"--config.data.path={root}", "--config.data.max_bytes=0",
            f"--config.data.cache_dir={tmp_path}"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr()
    assert "Corpus('shards', tokenizer=byte" in printed.out
    assert "shards: 4/4" in printed.err
    assert cli.main(argv) == 0  # built: loaded, nothing tokenized
    assert capsys.readouterr().err == ""
    assert cli.main([*argv[:-1], "--config.data.text_field=body"]) == 2
    assert "data.text_field" in capsys.readouterr().err


def test_attnlab_train_trains_on_shards_with_a_tokenizer_json(corpus_dir, tokenizer_file,
                                                              tmp_path):
    root, _ = corpus_dir
    code = cli.main(["train", "--config=configs/tiny.py", f"--run={tmp_path / 'run'}",
                     "--config.data.source=shards", f"--config.data.path={root}",
                     f"--config.data.tokenizer={tokenizer_file}",
                     f"--config.data.cache_dir={tmp_path / 'cache'}",
                     "--config.data.max_bytes=0", "--config.data.document_mask=true",
                     "--config.model.vocab_size=400", "--config.train.steps=4",
                     "--config.train.eval_every=4", "--config.train.checkpoint_every=4"])
    assert code == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed"


def test_a_tokenizer_with_gaps_in_its_ids_needs_a_table_for_its_largest(tokenizer_file,
                                                                          tmp_path):
    """A tokenizer.json whose ids skip numbers: its count (400) is not the table it needs
    (5001), which the check names before anything trains (it diverged to NaN)."""
    spec = json.loads(tokenizer_file.read_text())
    token = next(t for t, i in spec["model"]["vocab"].items() if i == 300)
    spec["model"]["vocab"][token] = 5000
    gapped = tmp_path / "tokenizer.json"
    gapped.write_text(json.dumps(spec))
    with pytest.raises(ConfigError) as error:
        check(Config(model=ModelConfig(vocab_size=400),
                     data=DataConfig(source="shards", path="x", tokenizer=str(gapped))))
    assert error.value.field == "model.vocab_size" and "5001 ids" in str(error.value)


def test_an_empty_jsonl_and_text_columns_stored_otherwise_are_read(tmp_path):
    """An empty .jsonl holds no documents (as an empty .txt); a text column stored as a
    dictionary of strings (a pandas category) or as string views is text."""
    docs = [f"document {i} " * 20 for i in range(40)]
    root = tmp_path / "shards"
    root.mkdir()
    (root / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    (root / "b.jsonl").write_text("")
    (root / "c.jsonl").write_text("\n")
    pq.write_table(pa.table({"text": pa.array(docs).dictionary_encode()}), root / "d.parquet")
    pq.write_table(pa.table({"text": pa.array(docs, type=pa.string_view())}),
                   root / "e.parquet")
    assert [len(list(shards.documents(root / n, "text"))) for n in ("b.jsonl", "c.jsonl")] == \
        [0, 0]
    for name in ("a.jsonl", "d.parquet", "e.parquet"):
        assert [t for batch in shards.documents(root / name, "text") for t in batch] == docs
    pq.write_table(pa.table({"text": pa.array([1, 2]).dictionary_encode()}), root / "f.parquet")
    with pytest.raises(DataSourceError, match=r"f.parquet: .text. .* holds int64, not text"):
        list(shards.documents(root / "f.parquet", "text"))


def test_a_run_resumes_only_on_the_corpus_it_started_on(corpus_dir, tmp_path):
    """A shard added (or a tokenizer rewritten) between a run's start and its resumption
    builds another corpus: the resumed run would train on it and record only it. Refused,
    naming data.path, before anything trains."""
    from attnlab.rundir import SUMMARY_FILE, write_json_atomic
    from attnlab.train.preflight import check_same_corpus

    root = tmp_path / "shards"
    root.mkdir()
    for name in ("a.parquet", "d.jsonl"):
        (root / name).write_bytes((corpus_dir[0] / name).read_bytes())
    cfg = Config(data=DataConfig(source="shards", path=str(root), cache_dir=str(tmp_path / "c")))
    started = prepare(cfg.data)
    run = tmp_path / "run"
    run.mkdir()
    write_json_atomic(run / SUMMARY_FILE, {"dataset": started.manifest})
    check_same_corpus(cfg, run, prepare(cfg.data))  # the same files: resumes
    (root / "e.jsonl").write_text(json.dumps({"text": "one more document"}) + "\n")
    with pytest.raises(ConfigError) as error:
        check_same_corpus(cfg, run, prepare(cfg.data))
    assert error.value.field == "data.path" and "differs from the one this run started on" in \
        str(error.value)


def test_a_killed_builds_temporary_directory_is_removed_by_the_next_build(tmp_path):
    """A build killed by SIGKILL cannot delete its temporary directory; the next build of the
    same corpus (under the same lock) removes it, and another corpus's is left alone."""
    from attnlab.data.cache import atomic_directory, build_lock

    final = tmp_path / "prepared" / "bpe300"
    stale = tmp_path / "prepared" / ".bpe300.incomplete-x1y2"
    other = tmp_path / "prepared" / ".bpe512.incomplete-x1y2"
    for d in (stale, other):
        d.mkdir(parents=True)
        (d / "train.npy").write_bytes(b"partial")
    with build_lock(tmp_path, final), atomic_directory(final) as tmp:
        (tmp / "manifest.json").write_text("{}")
    assert (final / "manifest.json").exists() and not stale.exists() and other.exists()


def test_a_shard_that_is_not_utf8_is_named_as_such(tmp_path):
    """Readable bytes that are not UTF-8 (a latin-1 file) are not a truncated shard."""
    (tmp_path / "latin.txt").write_bytes("café au lait".encode("latin-1"))
    (tmp_path / "latin.jsonl").write_bytes(b'{"text": "caf\xe9"}\n')
    for name in ("latin.txt", "latin.jsonl"):
        with pytest.raises(DataSourceError, match=rf"{name}: not UTF-8 text \(byte 3"):
            list(shards.documents(tmp_path / name, "text"))



def test_a_jsonl_document_larger_than_a_read_block_builds_as_its_parquet_twin(tmp_path):
    """A 10 MB document (a book, a large source file) among small ones in a JSON-lines shard:
    pyarrow's reader needs a block that holds it; the build equals the same documents stored
    as Parquet, token for token."""
    rng = np.random.default_rng(0)
    huge = "".join(rng.choice(list("abcdefgh ijklmnop\n"), size=10_000_000))
    docs = [f"small document {i} " * 30 for i in range(300)]
    docs[150:150] = [huge]
    built = {}
    for kind in ("jsonl", "parquet"):
        root = tmp_path / kind
        root.mkdir()
        if kind == "jsonl":
            (root / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
        else:
            pq.write_table(pa.table({"text": docs}), root / "a.parquet")
        built[kind] = prepare(DataConfig(source="shards", path=str(root),
                                         cache_dir=str(tmp_path / f"c_{kind}")))
    assert [t for b in shards.documents(tmp_path / "jsonl" / "a.jsonl", "text") for t in b] == docs
    for split in ("train", "validation", "test"):
        assert built["jsonl"].tokens(split).tolist() == built["parquet"].tokens(split).tolist()
    assert sum(len(built["jsonl"].tokens(s)) for s in ("train", "validation", "test")) > 10_000_000


def test_null_texts_are_skipped_and_a_comma_in_a_directory_name_is_one_path(tmp_path):
    root = tmp_path / "comma,dir"
    root.mkdir()
    docs = [f"document {i} " * 20 for i in range(60)]
    (root / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    (root / "b.jsonl").write_text('{"text": null}\n' * 5)  # every text null: pyarrow's null type
    assert list(shards.documents(root / "b.jsonl", "text")) == [[]]
    assert shards.shard_files(str(root)) == sorted([(root / "a.jsonl").resolve(),
                                                   (root / "b.jsonl").resolve()])
    with pytest.raises(DataSourceError, match="commas separate paths"):
        shards.shard_files(str(tmp_path / "comma") + ",x")


def _tokenizer(tmp_path, name: str, model) -> str:
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|endoftext|>"])
    path = tmp_path / name
    tok.save(str(path))
    return str(path)


def test_a_tokenizer_that_cannot_encode_or_drops_text_is_refused_before_the_build(tmp_path):
    root = tmp_path / "shards"
    root.mkdir()
    docs = [f"the of w12 café {i}" for i in range(50)]
    (root / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    no_unk = _tokenizer(tmp_path, "wordlevel.json",
                        models.WordLevel({"the": 0, "of": 1}, unk_token=None))
    vocab = {c: i for i, c in enumerate("w0123456789")}
    dropping = _tokenizer(tmp_path, "bpe.json", models.BPE(vocab, []))
    for tok, needle in ((no_unk, "cannot encode the text of"), (dropping, "drops")):
        cfg = DataConfig(source="shards", path=str(root), tokenizer=tok, workers=1,
                         cache_dir=str(tmp_path / "c"))
        with pytest.raises(DataSourceError, match=needle) as caught:
            prepare(cfg)
        assert "\n" not in str(caught.value)
        assert not (tmp_path / "c" / "prepared").exists() or not any(
            (tmp_path / "c" / "prepared").rglob("manifest.json"))
    # 'the', 'of' and 'café' of every document: 450 of its 690 non-space characters
    assert "drops 65.2% of the non-space characters" in str(caught.value)
    lossy = DataConfig(source="shards", path=str(root), tokenizer=dropping, workers=1,
                       cache_dir=str(tmp_path / "c"), allow_lossy_tokenizer=True)
    assert len(prepare(lossy).tokens("train")) > 0  # built on what it keeps, as asked
