"""A tiny positional-encoding extrapolation study (used by the tests): 6 encodings x 1 seed.

    attnlab extrapolate --config=experiments/tiny_pe.py --sweep=sweeps/tiny_pe --multipliers=1,2,4

Same shape, data, token budget, seed and data order for every encoding; only
``model.pos_encoding`` varies (and ``model.attention_window``, when that axis is overridden).
Runs take seconds; the numbers mean nothing at this size (see experiments/pe_extrapolation.py
for the real study).
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict


def get_config(scale: str = "cpu") -> ConfigDict:
    config = ConfigDict()
    config.scale = scale

    config.base = base = base_config_dict()
    base.model.d_model = 16
    base.model.n_layers = 1
    base.model.n_heads = 2
    base.model.max_len = 32  # = seq_len: the learned table covers exactly the training length
    base.data.source = "pystdlib"
    base.data.max_bytes = 200_000
    base.data.seq_len = 32
    base.data.batch_size = 8
    base.train.steps = 8
    base.train.learning_rate = 1e-2
    base.train.warmup_steps = 2
    base.train.log_every = 4
    base.train.eval_every = 8
    base.train.eval_batches = 2
    base.train.checkpoint_every = 8

    config.sweep = sweep = ConfigDict()
    sweep.name = "tiny_pe"
    sweep.mode = "grid"
    sweep.axes = ConfigDict()
    sweep.axes.model = ConfigDict(
        {"pos_encoding": ("none", "sinusoidal", "learned", "rope", "alibi", "t5"),
         "attention_window": (0,)})  # override: --config.sweep.axes.model.attention_window='(0,8)'
    sweep.axes.train = ConfigDict({"seed": (0,)})
    return config
