"""Coverage of ``attnlab fit --law=hparams --pair``'s 95% intervals on grids trained at 3 seeds.

Each draw is the known law of ``tests/test_scaling_hparams.py`` (lr* = 2 N^-0.3 D^0.1, batch* =
0.5 N^0.1 D^0.3; 4 sizes x 2 token counts, a 5 x 5 grid of lr and batch) at 3 seeds, each seed a
loss offset per (N, D) group shared by its runs and noise of each run's own
(``synthetic.hparams_seeds``). Its exponents' intervals are bootstrapped twice on the same data
and draws: taking n - 1 of each group's n seeds (what the fit does) and taking n. An interval
covers when it contains the true exponent; a draw whose interval is refused (more than 10% of
its refits lost a group's optimum to its grid's edge) counts as a miss.

    python docs/scripts/hparams_pair_coverage.py --draws=40
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from attnlab.scaling import synthetic
from attnlab.scaling.laws import hparams

LR = (2.0, {"params": -0.3, "tokens": 0.1})
BATCH = (0.5, {"params": 0.1, "tokens": 0.3})
SIZES, TOKENS = (1e5, 3e5, 1e6, 3e6), (1e8, 1e9)


def covers(intervals: dict) -> dict:
    """Per exponent, whether its interval holds the truth; a refused interval does not."""
    return {(t, k): bool(intervals) and intervals[t][k][0] < truth[1][k] < intervals[t][k][1]
            for t, truth in (("lr", LR), ("batch", BATCH)) for k in ("params", "tokens")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=40)
    parser.add_argument("--refits", type=int, default=100)
    parser.add_argument("--first", type=int, default=0, help="the first draw's seed (draws "
                        "first .. first + draws - 1: more draws beside an earlier run's)")
    args = parser.parse_args()
    start, hits, refused = time.time(), {True: [], False: []}, {True: 0, False: 0}
    for draw in range(args.first, args.first + args.draws):
        frame = synthetic.hparams_seeds(LR, BATCH, sizes=SIZES, tokens=TOKENS, seed=draw)
        runs, _ = hparams.read_runs(frame, "synthetic", None, pair="train.seed")
        for rescaled in hits:
            intervals, failed = hparams.bootstrap(runs, "smooth", 0.0, args.refits, draw, 0.95,
                                                  paired=True, rescaled=rescaled)
            hits[rescaled].append(covers(intervals))
            refused[rescaled] += not intervals
    print(f"{args.draws} draws x {args.refits} refits, 3 seeds, {time.time() - start:.0f} s")
    for rescaled, rows in hits.items():
        share = {key: np.mean([row[key] for row in rows]) for key in rows[0]}
        cells = ", ".join(f"{t}* {k} {v:.3f}" for (t, k), v in share.items())
        print(f"drawing {'n - 1' if rescaled else 'n'} of n seeds: mean coverage "
              f"{np.mean(list(share.values())):.3f} ({cells}); intervals refused in "
              f"{refused[rescaled]} of {args.draws} draws (counted as misses)")


if __name__ == "__main__":
    main()
