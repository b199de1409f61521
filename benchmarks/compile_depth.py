"""Trace and compile time of the real train step against depth, unrolled vs ``model.scan_layers``;
and the step time of the two at benchmarks/train_step.py's shapes.

    python benchmarks/compile_depth.py [--layers 2,6,12,24,48] [--d_model 256] [--rounds 3]
                                       [--layouts unrolled,scan | scan | unrolled]
    python benchmarks/compile_depth.py --step-time [--rounds 7] [--steps 3]

Compile: ``jax.jit(make_train_step(...)).lower(abstract state, batch)`` (trace, seconds) then
``.compile()`` (XLA, seconds), for each depth, unrolled and scanned alternately (vocab 256,
learned positions, GELU, pre-LN, head_dim 64, batch 8 x seq 128, AdamW + clipping: the
optimizer is part of the step). Nothing is executed, so parameters stay abstract. Repeated
``--rounds`` times in one process (new configs each round miss jax's caches: each
``init_model`` is a new graphdef), medians reported. The target: with scan, 48 layers
compile within 1.5x of 12.

``--step-time``: per-step seconds of the compiled steps, unrolled and scanned, at the three
shapes of benchmarks/train_step.py, in interleaved blocks (medians; ratio scan / unrolled).
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
from attnlab.train.state import abstract_model, abstract_train_state, init_train_state
from attnlab.train.step import make_train_step

SHAPES = ((128, 2, 32, 128), (256, 4, 16, 256), (384, 6, 8, 256))  # benchmarks/train_step.py


def config(d_model, n_layers, batch, seq_len, *, scan: bool) -> Config:
    model = ModelConfig(vocab_size=256, d_model=d_model, n_layers=n_layers,
                        n_heads=d_model // 64, max_len=seq_len, pos_encoding="learned",
                        ffn="gelu", scan_layers=scan)
    return Config(model=model, data=DataConfig(seq_len=seq_len, batch_size=batch),
                  train=TrainConfig(steps=1000, warmup_steps=10))


def build(cfg: Config):
    """(jitted train step with the state donated, optimizer)."""
    tx, schedule = make_optimizer(cfg.train, cfg.total_steps, cfg.model.d_model)
    graphdef, _ = abstract_model(cfg)  # shapes only: nothing is allocated
    return jax.jit(make_train_step(cfg, graphdef, tx, schedule), donate_argnums=0), tx


def compile_times(cfg: Config) -> tuple[float, float]:
    """(trace + lower seconds, XLA compile seconds) of the train step."""
    step, tx = build(cfg)
    state = abstract_train_state(cfg, tx)
    batch = jax.ShapeDtypeStruct((1, cfg.data.batch_size, cfg.data.seq_len + 1), np.int32)
    start = time.perf_counter()
    lowered = step.lower(state, batch)
    traced = time.perf_counter() - start
    start = time.perf_counter()
    lowered.compile()
    return traced, time.perf_counter() - start


def compile_table(depths, d_model: int, rounds: int, layouts=(False, True)) -> None:
    results = {(n, scan): [] for n in depths for scan in layouts}
    for r in range(rounds):
        for n in depths:
            for scan in layouts:
                times = compile_times(config(d_model, n, 8, 128, scan=scan))
                results[n, scan].append(times)
                print(f"# {n} layers {'scan' if scan else 'unrolled'}: trace {times[0]:.2f} s, "
                      f"compile {times[1]:.2f} s, load {os.getloadavg()[0]:.1f}", flush=True)
        print(f"# round {r + 1}/{rounds} done, load {os.getloadavg()}", flush=True)
    print(f"\n## trace + compile of the train step, d_model {d_model}, batch 8 x seq 128, "
          f"medians of {rounds}")
    names = {False: "unrolled", True: "scan"}
    print("| layers | " + " | ".join(f"{names[scan]} trace s | {names[scan]} compile s | "
                                     f"{names[scan]} total s" for scan in layouts)
          + (" | unrolled / scan |" if len(layouts) == 2 else " |"))
    print("|---" * (1 + 3 * len(layouts) + (len(layouts) == 2)) + "|")
    totals = {}
    for n in depths:
        row = [f"| {n} "]
        for scan in layouts:
            traced = statistics.median(t for t, _ in results[n, scan])
            compiled = statistics.median(c for _, c in results[n, scan])
            total = statistics.median(t + c for t, c in results[n, scan])
            totals[n, scan] = total
            row.append(f"| {traced:.2f} | {compiled:.2f} | {total:.2f} ")
        if len(layouts) == 2:
            row.append(f"| {totals[n, False] / totals[n, True]:.2f} ")
        print("".join(row) + "|")
    if 12 in depths and 48 in depths:
        for scan in layouts:
            print(f"# {names[scan]}: total(48) / total(12) = "
                  f"{totals[48, scan] / totals[12, scan]:.2f}")


def step_time_table(rounds: int, steps: int) -> None:
    print("\n## step time, unrolled vs scan (interleaved blocks of "
          f"{steps} steps, medians of {rounds})")
    print("| d_model | layers | batch | seq | unrolled ms | scan ms | scan / unrolled |")
    print("|---|---|---|---|---|---|---|")
    for d_model, n_layers, batch, seq_len in SHAPES:
        tokens = np.random.default_rng(0).integers(0, 256, (1, batch, seq_len + 1), np.int32)
        runs = {}
        for scan in (False, True):
            cfg = config(d_model, n_layers, batch, seq_len, scan=scan)
            step, tx = build(cfg)
            state = jax.jit(lambda cfg=cfg, tx=tx: init_train_state(cfg, tx))()
            batch_array = jax.device_put(tokens)
            for _ in range(2):  # compile, warm up
                state, metrics = step(state, batch_array)
            jax.block_until_ready(metrics)
            runs[scan] = [step, state, batch_array, []]
        for _ in range(rounds):
            for scan in (False, True):
                step, state, batch_array, times = runs[scan]
                start = time.perf_counter()
                for _ in range(steps):
                    state, metrics = step(state, batch_array)
                jax.block_until_ready(metrics)
                times.append((time.perf_counter() - start) / steps)
                runs[scan][1] = state
        unrolled = statistics.median(runs[False][3])
        scanned = statistics.median(runs[True][3])
        print(f"| {d_model} | {n_layers} | {batch} | {seq_len} | {unrolled * 1e3:.1f} | "
              f"{scanned * 1e3:.1f} | {scanned / unrolled:.2f} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", default="2,6,12,24,48")
    parser.add_argument("--d_model", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layouts", default="unrolled,scan",
                        help="which to compile: unrolled, scan or both (comma separated)")
    parser.add_argument("--steps", type=int, default=3, help="steps per timed block")
    parser.add_argument("--step-time", action="store_true",
                        help="time the steps at train_step.py's shapes instead of compiling")
    args = parser.parse_args()
    print(f"# jax {jax.__version__}, {jax.devices()[0].device_kind}, {os.cpu_count()} CPUs; "
          f"load {os.getloadavg()}")
    if args.step_time:
        step_time_table(args.rounds, args.steps)
    else:
        layouts = tuple(name == "scan" for name in args.layouts.split(","))
        compile_table([int(n) for n in args.layers.split(",")], args.d_model, args.rounds,
                      layouts)
    print(f"# load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
