"""A smoke-test model: 2 layers, d=32, a 1 MB slice of pystdlib; a run takes seconds."""

from attnlab.config import base_config_dict


def get_config():
    config = base_config_dict()
    config.name = "tiny"

    config.model.d_model = 32
    config.model.n_layers = 2
    config.model.n_heads = 2
    config.model.max_len = 64

    config.data.source = "pystdlib"
    config.data.max_bytes = 1_000_000
    config.data.seq_len = 32
    config.data.batch_size = 8

    config.train.steps = 20
    config.train.warmup_steps = 2
    config.train.log_every = 5
    config.train.eval_every = 10
    config.train.eval_batches = 2
    config.train.checkpoint_every = 10
    return config
