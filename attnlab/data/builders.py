"""TFDS builders for attnlab's own sources, written in the array_record format (no TensorFlow).

Each record is one document: ``{'path': str, 'text': bytes}``; documents are read back through
``builder.as_data_source(split)`` (random access) and put in ``path`` order. The builder config
name carries everything the content depends on (Python version, size limit, a fingerprint of the
file listing, Markov parameters), so a changed source gets its own directory and a cached one is
reused. The manifest (what the corpus is) is stored in ``builder.info.metadata['manifest']``.

TFDS builds into a temporary directory and renames it when complete, so an interrupted or failed
build leaves nothing half-written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import logging
import platform
import sys
from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds

from attnlab.data import files as files_lib
from attnlab.data import markov as markov_lib
from attnlab.data.errors import DataSourceError
from attnlab.data.tokenizer import EOS_BYTE

VERSION = "1.0.0"
TEXT_FEATURE = "text"
MARKOV_CHUNK = 1 << 16  # bytes per record of the Markov stream


def _info(builder: tfds.core.GeneratorBasedBuilder, description: str) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=builder,
        description=description,
        features=tfds.features.FeaturesDict(
            {
                "path": tfds.features.Text(),
                # Raw bytes, not Text: files need not be UTF-8 and must round-trip exactly.
                TEXT_FEATURE: tfds.features.Tensor(shape=(), dtype=np.object_),
            }
        ),
        metadata=tfds.core.MetadataDict(),
    )


@dataclasses.dataclass(eq=False)
class FilesConfig(tfds.core.BuilderConfig):
    """A set of text files; ``files`` is the listing made when the config was created."""

    root: str = ""
    files: tuple = ()
    max_bytes: int = 0
    source: str = ""
    skip_nul_files: bool = False  # pystdlib skips a file containing 0x00; text_files refuses it

    def __str__(self) -> str:
        # tfds logs the config with %s on every load; the full file listing would be ~240 KB.
        return f"FilesConfig({self.name}: {len(self.files)} files under {self.root})"


@functools.cache
def _stdlib_listing(max_bytes: int) -> tuple[Path, tuple, str]:
    # Once per process: the running interpreter's standard library does not change under it,
    # and listing it stats ~1,800 files twice (a sweep worker opens it for every run).
    root, files = files_lib.stdlib_files()
    fp = files_lib.fingerprint(root, files, platform.python_version(), max_bytes)
    return root, tuple(files), fp


def pystdlib_config(max_bytes: int) -> FilesConfig:
    root, files, fp = _stdlib_listing(max_bytes)
    version = platform.python_version()
    size = f"max{max_bytes}" if max_bytes else "full"
    return FilesConfig(
        name=f"py{version}-{size}-{fp}",
        description=f"Python {version} standard library at {root}",
        root=str(root),
        files=tuple(files),
        max_bytes=max_bytes,
        source="pystdlib",
        skip_nul_files=True,
    )


def text_files_config(pattern: str, max_bytes: int) -> FilesConfig:
    root, files = files_lib.text_files(pattern)
    size = f"max{max_bytes}" if max_bytes else "full"
    fp = files_lib.fingerprint(root, files, pattern, max_bytes)
    return FilesConfig(
        name=f"{size}-{fp}",
        description=f"text files {pattern!r}",
        root=str(root),
        files=tuple(files),
        max_bytes=max_bytes,
        source="text_files",
    )


def _file_splits(builder, config: FilesConfig):
    """Reads the selected files, checks them and records the manifest; returns the generators."""
    selected = files_lib.select_splits(list(config.files), config.max_bytes)
    skipped, documents = [], {}
    for split, split_files in selected.items():
        documents[split] = []
        for f in split_files:
            data = files_lib.read_file(f)
            if bytes([EOS_BYTE]) in data:
                if config.skip_nul_files:
                    skipped.append(f.relpath)
                    continue
                raise DataSourceError(
                    f"{f.path!r} contains the byte 0x00, which attnlab reserves as the "
                    "end-of-document separator (is it a binary file?); narrow data.path"
                )
            documents[split].append((f.relpath, data))
    for split in ("train", "validation"):
        if not documents[split]:
            raise DataSourceError(_empty_split_message(builder, config, split))
    whole = hashlib.sha256()
    for _, data in sorted(d for docs in documents.values() for d in docs):
        whole.update(data)
    manifest = {
        "source": config.source,
        "root": config.root,
        "python_version": platform.python_version(),
        "max_bytes": config.max_bytes,
        "files": sum(len(d) for d in documents.values()),
        "bytes": sum(len(x) for docs in documents.values() for _, x in docs),
        "sha256": whole.hexdigest(),
        "split_rule": files_lib.SPLIT_RULE,
        "splits": {s: _split_manifest(docs) for s, docs in documents.items()},
        "skipped_files_with_nul": skipped,
    }
    builder.info.metadata["manifest"] = manifest
    # TFDS writes no empty split: an empty test split (a small directory of files) is left out
    # and read back as empty (attnlab.data.corpus warns); train and validation are refused above.
    return {s: builder._generate_examples(docs) for s, docs in documents.items() if docs}


def _split_manifest(documents: list[tuple[str, bytes]]) -> dict:
    h = hashlib.sha256()
    for _, data in documents:
        h.update(data)
    return {
        "files": len(documents),
        "documents": len(documents),  # one per file
        "bytes": sum(len(x) for _, x in documents),
        "sha256": h.hexdigest(),
    }


def _empty_split_message(builder, config: FilesConfig, split: str) -> str:
    where = builder.EMPTY_SPLIT_NAMES or config.source
    if config.max_bytes:
        share = config.max_bytes * files_lib.SPLIT_PERCENT[split] // 100
        return (
            f"{where}: the {split} split is empty: data.max_bytes={config.max_bytes} leaves "
            f"{share} bytes for it and no file is that small; raise data.max_bytes"
        )
    return (
        f"{where}: the {split} split is empty: none of the {len(config.files)} files hashes to it "
        f"({files_lib.SPLIT_PERCENT[split]}% of files do on average); add more files"
    )


class AttnlabPystdlib(tfds.core.GeneratorBasedBuilder):
    """The ``.py`` files of the running interpreter's standard library (no site-packages)."""

    VERSION = tfds.core.Version(VERSION)
    EMPTY_SPLIT_NAMES = ""  # what an empty split's message names ("": the source)

    def _info(self) -> tfds.core.DatasetInfo:
        return _info(self, "Python standard library sources, one document per file.")

    def _split_generators(self, dl_manager):
        del dl_manager  # everything is local
        return _file_splits(self, self.builder_config)

    def _generate_examples(self, documents):
        for relpath, data in documents:
            yield relpath, {"path": relpath, TEXT_FEATURE: data}


class AttnlabTextFiles(tfds.core.GeneratorBasedBuilder):
    """A user's directory or glob of text files, one document per file."""

    VERSION = tfds.core.Version(VERSION)
    EMPTY_SPLIT_NAMES = "data.path"  # the user chose the files

    def _info(self) -> tfds.core.DatasetInfo:
        return _info(self, "User text files, one document per file.")

    def _split_generators(self, dl_manager):
        del dl_manager
        return _file_splits(self, self.builder_config)

    def _generate_examples(self, documents):
        for relpath, data in documents:
            yield relpath, {"path": relpath, TEXT_FEATURE: data}


@dataclasses.dataclass(eq=False)
class MarkovConfig(tfds.core.BuilderConfig):
    order: int = 2
    branching: int = 4
    seed: int = 0
    num_bytes: int = 2_000_000  # training split; validation and test get 1/20 each


def markov_config(order: int, branching: int, seed: int, num_bytes: int) -> MarkovConfig:
    markov_lib.check_size(order, branching)
    return MarkovConfig(
        name=f"o{order}-b{branching}-s{seed}-n{num_bytes}",
        description=f"order-{order} Markov chain, branching {branching}, seed {seed}",
        order=order,
        branching=branching,
        seed=seed,
        num_bytes=num_bytes,
    )


def markov_split_sizes(num_bytes: int) -> dict[str, int]:
    held_out = max(num_bytes // 20, 1)
    return {"train": num_bytes, "validation": held_out, "test": held_out}


class AttnlabMarkov(tfds.core.GeneratorBasedBuilder):
    """One continuous stream per split from a known Markov chain, stored in 64 KiB records.

    The streams have no documents, hence no separator: the records of a split are joined as is.
    """

    VERSION = tfds.core.Version(VERSION)

    def _info(self) -> tfds.core.DatasetInfo:
        return _info(self, "Samples of a seeded sparse order-k Markov chain over bytes.")

    def _split_generators(self, dl_manager):
        del dl_manager
        cfg = self.builder_config
        chain = markov_lib.build_chain(cfg.order, cfg.branching, cfg.seed)
        manifest = {"source": "markov", **markov_lib.summary(chain, cfg.branching, cfg.seed)}
        manifest["python_version"] = platform.python_version()
        streams = {}
        for index, (split, size) in enumerate(markov_split_sizes(cfg.num_bytes).items()):
            # Each split is its own draw from the same chain (seed [seed, 1 + split index]).
            streams[split] = markov_lib.sample(chain, size, [cfg.seed, 1 + index]).tobytes()
        manifest["bytes"] = sum(len(s) for s in streams.values())
        manifest["sha256"] = hashlib.sha256(b"".join(streams.values())).hexdigest()
        manifest["splits"] = {
            s: {"documents": 1, "bytes": len(x), "sha256": hashlib.sha256(x).hexdigest()}
            for s, x in streams.items()
        }
        self.info.metadata["manifest"] = manifest
        return {s: self._generate_examples(x) for s, x in streams.items()}

    def _generate_examples(self, stream: bytes):
        for i, start in enumerate(range(0, len(stream), MARKOV_CHUNK)):
            key = f"{i:09d}"  # sorts in stream order
            yield key, {"path": key, TEXT_FEATURE: stream[start : start + MARKOV_CHUNK]}


class _KnownHarmless(logging.Filter):
    """Drops TFDS's absl warnings about attnlab's own corpora that say nothing is wrong (a
    builder config named by its files; a cache folder not built yet)."""

    LINES = ("Using custom data configuration", "has no dataset_info.json")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(line in message for line in self.LINES)


logging.getLogger("absl").addFilter(_KnownHarmless())


def prepare_builder(builder: tfds.core.DatasetBuilder) -> None:
    """Builds the array_record files unless they exist (TFDS reuses a finished build).

    attnlab's own corpora (``attnlab_*``: built from local files or sampled, never downloaded)
    are built quietly with one line on stderr, instead of TFDS's "Downloading and preparing
    dataset Unknown size ..." on stdout and its progress bars; TFDS catalog datasets keep
    TFDS's own output (a real download is worth seeing)."""
    ours = builder.name.startswith("attnlab_")
    if ours and not builder.is_prepared():
        sys.stderr.write(f"building the {builder.name.removeprefix('attnlab_')} corpus once "
                         f"(cached in {builder.data_dir})\n")
        sys.stderr.flush()
    quiet = contextlib.redirect_stdout(io.StringIO()) if ours else contextlib.nullcontext()
    if ours:
        tfds.display_progress_bar(False)
    try:
        with quiet:
            builder.download_and_prepare(
                file_format="array_record",
                download_config=tfds.download.DownloadConfig(try_download_gcs=False),
            )
    finally:
        if ours:
            tfds.display_progress_bar(True)


def builder_data_dir(root: Path) -> str:
    return str(root / "tfds")
