"""The Markov known answer on a token ladder: each size trained once at a constant learning rate
with (1 - sqrt) cooldown branches at 0.5M-8M tokens, to see whether a decade of tokens per size
pins approach 3's E nearer the chain's entropy rate (3.7384 nats/byte) than the IsoFLOP plan of
experiments/markov_floor.py does.

    attnlab sweep --config=experiments/markov_ladder.py --sweep=sweeps/markov_ladder
    attnlab fit --sweep=sweeps/markov_ladder --law=chinchilla --approach=3 --bootstrap=200

Five 2-layer shapes, d_model 16-64 (10k-115k parameters), branches at 0.5M, 1M, 2M, 4M, 8M tokens
of the order-1, 64-successor chain (batches 16 x 64): 30 runs, 1.95e13 FLOPs (the IsoFLOP plan:
3e13). Learning rate 7.5e-3 x 32 / d_model, 25-step warmup, as experiments/quickstart_ladder.py.

Measured (2026-11-25, 2-core VM shared with four other jobs, load 10-16): 20 min of sweep. The
losses at 8M tokens fall linearly in log N (4.947, 4.663, 4.431, 4.082, 3.909 from 10k to 115k):
the sizes are capacity-bound, none bends towards the floor yet, and approach 3 puts E at 0 (grid
edge; interval [0, 4.4]). Worse than the IsoFLOP plan's 3.299 [2.761, 3.733]: the floor needs
models past ~250k parameters trained on several million tokens (docs/scaling.md).

Scale ``gpu`` (``experiments/markov_ladder.py:gpu``) goes past that bend: five 2-layer shapes,
d_model 64-256 (115k-1.7M parameters), branches at 2M-64M tokens (batches 256 x 64, 100 warmup
steps, a 70M-token corpus), 35 runs, 1.6e15 FLOPs: minutes on one accelerator.
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict


def get_config(scale: str = "cpu") -> ConfigDict:
    config = ConfigDict()
    config.scale = scale

    config.base = base = base_config_dict()
    base.data.source = "markov"
    base.data.markov_order = 1
    base.data.markov_branching = 64
    base.data.markov_seed = 0
    base.data.seq_len = 64
    base.data.batch_size = 16
    base.data.markov_tokens = 20_000_000
    base.train.learning_rate = 7.5e-3  # at d_model = 32
    base.train.b2 = 0.99
    base.train.min_lr_ratio = 0.0  # cooldowns to zero
    base.train.warmup_steps = 25
    base.train.eval_every = 1_000_000  # each branch is scored once, at its end
    base.train.eval_batches = 32
    base.train.log_every = 50
    base.train.checkpoint_every = 1000

    config.sweep = sweep = ConfigDict()
    sweep.name = "markov_ladder"
    sweep.mode = "ladder"
    sweep.flops_per_token = "chinchilla"
    sweep.learning_rate = ConfigDict({"rule": "inverse_width", "ref_d_model": 32})
    sweep.warmup = ConfigDict({"rule": "fixed"})
    # (d_model, n_layers, n_heads)
    sweep.shapes = ((16, 2, 2), (24, 2, 2), (32, 2, 2), (48, 2, 2), (64, 2, 2))
    sweep.branches = ConfigDict({"tokens": (500_000, 1_000_000, 2_000_000, 4_000_000, 8_000_000),
                                 "params": "total", "cooldown": "1-sqrt", "fraction": 0.2})
    if scale == "gpu":
        base.data.batch_size = 256
        base.data.markov_tokens = 70_000_000
        base.train.warmup_steps = 100
        sweep.shapes = ((64, 2, 2), (96, 2, 2), (128, 2, 4), (192, 2, 4), (256, 2, 4))
        sweep.branches.tokens = tuple(2_000_000 * 2**i for i in range(6))  # 2M .. 64M
    return config
