"""The architecture scaling study: one IsoFLOP ladder per sequence mixer, one law each.

    attnlab quickstart --config=experiments/architectures.py --sweep=sweeps/architectures
    attnlab sweep --config=experiments/architectures.py --sweep=sweeps/architectures --dry-run
    attnlab quickstart --config=experiments/architectures.py:gpu --sweep=sweeps/arch_gpu

Each architecture is a named variant of one sweep (``sweep.variants``): the same budgets, shape
list, data order (one data seed, one corpus), learning-rate rule and schedule rules, with the
variant's config overrides on the base. The results table names it in the ``architecture``
column, so ``attnlab fit --by=architecture`` fits one law per architecture, and the quickstart
(which sees ``sweep.variant_column``) prints per-architecture approach-3 and approach-2 fits with
95% bootstrap intervals, a ranking at a reference compute, each architecture's effective compute
multiplier against the baseline (``sweep.baseline``: gpt) at that compute and its loss difference
at the largest budget (multipliers.csv / .json), the frontiers in one plot and the r(4x)
extrapolation ratio of each architecture's largest run.

Architectures (papers in docs/attention.md and docs/design.md):

    gpt      pre-LN GPT, GELU MLP, RoPE (Su et al. 2021): the baseline
    alibi    ALiBi linear biases, no rotation (Press et al. 2022)
    cosine   cosine attention: q, k L2-normalised, learned temperature (Henry et al. 2020)
    window   sliding-window attention, each query sees the last seq_len/4 keys (Beltagy 2020)
    linear   elu+1 linear attention (Katharopoulos et al. 2020), no positions (causal order only)
    ngpt     nGPT (Loshchilov et al. 2024): all on the unit sphere, SwiGLU, RoPE, no warmup or
             weight decay (its config refuses both)
    mamba    Mamba selective SSM blocks (Gu & Dao 2023), no positions
    hybrid   (gpu scale) Mamba with every second layer softmax attention (RoPE)
    moe      the gpt baseline with each FFN replaced by 8 experts of its width, Switch top-1
             routing (Fedus et al. 2021): the shape's active parameters and FLOPs are the
             baseline's plus the router's, its total parameters ~8x the FFN's

FLOPs are counted per architecture by each mixer's own formula (``attnlab.model.flops_per_token``,
Chinchilla's full count: the softmax terms for attention, the band's width for the window, the
state products for linear attention, the scan for Mamba), so every architecture's run at budget C
spends C FLOPs in its own count and trains for D = C / (its FLOPs per token) tokens.

Ladders: every budget trains the shapes within ``span`` of a prior optimum N*(C) (``sweep.centre``,
per architecture where it differs). The prior is the quickstart's own IsoFLOP minima (39k
parameters at 9e11 FLOPs, N* ~ C^0.6, docs/results.md) for the softmax family; no earlier
measurement exists for the others, so they start from the same prior with a wider span (approach
2 flags a budget whose minimum sits at a ladder's edge).

Scale ``cpu``: three budgets 2.5x apart (6e10, 1.5e11, 3.75e11 FLOPs), 4-5 sizes each, eight
architectures, 112 runs, 2.3e13 FLOPs (Chinchilla's count). Measured 2026-11-28 on the 2-core VM
beside other sweeps: 128 min of training in all (Mamba's scan 84 min of it), then 4.3 min of
fits, r(4x) and plots; results in docs/results.md ("Architecture scaling study") and
docs/results/architectures_cpu.csv. `--dry-run` times each architecture's own shapes on your
machine. Scale ``gpu``: budgets 1e13-1e14, 0.1M-6.4M parameters, the hybrid added; 25 of its 85
runs ran on a lent H200 (docs/benchmarks.md, "Second lent session").

Scales ``cpu_tuned`` and ``gpu_tuned``: every architecture's points at their own best peak rate,
not one rule for all: the plan at the rule's rate times 1/2, 1 and 2 (the runs at 1 are the
untuned plan's), and up to 2 rates more past either end where a point's best is at the end
(``sweep.learning_rate.refine``); at cpu Mamba's, ALiBi's and MoE's ladders reach past the
largest sizes where their best runs sat (ALiBi's widest), and the plan is 384 runs before
refining, 485 after (measured: 3.1 h of run time for the seven other arms, niced beside other
work, 46 min for Mamba's 74 and 7.5 min for ALiBi's and MoE's 45 wider-ladder runs, with
``--parallel 2``). Fit
and compare at those rates:
``attnlab fit --sweep=DIR --law=chinchilla --by=architecture --best-over=train.learning_rate
--multiplier-against=gpt``.

Scale ``cpu_tuned_pair``: GPT and Mamba at the largest budget, every size at every tuned rate,
seeds 0 and 1 (seed 0's are ``cpu_tuned``'s own runs, the same ids): the two-seed check of
Mamba's lead, compared at held-out picks in docs/results.md.
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict

# The quickstart's prior as of its four-budget plan (experiments/quickstart.py has since moved
# on): N* = 39k parameters at 9e11 FLOPs, ~C^0.6; kept so this study's finished runs keep their ids.
_PRIOR = {"n_opt": 39e3, "budget": 9e11, "exponent": 0.6}


def architectures(scale: str) -> dict:
    """name -> the variant section: config overrides, and rules where they differ."""
    window = 32 if scale == "cpu" else 64  # a quarter of the training context
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


def get_config(scale: str = "cpu") -> ConfigDict:
    """``scale``: cpu, gpu, or cpu_tuned / gpu_tuned (every point at 3 peak rates, refined), or
    cpu_tuned_pair (Mamba and GPT at the largest budget with a second seed)."""
    paired = scale.endswith("_pair")
    scale = scale.removesuffix("_pair")
    tuned = scale.endswith("_tuned")
    scale = scale.removesuffix("_tuned")
    config = ConfigDict()
    config.scale = scale

    config.base = base = base_config_dict()
    base.data.source = "pystdlib"
    base.train.learning_rate = 1e-2  # at d_model = ref_d_model below
    base.train.b2 = 0.99  # Porian et al. 2024: beta2 = 0.95 is too low for small batches
    base.train.eval_every = 1_000_000  # isoflop runs are scored once, at their end
    base.train.eval_batches = 16
    base.train.log_every = 25
    base.train.checkpoint_every = 1000

    config.sweep = sweep = ConfigDict()
    sweep.name = "architectures"
    sweep.mode = "isoflop"
    sweep.flops_per_token = "chinchilla"  # each mixer's own count, embeddings and head included
    sweep.learning_rate = ConfigDict({"rule": "inverse_width", "ref_d_model": 32})
    sweep.warmup = ConfigDict({"rule": "fraction", "fraction": 0.05})
    sweep.min_steps = 50
    sweep.variant_column = "architecture"
    sweep.baseline = "gpt"  # the report's effective compute multipliers are against it
    sweep.variants = ConfigDict(architectures(scale))

    if scale == "gpu":
        base.data.seq_len = 256
        base.data.batch_size = 32
        base.model.dtype = "bfloat16"
        base.train.learning_rate = 3e-3  # at d_model = 128
        base.train.eval_batches = 32
        sweep.learning_rate.ref_d_model = 128
        sweep.min_steps = 100
        sweep.budgets = (1e13, 3e13, 1e14)
        # (d_model, n_layers, n_heads): 0.1M to 6.4M parameters, head_dim 32.
        sweep.shapes = ((64, 2, 2), (96, 2, 3), (128, 2, 4), (128, 4, 4), (192, 4, 6),
                        (192, 6, 6), (256, 8, 8), (320, 8, 10))
        sweep.centre = ConfigDict({"n_opt": 1.5e6, "budget": 1e14, "exponent": 0.55,
                                   "span": 3.0})
        sweep.max_epochs = 1.0  # checked where it runs (experiments/quickstart.py:gpu says why)
    else:
        base.data.seq_len = 128
        base.data.batch_size = 8
        sweep.budgets = (6e10, 1.5e11, 3.75e11)
        # (d_model, n_layers, n_heads): 2.9k to 115k parameters, about 1.5x apart.
        sweep.shapes = ((8, 1, 1), (12, 1, 1), (16, 1, 1), (20, 1, 1), (24, 1, 2), (32, 1, 2),
                        (32, 2, 2), (40, 2, 2), (48, 2, 3), (64, 2, 4))
        sweep.centre = ConfigDict({**_PRIOR, "span": 2.5})
    if tuned:  # each architecture's points at their own best rate
        sweep.name = "architectures_isoflop_tuned"
        sweep.learning_rate.factors = (0.5, 1.0, 2.0)
        sweep.learning_rate.refine = 2
        if scale == "cpu":  # these arms' best runs lay at a ladder's top: reach past it
            for arm, span in (("alibi", 4.0), ("mamba", 3.2), ("moe", 3.2)):
                sweep.variants[arm].centre = ConfigDict({**_PRIOR, "n_opt": 5e4, "span": span})
    if paired:  # the tuned plan's runs, seed 0's under the same ids
        sweep.budgets = sweep.budgets[-1:]
        sweep.variants = ConfigDict({k: sweep.variants[k].to_dict() for k in ("gpt", "mamba")})
        sweep.axes = ConfigDict({"train": ConfigDict({"seed": (0, 1)})})
    return config
