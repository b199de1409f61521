"""Sources of attnlab.data, each built for real through TFDS into a temporary cache."""

import dataclasses
import hashlib
import json
import platform
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow_datasets as tfds

from attnlab.config import DataConfig
from attnlab.data import DataSourceError, UnknownDatasetError, prepare
from attnlab.data import cache as cache_lib
from attnlab.data import files as files_lib

SLICE = 200_000  # bytes of the pystdlib slice used by these tests


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data_cache"))


@pytest.fixture(scope="module")
def stdlib_corpus(cache_dir):
    return prepare(DataConfig(source="pystdlib", max_bytes=SLICE, cache_dir=cache_dir))


def _records(corpus, split):
    """Every record of a split, read back through TFDS random access."""
    builder = tfds.builder_from_directory(corpus.manifest["tfds"]["data_dir"])
    source = builder.as_data_source(split)
    return [source[i] for i in range(len(source))]


def _paths(corpus, split):
    return {r["path"].decode() for r in _records(corpus, split)}


# --- pystdlib ---------------------------------------------------------------------------------


def test_pystdlib_manifest_describes_the_slice(stdlib_corpus):
    m = stdlib_corpus.manifest
    assert stdlib_corpus.name == "pystdlib"
    assert m["python_version"] == platform.python_version()
    assert m["root"] == str(files_lib.stdlib_root())
    assert 0 < m["bytes"] <= SLICE
    assert m["files"] == sum(s["files"] for s in m["splits"].values())
    assert m["bytes"] == sum(s["bytes"] for s in m["splits"].values())
    for split in files_lib.SPLITS:  # each split gets at most its share of the budget
        assert 0 < m["splits"][split]["bytes"] <= SLICE * files_lib.SPLIT_PERCENT[split] // 100
    json.dumps(m)  # serialisable, for run summaries


def test_full_pystdlib_builds_offline_on_first_use(tmp_path, monkeypatch):
    """The default corpus (no size limit) builds from nothing with every socket refused."""

    def refuse(*args, **kwargs):
        raise OSError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    corpus = prepare(DataConfig(cache_dir=str(tmp_path)))
    _, listed = files_lib.stdlib_files()
    m = corpus.manifest
    assert m["files"] == len(listed) - len(m["skipped_files_with_nul"]) > 1000
    assert m["bytes"] == sum(f.size for f in listed if f.relpath not in m["skipped_files_with_nul"])
    assert sum(m["tokens"].values()) == m["bytes"] + m["files"]


def test_pystdlib_has_no_site_packages_and_splits_are_disjoint(stdlib_corpus):
    paths = {s: _paths(stdlib_corpus, s) for s in files_lib.SPLITS}
    assert not paths["train"] & paths["validation"]
    assert not paths["train"] & paths["test"]
    assert not paths["validation"] & paths["test"]
    for split, names in paths.items():
        assert names, split
        for name in names:
            assert name.endswith(".py") and "site-packages" not in name
            assert files_lib.split_of(name) == split  # the hash rule decides


def test_pystdlib_tokens_are_the_files_from_disk(stdlib_corpus):
    """The byte stream is exactly the files, in path order, each followed by 0x00 (read
    independently from disk), and the sha256 in the manifest is of their concatenation."""
    root = Path(stdlib_corpus.manifest["root"])
    everything = []
    for split in files_lib.SPLITS:
        names = sorted(_paths(stdlib_corpus, split))
        contents = [(root / n).read_bytes() for n in names]
        expected = b"".join(c + b"\0" for c in contents)
        tokens = stdlib_corpus.tokens(split)
        assert tokens.dtype == np.int32
        assert stdlib_corpus.num_tokens(split) == len(expected) == len(tokens)
        assert tokens.astype(np.uint8).tobytes() == expected
        assert stdlib_corpus.manifest["tokens"][split] == len(expected)
        split_manifest = stdlib_corpus.manifest["splits"][split]
        assert split_manifest["bytes"] + split_manifest["documents"] == len(expected)
        assert (tokens == 0).sum() == len(names)  # one separator per document, nothing else
        everything += zip(names, contents, strict=True)
    whole = hashlib.sha256(b"".join(c for _, c in sorted(everything))).hexdigest()
    assert stdlib_corpus.manifest["sha256"] == whole


def test_pystdlib_is_cached_and_reused(stdlib_corpus, cache_dir):
    directory = stdlib_corpus.directory
    stamp = (directory / "train.npy").stat().st_mtime_ns
    again = prepare(DataConfig(source="pystdlib", max_bytes=SLICE, cache_dir=cache_dir))
    assert again.directory == directory
    assert (directory / "train.npy").stat().st_mtime_ns == stamp  # not rewritten
    assert np.array_equal(again.tokens("validation"), stdlib_corpus.tokens("validation"))


def test_max_bytes_slices_are_cached_separately(stdlib_corpus, cache_dir):
    smaller = prepare(DataConfig(source="pystdlib", max_bytes=SLICE // 2, cache_dir=cache_dir))
    assert smaller.directory != stdlib_corpus.directory
    assert smaller.manifest["bytes"] <= SLICE // 2 < stdlib_corpus.manifest["bytes"]


def test_concurrent_first_use_builds_once(tmp_path):
    """Runs of a sweep starting together on a fresh machine share one build."""
    script = (
        "from attnlab.config import DataConfig; from attnlab.data import prepare; "
        f"c = prepare(DataConfig(max_bytes=50_000, cache_dir={str(tmp_path)!r})); "
        "print(c.directory, c.manifest['sha256'])"
    )
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [run.communicate() for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    last_lines = [stdout.splitlines()[-1] for stdout, _ in outputs]  # TFDS also prints
    assert last_lines[0] == last_lines[1]
    assert len(list((tmp_path / "prepared").rglob("manifest.json"))) == 1


def test_cache_location_from_env_and_config(tmp_path, monkeypatch):
    monkeypatch.setenv(cache_lib.ENV_VAR, str(tmp_path / "from_env"))
    corpus = prepare(DataConfig(source="pystdlib", max_bytes=60_000))
    assert Path(corpus.manifest["prepared_dir"]).is_relative_to(tmp_path / "from_env")
    assert cache_lib.cache_root(str(tmp_path / "from_config")) == tmp_path / "from_config"
    monkeypatch.delenv(cache_lib.ENV_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_lib.cache_root("") == tmp_path / "xdg" / "attnlab"


# --- text_files -------------------------------------------------------------------------------


def _write_corpus(directory: Path, n_files: int = 80) -> dict[str, bytes]:
    """Files of real text (standard library sources, some not UTF-8) under nested dirs."""
    sources = sorted(files_lib.stdlib_root().glob("json/*.py")) + sorted(
        files_lib.stdlib_root().glob("test/encoded_modules/*.py")
    )
    contents = {}
    for i in range(n_files):
        rel = f"part{i % 3}/doc{i:03d}.txt"
        data = sources[i % len(sources)].read_bytes()[: 500 + 37 * i]
        (directory / rel).parent.mkdir(parents=True, exist_ok=True)
        (directory / rel).write_bytes(data)
        contents[rel] = data
    (directory / ".hidden").write_bytes(b"skipped: hidden")
    (directory / "empty.txt").write_bytes(b"")
    return contents


def test_text_files_directory(tmp_path):
    contents = _write_corpus(tmp_path / "corpus")
    corpus = prepare(
        DataConfig(
            source="text_files", path=str(tmp_path / "corpus"), cache_dir=str(tmp_path / "c")
        )
    )
    for split in files_lib.SPLITS:
        names = sorted(r for r in contents if files_lib.split_of(r) == split)
        expected = b"".join(contents[n] + b"\0" for n in names)
        assert corpus.tokens(split).astype(np.uint8).tobytes() == expected
    assert corpus.manifest["files"] == len(contents)  # hidden and empty files are skipped


def test_text_files_with_no_test_file_build_with_an_empty_test_split(tmp_path):
    """A small directory whose files all hash to train or validation (TFDS writes no empty
    split) builds, warns, and reads an empty test split; it was a TFDS traceback."""
    names = [f"f{i}.txt" for i in range(200)]
    kept = [n for n in names if files_lib.split_of(n) == "train"][:12]
    kept += [n for n in names if files_lib.split_of(n) == "validation"][:2]
    (tmp_path / "corpus").mkdir()
    for name in kept:
        (tmp_path / "corpus" / name).write_text(f"text of {name}\n" * 20)
    config = DataConfig(source="text_files", path=str(tmp_path / "corpus"),
                        cache_dir=str(tmp_path / "c"))
    with pytest.warns(UserWarning, match="the test split is empty"):
        corpus = prepare(config)
    assert len(corpus.tokens("test")) == 0 and len(corpus.tokens("validation")) > 0
    assert len(prepare(config).tokens("train")) == corpus.manifest["tokens"]["train"]  # cached


def test_text_files_glob_with_max_bytes(tmp_path):
    contents = _write_corpus(tmp_path / "corpus")
    pattern = str(tmp_path / "corpus" / "**" / "*.txt")
    corpus = prepare(
        DataConfig(
            source="text_files", path=pattern, max_bytes=60_000, cache_dir=str(tmp_path / "c")
        )
    )
    assert 0 < corpus.manifest["bytes"] <= 60_000
    train = corpus.tokens("train").astype(np.uint8).tobytes()
    documents = train.split(b"\0")[:-1]
    by_content = {v: k for k, v in contents.items()}
    assert all(files_lib.split_of(by_content[d]) == "train" for d in documents)


def test_text_files_changed_files_get_a_new_cache(tmp_path):
    _write_corpus(tmp_path / "corpus")
    cfg = DataConfig(
        source="text_files", path=str(tmp_path / "corpus"), cache_dir=str(tmp_path / "c")
    )
    first = prepare(cfg)
    (tmp_path / "corpus" / "part0" / "doc000.txt").write_bytes(b"edited " * 100)
    second = prepare(cfg)
    assert second.directory != first.directory
    assert second.manifest["sha256"] != first.manifest["sha256"]


# --- markov -----------------------------------------------------------------------------------


def test_markov_source(tmp_path):
    cfg = DataConfig(
        source="markov",
        markov_order=1,
        markov_branching=3,
        markov_tokens=40_000,
        cache_dir=str(tmp_path),
    )
    corpus = prepare(cfg)
    m = corpus.manifest
    assert corpus.num_tokens("train") == 40_000  # one stream: no separators
    assert corpus.num_tokens("validation") == corpus.num_tokens("test") == 2_000
    assert not (corpus.tokens("train") == 0).any()
    assert m["separator"] == {"kind": "none"}
    assert m["entropy_rate_bits"] == pytest.approx(m["entropy_rate_nats"] / np.log(2))
    assert 0 < m["entropy_rate_nats"] < np.log(3)  # at most uniform over 3 successors
    # Different seeds draw different streams from the same chain.
    assert not np.array_equal(corpus.tokens("validation"), corpus.tokens("test"))

    bpe = prepare(dataclasses.replace(cfg, tokenizer="bpe", bpe_vocab_size=300))
    per_token = bpe.manifest["entropy_rate_nats_per_token"]
    assert per_token == pytest.approx(m["entropy_rate_nats"] * 40_000 / bpe.num_tokens("train"))
    assert (
        bpe.tokenizer.decode(bpe.tokens("train"))
        == corpus.tokens("train").astype(np.uint8).tobytes()
    )


# --- TFDS catalog -----------------------------------------------------------------------------


class AttnlabTestVerses(tfds.core.GeneratorBasedBuilder):
    """A catalog-style dataset that needs no download: train and test splits only, like lm1b."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {"text": tfds.features.Text(), "label": tfds.features.ClassLabel(num_classes=2)}
            ),
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(0, 300), "test": self._generate_examples(300, 340)}

    def _generate_examples(self, start, stop):
        for i in range(start, stop):
            yield i, {"text": f"verse {i}: the quick brown fox é {i * i}\n", "label": i % 2}


class AttnlabTestTrainOnly(AttnlabTestVerses):
    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(0, 400)}


def _verses(split_range):
    return {f"verse {i}: the quick brown fox é {i * i}\n".encode() for i in split_range}


def test_tfds_catalog_dataset(tmp_path):
    corpus = prepare(DataConfig(source="tfds:attnlab_test_verses/text", cache_dir=str(tmp_path)))
    assert corpus.name == "tfds:attnlab_test_verses/text"
    m = corpus.manifest
    assert m["splits"]["validation"]["tfds_split"] == "test"  # no validation split: use test
    documents = {
        s: corpus.tokens(s).astype(np.uint8).tobytes().split(b"\0")[:-1]
        for s in ("train", "validation")
    }
    assert set(documents["train"]) == _verses(range(300))
    assert set(documents["validation"]) == _verses(range(300, 340))
    assert m["tokens"]["train"] == sum(len(d) + 1 for d in documents["train"])


def test_tfds_catalog_without_held_out_split_is_sliced(tmp_path):
    corpus = prepare(
        DataConfig(source="tfds:attnlab_test_train_only/text", cache_dir=str(tmp_path))
    )
    docs = {
        s: corpus.tokens(s).astype(np.uint8).tobytes().split(b"\0")[:-1] for s in files_lib.SPLITS
    }
    assert [len(docs[s]) for s in files_lib.SPLITS] == [360, 20, 20]
    assert set().union(*map(set, docs.values())) == _verses(range(400))
    assert corpus.manifest["splits"]["validation"]["tfds_split"] == "train[90%:95%]"


SHAKESPEARE = {
    "train": "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak.\n" * 40,
    "validation": "MENENIUS:\nEither you must confess yourselves wondrous malicious,\n" * 10,
    "test": "BRUTUS:\nHe's a lamb indeed, that baes like a bear.\n" * 10,
}


def test_tfds_catalog_dataset_that_needs_a_download(tmp_path):
    """tiny_shakespeare downloads its text; with no network, TFDS is given its metadata locally
    and tfds.testing.mock_data serves the records; everything after that is attnlab's code."""
    metadata_dir = tmp_path / "tfds_metadata"
    builder = tfds.builder("tiny_shakespeare", data_dir=str(metadata_dir))
    builder.info.set_splits(
        tfds.core.SplitDict(
            [
                tfds.core.SplitInfo(name=s, shard_lengths=[1], num_bytes=len(t))
                for s, t in SHAKESPEARE.items()
            ]
        )
    )
    builder.data_path.mkdir(parents=True)
    builder.info.write_to_directory(builder.data_path)

    def records(self, split, **kwargs):
        return [{"text": SHAKESPEARE[split].encode()}]

    with tfds.testing.mock_data(
        policy=tfds.testing.MockPolicy.USE_FILES,
        data_dir=str(metadata_dir),
        as_data_source_fn=records,
    ):
        corpus = prepare(
            DataConfig(source="tfds:tiny_shakespeare/text", cache_dir=str(tmp_path / "c"))
        )
    for split, text in SHAKESPEARE.items():
        assert corpus.tokenizer.decode(corpus.tokens(split)) == text.encode() + b"\0"
    assert corpus.manifest["dataset"] == "tiny_shakespeare"


def test_unknown_tfds_dataset_and_feature(tmp_path):
    with pytest.raises(UnknownDatasetError, match="no TFDS dataset named 'no_such_dataset_xyz'"):
        prepare(DataConfig(source="tfds:no_such_dataset_xyz/text", cache_dir=str(tmp_path)))
    with pytest.raises(UnknownDatasetError, match="has no feature 'body'.*label, text"):
        prepare(DataConfig(source="tfds:attnlab_test_verses/body", cache_dir=str(tmp_path)))
    with pytest.raises(UnknownDatasetError, match="'label'.*not a text string"):
        prepare(DataConfig(source="tfds:attnlab_test_verses/label", cache_dir=str(tmp_path)))
    with pytest.raises(UnknownDatasetError, match="tfds:<name>/<feature>"):
        prepare(DataConfig(source="tfds:attnlab_test_verses", cache_dir=str(tmp_path)))


def test_catalog_download_failure_is_one_clear_error(tmp_path, monkeypatch):
    """A catalog dataset that is not prepared locally would need the network: the TFDS failure
    becomes one DataSourceError. The download step is replaced by one that fails as an offline
    machine does, so no network access is ever attempted."""

    def offline(self, *args, **kwargs):
        raise ConnectionError("network is unreachable")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", offline)
    with pytest.raises(DataSourceError, match="could not download and prepare tiny_shakespeare"):
        prepare(DataConfig(source="tfds:tiny_shakespeare/text", cache_dir=str(tmp_path)))
    assert not (tmp_path / "prepared").exists()
