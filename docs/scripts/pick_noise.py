"""How much of a tuned study's gain a one-seed pick selects from noise (docs/results.md, "Each
architecture at its own best learning rate").

- The same Mamba run trained twice (alone for the untuned table, in an ensemble with its other
  rates for the tuned one): how far its final loss moves, last-bit differences grown by training.
- Across seeds at each point of two tuned studies that ran 2 seeds at every rate (MoE against
  dense at 7.5e11 FLOPs; GPT and Mamba at 3.75e11, ``experiments/architectures.py:
  cpu_tuned_pair``): the spread of a seed's log-loss difference between adjacent rates, and
  from it the expected gain of picking the better of two equally good rates with one seed,
  -sd / sqrt(2 pi) (E[min(0, D)] for D ~ N(0, sd^2)).

    python docs/scripts/pick_noise.py
"""

from pathlib import Path

import numpy as np
import pandas as pd

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def retrained() -> pd.Series:
    """|final loss change| of each Mamba run at the rule's rate in both the tuned table and the
    untuned one (the tuned ladders' larger sizes have no untuned run)."""
    tuned = pd.read_csv(RESULTS / "architectures_isoflop_tuned_cpu.csv")
    tuned = tuned.query('architecture == "mamba" and lr_factor == 1').set_index("run_id")
    first = pd.read_csv(RESULTS / "architectures_cpu.csv").set_index("run_id")
    return (tuned.final_val_loss - first.final_val_loss.reindex(tuned.index)).abs().dropna()


def adjacent_rate_sds(runs: pd.DataFrame, point: list[str]) -> list[float]:
    """Per point (``point``'s columns) and pair of adjacent rates: the sd over seeds of the
    log-loss difference."""
    sds = []
    for _, cell in runs.groupby(point):
        grid = np.log(cell.pivot_table(index="train.seed", columns="train.learning_rate",
                                       values="final_val_loss"))
        sds += [grid[hi].sub(grid[lo]).std() for lo, hi in zip(grid.columns, grid.columns[1:])]
    return sds


def expected_pick_gain(sd: float) -> float:
    """E[min(0, D)], D ~ N(0, sd^2): what picking the better of two equally good rates with one
    seed each gains on average, relative to always taking the first."""
    return -sd / np.sqrt(2 * np.pi)


# (table, the columns naming a point): tuned studies that ran two seeds at every rate.
TWO_SEEDS = (("moe_dense_tuned_cpu.csv", ["budget", "ffn", "model.d_model", "model.n_layers"]),
             ("architectures_pair_cpu.csv", ["architecture", "model.d_model", "model.n_layers"]))


def main() -> None:
    moved = retrained()
    print(f"Mamba retrained at 1x: |change| max {moved.max():.4f}, median {moved.median():.5f}, "
          f"> 0.005: {(moved > 0.005).sum()} of {len(moved)}")
    for name, point in TWO_SEEDS:
        runs = pd.read_csv(RESULTS / name).query('status == "completed"')
        sds = adjacent_rate_sds(runs, point)
        sd = float(np.nanmedian(sds))
        print(f"{name}: sd of a seed's log-loss difference between adjacent rates: median "
              f"{sd:.4f} over {len(sds)}; expected gain of the better of two equal rates: "
              f"{expected_pick_gain(sd):+.4f}")


if __name__ == "__main__":
    main()
