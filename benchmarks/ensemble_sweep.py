"""Wall time of one whole sweep under each ``--ensemble`` choice, interleaved, from empty
directories (each compiles its own programs, as a newcomer's first sweep does).

    python benchmarks/ensemble_sweep.py [--rounds 3] [--choices auto,off] [--seeds 8] [--steps 200]

The sweep is experiments/tiny_grid.py with ``--seeds`` seeds per shape and ``--steps`` steps
(8 and 200: 32 runs, four shapes of eight seeds). Each round runs every choice once, in a rotated
order; the report gives each choice's wall time per round, the median, its ratio to
``--ensemble=off``, what the sweep chose (its "N units" line: ensembles and lone runs), and the
load average before and after each sweep.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_sweep(choice: str, seeds: int, steps: int, workdir: Path) -> tuple[float, str]:
    """(seconds, the sweep's grouping line) of one sweep into ``workdir``."""
    seed_axis = "(" + ",".join(str(s) for s in range(seeds)) + ",)"
    argv = [sys.executable, "-m", "attnlab.cli", "sweep", "--config=experiments/tiny_grid.py",
            f"--sweep={workdir}", f"--cache-dir={workdir.parent / (workdir.name + '_cache')}",
            f"--config.sweep.axes.train.seed={seed_axis}", f"--config.base.train.steps={steps}",
            f"--ensemble={choice}"]  # the bar on: its first line says how runs are grouped
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"--ensemble={choice} failed:\n{done.stderr[-2000:]}")
    line = re.search(r"running (\d+)( in (\d+) ensembles and lone runs)?",
                     done.stdout + done.stderr)
    units = (f"{line.group(3)} units" if line and line.group(3) else "lone runs") if line else "?"
    return seconds, units


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--choices", default="auto,off")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    choices = args.choices.split(",")
    times: dict[str, list[float]] = {c: [] for c in choices}
    units: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = choices[r % len(choices):] + choices[:r % len(choices)]
            for choice in order:
                load = os.getloadavg()[0]
                seconds, units[choice] = one_sweep(choice, args.seeds, args.steps,
                                                   Path(tmp) / f"{choice}{r}")
                times[choice].append(seconds)
                print(f"round {r}: --ensemble={choice} {seconds:.1f} s ({units[choice]}; load "
                      f"{load:.1f} -> {os.getloadavg()[0]:.1f})", flush=True)
    base = statistics.median(times["off"]) if "off" in times else None
    print(f"\n| --ensemble | units | wall per round (s) | median (s) | against off |")
    print("|---|---|---|---:|---:|")
    for choice in choices:
        median = statistics.median(times[choice])
        ratio = f"{median / base:.2f}x" if base else "-"
        rounds = ", ".join(f"{t:.0f}" for t in times[choice])
        print(f"| {choice} | {units[choice]} | {rounds} | {median:.0f} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
