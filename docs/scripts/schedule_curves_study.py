"""The CPU study of the laws of whole curves (docs/scaling_studies.md, "Whole curves across schedules"):
from the sweep of ``experiments/schedule_curves.py``, writes its results and curves tables, the
multi-power and annealing fits on three schedules of a seed with the other two held out, the
figure of seed 0, and the table of each curve's relative error beside the S1-only baseline's.

    attnlab sweep --config=experiments/schedule_curves.py --sweep=sweeps/schedule_curves
    python docs/scripts/schedule_curves_study.py --sweep=sweeps/schedule_curves

Each seed is its own study (its curves table, its fits): runs are named by their schedule
(``--holdout=run:wsd20,linear``), and the two seeds show the spread.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
from pathlib import Path

import pandas as pd

from attnlab import results
from attnlab.plots.cli import plot_main
from attnlab.scaling.cli import fit_main

REPO = Path(__file__).resolve().parents[2]
OUT = "docs/results/schedule_curves_cpu"
SEEDS = (0, 1)
LAWS = ("multipower", "annealing")


def flags(seed: int) -> list[str]:
    """The fit's input flags for one seed's curves: three schedules fitted, two held out."""
    return [f"--sweep={OUT}.csv", f"--curves={OUT}_s{seed}_curves.csv",
            "--columns=loss:val_loss", "--holdout=run:wsd20,linear"]


def write_tables(sweep: Path) -> None:
    """The sweep's results table, and each seed's curves with each run named by its
    schedule."""
    shutil.copyfile(sweep / "results.csv", REPO / f"{OUT}.csv")
    curves = results.curves(sweep)
    for seed in SEEDS:
        one = curves[curves["train.seed"] == seed]
        one.assign(run_id=one["schedule"])[["run_id", "step", "tokens", "lr", "loss",
                                            "val_loss"]].to_csv(
            REPO / f"{OUT}_s{seed}_curves.csv", index=False)


def fit_all() -> dict[tuple[int, str], dict]:
    fits = {}
    for seed in SEEDS:
        for law in LAWS:
            path = f"{OUT}_s{seed}_{law}.json"
            if fit_main([f"--law={law}", *flags(seed), f"--json={path}"]):
                raise SystemExit(f"error: the {law} fit of seed {seed} failed")
            fits[seed, law] = json.loads((REPO / path).read_text())
    if plot_main(["--kind=curves", "--law=multipower", *flags(0), f"--plot={OUT}.png"]):
        raise SystemExit("error: the figure failed")
    return fits


def _cells(row: dict, last: bool = True) -> str:
    text = (f"{100 * row['mean_relative_error']:.2f}% / "
            f"{100 * row['max_relative_error']:.2f}%")
    return text + (f" / {100 * row['final_error']:+.2f}%" if last else "")


def table(fits: dict[tuple[int, str], dict]) -> str:
    """Markdown: per seed and run, its role, each law's mean and largest |relative error| and
    its signed error at the last step, and the baseline's mean and largest (%)."""
    lines = ["| seed | run | role | points | multi-power mean / max / last | annealing mean / "
             "max / last | S1-only mean / max |", "|---|---|---|---:|---|---|---|"]
    for seed in SEEDS:
        rows = {law: {r["run_id"]: r for r in fits[seed, law]["runs"]} for law in LAWS}
        for run, row in rows[LAWS[0]].items():
            cells = " | ".join(_cells(rows[law][run]) for law in LAWS)
            base = _cells({k.removeprefix("baseline_"): v for k, v in row.items()}, last=False)
            role = "held out" if row["heldout"] else "fitted"
            lines.append(f"| {seed} | {run} | {role} | {row['points']} | {cells} | {base} |")
    return "\n".join(lines) + "\n"


def ranking(fits: dict[tuple[int, str], dict]) -> str:
    """Markdown: per schedule, each seed's last validation loss, observed and predicted by each
    law (observed x (1 + final_error)), with its rank among the schedules (1: lowest)."""
    final = {}
    for seed in SEEDS:
        curves = pd.read_csv(REPO / f"{OUT}_s{seed}_curves.csv").dropna(subset=["val_loss"])
        observed = curves.groupby("run_id")["val_loss"].last()
        final[seed, "observed"] = observed
        for law in LAWS:
            errors = pd.Series({r["run_id"]: r["final_error"] for r in fits[seed, law]["runs"]})
            final[seed, law] = observed * (1.0 + errors[observed.index])
    ranks = {key: values.rank().astype(int) for key, values in final.items()}
    kinds = ("observed",) + LAWS
    lines = ["| run | " + " | ".join(f"seed {s}: {k}" for s in SEEDS for k in kinds) + " |",
             "|---|" + "---:|" * (len(SEEDS) * len(kinds))]
    for run in final[SEEDS[0], "observed"].index:
        cells = [f"{final[s, k][run]:.4f} ({ranks[s, k][run]})" for s in SEEDS for k in kinds]
        lines.append(f"| {run} | " + " | ".join(cells) + " |")
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
        fits = fit_all()
        text = table(fits) + "\n" + ranking(fits)
    (REPO / f"{OUT}.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
