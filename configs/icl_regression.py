"""In-context linear regression (Garg et al. 2022): prompts ``x_1, (y_1, 0..), .., x_16,
(y_16, 0..)`` with ``x ~ N(0, I_8)``, ``y = w.x``, ``w ~ N(0, I_8)`` fresh per prompt, read by a
decoder with a linear read-in and a scalar read-out (``model.inputs=vectors``), trained on the
squared error of its prediction of every ``y_j`` at ``x_j`` (``model.objective=regression``).
Evaluate against least squares, ridge, 3-NN, averaging and one GD step with
``attnlab icl --run=DIR``.

Garg et al.'s curriculum, scaled to d = 8: 2 dimensions and 5 examples at first, then one more
dimension and two more examples every 1000 steps, the full task from step 6000. Batch 256: at
batch 64 this model stays on a loss plateau (no previous-token head forms to pair each y with
its x). Their model is GPT-2 (12 layers, width 256, 8 heads, learned positions) trained 500k
steps of 64 prompts at Adam lr 1e-4; this one is a CPU-sized 4 layers at width 64, 24000 steps
at lr 1e-3, about an hour on 2 cores (docs/icl.md)."""

from attnlab.config import base_config_dict


def get_config():
    config = base_config_dict()
    config.name = "icl_regression"

    config.model.inputs = "vectors"
    config.model.objective = "regression"
    config.model.input_dim = 8
    config.model.d_model = 64
    config.model.n_layers = 4
    config.model.n_heads = 4
    config.model.pos_encoding = "learned"
    config.model.max_len = 32

    config.data.source = "regression"
    config.data.icl_dim = 8
    config.data.icl_examples = 16
    config.data.seq_len = 32
    config.data.batch_size = 256
    config.data.icl_curriculum_every = 1000
    config.data.icl_dim_start = 2
    config.data.icl_examples_start = 5

    config.train.steps = 24000
    config.train.learning_rate = 1e-3
    config.train.warmup_steps = 200
    config.train.weight_decay = 0.0
    config.train.log_every = 100
    config.train.eval_every = 1000
    config.train.eval_batches = 4
    config.train.checkpoint_every = 1000
    return config
