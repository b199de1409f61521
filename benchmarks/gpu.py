"""The accelerator numbers of docs/benchmarks.md in one command: GPT-2 small's bf16 train step
(tokens/s and MFU against the device's dense bf16 peak) with cuDNN attention on and off, and the
ensemble speed-up of the quickstart's small models.

    python benchmarks/gpu.py [--batch 16,32] [--steps 10] [--repeats 3] [--ks 1,2,4,8]
    python benchmarks/gpu.py --smoke        # a tiny stand-in for GPT-2 small: checks the script

GPT-2 small is ``configs/gpt2_small.py`` (124M parameters, 1024 tokens, learned positions, bf16,
vocabulary 50304) with ``train.grad_accum=1`` and synthetic tokens, so nothing is built or
downloaded. "cuDNN on" is ``model.attention_impl=xla`` (``jax.nn.dot_product_attention`` with
``implementation="cudnn"`` on a GPU for causal bf16 attention, see attnlab/model/attention.py);
"off" is ``einsum`` (the reference: XLA's own fusions). MFU = tokens/s x training FLOPs per
token (attnlab.train.loop's count, attention included) / the table peak of
attnlab.train.mfu (989 TFLOP/s dense bf16 for an H100 SXM); on a device the table does not know,
a measured bf16 matmul peak. The ensemble part is benchmarks/ensemble.py's contestants (members
vmapped on accelerators, mapped on CPUs), timed the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import sys
from pathlib import Path

import jax
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from ensemble import SHAPES, contestants  # noqa: E402  (benchmarks/ensemble.py)
from train_step import best_time  # noqa: E402  (benchmarks/train_step.py)

from attnlab.config import Config, from_config_dict  # noqa: E402
from attnlab.model import init_model, param_counts  # noqa: E402
from attnlab.train.loop import training_flops_per_token  # noqa: E402
from attnlab.train.mfu import measure_matmul_peak, table_peak  # noqa: E402
from attnlab.train.optimizer import optimizer_for  # noqa: E402
from attnlab.train.state import init_train_state  # noqa: E402
from attnlab.train.step import make_train_step  # noqa: E402


def gpt2_small(batch: int, smoke: bool) -> Config:
    """configs/gpt2_small.py with one micro-batch per step (``smoke``: a 2-layer d64 stand-in)."""
    spec = importlib.util.spec_from_file_location("gpt2_small", HERE.parent / "configs" /
                                                  "gpt2_small.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    raw = module.get_config()
    raw.data.batch_size, raw.train.grad_accum = batch, 1
    if smoke:
        raw.model.update(vocab_size=512, d_model=64, n_layers=2, n_heads=2, max_len=128)
        raw.data.update(seq_len=128, bpe_vocab_size=512)
    return from_config_dict(raw)


def step_seconds(cfg: Config, steps: int, repeats: int) -> float:
    """Best seconds per donated train step on synthetic tokens."""
    graphdef, _ = init_model(cfg.model, 0)
    tx, schedule = optimizer_for(cfg)
    # The key is an argument: a constant key lets XLA fold the whole initialisation at compile time.
    state = jax.jit(lambda key: init_train_state(cfg, tx, key))(jax.random.key(0))
    tokens = np.random.default_rng(0).integers(
        0, cfg.model.vocab_size, (1, cfg.data.batch_size, cfg.data.seq_len + 1), np.int32)
    step = jax.jit(make_train_step(cfg, graphdef, tx, schedule), donate_argnums=0)
    return best_time(step, (state, jax.device_put(tokens)), steps, repeats, carry=True)


def device_peak(dtype: str) -> tuple[float, str]:
    kind = jax.devices()[0].device_kind
    peak = table_peak(kind, dtype)
    return (peak, "table") if peak else (measure_matmul_peak(dtype), "measured matmul")


def gpt2_rows(args) -> list[str]:
    """cuDNN attention on and off at the first batch size, then on at each larger one (the
    batch a device's memory allows is part of its MFU)."""
    batches = [int(b) for b in str(args.batch).split(",")]
    base = gpt2_small(batches[0], args.smoke)
    peak, source = device_peak(base.model.dtype)
    flops = training_flops_per_token(base)["mfu"]
    print(f"GPT-2 small{' (smoke stand-in)' if args.smoke else ''}: "
          f"{param_counts(base.model)['total'] / 1e6:.1f}M parameters, batches "
          f"{args.batch} x {base.data.seq_len}, {base.model.dtype}; peak "
          f"{peak / 1e12:.1f} TFLOP/s ({source})", flush=True)
    rows = ["| attention | batch | step ms | tokens/s | MFU |", "|---|---:|---:|---:|---:|"]
    contestants = [("cuDNN on (xla)", "xla", batches[0]), ("cuDNN off (einsum)", "einsum",
                                                           batches[0])]
    contestants += [("cuDNN on (xla)", "xla", b) for b in batches[1:]]
    for label, impl, batch in contestants:
        cfg = gpt2_small(batch, args.smoke)
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, attention_impl=impl))
        seconds = step_seconds(cfg, args.steps, args.repeats)
        tokens = batch * cfg.data.seq_len
        rows.append(f"| {label} | {batch} | {seconds * 1e3:.1f} | {tokens / seconds:,.0f} | "
                    f"{tokens / seconds * flops / peak:.1%} |")
        print(rows[-1], flush=True)
    return rows


def ensemble_rows(args) -> list[str]:
    ks = [int(k) for k in args.ks.split(",") if int(k) > 1]
    rows = ["| shape | contestant | tokens/s | speed-up |", "|---|---|---:|---:|"]
    for label, shape in SHAPES.items():
        entries = contestants(shape, ks)
        rates = {}
        for name, (step, init, batch, k) in entries.items():
            seconds = best_time(step, (init(), batch), args.steps, args.repeats, carry=True)
            rates[name] = k * 8 * 128 / seconds
        for name, rate in rates.items():
            rows.append(f"| {label} d{shape[0]}-l{shape[1]} | {name} | {rate:,.0f} | "
                        f"{rate / rates['lone']:.2f}x |")
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="16", help="GPT-2 small sequences per step "
                                                      "(comma-separated: each is timed)")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=3, help="timed blocks (best is kept)")
    parser.add_argument("--ks", default="1,2,4,8", help="ensemble sizes")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny stand-in for GPT-2 small, 1 step, 1 block (for a CPU)")
    args = parser.parse_args()
    if args.smoke:
        args.batch, args.steps, args.repeats = "2,4", 1, 1
    device = jax.devices()[0]
    print(f"# jax {jax.__version__}, {jax.device_count()} x {device.device_kind} "
          f"({device.platform}); load {os.getloadavg()}", flush=True)
    gpt2 = gpt2_rows(args)
    ensembles = ensemble_rows(args)
    print("\n".join(["", *gpt2, "", *ensembles]))


if __name__ == "__main__":
    main()
