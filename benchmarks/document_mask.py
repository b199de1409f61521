"""The cost of a document mask (``data.document_mask``): the jitted train step of
configs/tiny.py with and without it, timed in alternation (min and median of ``--reps`` steps).

    python benchmarks/document_mask.py                     # the table in docs/attention.md
    python benchmarks/document_mask.py --seq 128 512 2048 --reps 50

Each window holds about one separator per 85 tokens (ids < 3 of 256 set to the separator), so
every attention row crosses documents. The step is ``attnlab.train.step.make_train_step`` of
the run's config, as ``attnlab train`` jits it (one device, no mesh).
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

import configs.tiny
from attnlab.config import from_config_dict
from attnlab.train.optimizer import optimizer_for
from attnlab.train.state import abstract_model, init_train_state
from attnlab.train.step import make_train_step


def step_of(seq: int, document_mask: bool):
    """``(jitted step, state, batch)`` of configs/tiny.py at ``seq`` tokens, compiled."""
    config = configs.tiny.get_config()
    config.data.seq_len = config.model.max_len = seq
    config.data.document_mask = document_mask
    cfg = from_config_dict(config)
    optimizer, schedule = optimizer_for(cfg)
    graphdef, _ = abstract_model(cfg)
    state = init_train_state(cfg, optimizer, jax.random.key(0))
    step = jax.jit(make_train_step(cfg, graphdef, optimizer, schedule))
    batch = np.random.default_rng(0).integers(1, 256, (1, cfg.data.batch_size, seq + 1))
    batch[batch < 3] = 0  # the byte tokenizer's separator
    batch = batch.astype(np.int32)
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    return step, state, batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    print(f"backend {jax.default_backend()}; ms per train step (min / median of {args.reps})")
    print("| seq_len | without mask | with mask | ratio of minima |")
    print("|---|---|---|---|")
    for seq in args.seq:
        runs = {mask: list(step_of(seq, mask)) for mask in (False, True)}
        times = {False: [], True: []}
        for _ in range(args.reps):
            for mask, run in runs.items():
                step, state, batch = run
                start = time.perf_counter()
                run[1], metrics = step(state, batch)
                jax.block_until_ready(metrics)
                times[mask].append(1e3 * (time.perf_counter() - start))
        off, on = times[False], times[True]
        print(f"| {seq} | {min(off):.1f} / {np.median(off):.1f} | {min(on):.1f} / "
              f"{np.median(on):.1f} | {min(on) / min(off):.2f} |")


if __name__ == "__main__":
    main()
