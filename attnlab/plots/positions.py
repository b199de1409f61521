"""Pictures of what a positional encoding does with positions (the data:
:func:`attnlab.model.inspect.position_pictures`), drawn by ``attnlab model-info --plot``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from attnlab import outputs
from attnlab.model.inspect import SimilarityPicture


def plot_positions(pictures: list, path: Path) -> None:
    """One panel per :mod:`attnlab.model.inspect` position picture: a similarity matrix as an
    image, a picture against distance as one line per row (head)."""
    fig = Figure(figsize=(4.6 * len(pictures), 4))
    axes = fig.subplots(1, len(pictures), squeeze=False)
    for ax, picture in zip(axes[0], pictures):
        if isinstance(picture, SimilarityPicture):
            image = ax.imshow(picture.matrix, cmap="RdBu_r", vmin=-1, vmax=1,
                              interpolation="nearest")
            fig.colorbar(image, ax=ax, fraction=0.046)
            ax.set_xlabel("position j")
            ax.set_ylabel("position i")
        else:
            distance = np.arange(picture.values.shape[1])
            for row, values in enumerate(picture.values):
                label = f"head {row}" if len(picture.values) > 1 else None
                ax.plot(distance, values, lw=1.2, label=label)
            if 1 < len(picture.values) <= 8:
                ax.legend(fontsize=7)
            ax.axhline(0, color="gray", lw=0.6)
            ax.set_xlabel("distance i - j (tokens back)")
            ax.set_ylabel(picture.ylabel, fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(picture.title, fontsize=8)
    fig.tight_layout()
    outputs.save_figure(fig, path, dpi=110)
