"""A tiny grid sweep (used by the tests): 2 shapes x 2 positional encodings = 4 runs of 24 steps.

    attnlab sweep --config=experiments/tiny_grid.py --sweep=sweeps/tiny_grid --dry-run
    attnlab sweep --config=experiments/tiny_grid.py --sweep=sweeps/tiny_grid

Each run takes seconds on a laptop CPU; the whole sweep well under a minute.
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict


def get_config(scale: str = "cpu") -> ConfigDict:
    config = ConfigDict()
    config.scale = scale  # this sweep is tiny at any scale

    # The train config every run starts from (the fields the sweep does not set).
    config.base = base = base_config_dict()
    base.model.max_len = 64
    base.data.source = "pystdlib"
    base.data.max_bytes = 200_000
    base.data.seq_len = 32
    base.data.batch_size = 8
    base.train.steps = 24
    base.train.warmup_steps = 2
    base.train.log_every = 4
    base.train.eval_every = 8
    base.train.eval_batches = 2
    base.train.checkpoint_every = 8

    config.sweep = sweep = ConfigDict()
    sweep.name = "tiny_grid"
    sweep.mode = "grid"
    # (d_model, n_layers, n_heads, learning_rate): an explicit learning rate per shape.
    sweep.shapes = ((16, 1, 2, 1e-2), (32, 2, 2, 5e-3))
    sweep.learning_rate = ConfigDict({"rule": "per_shape"})
    # Axes mirror the config; the grid is their cartesian product with the shapes.
    sweep.axes = ConfigDict()
    sweep.axes.model = ConfigDict({"pos_encoding": ("rope", "alibi")})
    sweep.axes.train = ConfigDict({"seed": (0,)})
    return config
