"""Routed language models over the expert count E at a fixed number of training tokens: the
points of Clark et al. 2022's law (arXiv 2202.01169, "Unified Scaling Laws for Routed Language
Models", eq. 1)

    log10 L(N, E) = a log10 N + b log10 E + c log10 N log10 E + d

    attnlab sweep --config=experiments/moe.py --sweep=sweeps/moe --dry-run
    attnlab sweep --config=experiments/moe.py --sweep=sweeps/moe
    attnlab fit --sweep=sweeps/moe --law=clark      # N: active non-embedding parameters

As in Clark et al., every model trains on the same tokens (their 130B; here ``train.tokens``)
and N is the size of the dense model the experts are added to: each shape's FFN of every layer
is replaced by E experts of the dense FFN's width with Switch's top-1 routing
(``model.moe_top_k=1``), so a shape's *active* parameters and FLOPs per token are the dense
model's plus the router's (``d E`` parameters, ``2 d E`` FLOPs), whatever E. E = 1 is the dense
model (its router has one logit: every gate is 1, and the capacity of ``1.25 T`` slots drops
nothing). The experiment is a grid: shapes x E (the axis ``model.moe_experts``, a numeric
column of the results, which ``attnlab fit --law=clark`` reads as E), one seed.

Scale ``cpu``: 4 two-layer shapes (6k-99k active non-embedding parameters), E in 1-16, 1M
tokens (976 steps of 8 x 128 bytes of ``pystdlib``): 20 runs; docs/moe.md has the dry run, the
wall time and the fit. Scale ``gpu``: 4 shapes to d 512, 100M tokens (not run).
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict

EXPERTS = (1, 2, 4, 8, 16)


def get_config(scale: str = "cpu") -> ConfigDict:
    config = ConfigDict()
    config.scale = scale

    config.base = base = base_config_dict()
    base.data.source = "pystdlib"
    base.data.seq_len = 128
    base.data.batch_size = 8
    base.model.moe = "token_choice"
    base.model.moe_top_k = 1
    base.train.learning_rate = 1e-2  # at d_model = ref_d_model below
    base.train.b2 = 0.99
    base.train.eval_every = 1_000_000  # scored once, at the end
    base.train.eval_batches = 16
    base.train.log_every = 25
    base.train.checkpoint_every = 1000

    config.sweep = sweep = ConfigDict()
    sweep.name = "moe"
    sweep.mode = "grid"
    sweep.learning_rate = ConfigDict({"rule": "inverse_width", "ref_d_model": 32})
    sweep.warmup = ConfigDict({"rule": "fraction", "fraction": 0.05})
    sweep.axes = ConfigDict({
        "model": ConfigDict({"moe_experts": EXPERTS}),
        "train": ConfigDict({"tokens": (1_000_000,), "seed": (0,)}),
    })
    # (d_model, n_layers, n_heads)
    sweep.shapes = ((16, 2, 2), (32, 2, 2), (48, 2, 3), (64, 2, 4))
    if scale == "gpu":
        base.data.seq_len = 256
        base.data.batch_size = 32
        sweep.shapes = ((64, 2, 2), (128, 4, 4), (256, 4, 4), (512, 8, 8))
        sweep.axes.train.tokens = (100_000_000,)
    return config
