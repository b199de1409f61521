"""Softmax saturation at init: the entropy of attention rows for each score scale, d_k = 16..256.

    python benchmarks/attention_entropy.py                # the table in docs/attention.md
    python benchmarks/attention_entropy.py --keys 512 --seeds 4

Two settings, both through the model's own code (``attnlab.model.scales`` and
``attnlab.model.attention.attention_weights``), every query against ``--keys`` keys (no mask,
so every row has the same maximum entropy ``ln T``):

* ``unit``: q and k with i.i.d. N(0, 1) entries, the notes' scaled-vs-unscaled experiment:
  ``<q, k>`` has std ``sqrt(d_k)``, so the logits' std is 1 with ``1/sqrt(d_k)``, ``sqrt(d_k)``
  unscaled (rows saturate towards one-hot), ``1/sqrt(d_k)`` with ``1/d_k``; cosine attention's
  ``tau cos(q, k)`` has std ``tau/sqrt(d_k)``.
* ``model``: the first attention layer of a freshly initialised model (GPT-2 init,
  ``init_std`` 0.02, 4 heads of ``d_k``, d_model = 4 d_k) on unit-variance inputs (what a
  LayerNorm hands it): q and k entries have std ``0.02 sqrt(d_model)``, so every dot-product
  scale starts near uniform attention and only cosine attention's ``tau`` sets a temperature.

Printed: mean row entropy as a fraction of ``ln T`` (1 = uniform, 0 = one-hot) and the mean of
each row's largest probability.
"""

from __future__ import annotations

import argparse
import math

import jax
import numpy as np
from flax import nnx

from attnlab.config import ModelConfig
from attnlab.model import SCORE_SCALES, attention_weights, resolve

HEAD_DIMS = (16, 32, 64, 128, 256)
HEADS = 4


def row_statistics(probs: jax.Array) -> tuple[float, float]:
    """``(mean entropy / ln T, mean max probability)`` of rows ``[..., T]``."""
    p = np.asarray(probs, np.float64)
    entropy = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)
    return float(entropy.mean() / math.log(p.shape[-1])), float(p.max(-1).mean())


def weights(cfg: ModelConfig, q, k, params) -> jax.Array:
    q, k, scale = resolve(cfg).score_scale.apply(q, k, params)
    return attention_weights(q, k, scale=scale, mask=None)


def attention_layer(cfg: ModelConfig, seed: int) -> nnx.Module:
    """The first layer's softmax attention, built as the model builds it."""
    return resolve(cfg).stack.mixers[0].build(nnx.Rngs(params=seed))


def unit_rows(cfg: ModelConfig, keys: int, seed: int) -> jax.Array:
    shape = (1, keys, HEADS, cfg.head_dim)
    q = jax.random.normal(jax.random.key(2 * seed), shape)
    k = jax.random.normal(jax.random.key(2 * seed + 1), shape)
    layer = attention_layer(cfg, seed)
    return weights(cfg, q, k, layer.temperature)


def model_rows(cfg: ModelConfig, keys: int, seed: int) -> jax.Array:
    layer = attention_layer(cfg, seed)
    x = jax.random.normal(jax.random.key(seed + 1000), (1, keys, cfg.d_model))
    q = layer.q_proj(x).reshape(1, keys, HEADS, cfg.head_dim)
    k = layer.k_proj(x).reshape(1, keys, HEADS, cfg.head_dim)
    return weights(cfg, q, k, layer.temperature)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=256, help="keys per row (T)")
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()
    print(f"T = {args.keys} keys per row (ln T = {math.log(args.keys):.3f}), {HEADS} heads, "
          f"{args.seeds} seeds; entropy / ln T  (mean max probability)")
    for setting, rows in (("unit", unit_rows), ("model", model_rows)):
        print(f"\n{setting}:")
        print("| attention_scale | " + " | ".join(f"d_k={d}" for d in HEAD_DIMS) + " |")
        print("|---|" + "---|" * len(HEAD_DIMS))
        for name in SCORE_SCALES:
            cells = []
            for head_dim in HEAD_DIMS:
                cfg = ModelConfig(d_model=HEADS * head_dim, n_heads=HEADS, attention_scale=name)
                stats = [row_statistics(rows(cfg, args.keys, seed)) for seed in range(args.seeds)]
                entropy, top = np.mean(stats, axis=0)
                cells.append(f"{entropy:.3f} ({top:.3f})")
            print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
