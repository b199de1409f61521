"""Fusion counts of the optimized HLO of attnlab's train step against the naive-JAX step of
benchmarks/peer_pytorch.py (the backward pass's copy/transpose fusions).

    .venv/bin/python benchmarks/hlo_fusions.py [--shapes 128,2,32,128 ...] [--variants default,bias]
        [--dump DIR]

For each step, from ``jax.jit(step).lower(...).compile().as_text()``: the number of fusion
instructions (``fusion(...)``; ``ynn_fusion`` = XLA:CPU's YNNPACK dot/library fusions), the copy
and transpose fusions (a fusion whose name says copy or transpose: a layout change, into which
XLA may pull elementwise backward math that it then recomputes in strided order), the inputs
(operands) of all fusions and of the copy/transpose ones, the largest operand list, and the MB
the copy/transpose fusions write. Fewer and narrower copy fusions = a backward compiled like the
naive step's.

Variants of attnlab (comma-separated; words combine): ``default`` (bias-free), ``bias``
(``model.linear_bias=True``: the same model as the naive step), ``rmsnorm``, and
``autodiff_norm``: the norms differentiated by autodiff of the textbook formula instead of their
custom VJPs (``attnlab.model.layers.standardize`` / ``rms_normalize``), i.e. attnlab before the
change, e.g. ``autodiff_norm,default,bias_autodiff_norm,bias``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_pytorch import SHAPES, attnlab_step, naive_step, tokens_for  # noqa: E402

FUSION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\S+) fusion\((.*?)\), kind=(\w+)")
SHAPE = re.compile(r"^[a-z0-9]+\[([0-9,]*)\]")


def attnlab_hlo(d, n_layers, batch, seq, variant: str) -> str:
    return attnlab_step(d, n_layers, batch, seq, variant)[0].as_text()


def naive_hlo(d, layers_, batch, seq) -> str:
    step, (params, opt_state) = naive_step(d, layers_, seq)
    tokens = jnp.asarray(tokens_for(batch, seq))
    return jax.jit(step).lower(params, opt_state, tokens).compile().as_text()


def fusion_stats(hlo: str) -> dict[str, float]:
    """Counts over every ``fusion(...)`` instruction of the optimized module."""
    stats = dict(fusions=0, ynn=0, copy=0, inputs=0, copy_inputs=0, max_copy_inputs=0,
                 copy_mb=0.0)
    for line in hlo.splitlines():
        match = FUSION.match(line)
        if not match:
            continue
        name, result, operands, _ = match.groups()
        n_in = operands.count("%")
        stats["fusions"] += 1
        stats["inputs"] += n_in
        if name.startswith("ynn_fusion"):
            stats["ynn"] += 1
        if "copy" in name or "transpose" in name:
            stats["copy"] += 1
            stats["copy_inputs"] += n_in
            stats["max_copy_inputs"] = max(stats["max_copy_inputs"], n_in)
            dims = SHAPE.match(result)
            if dims:
                size = int(np.prod([int(x) for x in dims.group(1).split(",") if x] or [1]))
                stats["copy_mb"] += 4 * size / 1e6
    return stats


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="*", default=[",".join(map(str, s)) for s in SHAPES])
    parser.add_argument("--variants", default="autodiff_norm,default,bias_autodiff_norm,bias")
    parser.add_argument("--dump", default="", help="write each optimized HLO text here")
    args = parser.parse_args()
    print("| shape | step | fusions | of which ynn | copy/transpose fusions | their inputs | "
          "max inputs | MB written by them | inputs of all fusions |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        d, n_layers, batch, seq = map(int, shape.split(","))
        steps = {f"attnlab[{v}]": (lambda v=v: attnlab_hlo(d, n_layers, batch, seq, v))
                 for v in args.variants.split(",") if v}
        steps["naive-jax"] = lambda: naive_hlo(d, n_layers, batch, seq)
        for name, build in steps.items():
            hlo = build()
            if args.dump:
                Path(args.dump).mkdir(parents=True, exist_ok=True)
                Path(args.dump, f"{name}_{d}.hlo").write_text(hlo)
            s = fusion_stats(hlo)
            print(f"| {shape} | {name} | {s['fusions']} | {s['ynn']} | {s['copy']} | "
                  f"{s['copy_inputs']} | {s['max_copy_inputs']} | {s['copy_mb']:.1f} | "
                  f"{s['inputs']} |", flush=True)


if __name__ == "__main__":
    main()
