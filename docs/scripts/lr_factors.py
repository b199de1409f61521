"""Adds the ``lr_factor`` column to a results table written before sweeps recorded it.

A sweep on a grid of rates (``sweep.learning_rate.factors``) now records each run's multiple of
its rule's rate as the table's ``lr_factor``, which ``attnlab compare --by=lr_factor
--baseline=1`` reads. For an older table, this plans the experiment again (the same config and
overrides the sweep ran with) and divides each run's rate by the rule's rate at its point: the
rate of the point's planned factor-1 run. Runs a refinement added (beyond the plan) share their
point's rule rate.

    python docs/scripts/lr_factors.py TABLE.csv EXPERIMENT[:SCALE] OUT.csv [--config.X=Y ...]

    python docs/scripts/lr_factors.py docs/results/device_h200_2026-11-28/quickstart_tuned.csv \\
        experiments/quickstart.py:gpu_tuned \\
        docs/results/device_h200_2026-11-28/quickstart_tuned_factors.csv

OUT must not exist (nothing is overwritten); a run with no planned point is an error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from attnlab.errors import AttnlabError
from attnlab.results import LR_FACTOR_COLUMN
from attnlab.sweep import load_spec, plan
from attnlab.sweep.planner import REPLICATE_KEYS

RATE = "train.learning_rate"
NOT_OF_THE_POINT = (RATE, *REPLICATE_KEYS)


def point_key(budget, axes: dict) -> tuple:
    """What a point's runs share: the budget and every axis but the rate and the seeds."""
    return (budget, *sorted((k, v) for k, v in axes.items() if k not in NOT_OF_THE_POINT))


def rule_rates(experiment: str, overrides: list[str]) -> tuple[dict, list[str]]:
    """({point key: the rule's rate there}, the axis columns the keys name)."""
    runs = plan(load_spec(experiment, overrides))
    rates = {point_key(r.budget, r.axes): r.axes[RATE] for r in runs if r.lr_factor == 1.0}
    columns = sorted({k for r in runs for k in r.axes} - set(NOT_OF_THE_POINT))
    return rates, columns


def with_factors(table: pd.DataFrame, rates: dict, columns: list[str]) -> pd.DataFrame:
    """``table`` with ``lr_factor`` after the rate column. Raises LookupError naming the first
    run whose point the plan does not have."""
    factors = []
    for _, row in table.iterrows():
        budget = row["budget"] if "budget" in row and pd.notna(row["budget"]) else None
        key = point_key(budget, {c: row[c] for c in columns})
        if key not in rates:
            raise LookupError(f"run {row['run_id']}: no planned point {key}; plan the "
                              f"experiment with the config and overrides it ran with")
        # Rates are stored to 6 significant digits, so their ratio is the factor to about 5.
        factors.append(float(f"{row[RATE] / rates[key]:.4g}"))
    out = table.copy()
    out.insert(out.columns.get_loc(RATE) + 1, LR_FACTOR_COLUMN, factors)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table")
    parser.add_argument("experiment")
    parser.add_argument("out")
    args, overrides = parser.parse_known_args(argv)  # --config.X=Y, as the sweep ran with
    if Path(args.out).exists():
        print(f"error: {args.out} exists; pick another path", file=sys.stderr)
        return 2
    table = pd.read_csv(args.table)
    try:
        rates, columns = rule_rates(args.experiment, overrides)
        out = with_factors(table, rates, columns)
    except (AttnlabError, LookupError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out.to_csv(args.out, index=False)
    factors = sorted(set(out[LR_FACTOR_COLUMN]))
    print(f"{args.out}: {len(table)} runs at lr_factor {', '.join(map(str, factors))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
