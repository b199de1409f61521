"""Hoffmann et al. 2022 (Chinchilla): IsoFLOP profiles for approaches 2 and 3.

    attnlab sweep --config=experiments/chinchilla_isoflop.py --sweep=runs/chinchilla --dry-run
    attnlab sweep --config=experiments/chinchilla_isoflop.py --sweep=runs/chinchilla --parallel=2
    attnlab fit --sweep=runs/chinchilla --law=chinchilla --approach=2 --bootstrap=1000
    attnlab fit --sweep=runs/chinchilla --law=chinchilla --approach=3 --bootstrap=1000
    attnlab quickstart --config=experiments/chinchilla_isoflop.py --sweep=runs/chinchilla
    attnlab plot --sweep=runs/chinchilla --kind=isoflop --plot=isoflop.png

Three compute budgets C a factor of 3 apart, times seven sizes about 2x apart in parameters
(Chinchilla's N: all parameters); each (C, N) pair trains for D = C / (FLOPs per token) tokens.
Pairs that a budget trains for fewer than 50 steps (100 at scale gpu) are left out; every budget
keeps at least 5 sizes, spread around its optimum: the parabola of approach 2 needs points on both
sides of its vertex, and approach 3's five parameters need N and D to vary independently, which
the budgets provide. The sizes follow the quickstart's measurement (experiments/quickstart.py):
at ~1e12 FLOPs the optimum is near 30k parameters, so the ladder starts at 13k.
(`attnlab quickstart --config=experiments/chinchilla_isoflop.py` runs this sweep and then both
fits and every plot.)

FLOPs per token are the full Chinchilla count (embeddings, attention, the output head: Porian et
al. 2024 show that leaving the head out skews small-scale fits). Training follows Porian et al.'s
small-scale fixes: a 5% warmup, a cosine cycle matched to each run's own length, AdamW beta2 0.99
at these small batches, and a learning rate falling as 1/width.

Scales (`--config.scale=gpu`, or `--config=experiments/chinchilla_isoflop.py:gpu`):
  cpu  C = 1e12, 3e12, 9e12 FLOPs; N from 13k to 690k; batches of 16 x 128 tokens; D up to 58M
       tokens (the smallest model at the largest budget reads the 28M-token corpus ~2 times):
       21 runs, 9.1e13 FLOPs. On the idle 2-core VM `--dry-run` estimated 47 min (the probe
       reached 28 GFLOP/s on the smallest model, 43 on the largest, with both cores); the whole
       plan ran in 75 min with `--parallel=2` while the Kaplan sweep shared the machine (about
       one core for this sweep). Result (docs/results.md): every budget's minimum inside the
       ladder, N_opt ~ C^0.44 [0.34, 0.62] (approach 3), C^0.59 [0.45, 0.81] (approach 2).
  gpu  C = 2e13, 6e13, 2e14 FLOPs; N from 0.25M to 6.4M; batches of 32 x 256, bfloat16: 19 runs,
       1.9e15 FLOPs, well under an hour on one H100 (not measured: no GPU was available). The
       smallest model at the largest budget reads pystdlib ~3 times (Muennighoff et al. 2023: up
       to ~4 epochs are nearly as good as fresh data); point `base.data` at a bigger corpus
       (text_files, tfds:...) to go further.
  cpu_tuned, gpu_tuned  every (C, N) point at its own best peak rate (Porian et al. 2024): the
       plan at the rule's rate times 1/2, 1 and 2 (the runs at 1 are the untuned plan's), and up
       to 2 rates more past either end where a point's best is at the end
       (``sweep.learning_rate.refine``); at cpu 63 runs before refining, about 3 hours of the
       2-core VM beyond the untuned plan. Fit each point at its best rate:
       ``attnlab fit --sweep=DIR --law=chinchilla --best-over=train.learning_rate``.
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict


def get_config(scale: str = "cpu") -> ConfigDict:
    """``scale``: cpu, gpu, or cpu_tuned / gpu_tuned (every point at 3 peak rates, refined)."""
    tuned = scale.endswith("_tuned")
    scale = scale.removesuffix("_tuned")
    config = ConfigDict()
    config.scale = scale

    config.base = base = base_config_dict()
    base.data.source = "pystdlib"
    base.train.b2 = 0.99  # Porian et al. 2024: beta2 = 0.95 is too low for small batches
    base.train.eval_every = 1_000_000  # isoflop runs are scored once, at their end
    base.train.eval_batches = 32
    base.train.log_every = 50
    base.train.checkpoint_every = 1000

    config.sweep = sweep = ConfigDict()
    sweep.name = "chinchilla_isoflop"
    sweep.mode = "isoflop"
    sweep.flops_per_token = "chinchilla"
    sweep.min_steps = 50
    sweep.warmup = ConfigDict({"rule": "fraction", "fraction": 0.05})

    if scale == "gpu":
        base.data.seq_len = 256
        base.data.batch_size = 32
        base.model.dtype = "bfloat16"
        base.train.learning_rate = 3e-3  # at d_model = 128
        sweep.min_steps = 100
        sweep.budgets = (2e13, 6e13, 2e14)
        # (d_model, n_layers, n_heads): 0.25M to 6.4M parameters, head_dim 32.
        sweep.shapes = ((96, 2, 3), (128, 2, 4), (128, 4, 4), (192, 4, 6), (192, 6, 6),
                        (256, 6, 8), (256, 8, 8))
        sweep.learning_rate = ConfigDict({"rule": "inverse_width", "ref_d_model": 128})
    else:
        base.data.seq_len = 128
        base.data.batch_size = 16
        base.train.learning_rate = 1e-2  # at d_model = 32
        sweep.budgets = (1e12, 3e12, 9e12)
        # (d_model, n_layers, n_heads): 13k to 690k parameters, head_dim 12-16.
        sweep.shapes = ((24, 1, 2), (32, 1, 2), (32, 2, 2), (48, 2, 3), (64, 3, 4), (80, 4, 5),
                        (96, 6, 6))
        sweep.learning_rate = ConfigDict({"rule": "inverse_width", "ref_d_model": 32})
    if tuned:
        sweep.name = "chinchilla_isoflop_tuned"
        sweep.learning_rate.factors = (0.5, 1.0, 2.0)
        sweep.learning_rate.refine = 2
    return config
