"""A tiny sweep over the sequence mixer: softmax, linear (elu+1), Performer and Mamba,
one shape, 12 steps each; used by the tests (hybrids: ``model.attention_every``, see
tests/test_mixers_train.py).

    attnlab sweep --config=experiments/tiny_mixers.py --sweep=sweeps/tiny_mixers --dry-run
    attnlab sweep --config=experiments/tiny_mixers.py --sweep=sweeps/tiny_mixers

No positional encoding (NoPE): a pure Mamba stack refuses encodings that act inside attention.
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict


def get_config(scale: str = "cpu") -> ConfigDict:
    config = ConfigDict()
    config.scale = scale  # this sweep is tiny at any scale

    config.base = base = base_config_dict()
    base.model.max_len = 64
    base.model.pos_encoding = "none"
    base.model.mixer_chunk = 16
    base.model.mixer_features = 32
    base.data.source = "pystdlib"
    base.data.max_bytes = 200_000
    base.data.seq_len = 32
    base.data.batch_size = 8
    base.train.steps = 12
    base.train.warmup_steps = 2
    base.train.log_every = 4
    base.train.eval_every = 6
    base.train.eval_batches = 2
    base.train.checkpoint_every = 6

    config.sweep = sweep = ConfigDict()
    sweep.name = "tiny_mixers"
    sweep.mode = "grid"
    sweep.shapes = ((32, 2, 2, 5e-3),)  # (d_model, n_layers, n_heads, learning_rate)
    sweep.learning_rate = ConfigDict({"rule": "per_shape"})
    sweep.axes = ConfigDict()
    sweep.axes.model = ConfigDict({"mixer": ("softmax", "linear", "performer", "mamba")})
    sweep.axes.train = ConfigDict({"seed": (0,)})
    return config
