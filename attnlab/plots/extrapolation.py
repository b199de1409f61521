"""Length-extrapolation plots in the style of Press et al. 2022 (ALiBi), Figure 1.

    plot_perplexity_ratio(table, "DIR/extrapolation_ratio")       # -> [.png, .pdf]
    plot_position_loss(curves, "DIR/extrapolation_positions")

``table`` is the combined table of ``attnlab extrapolate --config=FILE --sweep=DIR``
(``DIR/extrapolation.csv``): one row per (run, protocol, length) with columns pos_encoding, seed,
protocol, length, multiplier, status, perplexity, ppl_ratio. ``curves`` has one row per (run,
position) with pos_encoding, seed, position, loss. Figures are drawn on
``matplotlib.figure.Figure`` objects (Agg canvas, no pyplot state), so plotting is safe in
threads, servers and tests.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from attnlab import outputs

# One fixed colour per encoding, so that every figure of a study agrees.
ENCODING_ORDER = ("sinusoidal", "learned", "none", "rope", "alibi")
ENCODING_LABELS = {"none": "NoPE", "sinusoidal": "sinusoidal", "learned": "learned",
                   "rope": "RoPE", "alibi": "ALiBi"}
ENCODING_COLORS = {"sinusoidal": "tab:blue", "learned": "tab:purple", "none": "tab:gray",
                   "rope": "tab:orange", "alibi": "tab:green", "t5": "tab:red",
                   # RoPE rescaled at evaluation (attnlab extrapolate --rope-scaling)
                   "rope+ntk": "tab:brown", "rope+pi": "tab:pink", "rope+yarn": "tab:olive"}
FORMATS = ("png", "pdf")


def _style(label: str) -> dict:
    """Colour, line style and legend text of a study row label such as ``rope+w16+ntk``: one
    colour per encoding (and RoPE rescaling), dashed for a sliding window (``+w<w>``), so a
    study of many variants stays readable."""
    parts = label.split("+")
    window = next((p for p in parts[1:] if p.startswith("w") and p[1:].isdigit()), None)
    key = "+".join(p for p in parts if p != window)
    name = "+".join([ENCODING_LABELS.get(parts[0], parts[0])] + parts[1:])
    return {"color": ENCODING_COLORS.get(key), "linestyle": "--" if window else "-",
            "name": name}


def _encodings(frame: pd.DataFrame) -> list[str]:
    present = list(dict.fromkeys(frame["pos_encoding"]))
    return sorted(present, key=lambda e: (ENCODING_ORDER.index(e) if e in ENCODING_ORDER
                                          else len(ENCODING_ORDER), e))


def _save(fig: Figure, stem: str | Path) -> list[Path]:
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in FORMATS:
        path = stem.with_suffix(f".{fmt}")
        outputs.save_figure(fig, path, dpi=150, bbox_inches="tight")
        paths.append(path)
    return paths


def ratio_summary(table: pd.DataFrame, protocol: str = "nonoverlapping") -> pd.DataFrame:
    """Mean, min and max over seeds of r(k) per encoding and length (evaluated rows only).

    Returns columns pos_encoding, length, multiplier, mean, low, high, n_seeds.
    """
    rows = table[(table["protocol"] == protocol) & (table["status"] == "ok")]
    grouped = rows.groupby(["pos_encoding", "length", "multiplier"])["ppl_ratio"]
    summary = grouped.agg(mean="mean", low="min", high="max", n_seeds="count").reset_index()
    return summary.sort_values(["pos_encoding", "length"]).reset_index(drop=True)


def plot_perplexity_ratio(table: pd.DataFrame, stem: str | Path, *,
                          protocol: str = "nonoverlapping", title: str | None = None
                          ) -> list[Path]:
    """Perplexity ratio r(k) = ppl(k L_train) / ppl(L_train) against evaluation length.

    One line per encoding (mean over seeds, markers at evaluated lengths) with a band from the
    lowest to the highest seed; log-2 length axis, log ratio axis when the ratios span more than
    4x; L_train marked. Encodings with lengths that are
    not applicable (learned beyond its table) simply stop there.

    Returns:
      The written files: ``stem.png`` and ``stem.pdf``.
    """
    summary = ratio_summary(table, protocol)
    if summary.empty:
        raise ValueError(f"no evaluated rows for protocol {protocol!r} to plot")
    fig = Figure(figsize=(6.0, 4.2))
    ax = fig.add_subplot()
    for encoding in _encodings(summary):
        part = summary[summary["pos_encoding"] == encoding]
        style = _style(encoding)
        color = style["color"]
        seeds = int(part["n_seeds"].max())
        label = f"{style['name']} ({seeds} seed{'s' * (seeds > 1)}"
        skipped = table[(table["pos_encoding"] == encoding) & (table["protocol"] == protocol)
                        & (table["status"] != "ok")]
        if not skipped.empty:  # learned positions beyond their table
            label += f"; n/a beyond {part['length'].max()}"
        label += ")"
        ax.plot(part["length"], part["mean"], marker="o", color=color,
                linestyle=style["linestyle"], label=label)
        if seeds > 1:
            ax.fill_between(part["length"], part["low"], part["high"], color=color, alpha=0.2,
                            linewidth=0)
    train_lengths = sorted(set(table.loc[table["multiplier"] == 1.0, "length"]))
    for length in train_lengths:
        ax.axvline(length, color="black", linestyle=":", linewidth=1)
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    if summary["high"].max() / summary["low"].min() > 4:  # log only when ratios span decades
        ax.set_yscale("log")
        low, high = summary["low"].min(), summary["high"].max()
        ticks = [t for t in (0.9, 1, 1.5, 2, 3, 5, 7, 10, 20, 50, 100) if low <= t <= high * 1.05]
        ax.set_yticks(ticks)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("evaluation length (tokens)" + (f"; L_train = {train_lengths[0]}"
                                                   if len(train_lengths) == 1 else ""))
    ax.set_ylabel("perplexity ratio  ppl(L) / ppl(L_train)")
    ax.set_title(title or f"Length extrapolation ({protocol} evaluation)")
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, len(summary["pos_encoding"].unique()))
    return _save(fig, stem)


def _legend(ax, n_lines: int) -> None:
    """Inside the axes for a few lines; beside them for a study of many variants."""
    if n_lines <= 6:
        ax.legend(fontsize=8)
    else:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)


def binned_curve(loss: np.ndarray, bin_width: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean loss over consecutive position bins; returns (bin centres, mean loss), [n_bins]."""
    loss = np.asarray(loss, np.float64)
    n_bins = -(-loss.size // bin_width)
    padded = np.full(n_bins * bin_width, np.nan)
    padded[: loss.size] = loss
    means = np.nanmean(padded.reshape(n_bins, bin_width), axis=1)
    centres = np.arange(n_bins) * bin_width + (np.minimum(bin_width, loss.size) - 1) / 2
    return centres, means


def plot_position_loss(curves: pd.DataFrame, stem: str | Path, *, train_length: int | None = None,
                       n_bins: int = 64, title: str | None = None) -> list[Path]:
    """Mean loss at each position of the longest evaluated window, per encoding.

    Seeds are averaged position by position, then positions are averaged in ``n_bins`` equal
    bins (a single window position is noisy). ``train_length`` draws the training length.

    Returns:
      The written files: ``stem.png`` and ``stem.pdf``.
    """
    if curves.empty:
        raise ValueError("no per-position curves to plot")
    fig = Figure(figsize=(6.0, 4.2))
    ax = fig.add_subplot()
    for encoding in _encodings(curves):
        part = curves[curves["pos_encoding"] == encoding]
        mean = part.groupby("position")["loss"].mean().sort_index()
        bin_width = max(1, -(-len(mean) // n_bins))
        x, y = binned_curve(mean.to_numpy(), bin_width)
        seeds = part["seed"].nunique()
        style = _style(encoding)
        ax.plot(x, y, color=style["color"], linestyle=style["linestyle"],
                label=f"{style['name']} ({seeds} seed{'s' * (seeds > 1)}, to {len(mean)})")
    if train_length:
        ax.axvline(train_length, color="black", linestyle=":", linewidth=1,
                   label=f"L_train = {train_length}")
    ax.set_xlabel("position in the window")
    ax.set_ylabel("loss (nats / token), binned")
    ax.set_title(title or "Per-position loss at the longest evaluated length")
    ax.grid(True, alpha=0.3)
    _legend(ax, curves["pos_encoding"].nunique())
    return _save(fig, stem)
