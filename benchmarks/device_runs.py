"""The finished runs of a device session's sweeps, carried from one lease to the next.

A lent machine starts bare, so a study that outlasts one lease would start over on the next.
The sweep skips a run whose summary says it finished, and a finished run needs only its small
files (no checkpoints) for that and for the results table. So `benchmarks/device_session.sh`
packs them into ``runs.tar.gz`` beside its tables, and the next lease, carrying it (copied here
to ``.resume/runs.tar.gz``, never committed), unpacks it into its work folder first:

    python benchmarks/device_runs.py pack WORK ARCHIVE     # every finished run under WORK/*/runs
    python benchmarks/device_runs.py unpack ARCHIVE WORK   # run folders WORK lacks, nothing else

Unfinished runs stay behind: they restart from their beginning there (their checkpoints are
too large to bring back).
"""

from __future__ import annotations

import argparse
import sys
import tarfile
from pathlib import Path

from attnlab.rundir import (COMPLETED, CONFIG_FILE, DIVERGED, METRICS_FILE, RUN_FILE, RUNS_DIR,
                            SUMMARY_FILE, run_status)

KEPT = (RUN_FILE, CONFIG_FILE, SUMMARY_FILE, METRICS_FILE)


def finished_runs(work: Path) -> list[Path]:
    """The run folders under ``work/<sweep>/runs/`` whose runs completed or diverged: a rerun
    would not change them. A failed run is left to be tried again (out of memory, say, on a
    machine or a version of the code that has since changed)."""
    return sorted(d for d in work.glob(f"*/{RUNS_DIR}/*")
                  if d.is_dir() and run_status(d) in (COMPLETED, DIVERGED))


def pack(work: Path, archive: Path) -> int:
    """Writes ``archive`` (through a temporary name: a reader never sees half of one); returns
    the runs packed."""
    runs = finished_runs(work)
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w:gz") as tar:
        for run in runs:
            for name in KEPT:
                if (run / name).is_file():
                    tar.add(run / name, arcname=str((run / name).relative_to(work)))
    partial.replace(archive)
    return len(runs)


def unpack(archive: Path, work: Path) -> tuple[int, int]:
    """(runs added, runs skipped because ``work`` has their folder already)."""
    with tarfile.open(archive, "r:gz") as tar:
        members = tar.getmembers()
        runs = {Path(m.name).parent for m in members}
        fresh = {run for run in runs if not (work / run).exists()}
        tar.extractall(work, members=[m for m in members if Path(m.name).parent in fresh],
                       filter="data")
    return len(fresh), len(runs) - len(fresh)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack")
    packing.add_argument("work", type=Path)
    packing.add_argument("archive", type=Path)
    unpacking = commands.add_parser("unpack")
    unpacking.add_argument("archive", type=Path)
    unpacking.add_argument("work", type=Path)
    args = parser.parse_args(argv)
    if args.command == "pack":
        print(f"{args.archive}: {pack(args.work, args.archive)} finished runs")
        return 0
    if not args.archive.is_file():
        print(f"error: {args.archive}: no such archive", file=sys.stderr)
        return 2
    try:
        added, skipped = unpack(args.archive, args.work)
    except (tarfile.TarError, OSError) as error:
        print(f"error: {args.archive}: {error}", file=sys.stderr)
        return 2
    print(f"{args.work}: {added} finished runs from {args.archive} ({skipped} already there)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
