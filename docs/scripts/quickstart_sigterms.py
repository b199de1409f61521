"""SIGTERM to the whole process group of `attnlab quickstart` (as `timeout`, a scheduler or a
container stop sends it) at a random moment of the study, then the same command again to the
end: TRIALS times, each on a fresh study directory, so that the moments spread over start-up,
compilation, training, checkpoints, the fits and the plots. Each must end with every run
completed, none recorded failed, and the results table and fit equal to an uninterrupted
quickstart's.

    python docs/scripts/quickstart_sigterms.py [--trials 20] [--seed 0] \
        [--out docs/results/quickstart_sigterms.csv]

Each trial's row: the moment of the signal, the exit status, how far the study had got (runs
completed, the fit written), the rerun's exit status and its largest relative differences from
the uninterrupted study. The last line printed is the verdict.
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
            f"--sweep={workdir}", "--bootstrap=0", "--noprogress"]
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def statuses(workdir: Path) -> list[str]:
    """Each run's status as sweeps read it (an interrupted run is partial, not failed)."""
    return [rundir.run_status(d) for d in results.run_dirs(workdir)] if workdir.exists() else []


def trial(workdir: Path, reference: Path, logs: Path, delay: float, number: int) -> dict:
    """A fresh study, SIGTERM to its group after ``delay`` seconds (if still running), rerun."""
    proc = quickstart(workdir, logs / f"trial{number}.log")
    start = time.time()
    while proc.poll() is None and time.time() - start < delay:
        time.sleep(0.02)
    landed = proc.poll() is None
    if landed:
        os.killpg(proc.pid, signal.SIGTERM)
    code = proc.wait(timeout=300)
    seen = statuses(workdir)
    row = {"trial": number, "delay_s": round(delay, 2), "signalled": landed, "exit": code,
           "runs_completed": seen.count("completed"), "runs_failed": seen.count("failed"),
           "fit_written": (workdir / "fit.json").exists()}
    row["rerun_exit"] = quickstart(workdir, logs / f"trial{number}_rerun.log").wait()
    verdict = compare(workdir, reference) if row["rerun_exit"] == 0 else {}
    row["loss_rel_diff"] = verdict.get("loss_rel_diff", np.inf)
    row["fit_rel_diff"] = verdict.get("fit_rel_diff", np.inf)
    row["passed"] = (code in (0, 130) and row["runs_failed"] == 0 and row["rerun_exit"] == 0
                     and verdict["same_runs"] and verdict["status"] == ["completed"]
                     and row["loss_rel_diff"] <= 1e-6 and row["fit_rel_diff"] <= 1e-6)
    return row


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
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "docs/results/quickstart_sigterms.csv")
    parser.add_argument("--work", type=Path, default=None, help="default: a temporary directory")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="sigterms-"))
    work.mkdir(parents=True, exist_ok=True)
    reference = work / "reference"

    start = time.time()
    if quickstart(reference, work / "reference.log").wait() != 0:
        print(f"the uninterrupted quickstart failed: {work / 'reference.log'}")
        return 1
    longest = time.time() - start
    rng, rows = random.Random(args.seed), []
    for number in range(args.trials):
        rows.append(trial(work / f"study{number}", reference, work,
                          rng.uniform(0.5, longest), number))
        print(rows[-1], flush=True)
        pd.DataFrame(rows).to_csv(args.out, index=False)
    landed = sum(r["signalled"] for r in rows)
    passed = sum(r["passed"] for r in rows)
    print(f"{args.trials} trials, the signal landed in {landed} (uninterrupted study "
          f"{longest:.0f} s; moments uniform over it): {passed} of {args.trials} passed "
          f"(rerun completed every run, none failed, losses and fit equal to the "
          f"uninterrupted study's); rows in {args.out}")
    return 0 if passed == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
