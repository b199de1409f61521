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

Scale ``ladder``: the same shape, data, peak rate and 25-step warmup as a WSD ladder: per seed a
constant-rate trunk and (1 - sqrt) cooldown branches over the last 20% of 125k, 250k, 500k and
1M tokens (122-977 steps), 2 seeds: 10 runs. The laws fitted on a trunk and its shortest branch
predict the longer branches' cooldowns (docs/scripts/schedule_ladder_study.py):

    attnlab sweep --config=experiments/schedule_curves.py:ladder --sweep=sweeps/schedule_ladder

Scale ``family``: the ``cpu`` plan's shape, tokens, peak and warmup under a family of schedules
for one budget, WSD's cooldown over the last 10, 20, 30 or 50% (linear or 1 - sqrt) and cosine
to 0, 10 or 30% of the peak: 11 schedules x 2 seeds, 22 runs. The laws fitted at ``cpu`` rank
them before they are trained (docs/scripts/schedule_family_study.py):

    attnlab sweep --config=experiments/schedule_curves.py:family --sweep=sweeps/schedule_family
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


# One budget's candidate schedules: WSD's cooldown length and shape, cosine's floor.
FAMILY = {
    **{f"wsd{int(100 * f)}_{name}": {"train": {"schedule": "wsd", "cooldown": cooldown,
                                              "decay_fraction": f, "min_lr_ratio": 0.0}}
       for f in (0.1, 0.2, 0.3, 0.5) for name, cooldown in (("linear", "linear"),
                                                           ("sqrt", "1-sqrt"))},
    **{f"cosine{int(100 * r)}": {"train": {"schedule": "cosine", "min_lr_ratio": r}}
       for r in (0.0, 0.1, 0.3)},
}


def get_config(scale: str = "cpu") -> ConfigDict:
    """``scale``: cpu, ladder, family."""
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
    if scale == "ladder":
        return _as_ladder(config)
    if scale == "family":
        config.scale = "cpu"
        sweep.name = "schedule_family"
        sweep.baseline = "cosine10"
        sweep.variants = ConfigDict(FAMILY)
    return config


def _as_ladder(config: ConfigDict) -> ConfigDict:
    base, sweep = config.base, config.sweep
    config.scale = "cpu"
    base.train.warmup_steps = 25  # the cpu scale's 5% of 488 steps, fixed for every branch
    base.train.min_lr_ratio = 0.0
    sweep.name = "schedule_ladder"
    sweep.mode = "ladder"
    sweep.warmup = ConfigDict({"rule": "fixed"})
    for key in ("variant_column", "baseline", "variants"):
        del sweep[key]
    sweep.axes = ConfigDict({"train": ConfigDict({"seed": (0, 1)})})
    sweep.branches = ConfigDict({"tokens": (125_000, 250_000, 500_000, 1_000_000),
                                 "params": "total", "cooldown": "1-sqrt", "fraction": 0.2})
    return config
