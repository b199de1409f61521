"""Coverage of the bootstrap's 95% intervals on simulated ladders whose branches share a trunk.

Each simulation draws a ladder from Chinchilla's published law (``synthetic.ladder_points``: 8
sizes of 1e7-1e9 parameters, 6 trunks per size, 5 branches per trunk at 5-80 tokens per
parameter; a trunk's branches share a 1% random effect on the loss, each branch adds 0.2% of its
own), fits approach 3 once, and bootstraps it twice on the same draws of the same data: by rows
(as if the 240 branches were independent) and by trunks (48 clusters, drawn whole). An interval
covers when it contains the true parameter.

    python docs/scripts/cluster_coverage.py --sims=400 --out=docs/results/cluster_coverage.csv
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import pandas as pd

from attnlab.scaling.bootstrap import cluster_index
from attnlab.scaling.laws.approach3 import InitGrid, fit_approach3
from attnlab.scaling.synthetic import CHINCHILLA_PUBLISHED, ladder_points

SIZES = np.geomspace(1e7, 1e9, 8)
# A small grid around the published law: every simulated fit lands in its basin, and the
# main fit costs 72 starts instead of 4,500.
GRID = InitGrid(a=(4.0, 6.0, 8.0), b=(4.0, 6.0, 8.0), e=(0.0, 1.0), alpha=(0.2, 0.5),
                beta=(0.2, 0.5))
PARAMS = ("alpha", "beta", "E", "a")
TRUNKS = 6


def truth() -> dict[str, float]:
    p = dict(CHINCHILLA_PUBLISHED)
    p["a"] = p["beta"] / (p["alpha"] + p["beta"])
    return p


def one_simulation(rng: np.random.Generator, n_bootstrap: int, level: float, sizes=SIZES,
                   trunks: int = TRUNKS) -> list[dict]:
    """Rows (method, parameter, low, high, covered, refits) for one simulated ladder."""
    table = ladder_points(CHINCHILLA_PUBLISHED, sizes, trunks_per_size=trunks, rng=rng)
    seed = int(rng.integers(2**31))
    clusters = cluster_index(table["trunk"])
    out, true = [], truth()
    for method, groups in (("row", None), ("cluster", clusters)):
        fit = fit_approach3(table["params"], table["tokens"], table["loss"], grid=GRID,
                            n_bootstrap=n_bootstrap, bootstrap_grid_starts=0, ci_level=level,
                            seed=seed, clusters=groups)
        for name in PARAMS:
            low, high = fit.ci.get(name, (np.nan, np.nan))
            out.append({"method": method, "parameter": name, "estimate": fit.params[name],
                        "low": low, "high": high, "covered": bool(low <= true[name] <= high),
                        "refits": fit.n_bootstrap, "refused": fit.intervals_refused,
                        "failed_refits": fit.n_bootstrap_failed})
    return out


def coverage(n_sims: int, n_bootstrap: int = 200, level: float = 0.95, seed: int = 0,
             sizes=SIZES, trunks: int = TRUNKS) -> pd.DataFrame:
    """One row per (simulation, method, parameter)."""
    rng = np.random.default_rng(seed)
    rows = []
    for sim in range(n_sims):
        rows += [dict(r, sim=sim) for r in one_simulation(rng, n_bootstrap, level, sizes,
                                                          trunks)]
    return pd.DataFrame(rows)


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per method and parameter: the simulations, those whose intervals were refused (more
    than 10% of refits failed, unidentified draws among them), the coverage among the others
    with its binomial standard error, and the median interval width."""
    shown = frame[~frame["refused"]]
    grouped = shown.assign(width=shown["high"] - shown["low"]).groupby(
        ["parameter", "method"], sort=False)
    table = grouped.agg(with_interval=("covered", "size"), coverage=("covered", "mean"),
                        median_width=("width", "median")).reset_index()
    every = frame.groupby(["parameter", "method"], sort=False).agg(
        simulations=("covered", "size"), refused=("refused", "sum"),
        median_failed_refits=("failed_refits", "median")).reset_index()
    table = every.merge(table, on=["parameter", "method"], how="left")
    table["coverage_se"] = np.sqrt(table["coverage"] * (1 - table["coverage"])
                                   / table["with_interval"])
    return table


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sims", type=int, default=400)
    parser.add_argument("--bootstrap", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sizes", type=int, default=len(SIZES),
                        help="model sizes, log-spaced over 1e7-1e9")
    parser.add_argument("--trunks", type=int, default=TRUNKS, help="trunks (seeds) per size")
    parser.add_argument("--out", default=None, help="write the summary table (.csv) here")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    table = summary(coverage(args.sims, args.bootstrap, seed=args.seed,
                             sizes=np.geomspace(1e7, 1e9, args.sizes), trunks=args.trunks))
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"{args.sims} simulations x {args.bootstrap} refits x 2 methods in "
          f"{time.perf_counter() - start:.0f} s")
    if args.out:
        table.to_csv(args.out, index=False, float_format="%.6g")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
