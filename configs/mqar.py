"""Multi-query associative recall (Arora et al. 2023, "Zoology"): ``data.mqar_pairs`` key-value
pairs, then every key queried once. Softmax attention by default; compare mixers with
``--config.model.mixer=linear`` / ``mamba`` at the same ``model.d_model``. Evaluate with
``attnlab icl --run=DIR`` (accuracy per query)."""

from attnlab.config import base_config_dict


def get_config():
    config = base_config_dict()
    config.name = "mqar"

    config.model.vocab_size = 64
    config.model.d_model = 64
    config.model.n_layers = 2
    config.model.n_heads = 2
    config.model.pos_encoding = "rope"
    config.model.max_len = 64

    config.data.source = "mqar"
    config.data.task_vocab = 64
    config.data.mqar_pairs = 8
    config.data.seq_len = 48
    config.data.batch_size = 32

    config.train.steps = 5000
    config.train.learning_rate = 3e-3
    config.train.warmup_steps = 100
    config.train.weight_decay = 0.0
    config.train.log_every = 100
    config.train.eval_every = 1000
    config.train.eval_batches = 4
    config.train.checkpoint_every = 1000
    return config
