"""Is softmax attention's MQAR success a property of the initialisation or of the training length?
``configs/mqar.py``'s task (8 pairs in 32 tokens) and model (2 layers, no FFN, RoPE) at eight
initialisation seeds per width, trained on Zoology's number of windows (Arora et al. 2023 train
on ~6.4M; ``configs/mqar.py`` sees 192k).

    attnlab sweep --config=experiments/mqar_seeds.py:gpu --sweep=sweeps/mqar_seeds
    attnlab icl --sweep=sweeps/mqar_seeds          # accuracy per run and seed

Every seed of a width differs from the others in ``train.seed`` alone, so ``--ensemble=on``
trains the eight as one program (one directory, summary and results row each). Scale ``gpu``:
batches of 512 for 12500 steps (6.4M windows), sized for an accelerator (a minute or two per
width); scale ``cpu``: configs/mqar.py's 3000 steps of 64 windows, the CPU baseline.
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict


def get_config(scale: str = "cpu") -> ConfigDict:
    config = ConfigDict()
    config.scale = scale

    config.base = base = base_config_dict()
    base.model.vocab_size = 64
    base.model.max_len = 64
    base.model.ffn = "none"
    base.model.pos_encoding = "rope"
    base.data.source = "mqar"
    base.data.task_vocab = 64
    base.data.mqar_pairs = 8
    base.data.seq_len = 32
    base.data.loss_on = "answers"
    base.train.weight_decay = 0.0
    base.train.warmup_steps = 100
    base.train.log_every = 100
    base.train.eval_batches = 4
    if scale == "gpu":
        base.data.batch_size, base.train.steps = 512, 12_500
        base.train.eval_every = base.train.checkpoint_every = 2500
    else:
        base.data.batch_size, base.train.steps = 64, 3000
        base.train.eval_every = base.train.checkpoint_every = 1000

    config.sweep = sweep = ConfigDict()
    sweep.name = "mqar_seeds"
    sweep.mode = "grid"
    sweep.learning_rate = ConfigDict({"rule": "per_shape"})
    # (d_model, n_layers, n_heads, learning_rate)
    sweep.shapes = ((32, 2, 2, 1e-2), (64, 2, 2, 1e-2))
    sweep.axes = ConfigDict()
    sweep.axes.train = ConfigDict({"seed": tuple(range(8))})
    return config
