"""Local shards of a text corpus (``data.source=shards``), as web-text corpora ship: Parquet
files (each document's text in the column ``data.text_field``), JSON lines (plain, ``.gz`` or
``.zst``; the text under the key ``data.text_field``) and plain ``.txt`` files (one document
each), found under ``data.path``: a directory, a glob, or several of them comma-separated.

The build streams the shards one at a time through ``data.workers`` processes. Each reads its
shard in record batches, puts every document in a split by the SHA-256 of its text
(:data:`attnlab.data.files.SPLIT_RULE` applied to the document, so a document's split never
depends on the shard it came in), tokenizes the batches and writes one token file per split
and shard, then the shard's record. A build killed at any moment restarts from the shards whose
record exists; the finished shards are then joined, in shard order, into the ``<split>.npy``
files that training memory-maps, so the result equals an uninterrupted build's.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq
import tokenizers

from attnlab.data.cache import atomic_directory, build_lock
from attnlab.data.errors import DataSourceError
from attnlab.data.files import SPLIT_RULE, SPLITS, split_of_digest
from attnlab.data.tokenizer import (EOS_BYTE, TOKENIZER_FILE, ByteTokenizer, HubTokenizer,
                                    id_space, is_tokenizer_file)
from attnlab.rundir import write_json_atomic

FORMAT_VERSION = 1
READ_ROWS = 1024  # documents per record batch read and encoded at once
MAX_DOCUMENT_BYTES = 1 << 30  # the longest JSON line a shard may hold (pyarrow's block fits it)
# End-of-document tokens of common tokenizer.json files (GPT-2, Llama 3, T5/Llama 2, others).
EOS_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>")


# ------------------------------------------------------------------------------------------
# Reading shards
# ------------------------------------------------------------------------------------------


def _parquet_batches(path: Path, field: str) -> Iterator[pa.Array]:
    shard = pq.ParquetFile(path)
    if field not in shard.schema_arrow.names:
        raise DataSourceError(f"{path}: no column {field!r} (data.text_field); its columns are "
                              f"{', '.join(shard.schema_arrow.names)}")
    for batch in shard.iter_batches(batch_size=READ_ROWS, columns=[field]):
        yield batch.column(0)


def _jsonl_batches(path: Path, field: str) -> Iterator[pa.Array]:
    """The shard's ``field`` a record batch at a time. pyarrow reads JSON in blocks (1 MiB by
    default) that must each hold whole records: where a record is longer, the file is read
    again with a block that fits its longest line, from the record after the last one given."""
    given, block_size = 0, None
    while True:
        try:
            seen = 0
            for column in _jsonl_columns(path, field, block_size):
                if seen + len(column) > given:
                    yield column.slice(given - seen) if given > seen else column
                    given = seen + len(column)
                seen += len(column)
            return
        except pa.ArrowInvalid as e:
            if "straddl" not in str(e) or block_size is not None:
                raise
            longest = _longest_line(path)
            if longest > MAX_DOCUMENT_BYTES:
                raise DataSourceError(
                    f"{path}: a JSON line of {longest:,} bytes, more than the "
                    f"{MAX_DOCUMENT_BYTES:,} a shard's document may hold; split it, or store "
                    f"the shard as Parquet") from None
            block_size = max(2 * longest, 1 << 20)


def _jsonl_columns(path: Path, field: str, block_size: int | None) -> Iterator[pa.Array]:
    options = pa_json.ReadOptions(block_size=block_size) if block_size else None
    try:
        reader = pa_json.open_json(pa.input_stream(str(path), compression="detect"),
                                   read_options=options)
    except pa.ArrowInvalid as e:
        if "Empty JSON stream" in str(e):  # no records: no documents, as an empty .txt
            return
        raise
    for batch in reader:
        if field not in batch.schema.names:
            raise DataSourceError(f"{path}: no key {field!r} (data.text_field) in its records; "
                                  f"they have {', '.join(batch.schema.names)}")
        yield batch.column(field)


def _longest_line(path: Path) -> int:
    """The length in bytes of the longest line of ``path`` (decompressed), read in 16 MiB
    chunks."""
    longest = current = 0
    with pa.input_stream(str(path), compression="detect") as stream:
        while chunk := stream.read(1 << 24):
            parts = chunk.split(b"\n")
            if len(parts) == 1:
                current += len(chunk)
                continue
            longest = max(longest, current + len(parts[0]), *map(len, parts[1:-1]))
            current = len(parts[-1])
    return max(longest, current)


def _text_batches(path: Path, field: str) -> Iterator[pa.Array]:
    yield pa.array([path.read_bytes().decode("utf-8")])


# Each shard format: the ends of its file names and how its documents are read.
FORMATS = {(".parquet",): _parquet_batches,
           (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".json.zst"): _jsonl_batches,
           (".txt",): _text_batches}


def _reader(path: Path):
    return next((read for ends, read in FORMATS.items() if path.name.endswith(ends)), None)


def documents(path: Path, field: str) -> Iterator[list[str]]:
    """The non-empty texts of the shard ``path``, a record batch at a time. Raises
    DataSourceError naming the file (and data.text_field) when it cannot be read to its end."""
    try:
        for column in _reader(path)(path, field):
            yield [t for t in _text(column, path, field).to_pylist() if t]
    except UnicodeDecodeError as e:
        raise DataSourceError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); shards "
                              f"are read as UTF-8") from None
    except (pa.ArrowException, OSError, EOFError) as e:
        raise DataSourceError(f"{path}: unreadable or truncated shard "
                              f"({type(e).__name__}: {e})") from None


def _text(column, path: Path, field: str):
    """``column`` as strings: text columns as they are, and those stored as dictionaries of
    strings (a pandas category) or string views cast; DataSourceError for anything else."""
    def is_text(kind) -> bool:
        return pa.types.is_string(kind) or pa.types.is_large_string(kind)

    if is_text(column.type):
        return column
    if pa.types.is_null(column.type):  # JSON whose every text is null: no documents here
        return pa.nulls(len(column), pa.large_string())
    kind = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
    if not (is_text(kind) or pa.types.is_string_view(kind)):
        raise DataSourceError(f"{path}: {field!r} (data.text_field) holds {column.type}, "
                              f"not text")
    return column.cast(pa.large_string())


def shard_files(path: str) -> list[Path]:
    """The shards ``data.path`` names, in a fixed order: each directory's files and each glob's
    matches sorted, the patterns in the order given, every file once."""
    found: list[Path] = []
    # Commas separate paths, unless the whole value names a file or directory that exists.
    whole = Path(path.strip()).expanduser().exists()
    for pattern in [path.strip()] if whole else (p.strip() for p in path.split(",")):
        where = Path(pattern).expanduser()
        if where.is_dir():
            matches = sorted(f for f in where.rglob("*") if f.is_file() and _reader(f))
        else:
            matches = sorted(Path(m) for m in _glob(pattern) if Path(m).is_file())
            strangers = [m for m in matches if not _reader(m)]
            if strangers:
                raise DataSourceError(f"data.path: {strangers[0]} is not a shard attnlab reads "
                                      f"(it reads {', '.join(e for k in FORMATS for e in k)})")
        if not matches:
            commas = (f"; commas separate paths, so {path!r} was read as "
                      f"{len(path.split(','))} of them" if "," in path and not whole else "")
            raise DataSourceError(f"data.path: {pattern!r} names no shard (files ending "
                                  f"{', '.join(e for k in FORMATS for e in k)}){commas}")
        found.extend(m.resolve() for m in matches if m.resolve() not in found)
    return found


def _glob(pattern: str) -> list[str]:
    return glob.glob(os.path.expanduser(pattern), recursive=True)


# ------------------------------------------------------------------------------------------
# Tokenizers
# ------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def hub_tokenizer(path: str) -> tokenizers.Tokenizer:
    """The tokenizer.json at ``path``, read once per process."""
    return tokenizers.Tokenizer.from_file(path)


def eos_token_id(tokenizer: tokenizers.Tokenizer) -> int | None:
    """The id of the tokenizer's end-of-document token (:data:`EOS_TOKENS`), or None."""
    ids = (tokenizer.token_to_id(t) for t in EOS_TOKENS)
    return next((i for i in ids if i is not None), None)


def storage_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned type that holds every id."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    raise ValueError(f"vocabulary of {vocab_size} ids")


def _encode(texts: list[str], tokenizer: str, path: Path) -> list[np.ndarray]:
    """Each text's ids; ``tokenizer`` is ``byte`` or the path of a tokenizer.json."""
    if not is_tokenizer_file(tokenizer):
        out = [np.frombuffer(t.encode("utf-8"), np.uint8) for t in texts]
        if any((ids == EOS_BYTE).any() for ids in out):
            raise DataSourceError(f"{path}: a document contains the byte 0x00, which the byte "
                                  "tokenizer reserves as the end-of-document separator")
        return out
    encodings = _encodings(tokenizer, texts, f"{path}: data.tokenizer={tokenizer} cannot "
                                             f"encode this shard's text")
    return [np.asarray(e.ids, np.int64) for e in encodings]


def _encodings(tokenizer: str, texts: list[str], failure: str) -> list:
    """The tokenizer.json's encodings of ``texts``; DataSourceError ``failure (its reason)``
    where it cannot encode them."""
    try:
        return hub_tokenizer(tokenizer).encode_batch(texts, add_special_tokens=False)
    except Exception as e:  # noqa: BLE001 - tokenizers raises its own exception types
        lines = str(e).strip().splitlines()
        raise DataSourceError(f"{failure} ({lines[0] if lines else type(e).__name__})") from None


# The most of a sample's non-space characters a tokenizer.json may drop (no unknown token or
# byte fallback covers them) before the build is refused (data.allow_lossy_tokenizer).
LOSSY_SHARE = 0.01
SAMPLE_CHARS = 200_000


def check_tokenizer(files: list[Path], d, tokenizer: dict) -> None:
    """Encodes a sample (the first documents of the shards, up to SAMPLE_CHARS characters)
    before the build: DataSourceError naming data.tokenizer where it cannot encode them, or
    where its tokens cover fewer than 1 - LOSSY_SHARE of their non-space characters."""
    if not tokenizer["file"]:
        return  # bytes: every character is its bytes
    sample, where = _sample(files, d.text_field)
    if not sample:
        return
    encodings = _encodings(tokenizer["encoder"], sample,
                           f"data.tokenizer={d.tokenizer} cannot encode the text of {where}")
    visible = dropped = 0
    for text, encoding in zip(sample, encodings):
        covered = np.zeros(len(text), bool)
        for start, end in encoding.offsets:
            covered[start:end] = True
        shown = ~np.array([c.isspace() for c in text], bool)
        visible += int(shown.sum())
        dropped += int((shown & ~covered).sum())
    share = dropped / max(visible, 1)
    if share > LOSSY_SHARE and not d.allow_lossy_tokenizer:
        raise DataSourceError(
            f"data.tokenizer={d.tokenizer} drops {share:.1%} of the non-space characters of a "
            f"sample of {where} (no unknown token or byte fallback covers them), more than "
            f"{LOSSY_SHARE:.0%}; use another tokenizer, or set "
            f"data.allow_lossy_tokenizer=true to build on what it keeps")


def _sample(files: list[Path], field: str) -> tuple[list[str], str]:
    """The first record batch of the first shard that has documents, cut to SAMPLE_CHARS
    characters in all, and that shard."""
    for path in files:
        texts = next(iter(documents(path, field)), [])
        taken, size = [], 0
        for text in texts:
            if size >= SAMPLE_CHARS:
                break
            taken.append(text[:SAMPLE_CHARS - size])
            size += len(taken[-1])
        if taken:
            return taken, str(path)
    return [], ""


# ------------------------------------------------------------------------------------------
# The build
# ------------------------------------------------------------------------------------------


def shard_tokens(out: Path, index: int, split: str) -> Path:
    """The raw token file of one split of one shard (ids in the storage dtype, no header)."""
    return out / f"{index:05d}.{split}.bin"


def tokenize_shard(job: dict) -> dict:
    """Tokenizes one shard into its ``<index>.<split>.bin`` files, a record batch at a time
    (memory holds one batch), and writes its record last (a shard with a record is finished).
    Runs in a worker process."""
    path, out, index = Path(job["path"]), Path(job["out"]), job["index"]
    stats = {s: {"documents": 0, "bytes": 0, "tokens": 0} for s in SPLITS}
    eos = np.array([job["eos_id"]], np.int64)
    dtype = np.dtype(job["dtype"])
    tmp = {s: shard_tokens(out, index, s).with_suffix(".bin.tmp") for s in SPLITS}
    # Unbuffered: a write error (a full disk) is raised by the write that meets it.
    files = {s: open(tmp[s], "wb", buffering=0) for s in SPLITS}
    try:
        for texts in documents(path, job["text_field"]):
            pieces: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
            for text, ids in zip(texts, _encode(texts, job["tokenizer"], path)):
                data = text.encode("utf-8")
                split = split_of_digest(hashlib.sha256(data).digest())
                pieces[split] += [ids, eos]
                stats[split]["documents"] += 1
                stats[split]["bytes"] += len(data)
                stats[split]["tokens"] += len(ids) + 1
            for split, parts in pieces.items():
                if parts:
                    _write(files[split], np.concatenate(parts).astype(dtype), tmp[split])
    finally:
        for f in files.values():
            f.close()
    for split in SPLITS:
        os.replace(tmp[split], shard_tokens(out, index, split))
    record = {"file": str(path), "bytes": path.stat().st_size, "sha256": _file_sha256(path),
              "splits": stats}
    write_json_atomic(out / f"{job['index']:05d}.json", record)
    return record


def _write(handle, array: np.ndarray, path: Path) -> None:
    """``array``'s bytes to ``handle``; an OS error (a full disk) names ``path``. (numpy's
    ``tofile`` reports a short write as an OSError with neither errno nor file.)"""
    try:
        handle.write(array.tobytes())
    except OSError as e:
        raise OSError(e.errno, e.strerror or str(e), str(path)) from e


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class Progress:
    """One line on stderr per finished shard: shards done, MB read, MB/s and the ETA."""

    def __init__(self, files: list[Path], done: int, enabled: bool):
        self.total = sum(f.stat().st_size for f in files)
        self.count, self.done, self.read, self.enabled = len(files), done, 0, enabled
        self.start = time.monotonic()

    def update(self, record: dict) -> None:
        self.done += 1
        self.read += record["bytes"]
        if not self.enabled:
            return
        rate = self.read / max(time.monotonic() - self.start, 1e-9)
        left = max(self.total - self.read, 0) / max(rate, 1e-9)
        sys.stderr.write(f"shards: {self.done}/{self.count}, {self.read / 1e6:.1f} MB at "
                         f"{rate / 1e6:.1f} MB/s, ETA {left:.0f} s\n")


def tokenize_all(jobs: list[dict], workers: int, progress: Progress) -> None:
    """Runs :func:`tokenize_shard` on every job, in ``workers`` processes (1: in this one)."""
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            progress.update(tokenize_shard(job))
        return
    # spawn: the parent may hold JAX's threads, which fork would copy mid-state.
    context = multiprocessing.get_context("spawn")
    with context.Pool(min(workers, len(jobs)), initializer=_one_thread) as pool:
        for record in pool.imap_unordered(tokenize_shard, jobs):
            progress.update(record)


def _one_thread() -> None:
    """The processes are the parallelism: each encodes its batches in one thread (tokenizers'
    rayon pool, sized on first use)."""
    os.environ["RAYON_NUM_THREADS"] = "1"


def join_shards(partial: Path, count: int, dtype: np.dtype, tmp: Path) -> dict[str, int]:
    """Writes each split's shards back to back into ``tmp/<split>.npy`` by copying their files
    (constant memory); returns the token count per split."""
    counts = {}
    for split in SPLITS:
        parts = [shard_tokens(partial, i, split) for i in range(count)]
        counts[split] = sum(p.stat().st_size for p in parts) // dtype.itemsize
        with open(tmp / f"{split}.npy", "wb") as out:
            np.lib.format.write_array_header_1_0(out, {
                "descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                "shape": (counts[split],)})
            for part in parts:
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 22)
    return counts


def build(files: list[Path], d, tokenizer: dict, directory: Path, root: Path,
          progress: bool = True) -> None:
    """Builds the corpus of ``files`` into ``directory`` (once: under the build lock), resuming
    from the finished shards of an earlier, interrupted build."""
    with build_lock(root, directory):
        if directory.exists():  # another process built it meanwhile
            return
        partial = directory.with_name(directory.name + ".partial")
        partial.mkdir(parents=True, exist_ok=True)
        jobs = [{"index": i, "path": str(f), "out": str(partial), "text_field": d.text_field,
                 "tokenizer": tokenizer["encoder"], "eos_id": tokenizer["eos_id"],
                 "dtype": tokenizer["dtype"]} for i, f in enumerate(files)]
        pending = [j for j in jobs if not (partial / f"{j['index']:05d}.json").exists()]
        bar = Progress(files, len(jobs) - len(pending), progress)
        tokenize_all(pending, d.workers or os.cpu_count() or 1, bar)
        records = [json.loads((partial / f"{i:05d}.json").read_text())
                   for i in range(len(files))]
        for split in ("train", "validation"):
            if not any(r["splits"][split]["documents"] for r in records):
                raise DataSourceError(f"data.path: the {split} split of the shards is empty "
                                      f"({sum(r['splits']['train']['documents'] for r in records)}"
                                      " training documents); add more documents")
        with atomic_directory(directory) as tmp:
            counts = join_shards(partial, len(files), np.dtype(tokenizer["dtype"]), tmp)
            if tokenizer["file"]:
                shutil.copyfile(tokenizer["file"], tmp / TOKENIZER_FILE)
            manifest = _manifest(d, records, tokenizer, counts)
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
        shutil.rmtree(partial)


def _manifest(d, records: list[dict], tokenizer: dict, counts: dict[str, int]) -> dict:
    splits = {s: {k: sum(r["splits"][s][k] for r in records)
                  for k in ("documents", "bytes", "tokens")} for s in SPLITS}
    return {
        "format_version": FORMAT_VERSION,
        "name": d.source,
        "source": d.source,
        "text_field": d.text_field,
        "files": [{k: r[k] for k in ("file", "bytes", "sha256")} for r in records],
        "documents": sum(s["documents"] for s in splits.values()),
        "bytes": sum(r["bytes"] for r in records),
        "split_rule": SPLIT_RULE.replace("relative path", "document text (UTF-8)"),
        "splits": splits,
        "separator": {"kind": "eos", "id": tokenizer["eos_id"]},
        "tokenizer": {k: tokenizer[k] for k in ("name", "kind", "vocab_size", "sha256", "dtype")}
        | ({"file": TOKENIZER_FILE} if tokenizer["file"] else {}),
        "tokens": counts,
    }


def tokenizer_record(spec: str) -> dict:
    """What the build needs to know of ``data.tokenizer`` (``byte`` or a tokenizer.json path):
    the encoder, its end-of-document id, vocabulary, storage dtype and hash."""
    if not is_tokenizer_file(spec):  # byte: the sources that read shards refuse a trained one
        name = ByteTokenizer.name
        return {"name": name, "kind": name, "encoder": name, "file": "",
                "eos_id": ByteTokenizer.eos_id, "vocab_size": ByteTokenizer.vocab_size,
                "sha256": None, "dtype": storage_dtype(ByteTokenizer.vocab_size).name}
    path = str(Path(spec).expanduser().resolve())
    hub = hub_tokenizer(path)
    size = id_space(hub)
    return {"name": f"hf{size}", "kind": HubTokenizer.kind, "encoder": path, "file": path,
            "eos_id": eos_token_id(hub), "vocab_size": size, "sha256": _file_sha256(Path(path)),
            "dtype": storage_dtype(size).name}


def corpus_key(files: list[Path], d, tokenizer: dict) -> Path:
    """``shards/<listing>/<tokenizer>``: the files (path, size, modification time) and text
    field, and the tokenizer's hash; a changed shard or tokenizer builds a new corpus."""
    listing = hashlib.sha256(json.dumps(
        [d.text_field] + [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files]
    ).encode()).hexdigest()[:16]
    name = "byte" if tokenizer["sha256"] is None else f"hf-{tokenizer['sha256'][:16]}"
    return Path("shards") / listing / name
