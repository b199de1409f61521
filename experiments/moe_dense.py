"""Mixture of experts against dense at equal training compute, two seeds per point: the
quickstart's IsoFLOP plan with each FFN replaced by 8 experts of its width and Switch top-1
routing (Fedus et al. 2021), so a shape's active parameters and FLOPs per token are the dense
model's plus the router's, and its total parameters ~8x the FFN's.

    attnlab sweep --config=experiments/moe_dense.py --sweep=sweeps/moe_dense --dry-run
    attnlab quickstart --config=experiments/moe_dense.py --sweep=sweeps/moe_dense

``attnlab quickstart`` on this sweep of variants (column ``ffn``) fits approach 3 and approach 2
per arm, and reports the MoE arm's effective compute multiplier against dense (``sweep.baseline``)
with its bootstrap interval, and the loss difference at the largest budget with an interval over
the two seeds (docs/scaling.md, "Effective compute multipliers"). FLOPs are each arm's own count
(router, the chosen expert and the combine; the capacity buffers' empty slots are not counted).

Scale ``cpu``: the quickstart's three budgets (1.2e11, 3e11, 7.5e11 FLOPs) and shapes, each budget
the sizes within 1.8x of the quickstart's prior optimum, seeds 0 and 1 (a shape's seeds and both
arms train as one ensemble where their shapes agree).

Scale ``cpu_tuned``: the experts at their own learning rate. The largest budget's shapes at 5
peak rates (the rule's times 1/4 .. 4), both arms, seeds 0 and 1 (100 runs); each (arm, shape)
picks its rate by its mean loss over the seeds, then the arms are compared at those picks:

    attnlab sweep --config=experiments/moe_dense.py:cpu_tuned --sweep=sweeps/moe_dense_tuned
    attnlab compare --sweep=sweeps/moe_dense_tuned --by=ffn --baseline=dense \
        --match=budget,model.d_model,model.n_layers --pair=train.seed \
        --best-over=train.learning_rate
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict


def get_config(scale: str = "cpu") -> ConfigDict:
    """``scale``: cpu, or cpu_tuned (the largest budget at 5 peak rates per arm)."""
    tuned = scale.endswith("_tuned")
    scale = scale.removesuffix("_tuned")
    config = ConfigDict()
    config.scale = scale

    config.base = base = base_config_dict()
    base.data.source = "pystdlib"
    base.data.seq_len = 128
    base.data.batch_size = 8
    base.train.learning_rate = 1e-2  # at d_model = ref_d_model below
    base.train.b2 = 0.99
    base.train.eval_every = 1_000_000  # isoflop runs are scored once, at their end
    base.train.eval_batches = 16
    base.train.log_every = 25
    base.train.checkpoint_every = 1000

    config.sweep = sweep = ConfigDict()
    sweep.name = "moe_dense"
    sweep.mode = "isoflop"
    sweep.flops_per_token = "chinchilla"
    sweep.learning_rate = ConfigDict({"rule": "inverse_width", "ref_d_model": 32})
    sweep.warmup = ConfigDict({"rule": "fraction", "fraction": 0.05})
    sweep.min_steps = 50
    sweep.variant_column = "ffn"
    sweep.baseline = "dense"
    sweep.variants = ConfigDict({
        "dense": {},
        "moe": {"model": {"moe": "token_choice", "moe_experts": 8, "moe_top_k": 1}},
    })
    sweep.axes = ConfigDict({"train": ConfigDict({"seed": (0, 1)})})
    sweep.budgets = (1.2e11, 3e11, 7.5e11)
    # (d_model, n_layers, n_heads): the quickstart's shapes.
    sweep.shapes = ((12, 1, 1), (16, 1, 1), (20, 1, 1), (24, 1, 2), (28, 1, 2), (32, 1, 2),
                    (28, 2, 2), (32, 2, 2), (36, 2, 3), (40, 2, 2), (48, 2, 3), (64, 2, 4))
    sweep.centre = ConfigDict({"n_opt": 39e3, "budget": 9.4e11, "exponent": 0.65, "span": 1.8})
    if tuned:
        sweep.name = "moe_dense_tuned"
        sweep.budgets = (7.5e11,)
        # 1/4 added after the first 80 runs: the experts' best rate was the grid's lowest at
        # two shapes (the finished runs keep their ids).
        sweep.learning_rate.factors = (0.25, 0.5, 1.0, 2.0, 4.0)
    return config
