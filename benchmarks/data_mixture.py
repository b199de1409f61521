"""Mixture benchmark: a three-source data.mixture (a Markov chain, a pystdlib slice and generated
JSON-lines shards) read for 1,000 batches: each source's share of the rows against its weight,
the largest deviation of one batch from ``batch_size x weight`` rows, and the time to read a
batch against the same batches of one source alone.

    python benchmarks/data_mixture.py
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np

from attnlab.config import DataConfig
from attnlab.data import prepare

WEIGHTS = {"markov": 0.5, "pystdlib": 0.3, "web": 0.2}


def write_shards(directory: Path) -> None:
    rng = np.random.default_rng(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    for k in range(4):
        lines = (json.dumps({"text": " ".join(rng.choice(words, 200))}) for _ in range(500))
        (directory / f"{k}.jsonl").write_text("\n".join(lines) + "\n")


def microseconds_per_batch(batches, n: int = 1000) -> float:
    batches[0]
    start = time.perf_counter()
    for i in range(n):
        batches[i]
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        web = Path(tmp) / "web"
        web.mkdir()
        write_shards(web)
        spec = f"markov=0.5,pystdlib=0.3,web@shards:{web}=0.2"
        corpus = prepare(DataConfig(mixture=spec, max_bytes=1_000_000, markov_tokens=1_000_000,
                                    workers=1, cache_dir=str(Path(tmp) / "cache")))
        print(corpus)
        for seq_len, batch in ((128, 16), (1024, 64)):
            mixed = corpus.train_batches(seq_len, batch, seed=0)
            alone = corpus.corpora[1].train_batches(seq_len, batch, seed=0)
            consumed = mixed.consumed(1000)
            tokens = np.array([consumed[f"tokens/{name}"] for name in WEIGHTS])
            shares = tokens / tokens.sum()
            error = np.abs(shares - list(WEIGHTS.values())) / list(WEIGHTS.values())
            worst = max(np.abs(np.bincount(mixed.interleave.assign(mixed.rows(i))[0],
                                           minlength=3) - batch * corpus.weights).max()
                        for i in range(1000))
            rounded = {name: round(float(share), 5) for name, share in zip(WEIGHTS, shares)}
            print(f"batch {batch} x seq_len {seq_len}: shares over 1,000 batches "
                  f"{rounded} (largest relative error "
                  f"{error.max():.2%}); one batch at most {worst:.2f} rows off; "
                  f"{microseconds_per_batch(mixed):.0f} us per batch mixed, "
                  f"{microseconds_per_batch(alone):.0f} us pystdlib alone")


if __name__ == "__main__":
    main()
