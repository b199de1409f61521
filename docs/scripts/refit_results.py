"""Refits every results table the docs publish a fit of, and fails when a number moved.

Each ``attnlab fit ... --json=docs/results/NAME.json`` (or ``attnlab compare ...``) command
written in docs/*.md (a line of its own or continued with backslashes) is rerun with its JSON
sent to a scratch directory, and the fresh JSON is compared with the committed one, leaf by
leaf:

- point estimates, objectives and every other number: relative 1e-4 (XLA and L-BFGS differ
  in the last bits between machines; the fits are otherwise deterministic);
- what the bootstrap decides (``ci``, refit counts, notes and warnings, which quote them):
  relative 5% for numbers, text not compared: a refit that converges differently on another
  machine moves a percentile by a little, not a conclusion.

    python docs/scripts/refit_results.py            # check: exit 1 naming each difference
    python docs/scripts/refit_results.py --write    # regenerate the committed JSONs
    python docs/scripts/refit_results.py --only=quickstart_tuned   # those whose path holds it
    python docs/scripts/refit_results.py --part=2/3   # every third fit, from the second

The slow test lane runs the check (tests/test_docs_refit.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import re
import shlex
import sys
import tempfile
from pathlib import Path

from attnlab.scaling.cli import fit_main
from attnlab.scaling.compare_cli import compare_main

REPO = Path(__file__).resolve().parents[2]
COMMANDS = {"fit": fit_main, "compare": compare_main}
COMMAND = re.compile(rf"attnlab ({'|'.join(COMMANDS)}) "
                     r"((?:[^\n`|]*?)--json=(docs/results/[\w./-]+\.json)[^\n`|]*)")
LOOSE_KEYS = {"ci", "n_bootstrap", "n_bootstrap_failed", "notes", "warnings", "too_wide",
              "starts_converged"}
TIGHT, LOOSE = 1e-4, 0.05


def documented_fits(docs: Path = REPO / "docs") -> dict[str, tuple[str, list[str]]]:
    """{committed JSON path: (the command, its argv)}, from every docs/*.md."""
    fits = {}
    for page in sorted(docs.glob("*.md")):
        text = re.sub(r"\\\n\s*", " ", page.read_text())
        for match in COMMAND.finditer(text):
            fits[match.group(3)] = (match.group(1), shlex.split(match.group(2)))
    return fits


def differences(old, new, path: str = "", loose: bool = False) -> list[str]:
    """Leaves of two JSON values that differ beyond their tolerance, as 'path: old -> new'."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = [f"{path}/{k}: missing" for k in old.keys() ^ new.keys()]
        for key in old.keys() & new.keys():
            found += differences(old[key], new[key], f"{path}/{key}", loose or key in LOOSE_KEYS)
        return found
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [] if loose else [f"{path}: {len(old)} items -> {len(new)}"]
        return [d for i, (a, b) in enumerate(zip(old, new))
                for d in differences(a, b, f"{path}[{i}]", loose)]
    numbers = (int, float)
    if isinstance(old, numbers) and isinstance(new, numbers) and not isinstance(old, bool):
        close = (math.isclose(old, new, rel_tol=LOOSE if loose else TIGHT, abs_tol=1e-12)
                 or (math.isinf(old) and old == new))
        return [] if close else [f"{path}: {old!r} -> {new!r}"]
    return [] if loose or old == new else [f"{path}: {old!r} -> {new!r}"]


def refit(command: str, argv: list[str], json_path: Path) -> None:
    argv = [a for a in argv if not a.startswith("--json=")] + [f"--json={json_path}"]
    with contextlib.chdir(REPO), contextlib.redirect_stdout(io.StringIO()):
        code = COMMANDS[command](argv)
    if code:
        raise SystemExit(f"error: attnlab {command} {shlex.join(argv)} exited {code}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="regenerate the committed JSONs")
    parser.add_argument("--only", default="", help="just the JSONs whose path holds this text")
    parser.add_argument("--part", default="1/1", help="K/M: the K-th of M interleaved shares "
                        "of the fits (to spread them over processes)")
    args = parser.parse_args(argv)
    k, _, m = args.part.partition("/")
    if not (k.isdigit() and m.isdigit() and 1 <= int(k) <= int(m)):
        parser.error(f"--part={args.part}: K/M with 1 <= K <= M")
    fits = {key: v for i, (key, v) in enumerate(documented_fits().items())
            if args.only in key and i % int(m) == int(k) - 1}
    failed = 0
    with tempfile.TemporaryDirectory() as scratch:
        for committed, (command, fit_argv) in fits.items():
            fresh = Path(scratch) / Path(committed).name
            refit(command, fit_argv, fresh)
            if args.write:
                (REPO / committed).write_text(fresh.read_text())
                print(f"wrote {committed}")
                continue
            found = differences(json.loads((REPO / committed).read_text()),
                                json.loads(fresh.read_text()))
            failed += bool(found)
            print(f"{'DIFFERS' if found else 'same   '} {committed}")
            for line in found[:20]:
                print(f"    {line}")
    print(f"{len(fits)} documented fits refitted; {failed} differ")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
