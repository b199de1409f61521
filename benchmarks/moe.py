"""Train-step throughput of mixtures of experts against the dense model at equal active FLOPs,
and of the two dispatches (dropless grouped matmul, capacity buffers).

    python benchmarks/moe.py [--d_model 128] [--n_layers 2] [--batch 16] [--seq_len 128]
                             [--steps 5] [--repeats 3]

Every arm is the dense model's shape (byte vocabulary, RoPE, pre-LN, GELU, head_dim 64) with its
FFN of width ``4 d`` replaced by ``E`` experts of width ``4 d / k``, ``k`` per token: the same
expert FLOPs per token as the dense FFN (the router adds ``2 d E``, the combine ``2 k d``). The
step is the real ``attnlab.train.step.make_train_step`` (AdamW, clipping, the auxiliary losses),
state donated; arms are timed in turns, ``repeats`` rounds, best block of ``steps`` steps kept,
so that a machine shared with other work slows every arm alike. Synthetic tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import time

import jax
import numpy as np

from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
from attnlab.model import flops_per_token, init_model, param_counts
from attnlab.train.optimizer import make_optimizer
from attnlab.train.state import init_train_state
from attnlab.train.step import make_train_step

# (label, moe overrides): E experts, top-k, dispatch
ARMS = (
    ("dense", {}),
    ("E=4 k=2 dropless", dict(moe_experts=4, moe_top_k=2, moe_dispatch="dropless")),
    ("E=4 k=2 capacity 1.25", dict(moe_experts=4, moe_top_k=2, moe_dispatch="capacity")),
    ("E=8 k=2 dropless", dict(moe_experts=8, moe_top_k=2, moe_dispatch="dropless")),
    ("E=8 k=2 capacity 1.25", dict(moe_experts=8, moe_top_k=2, moe_dispatch="capacity")),
    ("E=8 k=1 dropless", dict(moe_experts=8, moe_top_k=1, moe_dispatch="dropless")),
    ("E=8 k=1 capacity 1.25", dict(moe_experts=8, moe_top_k=1, moe_dispatch="capacity")),
    ("E=16 k=4 dropless", dict(moe_experts=16, moe_top_k=4, moe_dispatch="dropless")),
    ("E=16 k=4 capacity 1.25", dict(moe_experts=16, moe_top_k=4, moe_dispatch="capacity")),
)


def config(d_model: int, n_layers: int, batch: int, seq_len: int, moe: dict) -> Config:
    k = moe.get("moe_top_k", 1)
    model = ModelConfig(vocab_size=256, d_model=d_model, n_layers=n_layers,
                        n_heads=max(1, d_model // 64), max_len=seq_len, ffn="gelu",
                        d_ff=4 * d_model // k, moe="token_choice" if moe else "none", **moe)
    return Config(model=model, data=DataConfig(seq_len=seq_len, batch_size=batch),
                  train=TrainConfig(steps=1000, warmup_steps=10))


@dataclasses.dataclass
class Arm:
    label: str
    cfg: Config
    step: object = None
    state: object = None
    batch: object = None
    compile_s: float = 0.0
    best: float = float("inf")

    def prepare(self) -> None:
        cfg = self.cfg
        tx, schedule = make_optimizer(cfg.train, cfg.total_steps, cfg.model.d_model)
        graphdef, _ = init_model(cfg.model, 0)
        self.state = jax.jit(lambda: init_train_state(cfg, tx))()
        tokens = np.random.default_rng(0).integers(
            0, 256, (1, cfg.data.batch_size, cfg.data.seq_len + 1), dtype=np.int32)
        self.batch = jax.device_put(tokens)
        self.step = jax.jit(make_train_step(cfg, graphdef, tx, schedule), donate_argnums=0)
        start = time.perf_counter()
        self.state, metrics = self.step(self.state, self.batch)
        jax.block_until_ready(metrics)
        self.compile_s = time.perf_counter() - start
        self.state, metrics = self.step(self.state, self.batch)  # warm-up
        jax.block_until_ready(metrics)

    def time_block(self, steps: int) -> None:
        start = time.perf_counter()
        for _ in range(steps):
            self.state, metrics = self.step(self.state, self.batch)
        jax.block_until_ready(metrics)
        self.best = min(self.best, (time.perf_counter() - start) / steps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d_model", type=int, default=128)
    parser.add_argument("--n_layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over the arms")
    parser.add_argument("--arms", default="", help="comma-separated labels (default: all)")
    args = parser.parse_args()
    chosen = [a for a in ARMS if not args.arms or a[0] in args.arms.split(",")]
    arms = [Arm(label, config(args.d_model, args.n_layers, args.batch, args.seq_len, moe))
            for label, moe in chosen]
    print(f"# jax {jax.__version__}, {jax.devices()[0].device_kind}, {os.cpu_count()} CPUs, "
          f"{platform.processor() or platform.machine()}; load {os.getloadavg()}")
    print(f"# d_model={args.d_model} n_layers={args.n_layers} batch={args.batch} "
          f"seq_len={args.seq_len}; best of {args.repeats} rounds of {args.steps} steps")
    for arm in arms:
        arm.prepare()
    for _ in range(args.repeats):
        for arm in arms:
            arm.time_block(args.steps)
    dense = arms[0].best if arms[0].label == "dense" else None
    tokens = args.batch * args.seq_len
    print("| arm | params (total) | active | fwd FLOPs/token (active) | computed | step ms | "
          "tokens/s | vs dense | compile s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for arm in arms:
        counts = param_counts(arm.cfg.model)
        flops = flops_per_token(arm.cfg.model, args.seq_len)
        computed = flops.get("moe_computed", flops["chinchilla"]) / 3
        ratio = f"{dense / arm.best:.2f}x" if dense else "-"
        print(f"| {arm.label} | {counts['total'] / 1e6:.2f}M | {counts['active'] / 1e6:.2f}M | "
              f"{flops['chinchilla_forward'] / 1e6:.2f}M | {computed / 1e6:.2f}M | "
              f"{arm.best * 1e3:.1f} | {tokens / arm.best:,.0f} | {ratio} | "
              f"{arm.compile_s:.1f} |", flush=True)
    print(f"# load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
