"""Shards benchmark: build throughput of data.source=shards against the tokenizers library's own
batch encoding of the same text, at 1 and N worker processes, and the build's peak memory.

    python benchmarks/data_shards.py                       # 64 MB, an 8,192-id BPE, 1 and 2 workers
    python benchmarks/data_shards.py --mb 1000 --vocab 50257 --workers 1 2 16
    python benchmarks/data_shards.py --mb 160 --workers 1 2 1 2 1 2  # interleaved, medians
    python benchmarks/data_shards.py --corpus=runs/web_corpus --mb=16  # only write the corpus

The corpus is generated here (Zipf-distributed words in documents of 20-2,000 words), half
Parquet and half JSONL.zst shards, and the tokenizer.json is trained here on a 2 MB sample.
Each build runs in a fresh process with a cold cache; the baseline encodes every document with
``Tokenizer.encode_batch`` in one thread (RAYON_NUM_THREADS=1), as each build worker does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SHARD_MB = 8

BUILD = """
import resource, sys, time
from attnlab.config import DataConfig
from attnlab.data import prepare
start = time.perf_counter()
corpus = prepare(DataConfig(source="shards", path=sys.argv[1], tokenizer=sys.argv[2],
                            cache_dir=sys.argv[3], workers=int(sys.argv[4])))
seconds = time.perf_counter() - start
peak = max(resource.getrusage(r).ru_maxrss for r in (resource.RUSAGE_SELF,
                                                     resource.RUSAGE_CHILDREN))
print(seconds, sum(corpus.num_tokens(s) for s in corpus.splits), peak * 1024)
"""

BASELINE = """
import sys, time, pyarrow.parquet as pq, pyarrow as pa, pyarrow.json as pj
from pathlib import Path
from tokenizers import Tokenizer
hub = Tokenizer.from_file(sys.argv[2])
seconds = 0.0
for path in sorted(Path(sys.argv[1]).iterdir()):
    if path.suffix == ".parquet":
        texts = pq.read_table(path).column("text").to_pylist()
    else:
        texts = pj.read_json(pa.input_stream(str(path), compression="detect")).column(
            "text").to_pylist()
    start = time.perf_counter()
    for i in range(0, len(texts), 1024):
        hub.encode_batch(texts[i:i + 1024], add_special_tokens=False)
    seconds += time.perf_counter() - start
print(seconds)
"""


def generate(directory: Path, megabytes: float, seed: int = 0, shard_mb: float = SHARD_MB) -> int:
    """Writes ``megabytes`` of documents as alternating Parquet / JSONL.zst shards of
    ``shard_mb``."""
    rng = np.random.default_rng(seed)
    words = np.array(["".join(rng.choice(list("etaoinshrdlucmfwypvbgk"), size=n))
                      for n in rng.integers(2, 10, size=20_000)])
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    written, index = 0, 0
    while written < megabytes * 1_000_000:
        docs, size = [], 0
        while size < shard_mb * 1_000_000:
            doc = " ".join(rng.choice(words, size=int(rng.integers(20, 2000)), p=weights))
            docs.append(doc)
            size += len(doc)
        if index % 2 == 0:
            pq.write_table(pa.table({"text": docs}), directory / f"{index:04d}.parquet")
        else:
            with pa.output_stream(str(directory / f"{index:04d}.jsonl.zst"),
                                  compression="zstd") as f:
                f.write("".join(json.dumps({"text": d}) + "\n" for d in docs).encode())
        written += size
        index += 1
    return written


def train_tokenizer(directory: Path, vocab: int, path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    sample = pq.read_table(sorted(directory.glob("*.parquet"))[0]).column("text").to_pylist()
    hub = Tokenizer(models.BPE())
    hub.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hub.train_from_iterator(sample[: 2_000_000 // 2_000], trainer)
    hub.save(str(path))


def run(code: str, *args: str, threads: str | None = None) -> list[float]:
    env = dict(os.environ)
    if threads:
        env["RAYON_NUM_THREADS"] = threads
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    return [float(x) for x in out]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=64)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--corpus", help="write the generated shards (and a tokenizer.json) to "
                                         "this directory and stop: a corpus to train on")
    args = parser.parse_args()
    if args.corpus:
        out = Path(args.corpus)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            print(f"error: --corpus={out} exists and is not an empty directory: it would "
                  f"overwrite its files; give a new directory", file=sys.stderr)
            sys.exit(2)
        out.mkdir(parents=True, exist_ok=True)
        total = generate(out, args.mb)
        train_tokenizer(out, args.vocab, out / "tokenizer.json")
        print(f"{total / 1e6:.1f} MB of shards and tokenizer.json in {args.corpus}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        shards, tokenizer = Path(tmp) / "shards", Path(tmp) / "tokenizer.json"
        shards.mkdir()
        total = generate(shards, args.mb)
        train_tokenizer(shards, args.vocab, tokenizer)
        (baseline,) = run(BASELINE, str(shards), str(tokenizer), threads="1")
        print(f"corpus {total / 1e6:.0f} MB in {len(list(shards.iterdir()))} shards; "
              f"tokenizers encode_batch, 1 thread: {total / 1e6 / baseline:.2f} MB/s")
        rates: dict[int, list[float]] = {}
        for i, workers in enumerate(args.workers):  # repeat counts to interleave them: 1 2 1 2
            seconds, tokens, peak = run(BUILD, str(shards), str(tokenizer),
                                        str(Path(tmp) / f"cache{i}"), str(workers),
                                        threads="1" if workers == 1 else None)
            shutil.rmtree(Path(tmp) / f"cache{i}")
            rate = total / 1e6 / seconds
            rates.setdefault(workers, []).append(rate)
            print(f"build, {workers} worker(s): {seconds:.1f} s, {rate:.2f} MB/s "
                  f"({rate / workers:.2f} MB/s per worker, "
                  f"{rate / workers / (total / 1e6 / baseline):.2f}x the baseline per core), "
                  f"{tokens / 1e6:.1f}M tokens, peak RSS {peak / 1e9:.2f} GB")
        one = np.median(rates.get(1, [np.nan]))
        for workers, measured in sorted(rates.items()):
            print(f"median of {len(measured)}, {workers} worker(s): "
                  f"{np.median(measured):.2f} MB/s, {np.median(measured) / one:.2f}x one worker")


if __name__ == "__main__":
    main()
