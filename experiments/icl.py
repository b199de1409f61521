"""In-context learning across sequence mixers: multi-query associative recall (Arora et al. 2023,
"Zoology", Fig. 2) at several widths per mixer.

    attnlab sweep --config=experiments/icl.py --sweep=sweeps/icl --dry-run
    attnlab sweep --config=experiments/icl.py --sweep=sweeps/icl
    attnlab icl --sweep=sweeps/icl          # accuracy per run, the table and the plot

Each mixer is a named variant (``sweep.variants``) on one grid of widths; every run trains on
fresh MQAR windows (``data.source=mqar``: ``mqar_pairs`` key-value pairs, then every key
queried) and ``attnlab icl --sweep`` scores the argmax at every answer on the task's fixed
validation windows, writing ``icl_table.csv`` and ``icl_accuracy.png`` (accuracy against width,
one line per mixer) in the sweep directory.

Mixers: softmax attention with RoPE, NoPE and ALiBi; a sliding window of 16 keys; linear
attention (elu+1); Performer (FAVOR+); Mamba; a hybrid (Mamba with every second layer softmax).
Zoology's finding to compare with: attention solves MQAR at the smallest width, gated
convolutions and SSMs need a width that grows with the number of pairs.

As Zoology's MQAR models, the blocks have no FFN (``model.ffn=none``: the mixer alone recalls)
and the loss is taken on the answers alone (``data.loss_on=answers``: the context's random keys
and values are noise).

Scale ``cpu``: three mixers (softmax with RoPE, linear, Mamba), 2 layers, widths 32 and 64,
8 pairs in 32 tokens, 3000 steps of 64 windows at lr 1e-2. Scale ``gpu``: all eight mixers,
64 pairs in 256 tokens, widths 64-512, 20k steps (not run).
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict


def mixers(scale: str) -> dict:
    """name -> the variant's config overrides."""
    window = 16 if scale != "gpu" else 64
    variants = {
        "softmax_rope": {},
        "softmax_nope": {"model": {"pos_encoding": "none"}},
        "softmax_alibi": {"model": {"pos_encoding": "alibi"}},
        "window": {"model": {"attention_window": window}},
        "linear": {"model": {"mixer": "linear", "pos_encoding": "none"}},
        "performer": {"model": {"mixer": "performer", "pos_encoding": "none"}},
        "mamba": {"model": {"mixer": "mamba", "pos_encoding": "none"}},
        "hybrid": {"model": {"mixer": "mamba", "attention_every": 2, "pos_encoding": "none"}},
    }
    if scale == "cpu":  # what a 2-core CPU trains in minutes
        variants = {k: variants[k] for k in ("softmax_rope", "linear", "mamba")}
    return variants


def get_config(scale: str = "cpu") -> ConfigDict:
    config = ConfigDict()
    config.scale = scale

    config.base = base = base_config_dict()
    base.model.vocab_size = 64
    base.model.max_len = 64
    base.model.mixer_chunk = 16
    base.model.mixer_features = 32
    base.model.ffn = "none"
    base.model.ssm_scan = "sequential"  # Mamba's loop over time: 2-3x faster on CPU at T = 32
    base.data.source = "mqar"
    base.data.task_vocab = 64
    base.data.mqar_pairs = 8
    base.data.seq_len = 32
    base.data.batch_size = 64
    base.data.loss_on = "answers"
    base.train.steps = 3000
    base.train.warmup_steps = 100
    base.train.weight_decay = 0.0
    base.train.log_every = 100
    base.train.eval_every = 1000
    base.train.eval_batches = 4
    base.train.checkpoint_every = 1000

    config.sweep = sweep = ConfigDict()
    sweep.name = "icl_mqar"
    sweep.mode = "grid"
    sweep.learning_rate = ConfigDict({"rule": "per_shape"})
    # (d_model, n_layers, n_heads, learning_rate)
    sweep.shapes = ((32, 2, 2, 1e-2), (64, 2, 2, 1e-2))
    sweep.axes = ConfigDict()
    sweep.axes.train = ConfigDict({"seed": (0,)})
    sweep.variant_column = "mixer_variant"
    sweep.variants = ConfigDict(mixers(scale))

    if scale == "gpu":
        base.model.vocab_size = 8192
        base.model.max_len = 256
        base.data.task_vocab = 8192
        base.data.mqar_pairs = 64
        base.data.seq_len = 256
        base.data.batch_size = 64
        base.model.dtype = "bfloat16"
        base.model.ssm_scan = "associative"
        base.train.steps = 20_000
        base.train.checkpoint_every = 5000
        base.train.eval_every = 5000
        sweep.shapes = ((64, 2, 2, 1e-3), (128, 2, 2, 1e-3), (256, 2, 4, 1e-3),
                        (512, 2, 8, 1e-3))
    return config
