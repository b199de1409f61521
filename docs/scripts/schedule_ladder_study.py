"""A WSD ladder's cooldown branches predicted by the laws of whole curves (docs/scaling_studies.md,
"Whole curves across schedules"): from the sweep of ``experiments/schedule_curves.py:ladder``,
writes its results table and each seed's curves (runs named trunk, b125k, ..., b1M), fits the
multi-power and annealing laws on a seed's trunk and its shortest branch (and its two
shortest), and tabulates how far off they put each longer branch's final loss, beside the
S1-only power law's.

    attnlab sweep --config=experiments/schedule_curves.py:ladder --sweep=sweeps/schedule_ladder
    python docs/scripts/schedule_ladder_study.py --sweep=sweeps/schedule_ladder

A branch's curve is its trunk's up to the branch point and its cooldown after it (the curves
reader joins them through the table's ``trunk`` column).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
from pathlib import Path

import pandas as pd

from attnlab import results
from attnlab.scaling.cli import fit_main

REPO = Path(__file__).resolve().parents[2]
OUT = "docs/results/schedule_ladder_cpu"
SEEDS = (0, 1)
LAWS = ("multipower", "annealing")
BRANCHES = ("b125k", "b250k", "b500k", "b1M")
# Fitted on the trunk and its shortest branch, or its two shortest: the rest held out. (The
# second design was added after the first's seed-1 fit left the decay terms at zero: its
# shortest cooldown holds two validation points.)
DESIGNS = (1, 2)


def short_name(run_id: str, role: str) -> str:
    return "trunk" if role == "trunk" else "b" + re.search(r"-t([^-]+)-s\d", run_id).group(1)


def write_tables(sweep: Path) -> None:
    """The sweep's results table, and each seed's curves with each run (and its trunk column)
    named by its role and tokens."""
    shutil.copyfile(sweep / "results.csv", REPO / f"{OUT}.csv")
    curves = results.curves(sweep)
    for seed in SEEDS:
        one = curves[curves["train.seed"] == seed].copy()
        names = {r: short_name(r, role) for r, role in
                 one.groupby("run_id")["role"].first().items()}
        one["run_id"] = one["run_id"].map(names)
        one["trunk"] = one["trunk"].map(names)  # a trunk's own is empty
        one[["run_id", "trunk", "step", "tokens", "lr", "loss", "val_loss"]].to_csv(
            REPO / f"{OUT}_s{seed}_curves.csv", index=False)


def fit_all() -> dict[tuple[int, int, str], dict]:
    fits = {}
    for seed in SEEDS:
        for fitted in DESIGNS:
            for law in LAWS:
                path = f"{OUT}_s{seed}_{law}_{fitted}.json"
                if fit_main([f"--law={law}", f"--sweep={OUT}.csv",
                             f"--curves={OUT}_s{seed}_curves.csv", "--columns=loss:val_loss",
                             f"--holdout=run:{','.join(BRANCHES[fitted:])}", f"--json={path}"]):
                    raise SystemExit(f"error: the {law} fit of seed {seed} failed")
                fits[seed, fitted, law] = json.loads((REPO / path).read_text())
    return fits


def table(fits: dict[tuple[int, int, str], dict]) -> str:
    """Markdown: per seed, design and held-out branch, its final validation loss and each
    law's signed error there (predicted / observed - 1), the S1-only law's beside them."""
    lines = ["| seed | fitted on | branch | final loss | multi-power | annealing | S1-only |",
             "|---|---|---|---:|---:|---:|---:|"]
    for seed in SEEDS:
        curves = pd.read_csv(REPO / f"{OUT}_s{seed}_curves.csv").dropna(subset=["val_loss"])
        final = curves.sort_values("step").groupby("run_id")["val_loss"].last()
        for fitted in DESIGNS:
            rows = {law: {r["run_id"]: r for r in fits[seed, fitted, law]["runs"]}
                    for law in LAWS}
            for run in BRANCHES[fitted:]:
                cells = [f"{100 * rows[law][run]['final_error']:+.2f}%" for law in LAWS]
                cells.append(f"{100 * rows[LAWS[0]][run]['baseline_final_error']:+.2f}%")
                lines.append(f"| {seed} | trunk, {', '.join(BRANCHES[:fitted])} | {run} | "
                             f"{final[run]:.4f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", default=None, help="the sweep directory (default: refit "
                        "the committed tables)")
    args = parser.parse_args(argv)
    sweep = Path(args.sweep).resolve() if args.sweep else None
    with contextlib.chdir(REPO):
        if sweep:
            write_tables(sweep)
        text = table(fit_all())
    (REPO / f"{OUT}.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
