"""Kaplan et al. 2020: a model-size sweep with long training, for L(N), L(D) and L(N, D).

    attnlab sweep --config=experiments/kaplan.py --sweep=runs/kaplan --dry-run   # plan + time
    attnlab sweep --config=experiments/kaplan.py --sweep=runs/kaplan --parallel=2
    attnlab fit --sweep=runs/kaplan --law=kaplan --form=n     # L(N) = (N_c/N)^alpha_N
    attnlab fit --sweep=runs/kaplan --law=kaplan              # L(N, D), N non-embedding
    attnlab fit --sweep=runs/kaplan --law=chinchilla --approach=1   # from the learning curves
    attnlab plot --sweep=runs/kaplan --kind=loss-vs-params --plot=kaplan.png

Six sizes (Kaplan's N: non-embedding parameters, ~2.3 decades) x five token budgets D, each a
factor of 2 apart, all on the embedded `pystdlib` corpus. Every (N, D) pair is its own run with
its own cosine cycle ending at D, so the loss at D is a trained-to-D loss, not a point part-way
along a longer schedule. (Kaplan's own L(N, D) trained on subsets of D tokens, repeated until
early stopping; here D counts tokens each seen once, as in Chinchilla and in the fits.) The
longest budget is the "long training" that L(N) reads: `--form=n` fits the lowest loss of each
size. The runs also record
learning curves (`curves` mode, 16 validation points each) for Kaplan's L(N, S) and for
Chinchilla's approach 1.

Training follows Porian et al. 2024's fixes rather than Kaplan's original recipe (3,000 warmup
steps, one schedule length), so that the law, not the training, is what differs from the
Chinchilla experiments: a 5% warmup, the cosine matched to each run, AdamW beta2 0.99 at these
small batches, and a 1/width learning rate. FLOPs are counted in full (`flops_chinchilla`);
`attnlab fit --law=kaplan` uses Kaplan's 6·N·D with N non-embedding (the `flops` column).

Scales (`--config.scale=gpu`, or `--config=experiments/kaplan.py:gpu`):
  cpu  N from 3.2k to 670k, D from 0.625M to 10M tokens (no data repeats: the corpus has 28M
       training tokens), batches of 16 x 128 tokens: 30 runs, 1.65e14 FLOPs. On the idle 2-core
       VM `--dry-run` estimated 80 min (the probe reached 19 GFLOP/s on the smallest model, 43 on
       the largest, with both cores); the whole plan ran in 111 min with `--parallel=2` while
       the Chinchilla sweep shared the machine for 75 of them. Result (docs/results.md):
       alpha_N = 0.100 [0.074, 0.127], approach 1 N_opt ~ C^0.52 [0.38, 0.65].
  gpu  N from 0.1M to 79M, D from 6.25M to 100M tokens, batches of 64 x 256, bfloat16: 35 runs,
       1.9e17 FLOPs, roughly an hour on one H100 (not measured: no GPU was available). The
       largest budgets read pystdlib's 28M training tokens up to 3.6 times; Muennighoff et al.
       2023 found up to ~4 epochs nearly as good as fresh data. Point `base.data` at a bigger
       corpus (text_files, tfds:...) to go further.
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict


def get_config(scale: str = "cpu") -> ConfigDict:
    config = ConfigDict()
    config.scale = scale

    config.base = base = base_config_dict()
    base.data.source = "pystdlib"
    base.train.b2 = 0.99  # Porian et al. 2024: beta2 = 0.95 is too low for small batches
    base.train.eval_batches = 16
    base.train.log_every = 50
    base.train.checkpoint_every = 1000

    config.sweep = sweep = ConfigDict()
    sweep.name = "kaplan"
    sweep.mode = "curves"
    sweep.curve_points = 16
    sweep.warmup = ConfigDict({"rule": "fraction", "fraction": 0.05})
    sweep.axes = ConfigDict()
    sweep.axes.train = ConfigDict()

    if scale == "gpu":
        base.data.seq_len = 256
        base.data.batch_size = 64
        base.model.dtype = "bfloat16"
        base.train.learning_rate = 3e-3
        base.train.b2 = 0.95
        # (d_model, n_layers, n_heads), head_dim 32 (the first 16).
        sweep.shapes = ((64, 2, 4), (128, 4, 4), (192, 6, 6), (256, 8, 8), (384, 12, 12),
                        (512, 12, 16), (640, 16, 20))
        sweep.learning_rate = ConfigDict({"rule": "inverse_width", "ref_d_model": 128})
        sweep.axes.train.tokens = (6_250_000, 12_500_000, 25_000_000, 50_000_000, 100_000_000)
    else:
        base.data.seq_len = 128
        base.data.batch_size = 16
        base.train.learning_rate = 1e-2  # at d_model = 32
        # (d_model, n_layers, n_heads): aspect ratio d_model / n_layers = 16 from 2 layers on.
        sweep.shapes = ((16, 1, 1), (32, 1, 2), (32, 2, 2), (48, 3, 3), (64, 4, 4), (96, 6, 6))
        sweep.learning_rate = ConfigDict({"rule": "inverse_width", "ref_d_model": 32})
        sweep.axes.train.tokens = (625_000, 1_250_000, 2_500_000, 5_000_000, 10_000_000)
    return config
