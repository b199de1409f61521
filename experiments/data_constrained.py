"""The data-constrained study (issue #47; Muennighoff et al. 2023): models trained on slices of
the Python standard library corpus repeated about 1-16 times, fitted by ``attnlab fit
--law=data_constrained`` (docs/scaling.md, "The data-constrained law").

    attnlab sweep --config=experiments/data_constrained.py --sweep=sweeps/data_constrained \
        --dry-run
    attnlab sweep --config=experiments/data_constrained.py --sweep=sweeps/data_constrained
    attnlab fit --sweep=sweeps/data_constrained --law=data_constrained --bootstrap=200

``data.max_bytes`` builds a smaller, separately cached slice of the corpus, 90% of it the
training split (byte tokens: about 0.9 tokens per byte of the slice), so a run's unique tokens
U_D are fixed by its slice and its repeats by ``train.tokens``: the results table's
``unique_tokens`` and ``epochs`` columns say what each run saw, and the law reads them (a run
shorter than its slice saw D unique tokens, epochs 1).

Scale cpu: 3 shapes (d_model 32, 64, 96; 2-3 layers) x 2 slices (280 kB, about 250k training
tokens, and 1.1 MB, about 1M) x 5 token counts (250k-4M, x2 apart): 30 runs, the small slice
repeated about 1-16 times, the large one 0.25-4. Every run scored once, at its end, on the
slice's validation split (files never trained on).
Scale gpu: d_model 128-512, slices of 2.8 MB and 11 MB, 2.5M-40M tokens.
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict

# Training tokens per byte of a slice: its training split is 90% of it, one token per byte.
TRAIN_SHARE = 0.9
EPOCHS = (1, 2, 4, 8, 16)  # of the smaller slice


def get_config(scale: str = "cpu") -> ConfigDict:
    """``scale``: cpu or gpu."""
    config = ConfigDict()
    config.scale = scale
    slices = (280_000, 1_120_000) if scale == "cpu" else (2_800_000, 11_200_000)
    unique = int(TRAIN_SHARE * slices[0])

    config.base = base = base_config_dict()
    base.model.max_len = 128
    base.data.source = "pystdlib"
    base.data.tokenizer = "byte"
    base.data.seq_len = 128
    base.data.batch_size = 16
    base.train.learning_rate = 1e-2  # the prior at d_model = 32
    base.train.warmup_steps = 20
    base.train.eval_every = 1_000_000  # each run is scored once, at its end
    # cpu: the 280 kB slice's validation split holds 109 windows of 128 tokens: 6 x 16 fit
    base.train.eval_batches = 6 if scale == "cpu" else 8
    base.train.log_every = 50
    base.train.checkpoint_every = 1000

    config.sweep = sweep = ConfigDict()
    sweep.name = "data_constrained"
    sweep.mode = "grid"
    sweep.flops_per_token = "chinchilla"
    sweep.learning_rate = ConfigDict({"rule": "inverse_width", "ref_d_model": 32})
    sweep.warmup = ConfigDict({"rule": "fixed"})
    sweep.shapes = ((32, 2, 2), (64, 2, 4), (96, 3, 4))  # (d_model, n_layers, n_heads)
    sweep.axes = ConfigDict()
    sweep.axes.data = ConfigDict({"max_bytes": slices})
    sweep.axes.train = ConfigDict({"tokens": tuple(e * unique for e in EPOCHS)})
    if scale == "gpu":
        base.data.batch_size = 64
        base.train.warmup_steps = 100
        sweep.shapes = ((128, 4, 4), (256, 4, 4), (512, 6, 8))
    return config
