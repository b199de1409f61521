"""Learning-rate transfer across width (Yang et al. 2022, "Tensor Programs V", Fig. 1): a
factor-2 learning-rate grid at widths 8x apart, under the standard parameterisation and under
muP (base width 16), two seeds each; the report plots loss against learning rate per width and
prints each width's best learning rate with a bootstrap interval over seeds.

    attnlab sweep --config=experiments/mup_transfer.py --sweep=sweeps/mup_transfer
    python experiments/mup_transfer.py sweeps/mup_transfer [--plot=docs/mup_transfer.png] \
        [--json=mup_lr.json]

``--json`` writes the best learning rates for a study's ``sweep.learning_rate.rule = 'transfer'``
(``sweep.learning_rate.report = 'mup_lr.json'``; docs/sweeps.md).

Under muP the best learning rate should stay put as the width grows; under SP (one Adam learning
rate, every matrix drawn at init_std) it should fall with width.

Scale ``cpu``: widths 16-128 (2 layers, 2 heads: head width 8-64), learning rates 2^-10..2^-5,
seeds 0 and 1, 100 steps of 8 x 32 tokens (cosine, 10 warmup steps), 96 runs. Scale ``gpu``:
widths 64-1024, 4 layers, 1000 steps of 32 x 128 tokens, learning rates 2^-12..2^-5 (not run).
"""

from __future__ import annotations

import math

from ml_collections import ConfigDict

from attnlab.config import base_config_dict

BASE_WIDTH = 16


def get_config(scale: str = "cpu") -> ConfigDict:
    config = ConfigDict()
    config.scale = scale
    gpu = scale == "gpu"

    config.base = base = base_config_dict()
    base.model.max_len = 128
    base.data.source = "pystdlib"
    base.data.max_bytes = 1_000_000
    base.data.seq_len = 128 if gpu else 32
    base.data.batch_size = 32 if gpu else 8
    base.train.steps = 1000 if gpu else 100
    base.train.warmup_steps = 100 if gpu else 10
    base.train.log_every = 50
    base.train.eval_every = base.train.steps
    base.train.eval_batches = 8
    base.train.checkpoint_every = base.train.steps

    config.sweep = sweep = ConfigDict()
    sweep.name = "mup_transfer"
    sweep.mode = "grid"
    layers = 4 if gpu else 2
    widths = (64, 128, 256, 512, 1024) if gpu else (16, 32, 64, 128)
    sweep.shapes = tuple((d, layers, 2) for d in widths)
    sweep.axes = ConfigDict()
    sweep.axes.train = ConfigDict({
        "learning_rate": tuple(2.0 ** e for e in (range(-12, -4) if gpu else range(-10, -4))),
        "seed": (0, 1),
    })
    base_width = 64 if gpu else BASE_WIDTH
    sweep.variant_column = "parameterization"
    sweep.variants = ConfigDict({
        "sp": {},
        "mup": {"model": {"parameterization": "mup", "mup_base_d_model": base_width,
                          "attention_scale": "mup"}},
    })
    return config


# -- the report ---------------------------------------------------------------------------------


def best_learning_rates(frame, *, resamples: int = 2000, seed: int = 0):
    """Per (parameterisation, width): the learning rate of the lowest seed-mean final loss, and
    a 90% bootstrap interval of it (the seeds resampled with replacement, the same draw for
    every learning rate).

    ``frame``: the sweep's results (columns parameterization, d_model, learning_rate, seed,
    final_val_loss). Returns rows ``(parameterization, d_model, best_lr, lo, hi)``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = []
    for (p, d), group in frame.groupby(["parameterization", "d_model"]):
        table = group.pivot_table(index="seed", columns="learning_rate",
                                  values="final_val_loss")  # [seeds, lrs]
        lrs = np.asarray(table.columns, np.float64)
        losses = table.to_numpy(np.float64, copy=True)
        # A learning rate at which any seed diverged (or is missing) is never the best.
        losses[:, ~np.isfinite(losses).all(axis=0)] = np.inf
        best = lrs[np.argmin(losses.mean(axis=0))]
        picks = rng.integers(0, losses.shape[0], (resamples, losses.shape[0]))
        boot = lrs[np.argmin(losses[picks].mean(axis=1), axis=1)]  # [resamples]
        lo, hi = np.quantile(np.log2(boot), [0.05, 0.95])
        rows.append((p, int(d), float(best), 2.0 ** lo, 2.0 ** hi))
    return rows


def report(frame, **kw) -> dict:
    """The JSON a study's learning-rate rule ``transfer`` reads (attnlab.sweep.spec):
    ``{"best_learning_rates": [{parameterization, d_model, mup_base_d_model, learning_rate,
    interval: [lo, hi]}, ...]}``; ``mup_base_d_model`` is the width a mup row's learning rate
    is relative to (0 for sp; a frame without the column reads as 0)."""
    base = (frame.groupby(["parameterization", "d_model"])["mup_base_d_model"].first()
            if "mup_base_d_model" in frame else {})
    rows = []
    for p, d, best, lo, hi in best_learning_rates(frame, **kw):
        rows.append({"parameterization": p, "d_model": d,
                     "mup_base_d_model": int(base.get((p, d), 0)) if p == "mup" else 0,
                     "learning_rate": best, "interval": [lo, hi]})
    return {"best_learning_rates": rows}


def plot(frame):
    """Yang et al. Fig. 1: final loss against learning rate, one line per width, a panel per
    parameterisation (seed means; the seeds as points)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    kinds = sorted(frame["parameterization"].unique(), key=lambda p: p != "sp")
    fig = Figure(figsize=(5.0 * len(kinds), 3.8), layout="constrained")
    axes = fig.subplots(1, len(kinds), squeeze=False, sharey=True)[0]
    widths = sorted(frame["d_model"].unique())
    for ax, p in zip(axes, kinds):
        for i, d in enumerate(widths):
            color = colormaps["viridis"](0.1 + 0.8 * i / max(1, len(widths) - 1))
            group = frame[(frame["parameterization"] == p) & (frame["d_model"] == d)]
            ax.scatter(group["learning_rate"], group["final_val_loss"], s=8, color=color,
                       alpha=0.5)
            mean = group.groupby("learning_rate")["final_val_loss"].mean()
            ax.plot(mean.index, mean.values, marker="o", ms=4, color=color, label=f"d={d}")
            ax.plot([mean.idxmin()], [mean.min()], marker="*", ms=12, color=color)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("learning rate")
        ax.set_title(p)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("final validation loss (nats/token)")
    finite = frame["final_val_loss"][frame["final_val_loss"].map(math.isfinite)]
    axes[0].set_ylim(finite.min() - 0.05, min(finite.max(), finite.min() + 1.5))
    return fig


def main(argv: list[str]) -> int:
    """``python experiments/mup_transfer.py SWEEP_DIR [--plot=FILE] [--json=FILE]``."""
    import json

    from attnlab.results import load

    if not argv or argv[0].startswith("-"):
        print(main.__doc__)
        return 2
    frame = load(argv[0]).rename(columns={"model.d_model": "d_model", "train.seed": "seed",
                                          "train.learning_rate": "learning_rate",
                                          "model.mup_base_d_model": "mup_base_d_model"})
    frame = frame[frame["status"] == "completed"]
    print(f"{'param':<6}{'d_model':>8}{'best lr':>10}{'90% interval':>22}")
    for p, d, best, lo, hi in best_learning_rates(frame):
        print(f"{p:<6}{d:>8}{best:>10.2e}   [{lo:.2e}, {hi:.2e}]")
    for arg in argv[1:]:
        if arg.startswith("--plot="):
            plot(frame).savefig(arg.partition("=")[2], dpi=120)
        if arg.startswith("--json="):
            with open(arg.partition("=")[2], "w") as f:
                json.dump(report(frame), f, indent=1)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
