"""Byte and BPE tokenizers: exact round trips on real files, the separator, the saved BPE."""

import hashlib
import json

import numpy as np
import pytest

from attnlab.config import DataConfig
from attnlab.data import BpeTokenizer, ByteTokenizer, DataError, prepare
from attnlab.data import files as files_lib
from attnlab.data.tokenizer import byte_alphabet

ROOT = files_lib.stdlib_root()
# Real files: plain ASCII, UTF-8 with non-ASCII text, and files that are not UTF-8 at all.
REAL_FILES = [
    "json/decoder.py",
    "test/test_unicode_identifiers.py",
    "test/encoded_modules/module_iso_8859_1.py",
    "test/encoded_modules/module_koi8_r.py",
    "test/tokenizedata/badsyntax_pep3120.py",
]


def _real_files():
    return {name: (ROOT / name).read_bytes() for name in REAL_FILES if (ROOT / name).exists()}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("bpe_cache"))


@pytest.fixture(scope="module")
def bpe_corpus(cache_dir):
    return prepare(
        DataConfig(max_bytes=150_000, tokenizer="bpe", bpe_vocab_size=600, cache_dir=cache_dir)
    )


def test_real_files_include_non_utf8():
    contents = _real_files()
    assert len(contents) >= 3
    undecodable = 0
    for data in contents.values():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            undecodable += 1
    assert undecodable >= 1


def test_byte_tokenizer_round_trip_on_real_files():
    tok = ByteTokenizer()
    for name, data in _real_files().items():
        ids = tok.encode(data)
        assert ids.dtype == np.int32 and len(ids) == len(data)
        assert np.array_equal(ids, np.frombuffer(data, np.uint8))
        assert tok.decode(ids) == data, name
    assert tok.encode("é").tolist() == [0xC3, 0xA9]  # str is UTF-8 encoded
    assert (tok.vocab_size, tok.eos_id, tok.name) == (256, 0, "byte")


def test_bpe_round_trip_on_real_files(bpe_corpus):
    tok = bpe_corpus.tokenizer
    for name, data in _real_files().items():
        ids = tok.encode(data)
        assert ids.dtype == np.int32
        assert ids.min() >= 0 and ids.max() < tok.vocab_size
        assert len(ids) < len(data)  # merges compress real code
        assert tok.decode(ids) == data, name
    every_byte = bytes(range(256)) * 3
    assert tok.decode(tok.encode(every_byte)) == every_byte


def test_bpe_corpus_decodes_to_the_byte_corpus(bpe_corpus, cache_dir):
    bytes_corpus = prepare(DataConfig(max_bytes=150_000, cache_dir=cache_dir))
    for split in ("train", "validation"):
        text = bpe_corpus.tokenizer.decode(bpe_corpus.tokens(split))
        assert text == bytes_corpus.tokens(split).astype(np.uint8).tobytes()
        # The separator stays one token: one EOS id per document, never merged.
        eos = bpe_corpus.tokenizer.eos_id
        assert (bpe_corpus.tokens(split) == eos).sum() == bpe_corpus.manifest["splits"][split][
            "files"
        ]


def test_bpe_is_saved_next_to_the_data_and_recorded(bpe_corpus):
    m = bpe_corpus.manifest["tokenizer"]
    path = bpe_corpus.directory / m["file"]
    assert m["name"] == f"bpe{bpe_corpus.vocab_size}" == bpe_corpus.tokenizer.name
    assert m["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert json.loads(path.read_text())["model"]["type"] == "BPE"
    reloaded = BpeTokenizer.load(path)
    sample = (ROOT / "json/encoder.py").read_bytes()
    assert np.array_equal(reloaded.encode(sample), bpe_corpus.tokenizer.encode(sample))
    assert 256 < bpe_corpus.vocab_size <= 600


def test_a_prepared_corpus_reloads_the_tokenizer_its_manifest_records(bpe_corpus, tmp_path):
    from attnlab.data.tokenizer import TOKENIZER_FILE, HubTokenizer, stored_tokenizer

    bpe = stored_tokenizer(bpe_corpus.manifest["tokenizer"], bpe_corpus.directory, -1)
    assert type(bpe) is BpeTokenizer and bpe.vocab_size == bpe_corpus.vocab_size
    assert type(stored_tokenizer({"name": "byte"}, tmp_path, 0)) is ByteTokenizer
    # A tokenizer.json read by shards: the manifest says its kind, the separator its eos id.
    (tmp_path / TOKENIZER_FILE).write_bytes((bpe_corpus.directory / TOKENIZER_FILE).read_bytes())
    hub = stored_tokenizer({"name": "hf600", "kind": HubTokenizer.kind}, tmp_path, 7)
    assert type(hub) is HubTokenizer and hub.eos_id == 7 and hub.vocab_size == bpe.vocab_size


def test_bpe_trained_on_the_training_split_only(bpe_corpus):
    """Retraining on the training documents alone gives the same merges."""
    train = bpe_corpus.tokenizer.decode(bpe_corpus.tokens("train")).split(b"\0")[:-1]
    retrained = BpeTokenizer.train(train, 600)
    sample = (ROOT / "json/scanner.py").read_bytes()
    assert np.array_equal(retrained.encode(sample), bpe_corpus.tokenizer.encode(sample))


def test_byte_alphabet_is_a_bijection():
    alphabet = byte_alphabet()
    assert len(set(alphabet)) == 256
    assert all(c.isprintable() for c in alphabet)


def test_decoding_bad_ids_is_an_error(bpe_corpus):
    with pytest.raises(DataError, match="0..255"):
        ByteTokenizer().decode([1, 256])
    with pytest.raises(DataError, match="ids must be in"):
        bpe_corpus.tokenizer.decode([-1])
