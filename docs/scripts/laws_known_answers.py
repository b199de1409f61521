"""Known answers of the data-constrained and over-training laws (docs/scaling_studies.md): synthetic runs
of each law's own form, with 0.5% multiplicative noise, fitted by ``attnlab fit`` as a user would.

- data_constrained_synthetic.csv: Muennighoff et al. 2023's published law (E 1.869, A 520.8,
  B 1487.7, alpha = beta = 0.3527, R*_D 15.4, R*_N 5.3) at 4 sizes (10M-3B) x 3 unique-token
  counts (1e8-1e10) x 1-64 epochs, 84 runs; fitted with the Chinchilla part frozen (as they
  do) and with all seven parameters free.
- overtrain_synthetic.csv: Gadre et al. 2024's L(C, M) with eta = 0.17 (alpha = beta = 0.34),
  E 1.69, a = 406.4 x 6^eta, M* = 20, at 8 budgets 1e15-1.6e19 (4x apart) x 6 ratios M 5-160,
  48 runs; fitted on the budgets <= 1e18 at M <= 40 to predict the 12 runs of the two largest
  budgets (M up to 160), and on all runs for the loss at M = 20, 200 and 2000 at 1e21 FLOPs.

    PYTHONPATH=. python docs/scripts/laws_known_answers.py --out=docs/results

writes the tables, each fit's report (``*.txt``) and JSON (``*.json``) there.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import time
from pathlib import Path

import numpy as np

from attnlab.scaling import synthetic
from attnlab.scaling.cli import fit_main

MUENNIGHOFF = synthetic.MUENNIGHOFF_PUBLISHED
FROZEN = ",".join(f"{k}={MUENNIGHOFF[k]}" for k in ("E", "A", "B", "alpha", "beta"))
ETA = 0.17
GADRE = {"E": 1.69, "a": 406.4 * 6**ETA, "b": 406.4 * 6**ETA * 20 ** (2 * ETA), "eta": ETA}


def tables(out: Path) -> dict[str, Path]:
    paths = {"data_constrained": out / "data_constrained_synthetic.csv",
             "overtrain": out / "overtrain_synthetic.csv",
             "overtrain_small": out / "overtrain_synthetic_holdout.csv"}
    rng = np.random.default_rng(0)
    synthetic.repeated_points(MUENNIGHOFF, sizes=np.geomspace(1e7, 3e9, 4),
                              unique_tokens=(1e8, 1e9, 1e10), epochs=(1, 2, 4, 8, 16, 32, 64),
                              noise=0.005, rng=rng).to_csv(paths["data_constrained"], index=False)
    frame = synthetic.overtrain_points(GADRE, budgets=1e15 * 4.0 ** np.arange(8),
                                       ratios=(5, 10, 20, 40, 80, 160), noise=0.005, rng=rng)
    frame.to_csv(paths["overtrain"], index=False)
    small = frame[(frame.flops >= 2e18) | (frame.tokens / frame.params <= 40)]
    small.to_csv(paths["overtrain_small"], index=False)
    return paths


def fit(name: str, args: list[str], out: Path) -> None:
    """``attnlab fit`` with ``args``; its report to NAME.txt, its JSON to NAME.json."""
    start = time.perf_counter()
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        code = fit_main(args + [f"--json={out / name}.json"])
    if code:
        raise SystemExit(f"{name}: attnlab fit exited {code}")
    seconds = time.perf_counter() - start
    command = "attnlab fit " + " ".join(args + [f"--json={out / name}.json"])
    (out / f"{name}.txt").write_text(f"$ {command}\n({seconds:.0f} s)\n\n{report.getvalue()}")
    print(f"{name}: {seconds:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/results")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    paths = tables(out)
    fit("data_constrained_frozen", [f"--sweep={paths['data_constrained']}",
                                    "--law=data_constrained", f"--fix={FROZEN}",
                                    "--bootstrap=200"], out)
    fit("data_constrained_joint", [f"--sweep={paths['data_constrained']}",
                                   "--law=data_constrained", "--bootstrap=100"], out)
    fit("overtrain_holdout", [f"--sweep={paths['overtrain_small']}", "--law=overtrain",
                              "--bootstrap=200", "--holdout=flops>=2e18"], out)
    fit("overtrain_ratios", [f"--sweep={paths['overtrain']}", "--law=overtrain",
                             "--bootstrap=200", "--budget=1e21",
                             "--tokens-per-param=20,200,2000"], out)


if __name__ == "__main__":
    main()
