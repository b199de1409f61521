"""Memory and step time of each ``model.remat`` policy (none, full, save_dots) at a shape where
activations dominate the train step's memory.

    python benchmarks/remat.py [--d_model 256] [--layers 6] [--batch 8] [--seq 1024]
                               [--rounds 5] [--steps 1]

Each policy with the layers unrolled and scanned (``model.scan_layers``): six compiled steps.
Memory: XLA's own account of the compiled train step (``compiled.memory_analysis()``): temp
bytes (the activations kept for the backward pass and every intermediate buffer, as XLA's
buffer assignment lays them out) plus argument and output bytes (the train state and the batch;
the state is donated, so outputs alias the arguments: the alias bytes are subtracted). Step
time: the real ``make_train_step`` (AdamW + clipping), the six in interleaved blocks, medians.
Model: vocab 256, learned positions, GELU, pre-LN, head_dim 64, fp32.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import numpy as np

from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
from attnlab.train.optimizer import make_optimizer
from attnlab.train.state import abstract_model, init_train_state
from attnlab.train.step import make_train_step

POLICIES = ("none", "save_dots", "full")
LAYOUTS = (False, True)  # model.scan_layers


def config(args, remat: str, scan: bool) -> Config:
    model = ModelConfig(vocab_size=256, d_model=args.d_model, n_layers=args.layers,
                        n_heads=args.d_model // 64, max_len=args.seq, pos_encoding="learned",
                        ffn="gelu", remat=remat, scan_layers=scan)
    return Config(model=model, data=DataConfig(seq_len=args.seq, batch_size=args.batch),
                  train=TrainConfig(steps=1000, warmup_steps=10))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d_model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1, help="steps per timed block")
    args = parser.parse_args()
    print(f"# jax {jax.__version__}, {jax.devices()[0].device_kind}, {os.cpu_count()} CPUs; "
          f"load {os.getloadavg()}")
    print(f"# d_model {args.d_model}, {args.layers} layers, batch {args.batch}, seq {args.seq}")
    tokens = np.random.default_rng(0).integers(0, 256, (1, args.batch, args.seq + 1), np.int32)
    batch = jax.device_put(tokens)
    runs, memory = {}, {}
    combos = [(remat, scan) for scan in LAYOUTS for remat in POLICIES]
    for remat, scan in combos:
        cfg = config(args, remat, scan)
        tx, schedule = make_optimizer(cfg.train, cfg.total_steps, cfg.model.d_model)
        graphdef, _ = abstract_model(cfg)
        step = jax.jit(make_train_step(cfg, graphdef, tx, schedule), donate_argnums=0)
        state = jax.jit(lambda cfg=cfg, tx=tx: init_train_state(cfg, tx))()
        start = time.perf_counter()
        compiled = step.lower(state, batch).compile()
        compile_s = time.perf_counter() - start
        m = compiled.memory_analysis()
        state, metrics = compiled(state, batch)  # warm-up
        jax.block_until_ready(metrics)
        memory[remat, scan] = dict(temp=m.temp_size_in_bytes, argument=m.argument_size_in_bytes,
                                   output=m.output_size_in_bytes, alias=m.alias_size_in_bytes,
                                   compile=compile_s)
        runs[remat, scan] = [compiled, state, []]
        print(f"# remat={remat} scan={scan}: compiled in {compile_s:.1f} s, load "
              f"{os.getloadavg()}", flush=True)
    for _ in range(args.rounds):
        for combo in combos:
            compiled, state, times = runs[combo]
            start = time.perf_counter()
            for _ in range(args.steps):
                state, metrics = compiled(state, batch)
            jax.block_until_ready(metrics)
            times.append((time.perf_counter() - start) / args.steps)
            runs[combo][1] = state
    print("| layers | remat | temp MB | argument MB | output MB | temp+arg+out-alias MB | "
          "compile s | step s (median) | step / none |")
    print("|---|---|---|---|---|---|---|---|---|")
    for remat, scan in combos:
        m = memory[remat, scan]
        total = m["temp"] + m["argument"] + m["output"] - m["alias"]
        step_s = statistics.median(runs[remat, scan][2])
        base = statistics.median(runs["none", scan][2])
        print(f"| {'scan' if scan else 'unrolled'} | {remat} | {m['temp'] / 1e6:.1f} | "
              f"{m['argument'] / 1e6:.1f} | {m['output'] / 1e6:.1f} | {total / 1e6:.1f} | "
              f"{m['compile']:.1f} | {step_s:.2f} | {step_s / base:.2f} |")
    print(f"# load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
