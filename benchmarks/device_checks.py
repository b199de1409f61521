"""The invariants the CPU suite checks, on whatever device JAX runs on here (a lent GPU):
KV-cache decoding equals the full forward pass, and an ensemble member's update equals the same
run's update alone, in float32 (at the device's default matmul precision, TF32 on a recent
GPU, and at "highest", true float32) and in bfloat16.

    python benchmarks/device_checks.py [--out checks.md] [--smoke]   # --smoke: a tiny model

Tolerances (logits and losses relative to the largest magnitude compared; parameters as the L2
norm of the difference over the L2 norm of the update, see ``update_error``):
float32 1e-2 (a GPU's float32 matmuls may run in TF32, 10 mantissa bits: ~5e-4 per product,
magnified in the updates as below; 1e-3 failed at 3.4e-3 on an H200 where "highest" gave 3.5e-6),
float32 at "highest" 1e-4 (23 bits; Adam's first steps move a parameter by about the learning
rate whatever its gradient's size, which magnifies a rounding of a tiny gradient), bfloat16 3e-2 (8 mantissa bits: ~4e-3 per rounding, a few roundings deep). Exit status 1 if any
check fails; the table says by how much each passed or failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig  # noqa: E402
from attnlab.model import apply, decode_step, init_model, init_state  # noqa: E402
from attnlab.train.ensemble import make_ensemble_step, member, stack  # noqa: E402
from attnlab.train.optimizer import optimizer_for  # noqa: E402
from attnlab.train.state import init_train_state  # noqa: E402
from attnlab.train.step import make_train_step  # noqa: E402

# (dtype, matmul precision): tolerance. On a lent H200 (2026-11-27, twice) the default float32
# row measured 3.4e-3 for the parameter updates and the "highest" row 3.5e-6: TF32's rounding,
# magnified by Adam's first steps as in bf16, not the ensemble, so TF32 is held to 1e-2.
TOLERANCE = {("float32", "default"): 1e-2, ("float32", "highest"): 1e-4,
             ("bfloat16", "default"): 3e-2}
VOCAB, SEQ, BATCH = 512, 64, 8
SHAPES = {"gpu": {"d_model": 128, "n_layers": 4, "n_heads": 4},  # the quickstart gpu plan's
          "smoke": {"d_model": 32, "n_layers": 2, "n_heads": 2}}  # middle shape; a tiny one


def model_config(dtype: str, shape: dict) -> ModelConfig:
    return ModelConfig(vocab_size=VOCAB, max_len=SEQ, pos_encoding="rope", dtype=dtype,
                       attention_impl="xla", **shape)


def relative_error(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def decode_error(dtype: str, shape: dict) -> float:
    """Largest difference of the cached decode's logits (a 16-token prompt, then one token at
    a time) from the full forward pass's."""
    cfg = model_config(dtype, shape)
    graphdef, state = init_model(cfg, seed=0)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, VOCAB, (BATCH, SEQ)), jnp.int32)
    full = jax.jit(lambda s, t: apply(graphdef, s, t))(state, tokens)
    step = jax.jit(decode_step, static_argnums=0)
    cache = init_state(cfg, batch=BATCH, max_len=SEQ)
    logits, cache = step(graphdef, state, cache, tokens[:, :16], 0)
    pieces = [logits]
    for i in range(16, SEQ):
        logits, cache = step(graphdef, state, cache, tokens[:, i:i + 1], i)
        pieces.append(logits)
    return relative_error(jnp.concatenate(pieces, axis=1), full)


def run_config(dtype: str, shape: dict, seed: int, learning_rate: float) -> Config:
    return Config(model=model_config(dtype, shape),
                  data=DataConfig(source="markov", seq_len=SEQ, batch_size=BATCH, seed=seed),
                  train=TrainConfig(steps=10, warmup_steps=2, seed=seed,
                                    learning_rate=learning_rate, eps=1e-6))


def ensemble_error(dtype: str, shape: dict, steps: int = 3) -> dict[str, float]:
    """Two members (other seeds, data and learning rates) stepped ``steps`` times as one
    vmapped ensemble against each trained alone: the largest relative differences of their
    losses and final parameters."""
    cfgs = [run_config(dtype, shape, 0, 3e-3), run_config(dtype, shape, 1, 1e-3)]
    graphdef, _ = init_model(cfgs[0].model, 0)
    rng = np.random.default_rng(0)
    batches = jnp.asarray(rng.integers(0, VOCAB, (steps, len(cfgs), 1, BATCH, SEQ + 1)),
                          jnp.int32)
    initial, lone_losses, lone_states = [], [], []
    for i, cfg in enumerate(cfgs):
        tx, schedule = optimizer_for(cfg)
        state = jax.jit(lambda key, cfg=cfg, tx=tx: init_train_state(cfg, tx, key))(
            jax.random.key(cfg.train.seed))
        initial.append(state)
        step = jax.jit(make_train_step(cfg, graphdef, tx, schedule))
        losses = []
        for s in range(steps):
            state, metrics = step(state, batches[s, i])
            losses.append(metrics["loss"])
        lone_losses.append(losses)
        lone_states.append(state)
    ensemble = jax.jit(make_ensemble_step(cfgs, graphdef, members="vmap"))
    stacked, active, losses = stack(initial), jnp.ones(len(cfgs), bool), []
    for s in range(steps):
        stacked, metrics = ensemble(stacked, batches[s], active)
        losses.append(metrics["loss"])
    loss = max(relative_error(jnp.stack(losses)[:, i], jnp.stack(lone_losses[i]))
               for i in range(len(cfgs)))
    params = max(update_error(member(stacked, i).params, lone_states[i].params,
                              initial[i].params) for i in range(len(cfgs)))
    return {"loss": loss, "params": params}


def update_error(together, alone, start) -> float:
    """``|together - alone| / |alone - start|`` over all parameters (L2 norms): the members'
    difference as a share of the training's own change. Per entry it means little in bfloat16:
    Adam moves a parameter by about the learning rate whatever its gradient's size, so a
    rounding that flips a tiny gradient's sign moves that entry by twice its update."""
    def norm(a, b):
        return float(np.sqrt(sum(np.sum((np.asarray(x, np.float64) - np.asarray(y, np.float64))
                                        ** 2) for x, y in zip(jax.tree.leaves(a),
                                                               jax.tree.leaves(b)))))
    return norm(together, alone) / max(norm(alone, start), 1e-30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="", help="also write the table to this file")
    parser.add_argument("--smoke", action="store_true", help="a 2-layer d32 model (for a CPU)")
    args = parser.parse_args()
    shape = SHAPES["smoke" if args.smoke else "gpu"]
    device = jax.devices()[0]
    rows = [f"# jax {jax.__version__} on {jax.device_count()} x {device.device_kind} "
            f"({device.platform})", "",
            "| check | dtype | matmul precision | largest relative difference | tolerance "
            "| result |", "|---|---|---|---:|---:|---|"]
    failed = False
    for (dtype, precision), tolerance in TOLERANCE.items():
        with jax.default_matmul_precision(precision):
            found = {"decode = full forward (logits)": decode_error(dtype, shape)}
            errors = ensemble_error(dtype, shape)
        found["ensemble member = lone run (losses, 3 steps)"] = errors["loss"]
        found["ensemble member = lone run (parameter updates, 3 steps)"] = errors["params"]
        for name, error in found.items():
            ok = error <= tolerance
            failed |= not ok
            rows.append(f"| {name} | {dtype} | {precision} | {error:.2e} | {tolerance:.0e} | "
                        f"{'pass' if ok else 'FAIL'} |")
            print(rows[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
