"""SIGTERM to the whole process group of `attnlab quickstart` (as `timeout`, a scheduler or a
container stop sends it) at random moments, each time followed by the same command again, until
KILLS signals have landed; then one rerun to the end. The study must end with every run
completed, none ever recorded failed, and the results table and fit equal to an uninterrupted
quickstart's.

    python docs/scripts/quickstart_sigterms.py [--kills 20] [--seed 0] \
        [--out docs/results/quickstart_sigterms.csv]

Each signal's row: the delay after the start, the exit status, and how far the study had got
(runs completed, whether the fit had been written). The last line printed is the verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from attnlab import results, rundir

REPO = Path(__file__).resolve().parents[2]
EXPERIMENT = REPO / "experiments" / "tiny_isoflop.py"


def quickstart(workdir: Path, log: Path) -> subprocess.Popen:
    """The command in its own process group, as a shell starts a job."""
    argv = [sys.executable, "-m", "attnlab.cli", "quickstart", f"--config={EXPERIMENT}",
            f"--workdir={workdir}", "--bootstrap=0", "--noprogress"]
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def statuses(workdir: Path) -> list[str]:
    """Each run's status as sweeps read it (an interrupted run is partial, not failed)."""
    return [rundir.run_status(d) for d in results.run_dirs(workdir)] if workdir.exists() else []


def interrupt_at_random(workdir: Path, logs: Path, rng: random.Random, longest: float,
                        attempt: int) -> dict:
    """One start of the study, SIGTERM to its group after a random delay (if still running)."""
    # Half the moments fall in the first third of a study's length, so that most land while
    # runs train rather than after a few starts have finished them.
    delay = rng.uniform(0.5, longest / 3 if rng.random() < 0.5 else longest)
    proc = quickstart(workdir, logs / f"attempt{attempt}.log")
    start = time.time()
    while proc.poll() is None and time.time() - start < delay:
        time.sleep(0.02)
    landed = proc.poll() is None
    if landed:
        os.killpg(proc.pid, signal.SIGTERM)
    code = proc.wait(timeout=300)
    seen = statuses(workdir)
    return {"attempt": attempt, "delay_s": round(delay, 2), "signalled": landed, "exit": code,
            "runs_completed": seen.count("completed"), "runs_failed": seen.count("failed"),
            "fit_written": (workdir / "fit.json").exists()}


def compare(workdir: Path, reference: Path) -> dict:
    """The largest relative difference of each run's losses and of the fit's parameters."""
    ours = pd.read_csv(workdir / "results.csv").set_index("run_id").sort_index()
    want = pd.read_csv(reference / "results.csv").set_index("run_id").sort_index()
    same_runs = list(ours.index) == list(want.index)
    losses = ["final_val_loss", "final_train_loss"]
    loss_diff = float(np.max(np.abs(ours[losses].to_numpy(float) - want[losses].to_numpy(float))
                             / np.abs(want[losses].to_numpy(float)))) if same_runs else np.inf
    fit, fit_want = (json.loads((d / "fit.json").read_text()) for d in (workdir, reference))
    numbers = [k for k, v in fit_want.items() if isinstance(v, (int, float))]
    fit_diff = max((abs(fit[k] - fit_want[k]) / max(abs(fit_want[k]), 1e-300) for k in numbers),
                   default=0.0)
    return {"same_runs": same_runs, "status": sorted(set(ours["status"])),
            "loss_rel_diff": loss_diff, "fit_rel_diff": fit_diff, "fit_numbers": len(numbers)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "docs/results/quickstart_sigterms.csv")
    parser.add_argument("--work", type=Path, default=None, help="default: a temporary directory")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="sigterms-"))
    work.mkdir(parents=True, exist_ok=True)
    reference, study = work / "reference", work / "study"

    start = time.time()
    if quickstart(reference, work / "reference.log").wait() != 0:
        print(f"the uninterrupted quickstart failed: {work / 'reference.log'}")
        return 1
    longest = time.time() - start  # delays up to the whole study's length
    rng, rows = random.Random(args.seed), []
    while sum(row["signalled"] for row in rows) < args.kills and len(rows) < 20 * args.kills:
        rows.append(interrupt_at_random(study, work, rng, longest, len(rows)))
        print(rows[-1], flush=True)
    final = quickstart(study, work / "final.log").wait()
    verdict = compare(study, reference)
    ok = (sum(r["signalled"] for r in rows) >= args.kills and final == 0
          and verdict["same_runs"] and verdict["status"] == ["completed"]
          and all(r["runs_failed"] == 0 for r in rows)
          and all(r["exit"] in (0, 130) for r in rows)
          and verdict["loss_rel_diff"] <= 1e-6 and verdict["fit_rel_diff"] <= 1e-6)
    pd.DataFrame(rows).to_csv(args.out, index=False)
    print(f"{args.kills} SIGTERMs to the group over {len(rows)} starts (uninterrupted study "
          f"{longest:.0f} s), final rerun exit {final}; runs {verdict['status']}, same runs "
          f"{verdict['same_runs']}, largest relative difference: losses "
          f"{verdict['loss_rel_diff']:.1e}, fit ({verdict['fit_numbers']} numbers) "
          f"{verdict['fit_rel_diff']:.1e}: {'PASS' if ok else 'FAIL'}; rows in {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
