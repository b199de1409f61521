"""The architecture study's arms, each with its own tuned learning rate (a tuning stage run by the
same command: ``sweep.tune``, learning-rate rule ``tuned``; docs/sweeps.md, docs/mup.md).

    attnlab sweep --config=experiments/architectures_tuned.py --sweep=sweeps/arch_tuned --dry-run
    attnlab sweep --config=experiments/architectures_tuned.py --sweep=sweeps/arch_tuned

``attnlab sweep`` first trains every arm's proxies (``DIR/tune``: widths 16, 32, 64 at a
factor-2 learning-rate grid, two seeds), writes each arm's pick to ``DIR/tuning.json``, then trains
the study at those rates. The arms are experiments/architectures.py's. Those muP is defined for
(softmax attention with 1/d_k scores: gpt, alibi, window) train under muP with base width 16 and
take the best rate of the widest proxy at every width (muTransfer, Yang et al. 2022); muP refuses
the others (cosine attention's own score scale, linear attention, nGPT, Mamba, the mixture of
experts, the hybrid: attnlab/model/parameterization.py), so they train under the standard
parameterisation at ``lr(d) = lr(16) (d / 16)^-p``, the power law fitted to their own best rates
at the three proxy widths. Rerunning the command trains nothing; an interrupted run resumes.

Scale ``cpu``: the study is a width series (not an IsoFLOP ladder, to keep it small): widths
16-128 (2 layers, 2 heads), 300 steps of 8 x 64 pystdlib bytes, seed 0, 32 runs; the tuning stage
trains 3 widths x 9 learning rates (2^-10..2^-2) x 2 seeds x 8 arms = 432 proxy runs of 100
steps. ``small`` (``--config=experiments/architectures_tuned.py:small``) is the cpu
scale with five arms (gpt and alibi under muP; cosine, linear and ngpt under sp; Mamba's scan and
the mixture of experts are the slow ones on a CPU) and 200-step study runs: 270 proxy runs and 20
study runs (docs/mup.md has its picks and times). Scale ``gpu``: widths 64-512 (4 layers,
4 heads), the hybrid arm added; not run.
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict

# The arms muP is defined for; the others keep the standard parameterisation
# (tests/test_sweep_tuning.py checks that muP refuses exactly those).
MUP_ARMS = ("gpt", "alibi", "window")


def architectures(scale: str) -> dict:
    """name -> the variant section (experiments/architectures.py's arms)."""
    window = 16 if scale == "cpu" else 64  # a quarter of the training context
    variants = {
        "gpt": {},
        "alibi": {"model": {"pos_encoding": "alibi"}},
        "cosine": {"model": {"attention_scale": "cosine"}},
        "window": {"model": {"attention_window": window}},
        "linear": {"model": {"mixer": "linear", "pos_encoding": "none"}},
        # nGPT's config refuses warmup and weight decay (Loshchilov et al. 2024 use neither).
        "ngpt": {"model": {"ngpt": True, "ffn": "swiglu"},
                 "train": {"weight_decay": 0.0, "warmup_steps": 0},
                 "warmup": {"rule": "fixed"}},
        "mamba": {"model": {"mixer": "mamba", "pos_encoding": "none"}},
        "moe": {"model": {"moe": "token_choice", "moe_experts": 8, "moe_top_k": 1}},
    }
    if scale == "gpu":
        variants["hybrid"] = {"model": {"mixer": "mamba", "attention_every": 2}}
    return variants


SMALL_ARMS = ("gpt", "alibi", "cosine", "linear", "ngpt")


def get_config(scale: str = "cpu") -> ConfigDict:
    """``scale``: cpu, gpu, or small (the cpu scale with five arms and shorter study runs)."""
    small = scale == "small"
    scale = "cpu" if small else scale
    config = ConfigDict()
    config.scale = scale
    gpu = scale == "gpu"
    base_width = 64 if gpu else 16
    heads, layers = (4, 4) if gpu else (2, 2)

    config.base = base = base_config_dict()
    base.data.source = "pystdlib"
    base.data.seq_len = 256 if gpu else 64
    base.data.batch_size = 32 if gpu else 8
    base.model.max_len = base.data.seq_len
    if gpu:
        base.model.dtype = "bfloat16"
    base.train.steps = 2000 if gpu else 200 if small else 300
    base.train.b2 = 0.99  # Porian et al. 2024: beta2 = 0.95 is too low for small batches
    base.train.eval_every = 1_000_000  # scored once, at the end
    base.train.eval_batches = 16
    base.train.log_every = 25
    base.train.checkpoint_every = 100

    config.sweep = sweep = ConfigDict()
    sweep.name = "architectures_tuned_small" if small else "architectures_tuned"
    sweep.mode = "grid"
    widths = (64, 128, 256, 512) if gpu else (16, 32, 64, 128)
    sweep.shapes = tuple((d, layers, heads) for d in widths)
    sweep.axes = ConfigDict({"train": {"seed": (0,)}})
    sweep.warmup = ConfigDict({"rule": "fraction", "fraction": 0.05})
    sweep.learning_rate = ConfigDict({"rule": "tuned"})
    sweep.tune = ConfigDict({
        "shapes": tuple((d, layers, heads) for d in widths[:3]),
        # 2^-10..2^-2 on a CPU: nGPT's best (2^-5, then 2^-4) sat at the edge of shorter grids
        "learning_rates": tuple(2.0 ** e for e in (range(-12, -3) if gpu else range(-10, -1))),
        "seeds": (0, 1),
        "steps": 500 if gpu else 100,
    })
    sweep.variant_column = "architecture"
    sweep.baseline = "gpt"
    variants = architectures(scale)
    if small:
        variants = {name: variants[name] for name in SMALL_ARMS}
    mup = {"parameterization": "mup", "mup_base_d_model": base_width, "attention_scale": "mup"}
    for name in set(MUP_ARMS) & set(variants):
        variants[name] = {**variants[name],
                          "model": {**variants[name].get("model", {}), **mup}}
    sweep.variants = ConfigDict(variants)
    return config
