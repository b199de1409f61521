"""The hyperparameter law's study: per (N, D), a grid of learning rates around a prior and of
batch sizes, on the Markov chain (a known entropy rate, no repeated data), fitted by
``attnlab fit --law=hparams`` (docs/scaling.md, "The hyperparameter law").

    attnlab sweep --config=experiments/hparams.py --sweep=sweeps/hparams --dry-run
    attnlab sweep --config=experiments/hparams.py --sweep=sweeps/hparams
    attnlab fit --sweep=sweeps/hparams --law=hparams --bootstrap=200

Scale cpu: 3 two-layer shapes (d_model 16, 32, 48) x 2 token counts (0.25M, 0.5M) x 3 batch sizes
(8, 16, 32 sequences of 64 tokens) x 5 learning rates (the prior 7.5e-3 x 32 / d_model times
1/4 .. 4): 90 runs; the 5 rates of one (shape, tokens, batch) train together as an ensemble.
Scale cpu_refined: the cpu grid moved where its optima sat at the edges (docs/scaling.md): the
prior 4x higher (3e-2 x 32 / d_model) and batches of 2, 4, 8 sequences.
Scale cpu_seeds: the two cpu grids' finding redone with three seeds, so that the fit's intervals
can resample seeds (``attnlab fit --law=hparams --pair=train.seed``): d_model 24, 32, 48 x 0.25M
and 0.5M tokens x batches of 2, 4, 8 sequences x rates 1/2 .. 2 x the prior 1.5e-2 x 32 /
d_model in steps of sqrt(2) (where both grids put the optima, just below the rate at which
training diverges) x seeds 0-2: 270 runs, each cell's 15 one ensemble; then, from their
results, a batch size past the largest where a group's best sits there and a rate past the
grid's edge where a point's does (``refine_batch``, ``learning_rate.refine``, one each).
Scale gpu: d_model 64-256 and 4M-16M tokens, batches 32-128 sequences.
Scale gpu_refined: the gpu grid moved where its optima sat on a lent H200 (docs/benchmarks.md,
"Third lent session"): rates 1-16 x the prior, batches 16-128 sequences, 2M and 8M tokens so
that its 120 runs fit one lease.
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict


def get_config(scale: str = "cpu") -> ConfigDict:
    """``scale``: cpu, gpu, cpu_refined / gpu_refined (each grid moved to where its optima
    sat), or cpu_seeds (the cpu optima's neighbourhood at three seeds)."""
    refined, seeded = scale.endswith("_refined"), scale == "cpu_seeds"
    scale = scale.removesuffix("_refined").removesuffix("_seeds")
    config = ConfigDict()
    config.scale = scale

    config.base = base = base_config_dict()
    base.data.source = "markov"
    base.data.markov_order = 1
    base.data.markov_branching = 64
    base.data.markov_seed = 0
    base.data.seq_len = 64
    base.data.markov_tokens = 4_000_000
    base.train.learning_rate = 7.5e-3  # the prior at d_model = 32
    base.train.b2 = 0.99
    base.train.warmup_steps = 10
    base.train.eval_every = 1_000_000  # each run is scored once, at its end
    base.train.eval_batches = 32
    base.train.log_every = 50
    base.train.checkpoint_every = 1000

    config.sweep = sweep = ConfigDict()
    sweep.name = "hparams_refined" if refined else "hparams"
    sweep.mode = "grid"
    sweep.flops_per_token = "chinchilla"
    # The prior (inverse width), then a factor-2 grid around it for every (shape, tokens, batch).
    sweep.learning_rate = ConfigDict({"rule": "inverse_width", "ref_d_model": 32,
                                      "factors": (0.25, 0.5, 1.0, 2.0, 4.0)})
    sweep.warmup = ConfigDict({"rule": "fixed"})
    sweep.shapes = ((16, 2, 2), (32, 2, 2), (48, 2, 2))  # (d_model, n_layers, n_heads)
    sweep.axes = ConfigDict()
    sweep.axes.train = ConfigDict({"tokens": (250_000, 500_000)})
    sweep.axes.data = ConfigDict({"batch_size": (8, 16, 32)})
    if refined and scale == "cpu":
        # The cpu grid's optima sat at its edges (the largest rate, the smallest batch, in most
        # groups): the same grid moved 4x up in rate and 4x down in batch.
        base.train.learning_rate = 3e-2
        sweep.axes.data.batch_size = (2, 4, 8)
    if seeded:
        sweep.name = "hparams_seeds"
        base.train.learning_rate = 1.5e-2
        sweep.learning_rate.factors = (0.5, 0.7071, 1.0, 1.4142, 2.0)
        sweep.shapes = ((24, 2, 2), (32, 2, 2), (48, 2, 2))
        sweep.axes.data.batch_size = (2, 4, 8)
        sweep.axes.train.seed = (0, 1, 2)
        # Its first pass put three groups' best batch at 8 sequences: those gain 16, and any
        # point whose best rate is at the grid's edge the next rate (sweep.refine_batch).
        sweep.refine_batch = 1
        sweep.learning_rate.refine = 1
    if scale == "gpu":
        base.data.markov_tokens = 40_000_000
        base.train.warmup_steps = 50
        sweep.shapes = ((64, 2, 2), (128, 2, 4), (256, 2, 4))
        sweep.axes.train.tokens = (4_000_000, 16_000_000)
        sweep.axes.data.batch_size = (32, 64, 128)
    if refined and scale == "gpu":
        # On an H200 the 16M-token groups were best at 2x the prior and 64 sequences, the
        # 4M-token ones at the largest rate (4x) and the smallest batch (32): the grid reaches
        # 16x and 16 sequences, at shorter runs.
        sweep.learning_rate.factors = (1.0, 2.0, 4.0, 8.0, 16.0)
        sweep.axes.train.tokens = (2_000_000, 8_000_000)
        sweep.axes.data.batch_size = (16, 32, 64, 128)
    return config
