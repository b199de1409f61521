"""docs/scripts/refit_results.py: every fit (and paired comparison) the docs publish a JSON of
regenerates from its committed results table, and the comparison fails on a moved number."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from repo_files import load_module

REPO = Path(__file__).resolve().parents[1]


def _script():
    return load_module("docs/scripts/refit_results.py")


def test_the_documented_fits_are_found_with_their_tables():
    fits = _script().documented_fits()
    assert "docs/results/hparams_cpu_fit.json" in fits
    assert "docs/results/device_h200_2026-11-27c/quickstart_fit.json" in fits
    assert fits["docs/results/wsd_cosine_cpu_compare.json"][0] == "compare"
    for committed, (_, argv) in fits.items():
        assert (REPO / committed).exists(), committed
        tables = next(a for a in argv if a.startswith("--sweep=")).split("=", 1)[1]
        assert all((REPO / t).exists() for t in tables.split(",")), argv


def test_a_moved_estimate_differs_and_a_bootstrap_wobble_does_not():
    differences = _script().differences
    fit = json.loads((REPO / "docs/results/data_constrained_cpu_frozen.json").read_text())
    moved = json.loads(json.dumps(fit))
    moved["R_D"] *= 1.001
    assert differences(fit, moved) == [f"/R_D: {fit['R_D']!r} -> {moved['R_D']!r}"]
    wobble = json.loads(json.dumps(fit))
    wobble["ci"]["R_D"][0] *= 1.02
    wobble["n_bootstrap"] -= 1
    wobble["notes"] = ["1 of 200 bootstrap refits did not converge"]
    assert differences(fit, wobble) == []
    wobble["ci"]["R_D"][1] *= 1.2
    assert len(differences(fit, wobble)) == 1
    assert differences(fit, {**fit, "law": "chinchilla"}) == [
        "/law: 'data_constrained' -> 'chinchilla'"]


@pytest.mark.slow
@pytest.mark.parametrize("part", ["1/3", "2/3", "3/3"])  # three processes, spread by xdist
def test_every_documented_fit_regenerates(part):
    """In a process of its own that compiles as a user's commands do: the multi-start fits run
    on JAX (optimistix), and the suite's unoptimized programs (tests/conftest.py) move some of
    them to another start, and with it their bootstrap intervals."""
    env = {**os.environ, "JAX_DISABLE_MOST_OPTIMIZATIONS": "0"}
    done = subprocess.run([sys.executable, str(REPO / "docs" / "scripts" / "refit_results.py"),
                           f"--part={part}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
