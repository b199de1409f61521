"""A prepared corpus: every split as one memory-mapped token array, plus its manifest.

:func:`prepare_built` turns a source's TFDS builder (``attnlab.data.sources``) into a
:class:`Corpus`. The first call builds the TFDS dataset (array_record), tokenizes every split
(training a BPE on the training split if asked) and writes ``<split>.npy`` files next to a
``manifest.json``; later calls only memory-map them. Within a split, documents are concatenated
in a fixed order, each followed by the end-of-document id (the Markov source is one stream and
has no separator).
"""

from __future__ import annotations

import hashlib
import json
import platform
import warnings
from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds

from attnlab.config import DataConfig
from attnlab.data import builders
from attnlab.data.batches import Batches, check_budget, epochs_read, validation_batches
from attnlab.data.cache import atomic_directory, build_lock
from attnlab.data.errors import CacheError, DataSourceError
from attnlab.data.files import SPLITS
from attnlab.data.tfds_build import TfdsBuild
from attnlab.data.tokenizer import (EOS_BYTE, TOKENIZER_FILE, Tokenizer, stored_tokenizer,
                                    tokenizer_class)

FORMAT_VERSION = 1
# Held-out splits of a catalog dataset, in order of preference (lm1b has only train and test).
_VALIDATION_NAMES = ("validation", "valid", "dev", "test")
_TEST_NAMES = ("test", "validation", "valid", "dev")


class Corpus:
    """Token arrays of the train / validation / test splits and what they were made from.

    Attributes:
      name: the data source, e.g. 'pystdlib', 'markov', 'tfds:tiny_shakespeare/text'.
      tokenizer: encodes bytes to ids and back; ``tokenizer.eos_id`` ends every document.
      vocab_size: ids are in [0, vocab_size).
      manifest: JSON-serialisable record of the source (files, bytes, sha256, Python version),
        the tokenizer, the token count per split and, for markov, the true entropy rate.
      directory: where the prepared arrays live.
    """

    def __init__(
        self,
        name: str,
        directory: Path,
        manifest: dict,
        tokenizer: Tokenizer,
        arrays: dict[str, np.ndarray],
    ):
        self.name = name
        self.directory = directory
        self.manifest = manifest
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self._arrays = arrays

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self._arrays)

    def stream(self, split: str) -> np.ndarray:
        """[n_tokens] read-only memory map in the stored dtype (uint8 / uint16 / int32 /
        uint32)."""
        if split not in self._arrays:
            raise DataSourceError(
                f"unknown split {split!r} of {self.name}; valid splits are {', '.join(self.splits)}"
            )
        return self._arrays[split]

    def tokens(self, split: str) -> np.ndarray:
        """[n_tokens] int32: the whole split, each document followed by the separator."""
        return np.asarray(self.stream(split), dtype=np.int32)

    def num_tokens(self, split: str) -> int:
        return int(self.stream(split).shape[0])

    def train_batches(self, seq_len: int, batch_size: int, seed: int, process_index: int = 0,
                      process_count: int = 1):
        """The training stream: :class:`attnlab.data.batches.Batches` of the train split."""
        return Batches(self, "train", seq_len, batch_size, seed, process_index, process_count)

    def validation_set(self, seq_len: int, batch_size: int, n_batches: int) -> np.ndarray:
        """[n_batches, batch_size, seq_len + 1] int32: :func:`~attnlab.data.batches.
        validation_batches`."""
        return validation_batches(self, seq_len, batch_size, n_batches)

    def budget_warnings(self, tokens: int, seq_len: int) -> list[str]:
        """:func:`~attnlab.data.batches.check_budget` (data repeated past one epoch)."""
        return check_budget(self, tokens, seq_len)

    def epochs(self, tokens: int, seq_len: int) -> float:
        """Times ``tokens`` predicted tokens read the training split."""
        return epochs_read(self, tokens, seq_len)

    def __repr__(self) -> str:
        counts = ", ".join(f"{s}={self.num_tokens(s):,}" for s in self.splits)
        return f"Corpus({self.name!r}, tokenizer={self.tokenizer.name}, tokens: {counts})"


def prepare_built(source: TfdsBuild, cfg: DataConfig, root: Path) -> Corpus:
    """Builds (once, cached) or loads the corpus of the TFDS builder ``source``."""
    directory = root / "prepared" / source.key / tokenizer_class(cfg.tokenizer).key(cfg)
    if not directory.exists():
        with build_lock(root, directory):
            if not directory.exists():  # another process may have built it meanwhile
                _build(source, cfg, directory)
    return load_corpus(directory, source.name)


def load_corpus(directory: Path, name: str | None = None) -> Corpus:
    """Memory-maps a prepared corpus. Raises CacheError when anything in it is unreadable."""
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
        if manifest.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format_version {manifest.get('format_version')!r}")
        tokenizer = stored_tokenizer(manifest["tokenizer"], directory,
                                     manifest.get("separator", {}).get("id", -1))
        arrays = {}
        for split, count in manifest["tokens"].items():
            arrays[split] = np.load(directory / f"{split}.npy", mmap_mode="r", allow_pickle=False)
            if arrays[split].shape != (count,):
                raise ValueError(f"{split}.npy holds {arrays[split].shape}, expected ({count},)")
    except Exception as e:  # any failure here means the files on disk are not what we wrote
        raise CacheError(
            f"prepared data at {str(directory)!r} is unreadable ({type(e).__name__}: {e}); "
            "delete that directory to rebuild it"
        ) from e
    manifest["prepared_dir"] = str(directory)
    return Corpus(name or manifest["name"], directory, manifest, tokenizer, arrays)


def _catalog_splits(builder: tfds.core.DatasetBuilder) -> dict[str, str]:
    """Maps train / validation / test onto the dataset's splits; without a held-out split,
    the last 10% of train is held out (5% validation, 5% test)."""
    available = set(builder.info.splits.keys())
    if "train" not in available:
        raise DataSourceError(
            f"data.source: {builder.name} has no 'train' split "
            f"(it has {', '.join(sorted(available))})"
        )
    validation = next((s for s in _VALIDATION_NAMES if s in available), None)
    test = next((s for s in _TEST_NAMES if s in available), None)
    if validation is None:
        return {"train": "train[:90%]", "validation": "train[90%:95%]", "test": "train[95%:]"}
    return {"train": "train", "validation": validation, "test": test}


def _prepare_builder(source: TfdsBuild) -> None:
    try:
        builders.prepare_builder(source.builder)
    except (DataSourceError, CacheError):
        raise
    except OSError as e:
        if source.own_builder:
            raise CacheError(
                f"cannot build {source.name} in {source.builder.data_dir!r}: {e}"
            ) from e
        raise DataSourceError(_catalog_failure(source, e)) from e
    except Exception as e:  # TFDS raises many kinds (download, checksum, missing TensorFlow)
        if source.own_builder:
            raise
        raise DataSourceError(_catalog_failure(source, e)) from e


def _catalog_failure(source: TfdsBuild, e: Exception) -> str:
    return (
        f"data.source: TFDS could not download and prepare {source.builder.name} in the "
        f"array_record format under {source.builder.data_dir!r} ({type(e).__name__}: {e}). "
        "Prepare it once where the network (and, for builders that use tf.io.gfile, TensorFlow) "
        "is available, with file_format='array_record', then point TFDS_DATA_DIR at that copy."
    )


def _read_documents(source: TfdsBuild, split: str) -> list[bytes]:
    """The documents of one split, in a fixed order ([one stream] when not separated)."""
    tfds_split = source.split_names[split]
    written = source.builder.info.splits
    if source.own_builder and written and tfds_split not in written:
        return []  # an empty split, which TFDS does not write (attnlab.data.builders)
    try:
        data_source = source.builder.as_data_source(tfds_split)
        records = _all_records(data_source)
    except Exception as e:
        raise CacheError(
            f"cannot read split {tfds_split!r} of {source.name} from "
            f"{source.builder.data_dir!r} ({type(e).__name__}: {e}); TFDS data must be in "
            "the array_record format; delete that directory to rebuild it"
        ) from e
    if source.own_builder:
        records.sort(key=lambda r: r["path"])
    documents = []
    for index, record in enumerate(records):
        text = _text_bytes(record[source.feature])
        if source.separated and bytes([EOS_BYTE]) in text:
            raise DataSourceError(
                f"{source.name}: record {index} of split {tfds_split!r} contains the byte 0x00, "
                "which attnlab reserves as the end-of-document separator"
            )
        if text:
            documents.append(text)
    return documents if source.separated else [b"".join(documents)]


def _all_records(data_source) -> list:
    getitems = getattr(data_source, "__getitems__", None)
    if getitems is None:  # any random-access sequence
        return [data_source[i] for i in range(len(data_source))]
    chunk = 1024
    out = []
    for start in range(0, len(data_source), chunk):
        out.extend(getitems(list(range(start, min(start + chunk, len(data_source))))))
    return out


def _text_bytes(value) -> bytes:
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value.item()
    if isinstance(value, str):
        return value.encode("utf-8")
    return bytes(value)


def _storage_dtype(vocab_size: int) -> np.dtype:
    if vocab_size <= 1 << 8:
        return np.dtype(np.uint8)
    if vocab_size <= 1 << 16:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)


def _join(pieces: list[np.ndarray], eos_id: int | None, dtype: np.dtype) -> np.ndarray:
    """[sum of lengths (+ one EOS per piece)] the pieces back to back, each followed by EOS."""
    extra = 0 if eos_id is None else 1
    out = np.empty(sum(len(p) for p in pieces) + extra * len(pieces), dtype)
    position = 0
    for piece in pieces:
        out[position : position + len(piece)] = piece
        position += len(piece)
        if eos_id is not None:
            out[position] = eos_id
            position += 1
    return out


def _sha256(documents: list[bytes]) -> str:
    h = hashlib.sha256()
    for d in documents:
        h.update(d)
    return h.hexdigest()


def _build(source: TfdsBuild, cfg: DataConfig, directory: Path) -> None:
    _prepare_builder(source)
    if not source.own_builder:
        source.split_names = _catalog_splits(source.builder)
    documents = {split: _read_documents(source, split) for split in SPLITS}
    source_manifest = _source_manifest(source, documents)

    kind = tokenizer_class(cfg.tokenizer)
    with atomic_directory(directory) as tmp:
        tokenizer = kind.for_corpus(documents["train"], cfg)
        if kind.trained:  # kept beside the corpus it was trained on
            tokenizer.save(tmp / TOKENIZER_FILE)
        dtype = _storage_dtype(tokenizer.vocab_size)
        eos_id = tokenizer.eos_id if source.separated else None
        counts = {}
        for split in SPLITS:
            stream = _join(tokenizer.encode_documents(documents[split]), eos_id, dtype)
            np.save(tmp / f"{split}.npy", stream, allow_pickle=False)
            counts[split] = int(stream.shape[0])
        tokenizer_manifest = tokenizer.describe()
        if kind.trained:
            tokenizer_manifest["file"] = TOKENIZER_FILE
            tokenizer_manifest["sha256"] = hashlib.sha256(
                (tmp / TOKENIZER_FILE).read_bytes()
            ).hexdigest()
        separator = {"kind": "none"}
        if source.separated:
            separator = {"kind": "eos", "byte": EOS_BYTE, "id": tokenizer.eos_id}
        manifest = {
            "format_version": FORMAT_VERSION,
            "name": source.name,
            **source_manifest,
            "separator": separator,
            "tokenizer": tokenizer_manifest,
            "tokens": counts,
        }
        if "entropy_rate_nats" in manifest and not kind.one_id_per_byte:
            # A BPE token spans several bytes: the rate per token scales by bytes per token.
            bytes_per_token = manifest["splits"]["train"]["bytes"] / counts["train"]
            manifest["entropy_rate_nats_per_token"] = (
                manifest["entropy_rate_nats"] * bytes_per_token
            )
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    if counts["test"] == 0:
        warnings.warn(f"{source.name}: the test split is empty", stacklevel=3)


def _source_manifest(source: TfdsBuild, documents: dict[str, list[bytes]]) -> dict:
    builder = source.builder
    tfds_record = {
        "builder": builder.name,
        "config": builder.builder_config.name if builder.builder_config else None,
        "version": str(builder.version),
        "data_dir": str(builder.data_dir),
    }
    if source.own_builder:
        manifest = dict(builder.info.metadata["manifest"])
        # The documents read back must be exactly the ones the builder wrote.
        for split, docs in documents.items():
            if _sha256(docs) != manifest["splits"][split]["sha256"]:
                raise CacheError(
                    f"TFDS data of {source.name} at {builder.data_dir!r} does not match its "
                    f"manifest (split {split}); delete that directory to rebuild it"
                )
        return {**manifest, "tfds": tfds_record}
    in_order = [d for split in SPLITS for d in documents[split]]
    return {
        "source": "tfds",
        "python_version": platform.python_version(),
        "dataset": builder.name,
        "feature": source.feature,
        "files": None,
        "documents": sum(len(d) for d in documents.values()),
        "bytes": sum(len(x) for x in in_order),
        "sha256": _sha256(in_order),
        "splits": {
            split: {
                "tfds_split": source.split_names[split],
                "documents": len(docs),
                "bytes": sum(len(x) for x in docs),
                "sha256": _sha256(docs),
            }
            for split, docs in documents.items()
        },
        "tfds": tfds_record,
    }
