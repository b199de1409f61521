"""Pictures of ``attnlab icl`` results and of attention maps (matplotlib, Agg)."""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from attnlab import outputs  # noqa: E402


def plot_result(result: dict, report, path: Path) -> None:
    """One evaluation drawn as its task's ``report`` draws it (a
    :class:`~attnlab.icl.evaluate.TaskReport`)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    report.plot(result, ax)
    ax.set_title(f"{result['task']}: {Path(result.get('run', '')).name}")
    fig.tight_layout()
    outputs.save_figure(fig, path, dpi=110)
    plt.close(fig)


def draw_repeat_loss(result: dict, ax) -> None:
    """Induction: loss per position with the optimum and ln V."""
    loss = np.asarray(result["loss_per_position"])
    ax.plot(np.arange(1, len(loss) + 1), loss, label="model")
    ax.plot(np.arange(1, len(loss) + 1), result["optimal_loss_per_position"], "--",
            label="optimum")
    ax.axhline(result["ln_vocab"], color="gray", lw=0.8, label="ln V")
    for edge in result["prefix_range"]:
        ax.axvline(edge, color="gray", ls=":", lw=0.8)
    ax.set_xlabel("target position (the repeat starts between the dotted lines)")
    ax.set_ylabel("loss (nats/token)")
    ax.legend()


def draw_recall(result: dict, ax) -> None:
    """MQAR: accuracy against the number of pairs."""
    ax.plot(result["pairs"], result["accuracy"], "o-")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("key-value pairs")
    ax.set_ylabel("recall accuracy")


def draw_regression(result: dict, ax) -> None:
    """In-context regression: the model's error against k (with its standard error) and every
    baseline's on the same prompts."""
    ax.errorbar(result["k"], result["error"], yerr=result["stderr"], fmt="o-", lw=2, ms=4,
                capsize=2, label="model", zorder=3)
    for (name, curve), style in zip(result["baselines"].items(),
                                    itertools.cycle(["--", ":", "-."])):
        ax.plot(result["k"], curve, style, lw=1.4, label=name.replace("_", " "))
    ax.axvline(result["dim"], color="gray", ls=":", lw=0.8)
    ax.set_ylim(-0.02, 1.6)
    ax.set_xlabel(f"in-context examples k (d = {result['dim']}: dotted)")
    ax.set_ylabel("squared error / d")
    ax.legend(fontsize=7)


def plot_maps(maps: list[np.ndarray], labels: list[str], path: Path,
              titles: list[str] | None = None) -> None:
    """A grid, one row per layer and one column per head, of ``[heads, t, t]`` maps in
    ``[0, 1]`` (query rows, key columns; :func:`attnlab.model.inspect.drawable`); ``titles``:
    each layer's ``(name, column)``, e.g. ``("softmax", "head")`` (default: no name, heads)."""
    heads = max(m.shape[0] for m in maps)
    t = maps[0].shape[-1]
    size = 2.2 if t <= 64 else 3.2
    fig, axes = plt.subplots(len(maps), heads, figsize=(size * heads, size * len(maps)),
                             squeeze=False)
    ticks = np.arange(t) if t <= 24 else np.arange(0, t, max(1, t // 8))
    for layer, weights in enumerate(maps):
        for head in range(heads):
            ax = axes[layer, head]
            if head >= weights.shape[0]:
                ax.axis("off")
                continue
            ax.imshow(weights[head], cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
            name, column = titles[layer] if titles else ("", "head")
            ax.set_title(f"{name + ' ' if name else ''}L{layer} {column} {head}", fontsize=7)
            ax.set_xticks(ticks, [labels[i] for i in ticks] if t <= 24 else ticks, fontsize=5,
                          rotation=90)
            ax.set_yticks(ticks, [labels[i] for i in ticks] if t <= 24 else ticks, fontsize=5)
    fig.tight_layout()
    outputs.save_figure(fig, path, dpi=110)
    plt.close(fig)


def plot_sweep(table, path: Path, column: str, label: str) -> None:
    """``column`` of a sweep's table (its task's headline, ``label`` on the axis) against
    width, one line per variant, with its standard error where the table has ``stderr``."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for variant, rows in table.groupby("variant"):
        rows = rows.sort_values("d_model")
        err = rows["stderr"] if "stderr" in rows else None
        ax.errorbar(rows["d_model"], rows[column], yerr=err, fmt="o-", capsize=3, label=variant)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(table["d_model"].unique()), [str(d) for d in
                                                      sorted(table["d_model"].unique())])
    ax.set_xlabel("d_model")
    ax.set_ylabel(label)
    ax.legend(fontsize=8)
    fig.tight_layout()
    outputs.save_figure(fig, path, dpi=110)
    plt.close(fig)
