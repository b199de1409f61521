"""The quickstart's question asked with a token ladder (WSD cooldown branches) instead of IsoFLOP
profiles: every size trained once at a constant learning rate, with (1 - sqrt) cooldowns branched
at 0.25M-4M tokens, so approach 3 sees each size over 16x of tokens at about the quickstart's
compute.

    attnlab sweep --config=experiments/quickstart_ladder.py --sweep=sweeps/qs_ladder --dry-run
    attnlab quickstart --config=experiments/quickstart_ladder.py --sweep=sweeps/qs_ladder
    attnlab fit --sweep=sweeps/qs_ladder --law=chinchilla --holdout='params>=6e4'

Five 2-layer shapes, d_model 12-48 (6.6k-68k parameters, 10x), each a trunk to 3.2M tokens and
five branches at 0.25M, 0.5M, 1M, 2M and 4M tokens (the last 20% of each a cooldown to zero,
Hägele et al. 2024): 30 runs, 6.9e12 FLOPs (the branches as separate runs: 1.1e13). Peak
learning rate 7.5e-3 x 32 / d_model, from a probe of 4 rates x 5 widths at 0.5M tokens (each
width's best within a factor 2 of this rule; the quickstart's 1e-2 x 32 / d_model sits at the high
edge); a fixed 25-step warmup (a warmup of 0.5 tokens per parameter, 3-33 steps, cost the 10k
model 0.19 nats at 0.25M tokens); one depth, so neighbouring sizes differ by width alone
(with the quickstart's 1-2 layer shapes, its rate and that short warmup, a 21k model sat above
a 13k one at 0.25M tokens: 2.516 against 2.383).

Measured (2026-11-25, the 2-core VM shared with four other jobs, load 10-16): 14.9 min of sweep,
losses regular in N and D (docs/results.md, "The quickstart as a ladder"); approach 3 is still not
pinned (E in [0, 2.07], a in [0.04, 0.85]), approach 2's slices are wider than the IsoFLOP plan's,
and holding out the largest size predicts its branches with a mean error of 2.9% (max 5.9%): at
this scale the losses are far from any floor, and 25 points do not separate E from the two
power laws. Kept as the starting point for a design that does; the quickstart itself stays on
IsoFLOP profiles.
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict


def get_config(scale: str = "cpu") -> ConfigDict:
    config = ConfigDict()
    config.scale = scale

    config.base = base = base_config_dict()
    base.data.source = "pystdlib"
    base.train.learning_rate = 7.5e-3  # at d_model = ref_d_model below
    base.train.b2 = 0.99  # Porian et al. 2024: beta2 = 0.95 is too low for small batches
    base.train.min_lr_ratio = 0.0  # cooldowns to zero, as in Hägele et al. 2024
    base.train.warmup_steps = 25
    base.train.eval_every = 1_000_000  # each branch is scored once, at its end
    base.train.eval_batches = 16
    base.train.log_every = 25
    base.train.checkpoint_every = 1000

    config.sweep = sweep = ConfigDict()
    sweep.name = "quickstart_ladder"
    sweep.mode = "ladder"
    sweep.flops_per_token = "chinchilla"
    sweep.learning_rate = ConfigDict({"rule": "inverse_width", "ref_d_model": 32})
    sweep.warmup = ConfigDict({"rule": "fixed"})
    sweep.axes = ConfigDict({"train": ConfigDict({"seed": (0,)})})
    sweep.branches = ConfigDict({"tokens": (250_000, 500_000, 1_000_000, 2_000_000, 4_000_000),
                                 "params": "total", "cooldown": "1-sqrt", "fraction": 0.2})
    if scale == "gpu":
        base.data.seq_len = 256
        base.data.batch_size = 32
        base.model.dtype = "bfloat16"
        base.train.learning_rate = 3e-3  # at d_model = 128
        base.train.warmup_steps = 100
        sweep.learning_rate.ref_d_model = 128
        sweep.shapes = ((64, 4, 2), (96, 4, 3), (128, 4, 4), (192, 4, 6), (256, 4, 8))
        sweep.branches.tokens = (6.25e6, 12.5e6, 25e6, 50e6, 100e6)  # <= 3.5 epochs
    else:
        base.data.seq_len = 128
        base.data.batch_size = 8
        # (d_model, n_layers, n_heads)
        sweep.shapes = ((12, 2, 2), (16, 2, 2), (24, 2, 2), (32, 2, 2), (48, 2, 2))
    return config
