"""Throughput of the jitted training step on this machine, against a matmul peak measured in the
same run.

    python benchmarks/train_step.py [--steps 20] [--attention_impl einsum|xla] [--dtype float32]

Model: byte vocabulary (256), learned positions, GELU FFN (d_ff = 4 d), pre-LN, head_dim 64,
fp32 by default; AdamW + clipping, the real ``attnlab.train.step.make_train_step``, state donated.
FLOPs per token: ``6N + 6 n_layers seq d_model`` (Kaplan: N non-embedding, attention causal-
averaged) ``+ 6 d_model vocab`` (the output layer) -- the same count attnlab uses for MFU.
Synthetic tokens: the step's speed does not depend on their values.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import jax
import numpy as np

from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
from attnlab.model import init_model, param_counts
from attnlab.train.loop import training_flops_per_token
from attnlab.train.mfu import measure_matmul_peak
from attnlab.train.optimizer import make_optimizer
from attnlab.train.state import init_train_state
from attnlab.train.step import make_train_step, mean_loss

# (d_model, n_layers, batch, seq_len), the shapes the CPU step is measured at
SHAPES = ((128, 2, 32, 128), (256, 4, 16, 256), (384, 6, 8, 256))


def config(d_model, n_layers, batch, seq_len, *, dtype, attention_impl) -> Config:
    model = ModelConfig(vocab_size=256, d_model=d_model, n_layers=n_layers,
                        n_heads=d_model // 64, max_len=seq_len, pos_encoding="learned",
                        ffn="gelu", dtype=dtype, attention_impl=attention_impl)
    return Config(model=model, data=DataConfig(seq_len=seq_len, batch_size=batch),
                  train=TrainConfig(steps=1000, warmup_steps=10))


def best_time(function, args, steps: int, repeats: int, *, carry: bool = False) -> float:
    """Best seconds per call over ``repeats`` blocks of ``steps`` calls (after two warm-ups).
    With ``carry``, each call's first output is the next call's first argument (donated state).
    """
    def call(args):
        out = function(*args)
        return ((out[0], *args[1:]) if carry else args), out

    for _ in range(2):
        args, out = call(args)
    jax.block_until_ready(out)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            args, out = call(args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - start) / steps)
    return best


def time_step(cfg: Config, steps: int, repeats: int) -> dict[str, float]:
    """Seconds per call of the full train step, of forward + backward alone, and of the forward;
    and the step's compile time."""
    tx, schedule = make_optimizer(cfg.train, cfg.total_steps, cfg.model.d_model)
    graphdef, _ = init_model(cfg.model, 0)
    state = jax.jit(lambda: init_train_state(cfg, tx))()
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, (cfg.data.batch_size, cfg.data.seq_len + 1), dtype=np.int32)
    batch = jax.device_put(tokens[None])
    loss = jax.jit(lambda p, b: mean_loss(graphdef, p, b))
    grads = jax.jit(jax.value_and_grad(lambda p, b: mean_loss(graphdef, p, b)))
    times = {"forward": best_time(loss, (state.params, batch[0]), steps, repeats),
             "forward_backward": best_time(grads, (state.params, batch[0]), steps, repeats)}
    step = jax.jit(make_train_step(cfg, graphdef, tx, schedule), donate_argnums=0)
    start = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    times["compile"] = time.perf_counter() - start
    times["step"] = best_time(step, (state, batch), steps, repeats, carry=True)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=3, help="timed blocks (best is kept)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--attention_impl", default="einsum")
    args = parser.parse_args()

    peak = max(measure_matmul_peak("float32", size=n, repeats=10) for n in (1024, 2048))
    print(f"# jax {jax.__version__}, {jax.devices()[0].device_kind}, {os.cpu_count()} CPUs, "
          f"{platform.processor() or platform.machine()}; load {os.getloadavg()}")
    print(f"# fp32 matmul peak (best of 1024^3 / 2048^3 jnp.matmul): {peak / 1e9:.1f} GFLOP/s")
    print(f"# dtype={args.dtype} attention_impl={args.attention_impl} "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    print("| d_model | layers | batch | seq | params | step ms | tokens/s | GFLOP/s | "
          "fraction of peak | fwd ms (of peak) | fwd+bwd ms (of peak) | compile s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for d_model, n_layers, batch, seq_len in SHAPES:
        cfg = config(d_model, n_layers, batch, seq_len, dtype=args.dtype,
                     attention_impl=args.attention_impl)
        t = time_step(cfg, args.steps, args.repeats)
        flops_per_batch = training_flops_per_token(cfg)["mfu"] * batch * seq_len
        tokens_per_s = batch * seq_len / t["step"]
        params = param_counts(cfg.model)["total"]
        print(f"| {d_model} | {n_layers} | {batch} | {seq_len} | {params / 1e6:.2f}M | "
              f"{t['step'] * 1e3:.1f} | {tokens_per_s:,.0f} | "
              f"{flops_per_batch / t['step'] / 1e9:.1f} | {flops_per_batch / t['step'] / peak:.2f} | "
              f"{t['forward'] * 1e3:.1f} ({flops_per_batch / 3 / t['forward'] / peak:.2f}) | "
              f"{t['forward_backward'] * 1e3:.1f} "
              f"({flops_per_batch / t['forward_backward'] / peak:.2f}) | {t['compile']:.1f} |",
              flush=True)
    print(f"# load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
