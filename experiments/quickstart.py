"""The quick scaling study behind `attnlab quickstart`: an IsoFLOP sweep on the embedded corpus.

    attnlab quickstart                                     # sweep + Chinchilla fits + plots
    attnlab quickstart --config.scale=gpu --sweep=runs/quickstart_gpu
    attnlab sweep --config=experiments/quickstart.py --sweep=runs/quickstart --dry-run

Three compute budgets C a factor of 2.5 apart (1.2e11, 3e11, 7.5e11 FLOPs), each with the
byte-level models near its own optimum: from a list of twelve shapes (4.9k to 115k parameters,
1.2-1.4x apart), `sweep.centre` keeps at budget C those within 2.3x of the prior optimum
N*(C) = 39k (C / 9.4e11)^0.65, 6-7 sizes per budget, 20 runs in all. Each (C, N) pair trains for
D = C / (FLOPs per token) tokens of the `pystdlib` corpus (the Python standard library's own
source, built on first use, nothing downloaded): enough points for approach 3's five parameters
and a profile per budget for approach 2. FLOPs are the full Chinchilla count (embeddings,
attention and the output head: Porian et al. 2024 found that leaving the head out skews
small-scale fits), so the fit's C is about 10 N D here rather than 6 N D.

The prior comes from this study's previous plan (four budgets 6e10-9.4e11 with 4-5 sizes each,
docs/results.md): its approach-2 minima were 11.5k parameters at 1.5e11 FLOPs, 22.5k at 3.75e11
and 38.9k at 9.4e11 (a = 0.65). That plan's 6e10 profile was flat within the run-to-run noise,
and with 4-5 sizes a bootstrap replicate often lost the sizes around a minimum, so a's interval
was 0.40 wide; 6-7 sizes per budget at three budgets give 0.27 for a little more compute
(8.1e12 FLOPs against 6.6e12).

Training follows Porian et al. 2024's small-scale fixes: a 5% warmup, a cosine decay spanning
exactly each run (the schedule is built from the run's own length), AdamW beta2 = 0.99 for the
small batch (8 x 128 = 1,024 tokens: halving it from 2,048 lowered the loss of 12 of 13 runs
compared, by up to 0.25 nats), and a peak learning rate falling as 1/width from 1e-2 at
d_model = 32 (muP-lite).

Time (`scale=cpu`): from a fresh clone on 2026-11-23 the study took 5.5 min on the idle 2-core
VM (5.4 min of sweep); `attnlab sweep ... --dry-run` (above) times a few real steps on your
machine. A rerun reuses the finished runs and only refits. That run found approach 2's
N_opt ~ C^0.72 (95% interval 0.56-0.83; Hoffmann et al.: 0.49) with every budget's minimum
inside its ladder, and a loose approach 3 (L = 1.39 + 81/N^0.56 + 5.2e8/D^1.56, a in
[0.15, 0.89]): ladders centred on each optimum vary N and D together (docs/results.md).

`scale=gpu` (`--config=experiments/quickstart.py:gpu`) keeps the layout at ~250x the compute:
budgets 1e13, 2e13, 5e13, 1e14 FLOPs, each with the sizes (of eleven, 33k to 6.4M parameters)
within 2.4x of N* = 0.6M (C / 1e14)^0.75, batches of 32 x 256 tokens, bfloat16, at least 100
steps per run, three seeds per point: 42 runs, 2.1e15 FLOPs, no run reading the 28.6M-token
corpus more than once (the smallest size at 1e14, 0.43M, reads it 0.98 times). Its design
check (`--dry-run`) expects 95% widths of 0.24 for approach 3's a and 0.20 for E at 1% seed
noise (two seeds: 0.30, over the 0.25 target). Peak learning rate: the
inverse-width rule above (3e-3 at d_model = 128), untuned. The first run on an H200
(2026-11-27, docs/results/device_h200_2026-11-27b/: 40 runs in about 6 minutes with 4 workers)
was centred on N* = 1.5M (C / 1e14)^0.6; every budget's best run was its smallest size below
1e14, so approach 2 had one usable profile and approach 3's a was not pinned ([0.04, 0.92]).
The centre above comes from that run; the 20 runs the two plans share keep their run ids.

Scale ``cpu_tuned`` (and ``gpu_tuned``): every (C, N) point at its own best peak rate, as
Porian et al. 2024 tune each size before fitting. The same plan at 4 peak rates (the rule's
times 1/2 .. 4; at ``gpu`` 1 .. 8), 80 runs at ``cpu`` (the 20 at factor 1 keep the untuned study's run ids), and
up to 2 rates more past either end for a point whose best is at the end
(``sweep.learning_rate.refine``); the fit reads each point at the rate with its lowest loss:

    attnlab sweep --config=experiments/quickstart.py:cpu_tuned --sweep=sweeps/quickstart_tuned
    attnlab fit --sweep=sweeps/quickstart_tuned --law=chinchilla --approach=2 \
        --best-over=train.learning_rate
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict


def get_config(scale: str = "cpu") -> ConfigDict:
    """``scale``: cpu, gpu, or cpu_tuned / gpu_tuned (every point at 4 peak rates)."""
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

    config.sweep = sweep = ConfigDict()
    sweep.name = "quickstart"
    sweep.mode = "isoflop"
    sweep.flops_per_token = "chinchilla"  # includes embeddings, attention and the output head
    sweep.learning_rate = ConfigDict({"rule": "inverse_width", "ref_d_model": 32})
    sweep.warmup = ConfigDict({"rule": "fraction", "fraction": 0.05})
    sweep.min_steps = 50
    # Seeds per point: --config.sweep.axes.train.seed='(0,1)' trains two of each run, as one
    # ensemble (one compiled program); the fits take each seed as a point of its own.
    sweep.axes = ConfigDict({"train": ConfigDict({"seed": (0,)})})

    if scale == "gpu":
        base.data.seq_len = 256
        base.data.batch_size = 32
        base.model.dtype = "bfloat16"
        base.train.learning_rate = 3e-3  # at d_model = 128
        base.train.checkpoint_every = 1000
        base.train.eval_batches = 32
        sweep.learning_rate.ref_d_model = 128
        sweep.min_steps = 100
        sweep.budgets = (1e13, 2e13, 5e13, 1e14)
        # (d_model, n_layers, n_heads): 35k to 6.4M parameters, head_dim 24-32.
        sweep.shapes = ((32, 2, 1), (48, 2, 2), (64, 2, 2), (96, 2, 3), (128, 2, 4),
                        (128, 3, 4), (128, 4, 4), (160, 4, 5), (192, 4, 6), (192, 6, 6),
                        (256, 8, 8))
        # Each budget's sizes within 2.4x of N* = 0.6M (C / 1e14)^0.75: the first run of this
        # plan on an H200 (docs/results/device_h200_2026-11-27b/, centred on 1.5M (C/1e14)^0.6)
        # found every budget's best run at its smallest size below 1e14, and 0.43M and 0.82M
        # tied at 1e14. Below 0.43M a run at 1e14 would read the corpus more than once.
        sweep.centre = ConfigDict({"n_opt": 6e5, "budget": 1e14, "exponent": 0.75,
                                   "span": 2.4})
        sweep.axes.train.seed = (0, 1, 2)  # three seeds per point, one vmapped ensemble
        # Checked where it runs: a lent H200's Python ships no test suite, so its pystdlib
        # corpus is 9.4M training tokens against 28.6M here, and the first run of this plan read
        # it up to 3 times (docs/results/device_h200_2026-11-27c/).
        sweep.max_epochs = 1.0
    else:
        base.data.seq_len = 128
        base.data.batch_size = 8
        base.train.checkpoint_every = 1000
        # Three budgets 2.5x apart (FLOPs, in the chinchilla count above).
        sweep.budgets = (1.2e11, 3e11, 7.5e11)
        # (d_model, n_layers, n_heads): 4.9k to 115k parameters, 1.2-1.4x apart; each budget
        # trains the sizes within 2.3x of its prior optimum N*(C) (sweep.centre below): 6-7
        # sizes, so a bootstrap replicate that drops a size still has a minimum inside.
        sweep.shapes = ((12, 1, 1), (16, 1, 1), (20, 1, 1), (24, 1, 2), (28, 1, 2), (32, 1, 2),
                        (28, 2, 2), (32, 2, 2), (36, 2, 3), (40, 2, 2), (48, 2, 3), (64, 2, 4))
        # The prior: the previous plan's approach-2 fit (minima 11.5k parameters at 1.5e11
        # FLOPs, 22.5k at 3.75e11, 38.9k at 9.4e11; docs/results.md), N* = 39k (C / 9.4e11)^0.65.
        sweep.centre = ConfigDict({"n_opt": 39e3, "budget": 9.4e11, "exponent": 0.65,
                                   "span": 2.3})
    if tuned:
        sweep.name = "quickstart_tuned"
        sweep.learning_rate.factors = (0.5, 1.0, 2.0, 4.0)
        if scale == "gpu":
            # The first lease of this plan (docs/results/device_h200_2026-11-28/) found 1/2x
            # worse than the rule at all 9 points it trained and the best at 2x-8x: the grid
            # moves up one step, keeping the rule's own runs.
            sweep.learning_rate.factors = (1.0, 2.0, 4.0, 8.0)
        sweep.learning_rate.refine = 2  # a point best at 1/2 or 4 tries up to 2 rates beyond
    return config
