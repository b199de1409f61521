"""Bad input: each case is one clear AttnlabError naming what is wrong; the cache stays clean."""

import shutil
from pathlib import Path

import pytest

from attnlab.config import DataConfig
from attnlab.data import (
    Batches,
    CacheError,
    CorpusTooSmallError,
    DataSourceError,
    prepare,
    validation_batches,
)
from attnlab.errors import AttnlabError, ConfigError


@pytest.fixture(scope="module")
def small_cfg(tmp_path_factory):
    return DataConfig(max_bytes=60_000, cache_dir=str(tmp_path_factory.mktemp("err_cache")))


@pytest.fixture(scope="module")
def corpus(small_cfg):
    return prepare(small_cfg)


def _text_dir(path: Path, n_files: int) -> Path:
    path.mkdir(parents=True)
    for i in range(n_files):
        (path / f"f{i:03d}.txt").write_text(f"document {i}\n" * 20)
    return path


def _files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()] if path.exists() else []


def _text_cfg(tmp_path, path) -> DataConfig:
    return DataConfig(source="text_files", path=str(path), cache_dir=str(tmp_path / "cache"))


def test_all_data_errors_are_attnlab_errors():
    for cls in (CacheError, CorpusTooSmallError, DataSourceError):
        assert issubclass(cls, AttnlabError) and issubclass(cls, ValueError)


def test_missing_directory(tmp_path):
    with pytest.raises(DataSourceError, match="does not exist") as info:
        prepare(_text_cfg(tmp_path, tmp_path / "nowhere"))
    assert "nowhere" in str(info.value)


def test_empty_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataSourceError, match="directory .*empty.* is empty"):
        prepare(_text_cfg(tmp_path, tmp_path / "empty"))
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "a.txt").write_bytes(b"")
    with pytest.raises(DataSourceError, match="every file under .* is empty"):
        prepare(_text_cfg(tmp_path, tmp_path / "blank"))


def test_glob_without_matches_and_single_file(tmp_path):
    with pytest.raises(DataSourceError, match=r"no file matches the glob .*\*\.md"):
        prepare(_text_cfg(tmp_path, tmp_path / "*.md"))
    (tmp_path / "one.txt").write_text("hello")
    with pytest.raises(DataSourceError, match="single file"):
        prepare(_text_cfg(tmp_path, tmp_path / "one.txt"))


def test_too_few_files_for_a_validation_split(tmp_path):
    with pytest.raises(DataSourceError, match="validation split is empty: none of the 3 files"):
        prepare(_text_cfg(tmp_path, _text_dir(tmp_path / "three", 3)))


def test_max_bytes_too_small(tmp_path):
    with pytest.raises(DataSourceError, match="data.max_bytes=100 leaves"):
        prepare(DataConfig(max_bytes=100, cache_dir=str(tmp_path)))


def test_binary_file_fails_and_leaves_nothing_half_written(tmp_path):
    corpus_dir = _text_dir(tmp_path / "mixed", 60)
    (corpus_dir / "f007.txt").write_bytes(b"text then a NUL \x00 byte")
    with pytest.raises(DataSourceError, match=r"f007.txt.* contains the byte 0x00"):
        prepare(_text_cfg(tmp_path, corpus_dir))
    cache = tmp_path / "cache"
    assert not (cache / "prepared").exists()
    assert _files_under(cache / "tfds") == []  # TFDS built into a temp dir and removed it


def test_unknown_source_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="data.source.*'wikipedia'"):
        prepare(DataConfig(source="wikipedia", cache_dir=str(tmp_path)))


def test_bpe_vocab_must_exceed_bytes(tmp_path):
    with pytest.raises(ConfigError, match="data.bpe_vocab_size"):
        prepare(
            DataConfig(
                max_bytes=60_000, tokenizer="bpe", bpe_vocab_size=200, cache_dir=str(tmp_path)
            )
        )
    assert not (tmp_path / "prepared").exists() and not (tmp_path / "tfds").exists()


def test_seq_len_larger_than_the_corpus(corpus):
    n = corpus.num_tokens("train")
    with pytest.raises(CorpusTooSmallError, match=f"seq_len={n}.*only {n} tokens"):
        Batches(corpus, "train", seq_len=n, batch_size=1, seed=0)


def test_corpus_smaller_than_one_batch(corpus):
    windows = (corpus.num_tokens("train") - 1) // 512
    with pytest.raises(CorpusTooSmallError, match="fewer than one batch"):
        Batches(corpus, "train", seq_len=512, batch_size=windows + 1, seed=0)
    with pytest.raises(CorpusTooSmallError, match="validation split .* fewer than the"):
        validation_batches(corpus, seq_len=256, batch_size=64, n_batches=64)


def test_bad_split_and_process_layout(corpus):
    with pytest.raises(DataSourceError, match="unknown split 'dev'"):
        Batches(corpus, "dev", 16, 4, 0)
    with pytest.raises(ConfigError, match="data.batch_size"):
        Batches(corpus, "train", 16, 6, 0, process_index=0, process_count=4)
    with pytest.raises(ConfigError, match="train.process_id"):
        Batches(corpus, "train", 16, 8, 0, process_index=4, process_count=4)
    with pytest.raises(IndexError):
        Batches(corpus, "train", 16, 4, 0)[-1]


def _fresh_copy(corpus, small_cfg, tmp_path) -> DataConfig:
    cache = tmp_path / "copy"
    shutil.copytree(small_cfg.cache_dir, cache)
    return DataConfig(max_bytes=small_cfg.max_bytes, cache_dir=str(cache))


def test_unreadable_manifest(corpus, small_cfg, tmp_path):
    cfg = _fresh_copy(corpus, small_cfg, tmp_path)
    directory = prepare(cfg).directory
    (directory / "manifest.json").write_text("{not json")
    with pytest.raises(CacheError, match=f"{directory}.* is unreadable.*delete that directory"):
        prepare(cfg)


def test_truncated_token_array(corpus, small_cfg, tmp_path):
    cfg = _fresh_copy(corpus, small_cfg, tmp_path)
    directory = prepare(cfg).directory
    data = (directory / "train.npy").read_bytes()
    (directory / "train.npy").write_bytes(data[: len(data) // 2])
    with pytest.raises(CacheError, match="is unreadable"):
        prepare(cfg)


def test_corrupt_tfds_files(corpus, small_cfg, tmp_path):
    cfg = _fresh_copy(corpus, small_cfg, tmp_path)
    shutil.rmtree(prepare(cfg).directory)  # force a re-read of the TFDS data
    for record_file in Path(cfg.cache_dir, "tfds").rglob("*train.array_record*"):
        record_file.write_bytes(b"garbage")
    with pytest.raises(CacheError, match="cannot read split 'train' of pystdlib"):
        prepare(cfg)


def test_cache_dir_that_is_a_file(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(CacheError, match="data.cache_dir: cannot create"):
        prepare(DataConfig(max_bytes=60_000, cache_dir=str(tmp_path / "file" / "sub")))
