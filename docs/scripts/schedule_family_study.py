"""Which schedule of a family is best for one budget, predicted before training and then
trained (docs/scaling_studies.md, "Whole curves across schedules"): the multi-power and annealing laws
fitted at ``experiments/schedule_curves.py:cpu`` (each seed's constant, cosine and wsd50
curves: ``docs/results/schedule_curves_cpu_s*_*.json``) predict the final loss of every
schedule of ``:family``; the family's trained final losses (its results table) rank them.

    attnlab sweep --config=experiments/schedule_curves.py:family --sweep=sweeps/schedule_family
    python docs/scripts/schedule_family_study.py --sweep=sweeps/schedule_family

Writes ``docs/results/schedule_family_cpu.csv`` (the sweep's results) and ``.md`` (the table:
per schedule and seed the trained loss and each law's prediction with their ranks, and per seed
and law Spearman's rank correlation of predicted against trained, and the trained loss of the
law's pick above the best trained).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pandas as pd
from scipy import stats

from attnlab.scaling.curves import schedule_curve
from attnlab.scaling.laws.registry import law_named

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "docs/results/schedule_family_cpu"
FITS = REPO / "docs/results/schedule_curves_cpu_s{seed}_{law}.json"
SEEDS = (0, 1)
LAWS = ("multipower", "annealing")


def spec(row: pd.Series) -> str:
    """The run's schedule spelled as ``curves.schedule_curve`` reads it, from its config."""
    fields = (f"peak={row['train.learning_rate']},warmup_steps={int(row['train.warmup_steps'])},"
              f"total_steps={int(row['steps'])}")
    if row["train.schedule"] == "constant":
        return f"constant:{fields}"
    fields += f",min_lr_ratio={row['train.min_lr_ratio']}"
    if row["train.schedule"] == "cosine":
        return f"cosine:{fields}"
    return (f"wsd:{fields},decay_fraction={row['train.decay_fraction']},"
            f"cooldown={row['train.cooldown']}")


def predictions(table: pd.DataFrame) -> pd.DataFrame:
    """Per run, each law's predicted final loss from its seed's fit."""
    rows = []
    for _, run in table.iterrows():
        curve = schedule_curve(spec(run))
        out = {"schedule": run["schedule"], "seed": int(run["train.seed"]),
               "trained": float(run["final_val_loss"])}
        for name in LAWS:
            law, settings = law_named(name), law_named(name).options({})
            fit = json.loads(Path(str(FITS).format(seed=out["seed"], law=name)).read_text())
            params = {k: fit[k] for k in law.model(settings).names}
            out[name] = float(law.predict(params, curve, settings)[-1])
        rows.append(out)
    return pd.DataFrame(rows)


def table(frame: pd.DataFrame) -> str:
    kinds = ("trained",) + LAWS
    lines = ["| schedule | " + " | ".join(f"seed {s}: {k}" for s in SEEDS for k in kinds)
             + " | seed spread |", "|---|" + "---:|" * (len(SEEDS) * len(kinds) + 1)]
    ranked = {s: frame[frame.seed == s].set_index("schedule") for s in SEEDS}
    ranks = {s: ranked[s][list(kinds)].rank().astype(int) for s in SEEDS}
    for name in sorted(ranked[SEEDS[0]].index, key=lambda n: ranked[SEEDS[0]].loc[n, "trained"]):
        cells = [f"{ranked[s].loc[name, k]:.4f} ({ranks[s].loc[name, k]})" for s in SEEDS
                 for k in kinds]
        spread = abs(ranked[0].loc[name, "trained"] - ranked[1].loc[name, "trained"])
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {spread:.4f} |")
    lines.append("")
    for s in SEEDS:
        for law in LAWS:
            rho = stats.spearmanr(ranked[s]["trained"], ranked[s][law]).statistic
            pick, best = ranked[s][law].idxmin(), ranked[s]["trained"].idxmin()
            regret = ranked[s].loc[pick, "trained"] / ranked[s].loc[best, "trained"] - 1
            lines.append(f"- seed {s}, {law}: Spearman {rho:.2f}; predicted best {pick}, "
                         f"trained best {best}; the pick's trained loss {100 * regret:+.2f}% "
                         f"above the best")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", default=None, help="the sweep directory (default: the "
                        "committed table)")
    args = parser.parse_args(argv)
    if args.sweep:
        shutil.copyfile(Path(args.sweep) / "results.csv", f"{OUT}.csv")
    runs = pd.read_csv(f"{OUT}.csv")
    text = table(predictions(runs[runs["status"] == "completed"]))
    Path(f"{OUT}.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
