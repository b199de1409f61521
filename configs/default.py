"""The small default: a 4-layer, d=128 byte-level LM on the embedded pystdlib corpus (~0.8M params).

Trains in a few minutes on a 2-core CPU. Override any field from the command line, e.g.
``attnlab train --config=configs/default.py --config.model.pos_encoding=alibi --run=runs/x``.
"""

from attnlab.config import base_config_dict


def get_config():
    config = base_config_dict()
    config.name = "default"

    config.model.d_model = 128
    config.model.n_layers = 4
    config.model.n_heads = 4
    config.model.max_len = 256
    config.model.pos_encoding = "rope"
    config.model.ffn = "gelu"

    config.data.source = "pystdlib"
    config.data.seq_len = 128
    config.data.batch_size = 16

    config.train.steps = 600
    config.train.learning_rate = 3e-3
    config.train.warmup_steps = 50
    config.train.eval_every = 200
    config.train.checkpoint_every = 200
    return config
