"""Induction heads (Olsson et al. 2022): a 2-layer attention-only model (no FFN) trained on a
random sequence of distinct tokens followed by its repeat; ``--config.model.n_layers=1`` is the
1-layer control, which cannot form an induction head. Evaluate with
``attnlab icl --run=DIR`` and look with ``attnlab attention --run=DIR --task-example``."""

from attnlab.config import base_config_dict


def get_config():
    config = base_config_dict()
    config.name = "induction"

    config.model.vocab_size = 64
    config.model.d_model = 64
    config.model.n_layers = 2
    config.model.n_heads = 4
    config.model.ffn = "none"  # attention-only
    config.model.pos_encoding = "rope"
    config.model.max_len = 128

    config.data.source = "induction"
    config.data.task_vocab = 64
    # Periods of 32-64 distinct tokens: so many ids are seen before the repeat that a 1-layer
    # model, which cannot find the current token's previous occurrence, stays near ln 32-ln 64.
    config.data.seq_len = 126
    config.data.batch_size = 32

    # Where the induction head forms varies by seed: by step 1000 at some, past 4000 at others
    # (docs/icl.md); 10,000 steps leave room for the late ones.
    config.train.steps = 10000
    config.train.learning_rate = 3e-3
    config.train.warmup_steps = 100
    config.train.weight_decay = 0.0
    config.train.log_every = 100
    config.train.eval_every = 1000
    config.train.eval_batches = 4
    config.train.checkpoint_every = 1000
    return config
