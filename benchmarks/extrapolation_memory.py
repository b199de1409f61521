"""Extrapolation benchmark: peak RSS of a whole evaluation at T = 8192 (16 x L_train = 512).

    python benchmarks/extrapolation_memory.py                    # chunked (the default, 512)
    python benchmarks/extrapolation_memory.py --chunks 512,0     # also the unchunked path

Target: a ~1M-parameter byte-level model (d_model 128, 5 layers, 4 heads) evaluated by
:func:`attnlab.extrapolation.evaluate_model` at lengths 512 and 8192 (nonoverlapping, two windows
of 8192) stays under 2 GB peak RSS on a CPU. The evaluator uses the model's query-block attention
for windows longer than ``attention_chunk``, so at most a [heads, chunk, T] score block exists
at once; with ``--chunks 0`` the full [heads, T, T] tensor (1 GiB per layer in float32) is built.

Each setting runs in a fresh subprocess, so its peak RSS (``ru_maxrss``) is its own. Parameters
are freshly initialised and the tokens random: memory does not depend on either.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

LONGEST = 8192
TRAIN_LENGTH = 512


def worker(chunk: int, encoding: str, seq: int) -> dict:
    import numpy as np

    from attnlab.config import Config, DataConfig, ModelConfig
    from attnlab.extrapolation import EvalSettings, evaluate_model
    from attnlab.model import init_model, param_counts

    model = ModelConfig(vocab_size=256, d_model=128, n_layers=5, n_heads=4,
                        pos_encoding=encoding, max_len=seq)
    cfg = Config(model=model, data=DataConfig(seq_len=TRAIN_LENGTH))
    _, state = init_model(model, seed=0)
    stream = np.random.default_rng(0).integers(0, 256, 2 * seq + 1, dtype=np.int32)
    settings = EvalSettings(lengths=(seq,), attention_chunk=chunk, batch_tokens=seq)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    report = evaluate_model(cfg, state, stream, settings)
    seconds = time.perf_counter() - start
    longest = next(r for r in report["results"] if r["length"] == seq)
    return {
        "encoding": encoding, "chunk": chunk, "seq": seq, "params": param_counts(model)["total"],
        "loss": longest["loss"], "seconds": round(seconds, 1),
        "rss_before_mb": round(rss_before),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", default="512", help="comma-separated attention_chunk values")
    parser.add_argument("--encodings", default="rope,alibi")
    parser.add_argument("--seq", type=int, default=LONGEST)
    parser.add_argument("--limit-mb", type=float, default=2048, help="target peak RSS")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--chunk", type=int, default=512, help=argparse.SUPPRESS)
    parser.add_argument("--encoding", default="rope", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.chunk, args.encoding, args.seq)))
        return
    print("| encoding | T | attention_chunk | params | peak RSS (MB) | RSS after setup (MB) "
          "| time (s) | under target |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    failed = False
    for encoding in args.encodings.split(","):
        for chunk in (int(c) for c in args.chunks.split(",")):
            command = [sys.executable, __file__, "--worker", f"--chunk={chunk}",
                       f"--encoding={encoding}", f"--seq={args.seq}"]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                print(f"| {encoding} | {args.seq} | {chunk} | failed: "
                      f"{done.stderr.strip().splitlines()[-1]} |||||")
                failed = True
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            under = r["peak_rss_mb"] < args.limit_mb
            failed |= chunk > 0 and not under
            print(f"| {encoding} | {r['seq']} | {chunk} | {r['params']:,} | "
                  f"{r['peak_rss_mb']:,} | {r['rss_before_mb']:,} | {r['seconds']} | "
                  f"{'yes' if under else 'NO'} |", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
