"""A tiny ladder sweep (used by the tests): 2 shapes, each one constant-LR trunk and three
cooldown branches at 10, 20 and 40 steps (a 1-sqrt cooldown over the last 20% of each).

    attnlab sweep --config=experiments/tiny_ladder.py --sweep=sweeps/tiny_ladder --dry-run
    attnlab sweep --config=experiments/tiny_ladder.py --sweep=sweeps/tiny_ladder

The trunk trains steps 1-32 once; the branches train 2, 4 and 8 cooldown steps from its
checkpoints at steps 8, 16 and 32: 46 steps per shape instead of 70 for three separate runs.
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict


def get_config(scale: str = "cpu") -> ConfigDict:
    config = ConfigDict()
    config.scale = scale  # this sweep is tiny at any scale

    config.base = base = base_config_dict()
    base.model.max_len = 64
    base.data.source = "pystdlib"
    base.data.max_bytes = 200_000
    base.data.seq_len = 32
    base.data.batch_size = 8
    base.train.warmup_steps = 2
    base.train.min_lr_ratio = 0.0  # cooldowns to zero, as in Hägele et al. 2024
    base.train.log_every = 4
    base.train.eval_every = 8
    base.train.eval_batches = 2
    base.train.checkpoint_every = 8

    config.sweep = sweep = ConfigDict()
    sweep.name = "tiny_ladder"
    sweep.mode = "ladder"
    sweep.shapes = ((16, 1, 2, 1e-2), (32, 2, 2, 5e-3))
    sweep.learning_rate = ConfigDict({"rule": "per_shape"})
    # Each shape's branches: D in tokens (or tokens_per_param: D / N), the cooldown's shape and
    # its length as a fraction of each branch's D.
    sweep.branches = ConfigDict({"tokens": (2560, 5120, 10240), "tokens_per_param": (),
                                 "params": "total", "cooldown": "1-sqrt", "fraction": 0.2})
    return config
