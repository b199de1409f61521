"""In-context linear regression across sequence mixers (Garg et al. 2022's task; the mixers of
experiments/icl.py): each mixer at several widths, scored against least squares.

    attnlab sweep --config=experiments/icl_regression_mixers.py --sweep=sweeps/icl_regression
    attnlab icl --sweep=sweeps/icl_regression   # error / d at the largest k per run, table, plot

Every run trains on fresh prompts (``data.source=regression``) of a vector model
(``model.inputs=vectors``, ``model.objective=regression``); ``attnlab icl --sweep`` scores each on
the task's fixed test prompts and plots the error at the largest k against width, one line per
mixer. The question is Zoology's for regression: does a mixer without softmax attention's
exact lookup (linear attention's fixed-size state, Mamba's selective scan) reach least squares
at the width where softmax does?

Scale ``cpu``: d = 4, k = 8 (least squares is exact from k = 4), no curriculum, batch 256 (at
batch 64 even softmax stays on a plateau, docs/icl.md), 5000 steps; softmax (learned positions),
linear attention and Mamba at widths 32 and 64, 4 layers. Scale ``gpu``: d = 8, k = 16 with
Garg et al.'s curriculum, 24000 steps, every mixer of experiments/icl.py at widths 64-256
(not run).
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict


def mixers(scale: str) -> dict:
    """name -> the variant's config overrides (positions: learned for softmax, none otherwise)."""
    variants = {
        "softmax": {},
        "softmax_nope": {"model": {"pos_encoding": "none"}},
        "window": {"model": {"attention_window": 8}},  # 4 examples back
        "linear": {"model": {"mixer": "linear", "pos_encoding": "none"}},
        "performer": {"model": {"mixer": "performer", "pos_encoding": "none"}},
        "mamba": {"model": {"mixer": "mamba", "pos_encoding": "none"}},
        "hybrid": {"model": {"mixer": "mamba", "attention_every": 2, "pos_encoding": "none"}},
    }
    if scale == "cpu":
        variants = {k: variants[k] for k in ("softmax", "linear", "mamba")}
    return variants


def get_config(scale: str = "cpu") -> ConfigDict:
    config = ConfigDict()
    config.scale = scale

    config.base = base = base_config_dict()
    base.model.inputs = "vectors"
    base.model.objective = "regression"
    base.model.pos_encoding = "learned"
    base.model.mixer_chunk = 16
    base.model.mixer_features = 32
    base.model.ssm_scan = "sequential"  # Mamba's loop over time: faster on a CPU at T = 16
    base.data.source = "regression"
    base.data.batch_size = 256
    base.train.learning_rate = 1e-3
    base.train.warmup_steps = 200
    base.train.weight_decay = 0.0
    base.train.log_every = 100
    base.train.eval_every = 1000
    base.train.eval_batches = 4
    base.train.checkpoint_every = 1000
    if scale == "gpu":
        dim, examples = 8, 16
        base.data.icl_curriculum_every = 1000
        base.data.icl_dim_start, base.data.icl_examples_start = 2, 5
        base.model.ssm_scan = "associative"
        base.train.steps = 24_000
    else:
        dim, examples = 4, 8
        base.train.steps = 5000
    base.model.input_dim = base.data.icl_dim = dim
    base.data.icl_examples = examples
    base.data.seq_len = base.model.max_len = 2 * examples

    config.sweep = sweep = ConfigDict()
    sweep.name = "icl_regression_mixers"
    sweep.mode = "grid"
    sweep.learning_rate = ConfigDict({"rule": "per_shape"})
    # (d_model, n_layers, n_heads, learning_rate)
    sweep.shapes = ((32, 4, 4, 1e-3), (64, 4, 4, 1e-3))
    if scale == "gpu":
        sweep.shapes = ((64, 4, 4, 1e-3), (128, 4, 4, 1e-3), (256, 4, 8, 1e-3))
    sweep.axes = ConfigDict()
    sweep.axes.train = ConfigDict({"seed": (0,)})
    sweep.variant_column = "mixer_variant"
    sweep.variants = ConfigDict(mixers(scale))
    return config
