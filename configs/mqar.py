"""Multi-query associative recall (Arora et al. 2023, "Zoology"): ``data.mqar_pairs`` key-value
pairs, then every key queried once. Softmax attention by default; compare mixers with
``--config.model.mixer=linear`` / ``mamba`` at the same ``model.d_model``. Evaluate with
``attnlab icl --run=DIR`` (accuracy per query).

As Zoology's MQAR models: no FFN (``model.ffn=none``: the mixers alone do the recall) and the
loss on the answers alone (``data.loss_on=answers``); 8 pairs in 32 tokens, 3000 steps of 64
windows at lr 1e-2 (about a minute on a 2-core CPU; docs/icl.md)."""

from attnlab.config import base_config_dict


def get_config():
    config = base_config_dict()
    config.name = "mqar"

    config.model.vocab_size = 64
    config.model.d_model = 32
    config.model.n_layers = 2
    config.model.n_heads = 2
    config.model.pos_encoding = "rope"
    config.model.max_len = 64
    config.model.ffn = "none"

    config.data.source = "mqar"
    config.data.task_vocab = 64
    config.data.mqar_pairs = 8
    config.data.seq_len = 32
    config.data.batch_size = 64
    config.data.loss_on = "answers"

    config.train.steps = 3000
    config.train.learning_rate = 1e-2
    config.train.warmup_steps = 100
    config.train.weight_decay = 0.0
    config.train.log_every = 100
    config.train.eval_every = 1000
    config.train.eval_batches = 4
    config.train.checkpoint_every = 1000
    return config
