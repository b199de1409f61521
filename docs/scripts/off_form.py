"""Every law fitted off its own form, and the over-training law on Gadre et al.'s runs: the
tables of docs/scaling_studies.md's "off its own form" sections (attnlab/scaling/off_form.py's cases;
tests/test_scaling_off_form.py checks the same cases, some at fewer seeds).

- off_form.csv: one row per (law, truth, seed, quantity): the truth, the estimate and its 95%
  bootstrap interval.
- off_form_gadre.csv: per training set and fit, each held-out 1.4B/6.9B run's observed and
  predicted C4 eval loss and the relative error.

    PYTHONPATH=. python docs/scripts/off_form.py --out=docs/results

(about 2 min on the shared 2-core VM.)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from attnlab.scaling import off_form, published_runs

CASES = (
    [(off_form.overtrain_case, off_form.CHINCHILLA, seed) for seed in range(3)]
    + [(off_form.overtrain_case, off_form.EQUAL, seed) for seed in range(6)]
    + [(off_form.approach3_case, gamma, seed) for gamma in (1.0, 1.5, 0.7) for seed in range(4)]
    + [(off_form.kaplan_case, truth, seed) for truth in off_form.KAPLAN_TRUTHS
       for seed in range(3)]
    + [(off_form.data_constrained_case, rise, seed) for rise in (0.0, 0.05) for seed in range(3)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/results")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows = [row for case, truth, seed in CASES for row in case(truth, seed)]
    pd.DataFrame(rows).to_csv(out / "off_form.csv", index=False, float_format="%.6g")
    gadre = off_form.gadre_predictions(published_runs.gadre_runs())
    gadre.to_csv(out / "off_form_gadre.csv", index=False, float_format="%.6g")
    print(f"{len(rows)} rows, {len(gadre)} predictions, {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
