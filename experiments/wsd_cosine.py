"""The known answer behind cooldown ladders: WSD with a short (1 - sqrt) cooldown against a cosine
schedule of the same length, at the same tokens, several sizes and seeds.

    attnlab sweep --config=experiments/wsd_cosine.py --sweep=sweeps/wsd_cosine --dry-run
    attnlab sweep --config=experiments/wsd_cosine.py --sweep=sweeps/wsd_cosine
    attnlab compare --sweep=sweeps/wsd_cosine --by=schedule --baseline=cosine

Hägele et al. 2024 ("Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations",
Fig. 3-4): warmup, a constant learning rate, then a cooldown over the last ~20% of the steps in
the (1 - sqrt) shape reaches the loss of a cosine schedule tuned to that length (cosine to 10% of
the peak; the cooldown to zero). A ladder sweep's branches are exactly such runs, so this is the
check that a branch's loss is the loss a fixed-length study would have measured.

Three arms (``sweep.variants``, named in the ``schedule`` column: cosine to 10%, cosine to zero
and wsd) of the same shapes, tokens, peak learning rate (7.5e-3 x 32 / d_model, the quickstart's
rule), warmup and data order; three training seeds each (the seeds of one shape and arm train as
one ensemble). `attnlab compare` pairs each
wsd point with the cosine point of the same size and tokens: the mean difference over seeds with a
bootstrap interval, per size and pooled.

Scale ``cpu``: 3 sizes (10k, 33k, 68k parameters, 2 layers) x 3 schedules x 3 seeds at 0.5M tokens
(490 steps of 8 x 128 bytes of ``pystdlib``): 27 runs, 5.0e12 FLOPs (Chinchilla's count, the
dry run's).

Scale ``cpu_tuned`` (and ``gpu_tuned``): each schedule at its own best rate, as Hägele et al. tune
each schedule. The same plan at 5 peak rates (the rule's times 1/2 .. 8, where the shared rate
above sat low for cosine): 135 runs, each (shape, schedule) picking its rate by its mean loss over
the seeds, then compared at those picks:

    attnlab sweep --config=experiments/wsd_cosine.py:cpu_tuned --sweep=sweeps/wsd_cosine_tuned
    attnlab compare --sweep=sweeps/wsd_cosine_tuned --by=schedule --baseline=cosine \
        --pair=train.seed --best-over=train.learning_rate
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict

SCHEDULES = {
    # Cosine to 10% of the peak, as Hägele et al.'s baseline.
    "cosine": {"train": {"schedule": "cosine", "min_lr_ratio": 0.1}},
    # Cosine to zero: separates the schedule's shape from its final learning rate.
    "cosine0": {"train": {"schedule": "cosine", "min_lr_ratio": 0.0}},
    # Constant after warmup, then (1 - sqrt) to zero over the last 20% of the steps.
    "wsd": {"train": {"schedule": "wsd", "cooldown": "1-sqrt", "decay_fraction": 0.2,
                      "min_lr_ratio": 0.0}},
}


def get_config(scale: str = "cpu") -> ConfigDict:
    """``scale``: cpu, gpu, or cpu_tuned / gpu_tuned (every schedule at 5 peak rates)."""
    tuned = scale.endswith("_tuned")
    scale = scale.removesuffix("_tuned")
    config = ConfigDict()
    config.scale = scale

    config.base = base = base_config_dict()
    base.data.source = "pystdlib"
    base.data.seq_len = 128
    base.data.batch_size = 8
    base.train.learning_rate = 7.5e-3  # at d_model = ref_d_model below
    base.train.b2 = 0.99
    base.train.eval_every = 1_000_000  # scored once, at the end
    base.train.eval_batches = 16
    base.train.log_every = 25
    base.train.checkpoint_every = 1000

    config.sweep = sweep = ConfigDict()
    sweep.name = "wsd_cosine"
    sweep.mode = "grid"
    sweep.learning_rate = ConfigDict({"rule": "inverse_width", "ref_d_model": 32})
    sweep.warmup = ConfigDict({"rule": "fraction", "fraction": 0.05})
    sweep.variant_column = "schedule"
    sweep.baseline = "cosine"
    sweep.variants = ConfigDict(SCHEDULES)
    sweep.axes = ConfigDict({"train": ConfigDict({"tokens": (500_000,), "seed": (0, 1, 2)})})
    # (d_model, n_layers, n_heads)
    sweep.shapes = ((16, 2, 2), (32, 2, 2), (48, 2, 2))
    if scale == "gpu":
        base.data.seq_len = 256
        base.data.batch_size = 32
        sweep.shapes = ((64, 2, 2), (128, 4, 4), (256, 8, 8))
        sweep.axes.train.tokens = (50_000_000,)
    if tuned:
        sweep.name = "wsd_cosine_tuned"
        sweep.learning_rate.factors = (0.5, 1.0, 2.0, 4.0, 8.0)
    return config
