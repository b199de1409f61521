"""Model benchmark: peak RSS and time of a long-context evaluation forward pass.

    python benchmarks/model_memory.py                     # default grid, T = 8192
    python benchmarks/model_memory.py --seq 4096 --chunks 0,512

Target (the extrapolation benchmark): a ~1M-parameter model (d_model 128, 4 layers, 4 heads,
byte vocabulary) evaluated at T = 8192, batch 1, must stay under 2 GB RSS. That needs
``attention_chunk > 0``: the unchunked path materialises a [heads, T, T] score tensor.

Each setting runs in a fresh subprocess so that its peak RSS (``ru_maxrss``) is its own.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def worker(seq: int, chunk: int, encoding: str, impl: str) -> dict:
    import jax

    from attnlab.config import ModelConfig
    from attnlab.model import apply, init_model, param_counts, token_losses

    cfg = ModelConfig(
        vocab_size=256, d_model=128, n_layers=4, n_heads=4, pos_encoding=encoding,
        attention_impl=impl, attention_chunk=chunk,
    )
    graphdef, state = init_model(cfg, seed=0)
    tokens = jax.random.randint(jax.random.key(0), (1, seq + 1), 0, 256)

    @jax.jit
    def mean_loss(state, tokens):
        logits = apply(graphdef, state, tokens[:, :-1])
        return token_losses(logits, tokens[:, 1:]).mean()

    start = time.perf_counter()
    jax.block_until_ready(mean_loss(state, tokens))
    first = time.perf_counter() - start
    start = time.perf_counter()
    loss = float(mean_loss(state, tokens))
    second = time.perf_counter() - start
    return {
        "seq": seq, "chunk": chunk, "encoding": encoding, "impl": impl,
        "params": param_counts(cfg)["total"], "loss": loss,
        "compile_and_run_s": round(first, 2), "run_s": round(second, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--chunks", default="0,256,1024", help="comma-separated attention_chunk")
    parser.add_argument("--encodings", default="rope,alibi")
    parser.add_argument("--impls", default="einsum,xla")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--chunk", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--encoding", default="rope", help=argparse.SUPPRESS)
    parser.add_argument("--impl", default="einsum", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.seq, args.chunk, args.encoding, args.impl)))
        return
    print("| encoding | impl | T | attention_chunk | params | peak RSS (MB) | compile+run (s) "
          "| run (s) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for encoding in args.encodings.split(","):
        for impl in args.impls.split(","):
            for chunk in (int(c) for c in args.chunks.split(",")):
                command = [sys.executable, __file__, "--worker", f"--seq={args.seq}",
                           f"--chunk={chunk}", f"--encoding={encoding}", f"--impl={impl}"]
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode:
                    print(f"| {encoding} | {impl} | {args.seq} | {chunk} | failed: "
                          f"{done.stderr.strip().splitlines()[-1]} |||")
                    continue
                r = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"| {encoding} | {impl} | {r['seq']} | {chunk} | {r['params']:,} | "
                      f"{r['peak_rss_mb']:,} | {r['compile_and_run_s']} | {r['run_s']} |",
                      flush=True)


if __name__ == "__main__":
    main()
