"""Sweep overhead: a sweep's wall time against the sum of its runs' pure training-step time.

    python benchmarks/sweep.py --steps=200 --rounds=2 --workdir=/tmp/sweep_bench

Runs a small grid (2 shapes x ``--seeds`` seeds, default 2) twice through
``attnlab.sweep.run_sweep`` on the local launcher:

  cold:  a fresh sweep directory and a fresh JAX compilation cache;
  warm:  new seeds (new runs, same shapes) into the same directory, so every program is in the
         persistent compilation cache already;

once with the workers compiling their next run ahead (``compile_ahead``) and once without (the
default), alternating, ``--rounds`` times. A run that trains beside the next run's compilation
is slowed by it, so compare the sweeps' wall times between the two modes, not only the ratios.

Pure training-step time of a run = tokens / tokens_per_s, where tokens_per_s is training's
timed rate (it leaves out the first, compiling step, the evaluations and the checkpoint saves).
Target: wall / pure <= 1.1. The runs' summaries also give the time their evaluations
(``evaluation_seconds``: work the config asks for, 16 batches per run here) and checkpoint saves
(``checkpoint_seconds``) took, so the table splits the rest of the sweep's wall time into them
and the fixed cost (worker start, tracing, compilation or cache reads, first calls).
Prints a markdown section for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import time
from pathlib import Path

from attnlab.sweep import load_spec, run_sweep

ROOT = Path(__file__).resolve().parents[1]


def overrides(steps: int, seeds: tuple[int, ...]) -> list[str]:
    """tiny_grid's layout at a size where a step is real work (d 64-96, seq 128, batch 16)."""
    return [
        "sweep.shapes=((64, 2, 4, 3e-3), (96, 3, 4, 3e-3))",
        "sweep.axes.model.pos_encoding=('rope',)",
        f"sweep.axes.train.seed={seeds!r}",
        "base.model.max_len=128",
        "base.data.max_bytes=2000000",
        "base.data.seq_len=128",
        "base.data.batch_size=16",
        f"base.train.steps={steps}",
        f"base.train.warmup_steps={max(1, steps // 20)}",
        f"base.train.log_every={max(1, steps // 20)}",
        f"base.train.eval_every={max(1, steps // 4)}",
        "base.train.eval_batches=4",
        f"base.train.checkpoint_every={max(1, steps // 2)}",
    ]


def measure(workdir: Path, steps: int, seeds: tuple[int, ...], parallel: int,
            compile_ahead: bool) -> dict:
    spec = load_spec(str(ROOT / "experiments" / "tiny_grid.py"), overrides(steps, seeds))
    start = time.perf_counter()
    table = run_sweep(spec, workdir, parallel=parallel, progress=False,
                      compile_ahead=compile_ahead)
    wall = time.perf_counter() - start
    mine = table[table["train.seed"].isin(seeds)]
    assert set(mine["status"]) == {"completed"}, mine[["run_id", "status", "error"]]
    pure = float((mine["tokens"] / mine["tokens_per_s"]).sum())
    in_runs = float(mine["wall_seconds"].sum())
    summaries = [json.loads((workdir / "runs" / run_id / "summary.json").read_text())
                 for run_id in mine["run_id"]]
    evals = sum(s["evaluation_seconds"] for s in summaries)
    saves = sum(s["checkpoint_seconds"] for s in summaries)
    return {"runs": len(mine), "wall": wall, "pure": pure, "in_runs": in_runs, "evals": evals,
            "saves": saves, "ratio": wall / pure}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=2, help="seeds per shape and scenario")
    parser.add_argument("--workdir", default="/tmp/attnlab_sweep_bench")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    workdir = Path(args.workdir)
    seeds = tuple(range(2 * args.seeds))
    load_before = os.getloadavg()[0]
    rows = []
    for round_ in range(args.rounds):
        for compile_ahead in (True, False):
            shutil.rmtree(workdir, ignore_errors=True)
            mode = "compile ahead" if compile_ahead else "no compile ahead"
            cold = measure(workdir, args.steps, seeds[:args.seeds], args.parallel, compile_ahead)
            warm = measure(workdir, args.steps, seeds[args.seeds:], args.parallel, compile_ahead)
            rows += [(round_ + 1, mode, "cold (empty compilation cache)", cold),
                     (round_ + 1, mode, "warm (same shapes, new seeds)", warm)]
    print(f"## Sweep overhead ({time.strftime('%Y-%m-%d')})\n")
    print(f"`python benchmarks/sweep.py --steps={args.steps} --parallel={args.parallel} "
          f"--seeds={args.seeds} --rounds={args.rounds}` on "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs "
          f"(load average before {load_before:.1f}, at the end {os.getloadavg()[0]:.1f}).\n")
    # The runs' step time without a compilation beside them: the same round's sweep without
    # compile ahead (with it, the runs' own pure time absorbs part of the compilation).
    clean = {(r, name): m["pure"] for r, mode, name, m in rows if mode == "no compile ahead"}
    print("| round | workers | sweep | runs | sweep wall (s) | sum of runs' wall_seconds (s) | "
          "sum of pure step time (s) | evaluations (s) | checkpoint saves (s) | the rest (s) | "
          "wall / pure | wall / (pure + evaluations) | wall / pure without compile ahead |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for round_, mode, name, m in rows:
        rest = m["wall"] - m["pure"] - m["evals"] - m["saves"]
        print(f"| {round_} | {mode} | {name} | {m['runs']} | {m['wall']:.1f} | "
              f"{m['in_runs']:.1f} | {m['pure']:.1f} | {m['evals']:.1f} | {m['saves']:.1f} | "
              f"{rest:.1f} | {m['ratio']:.3f} | {m['wall'] / (m['pure'] + m['evals']):.3f} | "
              f"{m['wall'] / clean[round_, name]:.3f} |")


if __name__ == "__main__":
    main()
