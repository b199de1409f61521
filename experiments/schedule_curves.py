"""Whole learning curves under five learning-rate schedules, for the laws of whole curves
(``attnlab fit --law=multipower`` / ``--law=annealing``): one size, the same tokens, peak rate,
warmup and data order, two seeds, the rate logged at every step and the validation loss every 20.

    attnlab sweep --config=experiments/schedule_curves.py --sweep=sweeps/schedule_curves
    python docs/scripts/schedule_curves_study.py --sweep=sweeps/schedule_curves

Luo et al. 2025 fit the multi-power law on a constant, a cosine and a two-stage schedule and
predict others; attnlab's schedule classes have no step drop, so a WSD run with a linear
cooldown over its second half stands in for the two-stage run. Fitted on constant, cosine and
wsd50; held out: WSD with a (1 - sqrt) cooldown over the last 20% and a linear decay from the
peak.

Scale ``cpu``: d_model 32, 2 layers (33k parameters), 0.5M tokens (488 steps of 8 x 128 bytes of
``pystdlib``), 2 seeds: 10 runs.
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict

SCHEDULES = {
    "constant": {"train": {"schedule": "constant"}},
    "cosine": {"train": {"schedule": "cosine", "min_lr_ratio": 0.1}},
    "wsd50": {"train": {"schedule": "wsd", "cooldown": "linear", "decay_fraction": 0.5,
                        "min_lr_ratio": 0.0}},
    "wsd20": {"train": {"schedule": "wsd", "cooldown": "1-sqrt", "decay_fraction": 0.2,
                        "min_lr_ratio": 0.0}},
    "linear": {"train": {"schedule": "wsd", "cooldown": "linear", "decay_fraction": 1.0,
                         "min_lr_ratio": 0.0}},
}


def get_config(scale: str = "cpu") -> ConfigDict:
    """``scale``: cpu."""
    config = ConfigDict()
    config.scale = scale

    config.base = base = base_config_dict()
    base.data.source = "pystdlib"
    base.data.seq_len = 128
    base.data.batch_size = 8
    base.train.learning_rate = 7.5e-3  # at d_model = ref_d_model below (wsd_cosine's rule)
    base.train.b2 = 0.99
    base.train.eval_every = 20
    base.train.eval_batches = 8
    base.train.log_every = 1  # every step's rate: the laws sum it
    base.train.checkpoint_every = 1000

    config.sweep = sweep = ConfigDict()
    sweep.name = "schedule_curves"
    sweep.mode = "grid"
    sweep.learning_rate = ConfigDict({"rule": "inverse_width", "ref_d_model": 32})
    sweep.warmup = ConfigDict({"rule": "fraction", "fraction": 0.05})
    sweep.variant_column = "schedule"
    sweep.baseline = "constant"
    sweep.variants = ConfigDict(SCHEDULES)
    sweep.axes = ConfigDict({"train": ConfigDict({"tokens": (500_000,), "seed": (0, 1)})})
    sweep.shapes = ((32, 2, 2),)  # (d_model, n_layers, n_heads)
    return config
