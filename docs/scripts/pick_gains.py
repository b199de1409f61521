"""Where each point's best rate lies on a tuned study's grid, and what picking it gains over the
rule's rate: the counts and gains docs/results.md quotes for the tuned studies ("the best rate
is 2x the rule at 70 of 128 points", "every arm gains 0.2-2.3% per point on average").

Each (arm, N, D) point's pick is attnlab's own (``attnlab.scaling.tables.picks.at_best`` over the
table's ``lr_factor``, the multiple of the rule's rate: the value with the lowest mean loss over
seeds); its gain is its mean loss over the mean loss at factor 1 at that point, minus 1.

    python docs/scripts/pick_gains.py docs/results/architectures_isoflop_tuned_cpu.csv \\
        --by=architecture
    python docs/scripts/pick_gains.py docs/results/chinchilla_isoflop_tuned_cpu_factors.csv
    python docs/scripts/pick_gains.py docs/results/quickstart_tuned_cpu_factors.csv
"""

from __future__ import annotations

import argparse

import pandas as pd

from attnlab.results import LR_FACTOR_COLUMN
from attnlab.scaling.tables.picks import at_best
from attnlab.scaling.tables.read import read_table

METRIC = "final_val_loss"
POINT = ("params", "tokens")


def pick_gains(table: pd.DataFrame, by: str | None) -> pd.DataFrame:
    """One row per (arm, N, D) point: the picked factor and the pick's gain over factor 1."""
    if by is None:
        table, by = table.assign(arm="all"), "arm"
    _, picks = at_best(table, by=by, match=POINT, metric=METRIC, over=LR_FACTOR_COLUMN)
    done = table[table["status"] == "completed"]
    rule = done[done[LR_FACTOR_COLUMN] == 1].groupby([by, *POINT])[METRIC].mean()
    rule.index = rule.index.set_levels(rule.index.levels[0].astype(str), level=0)
    picks = picks.set_index([by, *POINT])
    picks["gain"] = picks[METRIC] / rule.reindex(picks.index) - 1
    return picks.reset_index().rename(columns={by: "arm"})


def describe(rows: pd.DataFrame) -> str:
    counts = rows[LR_FACTOR_COLUMN].value_counts().sort_index()
    picked = ", ".join(f"{factor:g}x: {n}" for factor, n in counts.items())
    gain = 100 * rows["gain"]
    return (f"{len(rows)} points; best factor {picked}; gain mean {gain.mean():+.2f}%, median "
            f"{gain.median():+.2f}%, largest {gain.min():+.2f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table")
    parser.add_argument("--by", help="the arms' column (e.g. architecture)")
    args = parser.parse_args()
    rows = pick_gains(read_table(args.table), args.by)
    for arm, group in rows.groupby("arm"):
        print(f"{arm}: {describe(group)}")
    if rows["arm"].nunique() > 1:
        print(f"all: {describe(rows)}")


if __name__ == "__main__":
    main()
