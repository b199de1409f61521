"""A tiny IsoFLOP sweep (Chinchilla approach 2; used by the tests): 2 budgets x 3 sizes.

A size ladder generates the shapes from target non-embedding parameter counts at a fixed aspect
ratio d_model / n_layers = 16; each run trains for D = C / (FLOPs per token) tokens, its cosine
schedule spanning exactly that run and its warmup 10% of it (Porian et al. 2024: short warmups
and schedules matched to each run's length matter most at small scale).

    attnlab sweep --config=experiments/tiny_isoflop.py --sweep=sweeps/tiny_isoflop

Scale ``cpu_tuned``: every point at the rule's rate times 1/2, 1 and 2, the grid refined by one
rate where a point's best is at its edge (the CPU stand-in for ``quickstart.py:gpu_tuned`` in
benchmarks/device_session.sh --smoke).
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict


def get_config(scale: str = "cpu") -> ConfigDict:
    tuned = scale.endswith("_tuned")
    config = ConfigDict()
    config.scale = scale.removesuffix("_tuned")

    config.base = base = base_config_dict()
    base.model.max_len = 64
    base.data.source = "pystdlib"
    base.data.max_bytes = 200_000
    base.data.seq_len = 32
    base.data.batch_size = 8
    base.train.learning_rate = 1e-2
    base.train.log_every = 4
    base.train.eval_every = 1000  # isoflop runs are scored at their end
    base.train.eval_batches = 2
    base.train.checkpoint_every = 16

    config.sweep = sweep = ConfigDict()
    sweep.name = "tiny_isoflop"
    sweep.mode = "isoflop"
    sweep.budgets = (1e9, 2e9)  # FLOPs, counted as below
    sweep.flops_per_token = "chinchilla"  # full count incl. embeddings and output head
    sweep.min_steps = 4  # leave out (budget, shape) pairs with fewer steps
    sweep.ladder = ConfigDict({
        "non_embedding_params": (3e3, 2.5e4, 8e4),
        "aspect_ratio": 16.0,  # d_model / n_layers
        "head_dim": 8,
    })
    # muP-lite: lr = base * ref_d_model / d_model (base: base.train.learning_rate).
    sweep.learning_rate = ConfigDict({"rule": "inverse_width", "ref_d_model": 16})
    sweep.warmup = ConfigDict({"rule": "fraction", "fraction": 0.1})
    if tuned:
        sweep.name = "tiny_isoflop_tuned"
        sweep.learning_rate.factors = (0.5, 1.0, 2.0)
        sweep.learning_rate.refine = 1
    return config
