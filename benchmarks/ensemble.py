"""Total training throughput of an ensemble of k runs (one vmapped program) against one run
trained alone, at the quickstart's smallest and largest shapes.

    python benchmarks/ensemble.py [--rounds 5] [--steps 20] [--ks 1,2,4,8] [--host-devices 2]

Shapes: experiments/quickstart.py's cpu scale (byte vocabulary, batch 8 x 128 tokens, RoPE,
GELU, pre-LN): d12-l1 (the smallest, 4.9k parameters) and d64-l2 (the largest, 115k). The
contestants are the lone run's real train step (``make_train_step``) and the ensemble step
(``make_ensemble_step``) at each k, members differing in seed; state donated, synthetic tokens.
Rounds are interleaved (every contestant once per round, in a rotated order) and each is timed
over ``--steps`` steps after a warm-up; the report gives the median over rounds of the total
tokens/s (k x batch x seq per step), the speed-up over the lone run, the model FLOP/s (the
MFU count of attnlab.train.loop) as a fraction of a matmul peak measured in the same run, and
the load average.

``--host-devices N`` shows XLA:CPU N devices (as a sweep worker does, one per core): the lone
run stays on the first, and ``k=K map/G`` splits the members over G device groups
(:func:`attnlab.train.sharding.ensemble_mesh`), each mapping its own members.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

if __name__ == "__main__":  # before JAX starts: the device count is fixed at its first use
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from attnlab.worker import expose_host_devices

    _devices = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--host-devices=")]
    expose_host_devices(int(_devices[0]) if _devices else 1)

import jax
import jax.numpy as jnp
import numpy as np

from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
from attnlab.model import init_model
from attnlab.train.ensemble import make_ensemble_step, stack
from attnlab.train.sharding import ENSEMBLE_AXIS, ensemble_mesh
from attnlab.train.loop import training_flops_per_token
from attnlab.train.mfu import measure_matmul_peak
from attnlab.train.optimizer import optimizer_for
from attnlab.train.state import init_train_state
from attnlab.train.step import make_train_step

SHAPES = {"smallest": (12, 1, 1), "largest": (64, 2, 4)}  # (d_model, n_layers, n_heads)


def config(d_model: int, n_layers: int, n_heads: int, seed: int = 0) -> Config:
    return Config(model=ModelConfig(vocab_size=256, d_model=d_model, n_layers=n_layers,
                                    n_heads=n_heads, max_len=128),
                  data=DataConfig(seq_len=128, batch_size=8),
                  train=TrainConfig(steps=1000, warmup_steps=10, seed=seed))


def contestants(shape, ks):
    """name -> (step function, initial state, batch, runs per step)."""
    base = config(*shape)
    graphdef, _ = init_model(base.model, 0)
    tx, schedule = optimizer_for(base)
    first = jax.devices()[0]
    batch = jax.device_put(np.random.default_rng(0).integers(0, 256, (1, 8, 129), np.int32),
                           first)
    lone = jax.jit(make_train_step(base, graphdef, tx, schedule), donate_argnums=0)
    out = {"lone": (lone, lambda: jax.device_put(init_train_state(base, tx, jax.random.key(0)),
                                                 first), batch, 1)}
    for k in ks:
        cfgs = [dataclasses.replace(base, train=dataclasses.replace(base.train, seed=s))
                for s in range(k)]
        mesh = ensemble_mesh(base, k)
        groups = mesh.shape[ENSEMBLE_AXIS]
        kinds = [("vmap", None), ("map", None)] + ([("map", mesh)] if groups > 1 else [])
        for members, on in kinds:
            sharding = (jax.sharding.NamedSharding(on, jax.sharding.PartitionSpec(ENSEMBLE_AXIS))
                        if on is not None else first)
            step = jax.jit(make_ensemble_step(cfgs, graphdef, members=members, mesh=on),
                           donate_argnums=0)
            active = jnp.ones(k, bool)
            name = f"k={k} {members}" + (f"/{groups}" if on is not None else "")
            out[name] = (lambda s, b, step=step, active=active: step(s, b, active),
                         lambda cfgs=cfgs, sharding=sharding: jax.device_put(stack(
                             [init_train_state(c, tx, jax.random.key(c.train.seed))
                              for c in cfgs]), sharding),
                         jax.device_put(jnp.stack([batch] * k), sharding), k)
    return out


def time_block(step, state, batch, steps: int):
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    return state, (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--ks", default="1,2,4,8")
    parser.add_argument("--host-devices", type=int, default=1,
                        help="XLA:CPU devices (read before JAX starts)")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    peak = measure_matmul_peak()
    print(f"matmul peak {peak / 1e9:.0f} GFLOP/s; {jax.device_count()} device(s); "
          f"load average {os.getloadavg()}; "
          f"{args.rounds} interleaved rounds of {args.steps} steps, medians")
    for label, shape in SHAPES.items():
        flops = training_flops_per_token(config(*shape))["mfu"]
        entries = contestants(shape, ks)
        states = {}
        for name, (step, init, batch, _) in entries.items():  # compile and warm up
            states[name], _ = time_block(step, init(), batch, 2)
        seconds = {name: [] for name in entries}
        names = list(entries)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                step, _, batch, _ = entries[name]
                states[name], took = time_block(step, states[name], batch, args.steps)
                seconds[name].append(took)
        lone = 8 * 128 / float(np.median(seconds["lone"]))
        print(f"\n{label} d{shape[0]}-l{shape[1]} ({flops / 6:,.0f} FLOP-equivalent params):")
        for name, (_, _, _, k) in entries.items():
            rate = k * 8 * 128 / float(np.median(seconds[name]))
            print(f"  {name:10s} {rate:10,.0f} tokens/s  x{rate / lone:5.2f}  "
                  f"{rate * flops / peak:6.1%} of the matmul peak")
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
