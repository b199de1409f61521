"""Data benchmark: build time of the full pystdlib corpus and tokens/s delivered by Batches.

    python benchmarks/data.py                    # cold build in a temporary cache, byte tokenizer
    python benchmarks/data.py --bpe              # also time the BPE build (train + encode)
    python benchmarks/data.py --cache-dir DIR    # reuse (or fill) a cache instead

The target: batches must come at least 10x faster than the fastest training step consumes them
(a small CPU train step does ~30-60k tokens/s), i.e. well above 1M tokens/s.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from attnlab.config import DataConfig
from attnlab.data import Batches, prepare, validation_batches

SHAPES = ((32, 128), (16, 256), (8, 256))


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def batch_rate(corpus, batch_size: int, seq_len: int, seconds: float) -> float:
    """Predicted tokens/s from consecutive batches (epoch shuffles included)."""
    batches = Batches(corpus, "train", seq_len, batch_size, seed=0)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        batches[count]
        count += 1
    elapsed = time.perf_counter() - start
    return count * batches.tokens_per_batch / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", default="", help="cache to use (default: a fresh temp dir)")
    parser.add_argument("--seconds", type=float, default=2.0, help="time per batch shape")
    parser.add_argument("--bpe", action="store_true", help="also build a 1024-token BPE corpus")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="attnlab-data-") as scratch:
        run(args.cache_dir or scratch, args.seconds, args.bpe)


def run(cache_dir: str, seconds: float, bpe: bool) -> None:
    cfg = DataConfig(source="pystdlib", cache_dir=cache_dir)
    corpus, build_s = timed(lambda: prepare(cfg))
    _, load_s = timed(lambda: prepare(cfg))
    m = corpus.manifest
    print(f"pystdlib (Python {m['python_version']}): {m['files']} files, {m['bytes']:,} bytes")
    print("  tokens: " + ", ".join(f"{s} {n:,}" for s, n in m["tokens"].items()))
    print(f"  prepare, first call: {build_s:.2f} s   (cached: {load_s:.3f} s)")
    if bpe:
        bpe_cfg = DataConfig(source="pystdlib", cache_dir=cache_dir, tokenizer="bpe")
        bpe_corpus, bpe_s = timed(lambda: prepare(bpe_cfg))
        ratio = m["bytes"] / sum(bpe_corpus.manifest["tokens"].values())
        print(f"  BPE {bpe_corpus.vocab_size} prepare: {bpe_s:.2f} s ({ratio:.2f} bytes/token)")

    print("\n| batch | seq_len | batches/s | tokens/s |")
    print("|---:|---:|---:|---:|")
    for batch_size, seq_len in SHAPES:
        rate = batch_rate(corpus, batch_size, seq_len, seconds)
        batches_per_s = rate / (batch_size * seq_len)
        print(f"| {batch_size} | {seq_len} | {batches_per_s:,.0f} | {rate / 1e6:,.1f} M |")
    _, val_s = timed(lambda: validation_batches(corpus, 256, 16, 8))
    print(f"\nvalidation_batches(seq_len=256, batch=16, n=8): {val_s * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
