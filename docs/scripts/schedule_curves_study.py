"""The CPU study of the laws of whole curves (docs/scaling.md, "Whole curves across schedules"):
from the sweep of ``experiments/schedule_curves.py``, writes its results and curves tables, the
multi-power and annealing fits on three schedules with the other two held out, their figure,
and the table of each curve's relative error beside the S1-only baseline's.

    attnlab sweep --config=experiments/schedule_curves.py --sweep=sweeps/schedule_curves
    python docs/scripts/schedule_curves_study.py --sweep=sweeps/schedule_curves

Runs are named by their schedule in the curves table (``--holdout=run:wsd20,linear``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
from pathlib import Path

from attnlab import results
from attnlab.plots.cli import plot_main
from attnlab.scaling.cli import fit_main

REPO = Path(__file__).resolve().parents[2]
OUT = "docs/results/schedule_curves_cpu"
HELD = "wsd20,linear"
COMMON = [f"--sweep={OUT}.csv", f"--curves={OUT}_curves.csv", "--columns=loss:val_loss",
          f"--holdout=run:{HELD}"]
LAWS = ("multipower", "annealing")


def write_tables(sweep: Path) -> None:
    """The sweep's results table, and its curves with each run named by its schedule."""
    shutil.copyfile(sweep / "results.csv", REPO / f"{OUT}.csv")
    curves = results.curves(sweep)
    curves = curves.assign(run_id=curves["schedule"])
    curves[["run_id", "step", "tokens", "lr", "loss", "val_loss"]].to_csv(
        REPO / f"{OUT}_curves.csv", index=False)


def fit_all() -> dict[str, dict]:
    fits = {}
    for law in LAWS:
        path = f"{OUT}_{law}.json"
        if fit_main([f"--law={law}", *COMMON, f"--json={path}"]):
            raise SystemExit(f"error: the {law} fit failed")
        fits[law] = json.loads((REPO / path).read_text())
    if plot_main(["--kind=curves", "--law=multipower", *COMMON, f"--plot={OUT}.png"]):
        raise SystemExit("error: the figure failed")
    return fits


def table(fits: dict[str, dict]) -> str:
    """Markdown: per run, its role, each law's mean and largest |relative error| and its
    signed error at the last step, and the baseline's (%)."""
    rows = {law: {r["run_id"]: r for r in fit["runs"]} for law, fit in fits.items()}
    first = rows[LAWS[0]]
    lines = ["| run | role | points | multi-power mean / max / last | annealing mean / max / "
             "last | S1-only mean / max |", "|---|---|---:|---|---|---|"]
    for run, row in first.items():
        cells = [f"{100 * rows[law][run]['mean_relative_error']:.2f}% / "
                 f"{100 * rows[law][run]['max_relative_error']:.2f}% / "
                 f"{100 * rows[law][run]['final_error']:+.2f}%" for law in LAWS]
        base = (f"{100 * row['baseline_mean_relative_error']:.2f}% / "
                f"{100 * row['baseline_max_relative_error']:.2f}%")
        role = "held out" if row["heldout"] else "fitted"
        lines.append(f"| {run} | {role} | {row['points']} | {' | '.join(cells)} | {base} |")
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
