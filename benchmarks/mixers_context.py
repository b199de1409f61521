"""Sequence-mixer benchmark: time of one forward+backward and peak memory against context length.

    python benchmarks/mixers_context.py                       # T = 512 .. 16384, writes JSON
    python benchmarks/mixers_context.py --seqs 512,2048 --mixers softmax,mamba
    python benchmarks/mixers_context.py --plot docs/mixers_context.png --json results.json

A fixed small model (d_model 64, 2 layers, 2 heads, byte vocabulary, batch 1, float32, NoPE),
one jitted ``grad`` of the mean token loss per setting, timed as the median of ``--repeats`` runs
after a warm-up (compilation excluded). Peak memory is XLA's own buffer assignment for the compiled
step (``compiled.memory_analysis()``: arguments + outputs + temporaries), which is deterministic
and does not depend on what else runs on the machine; settings whose buffers exceed
``--max-gib`` are compiled and reported but not run.

Mixers: softmax (einsum path, the full ``[heads, T, T]`` scores), linear attention (elu+1, chunk
64), Performer (m = 64, chunk 64), Mamba (E = 2 d, N = 16), and sliding-window softmax
(``model.attention_window = 256``) when the config has that field.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from attnlab.model import ModelConfig, apply, init_model, token_losses

BASE = dict(vocab_size=256, d_model=64, n_layers=2, n_heads=2, pos_encoding="none",
            max_len=64)
MIXERS = {
    "softmax": dict(),
    "linear": dict(mixer="linear", mixer_chunk=64),
    "performer": dict(mixer="performer", mixer_chunk=64, mixer_features=64),
    "mamba": dict(mixer="mamba"),
    "sliding_window": dict(attention_window=256),
}


def available(name: str) -> bool:
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    return set(MIXERS[name]) <= fields


def measure(name: str, seq: int, repeats: int, max_gib: float) -> dict:
    cfg = ModelConfig(**BASE, **MIXERS[name])
    graphdef, params = init_model(cfg, seed=0)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (1, seq + 1)), jnp.int32)

    def loss(params, tokens):
        logits = apply(graphdef, params, tokens[:, :-1])
        return token_losses(logits, tokens[:, 1:]).mean()

    step = jax.jit(jax.value_and_grad(loss))
    compiled = step.lower(params, tokens).compile()
    memory = compiled.memory_analysis()
    peak = (memory.argument_size_in_bytes + memory.output_size_in_bytes
            + memory.temp_size_in_bytes)
    row = {"mixer": name, "seq": seq, "peak_mib": peak / 2**20, "seconds": None}
    if peak > max_gib * 2**30:
        return row
    jax.block_until_ready(compiled(params, tokens))  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(params, tokens))
        times.append(time.perf_counter() - start)
    row["seconds"] = statistics.median(times)
    return row


def crossover(rows: list[dict], a: str, b: str) -> float | None:
    """The smallest T at which mixer ``b`` is faster than ``a`` (log-linear interpolation
    between measured points); None if it never is."""
    ta = {r["seq"]: r["seconds"] for r in rows if r["mixer"] == a and r["seconds"]}
    tb = {r["seq"]: r["seconds"] for r in rows if r["mixer"] == b and r["seconds"]}
    seqs = sorted(set(ta) & set(tb))
    previous = None
    for s in seqs:
        ratio = np.log(ta[s] / tb[s])
        if ratio > 0:
            if previous is None:
                return float(s)
            s0, r0 = previous
            w = -r0 / (ratio - r0)
            return float(np.exp(np.log(s0) + w * (np.log(s) - np.log(s0))))
        previous = (s, ratio)
    return None


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name in dict.fromkeys(r["mixer"] for r in rows):
        mine = [r for r in rows if r["mixer"] == name]
        timed = [r for r in mine if r["seconds"]]
        left.loglog([r["seq"] for r in timed], [r["seconds"] for r in timed], "o-", label=name)
        right.loglog([r["seq"] for r in mine], [r["peak_mib"] for r in mine], "o-", label=name)
    seqs = np.array(sorted({r["seq"] for r in rows}), float)
    for axis, ylabel in ((left, "seconds per forward+backward"), (right, "peak MiB (XLA)")):
        axis.set_xlabel("context length T")
        axis.set_ylabel(ylabel)
        axis.grid(True, which="both", alpha=0.3)
    t0 = [r["seconds"] for r in rows if r["mixer"] == "softmax" and r["seq"] == seqs[0]]
    if t0 and t0[0]:
        left.loglog(seqs, t0[0] * (seqs / seqs[0]) ** 2, "k:", label="~T^2")
        left.loglog(seqs, t0[0] * (seqs / seqs[0]), "k--", label="~T")
    left.legend(fontsize=8)
    fig.suptitle("one training step of a 2-layer d=64 model, batch 1 (CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", default="512,1024,2048,4096,8192,16384")
    parser.add_argument("--mixers", default=",".join(MIXERS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-gib", type=float, default=6.0)
    parser.add_argument("--json", default="")
    parser.add_argument("--plot", default="")
    args = parser.parse_args(argv)
    rows = []
    header = {"machine": f"{platform.processor() or platform.machine()}, "
                         f"{os.cpu_count()} CPUs, {jax.default_backend()}",
              "load_before": os.getloadavg()}
    print(json.dumps(header))
    for name in args.mixers.split(","):
        if not available(name):
            print(f"# {name}: not in this ModelConfig, skipped")
            continue
        for seq in map(int, args.seqs.split(",")):
            row = measure(name, seq, args.repeats, args.max_gib)
            rows.append(row)
            print(json.dumps(row), flush=True)
    header["load_after"] = os.getloadavg()
    result = {**header, "rows": rows,
              "crossover": {b: crossover(rows, "softmax", b)
                            for b in ("linear", "performer", "mamba", "sliding_window")}}
    print(json.dumps({k: result[k] for k in ("load_after", "crossover")}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
