"""Benchmark: Chinchilla approach 3 with Hoffmann et al.'s 4,500-start grid plus 1,000 bootstrap
refits on 250 points. Target: under 60 s on a 2-core CPU (docs/benchmarks.md).

    .venv/bin/python benchmarks/scaling_fit.py [--points=250] [--bootstrap=1000] [--repeats=1]

Times one cold call (compiling included, as a user's first `attnlab fit` pays it) and then warm
calls, with CPU time next to wall time (a shared machine's load shows as wall >> CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=250)
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=1, help="warm repeats after the cold one")
    args = parser.parse_args()

    from attnlab.scaling import CHINCHILLA_GRID, fit_approach3
    from attnlab.scaling.synthetic import CHINCHILLA_PUBLISHED, grid_points

    frame = grid_points(CHINCHILLA_PUBLISHED, n_points=args.points, noise=0.01,
                        rng=np.random.default_rng(0))
    runs = []
    for repeat in range(1 + args.repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fit = fit_approach3(frame["params"], frame["tokens"], frame["loss"],
                            grid=CHINCHILLA_GRID, n_bootstrap=args.bootstrap, seed=0)
        runs.append({"call": "cold (compiles)" if repeat == 0 else "warm",
                     "wall_s": round(time.perf_counter() - wall, 2),
                     "cpu_s": round(time.process_time() - cpu, 2)})
        print(json.dumps(runs[-1]), flush=True)
    summary = {
        "points": args.points, "grid_starts": len(CHINCHILLA_GRID),
        "starts_converged": fit.details["starts_converged"],
        "bootstrap_refits": fit.n_bootstrap, "bootstrap_starts": fit.details["bootstrap_starts"],
        "runs": runs, "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "fit": {k: round(v, 4) for k, v in fit.params.items()},
        "ci_alpha": [round(v, 4) for v in fit.ci["alpha"]],
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
