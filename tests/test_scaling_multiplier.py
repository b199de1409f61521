"""Effective compute multipliers against a baseline (attnlab fit --by --multiplier-against): on
synthetic sweeps from known Chinchilla laws, the multiplier equals the one derived from the two
laws by root finding in float64 (an independent route to the closed form) and its bootstrap
interval covers it; the loss difference at the largest budget matches the laws' own; a group
that cannot be fitted or pinned is a one-line note."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import optimize

from attnlab.scaling import FitInputError, equations
from attnlab.scaling.cli import fit_main
from attnlab.scaling.laws.registry import law_named
from attnlab.scaling.synthetic import CHINCHILLA_PUBLISHED, isoflop_points
from attnlab.scaling.tables.grouped import fit_by
from attnlab.scaling.tables.multiplier import (compute_to_reach, format_multipliers,
                                               multipliers_against)

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized

BASE = CHINCHILLA_PUBLISHED
# Better than the baseline by a smaller N term; and by a steeper D term (a different exponent).
LAWS = {"gpt": BASE, "smaller_a": {**BASE, "A": 250.0},
        "steeper_d": {**BASE, "B": 600.0, "beta": 0.31}}
BUDGETS = np.geomspace(1e18, 1e20, 3)
SEEDS = 3
C_REF = 1e19
# The six runs of a sweep whose larger models are undertrained (tests/test_scaling_degenerate.py):
# approach 3 does not pin its law.
UNDERTRAINED = np.array([
    (7264, 13568, 3.4008963108062744), (33088, 3584, 4.239017486572266),
    (95904, 1536, 4.849584102630615), (7264, 26880, 3.1778404712677),
    (33088, 7424, 3.474605083465576), (95904, 2816, 4.422915458679199)])


def analytic_multiplier(base: dict, other: dict, reference: float) -> float:
    """The C at which base's compute-optimal loss equals other's at ``reference``, / reference:
    a root of L*_base(C) - L*_other(C_ref) in log C (float64, Brent's method)."""
    target = equations.chinchilla_optimal(other, reference)["loss"]

    def gap(log_c):
        return equations.chinchilla_optimal(base, math.exp(log_c))["loss"] - target

    log_c = optimize.brentq(gap, math.log(reference) - 30, math.log(reference) + 30,
                            xtol=1e-14, rtol=1e-14)
    return math.exp(log_c) / reference


def _results(groups=LAWS, seeds: int = SEEDS) -> pd.DataFrame:
    """IsoFLOP ladders of each law, ``seeds`` noisy repeats of every (N, D) point; the columns of
    a sweep's results table."""
    rows = []
    for i, (name, law) in enumerate(groups.items()):
        for seed in range(seeds):
            frame = isoflop_points(law, BUDGETS, sizes_per_budget=7, noise=0.003,
                                   rng=np.random.default_rng(100 * i + seed))
            frame["architecture"], frame["seed"] = name, seed
            rows.append(frame)
    frame = pd.concat(rows, ignore_index=True).rename(columns={"loss": "final_val_loss"})
    frame["status"] = "completed"
    return frame


def test_closed_form_equals_root_finding():
    """compute_to_reach (the closed form along the frontier) against brentq, for laws whose
    exponents differ, over losses across decades of compute."""
    for other in LAWS.values():
        for reference in (1e17, 1e20, 1e24):
            loss = equations.chinchilla_optimal(other, reference)["loss"]
            expected = analytic_multiplier(BASE, other, reference)
            assert compute_to_reach(BASE, loss) / reference == pytest.approx(expected, rel=1e-9)
    assert compute_to_reach(BASE, BASE["E"] - 0.01) == np.inf  # below the floor: never


@pytest.fixture(scope="module")
def grouped():
    return fit_by(_results(), "architecture", law=law_named("chinchilla", 3), n_bootstrap=40)


def test_multiplier_and_loss_difference_recover_the_laws(grouped):
    frame = multipliers_against(grouped, "gpt", C_REF)
    assert list(frame["architecture"]) == ["smaller_a", "steeper_d"]
    for _, row in frame.iterrows():
        law = LAWS[row["architecture"]]
        truth = analytic_multiplier(BASE, law, C_REF)
        assert truth > 1.2  # both are better than the baseline, clearly
        assert row["multiplier"] == pytest.approx(truth, rel=0.15)
        assert row["multiplier_low"] <= truth <= row["multiplier_high"]
        # The loss difference at the largest budget: the best size of each ladder, by the laws.
        sizes = isoflop_points(law, BUDGETS[-1:], sizes_per_budget=7, noise=0.0,
                               rng=np.random.default_rng(0))
        base_sizes = isoflop_points(BASE, BUDGETS[-1:], sizes_per_budget=7, noise=0.0,
                                    rng=np.random.default_rng(0))
        expected = sizes["loss"].min() - base_sizes["loss"].min()
        assert row["budget"] == pytest.approx(BUDGETS[-1])
        assert row["loss_diff"] == pytest.approx(expected, abs=0.01)
        assert row["loss_diff_low"] <= expected <= row["loss_diff_high"]
        assert row["note"] == ""
    text = format_multipliers(frame)
    assert "effective compute multiplier against architecture=gpt" in text
    assert text.count("[") >= 2 * len(frame) + 2


def test_unfittable_and_unpinned_groups_are_one_line_notes():
    results = _results({"gpt": BASE}, seeds=1)
    lonely = results.iloc[:1].assign(architecture="lonely")
    n, d, loss = UNDERTRAINED.T
    broken = pd.DataFrame({"params": n, "tokens": d, "final_val_loss": loss,
                           "flops": 6 * n * d, "budget": 6 * n * d,
                           "architecture": "broken", "status": "completed"})
    grouped = fit_by(pd.concat([results, lonely, broken], ignore_index=True), "architecture",
                     law=law_named("chinchilla", 3), n_bootstrap=5)
    frame = multipliers_against(grouped, "gpt", C_REF)
    notes = dict(zip(frame["architecture"], frame["note"]))
    assert set(notes) == {"lonely", "broken"}
    assert notes["lonely"].startswith("not fitted")
    assert "not pinned" in notes["broken"] or "not fitted" in notes["broken"]
    assert frame["multiplier"].isna().all()
    assert all("\n" not in note for note in notes.values())
    text = format_multipliers(frame)
    assert "note [lonely]" in text and "note [broken]" in text
    # One seed per size: the loss difference has no interval, and says so.
    single = multipliers_against(fit_by(_results(seeds=1), "architecture",
                                        law=law_named("chinchilla", 3), n_bootstrap=0),
                                 "gpt", C_REF)
    assert single["loss_diff"].notna().all() and single["loss_diff_low"].isna().all()
    assert all("add seeds" in note for note in single["note"])
    with pytest.raises(FitInputError, match="'nope' is not a value of architecture"):
        multipliers_against(grouped, "nope", C_REF)


def test_fit_command_reports_and_writes_the_multipliers(tmp_path, capsys):
    path = tmp_path / "results.csv"
    _results({"gpt": BASE, "smaller_a": LAWS["smaller_a"]}, seeds=2).to_csv(path, index=False)
    out = tmp_path / "fit.json"
    argv = [f"--sweep={path}", "--law=chinchilla", "--by=architecture", "--bootstrap=10",
            "--multiplier-against=gpt", f"--budget={C_REF:g}", f"--json={out}"]
    assert fit_main(argv) == 0
    text = capsys.readouterr().out
    assert "effective compute multiplier against architecture=gpt" in text
    (row,) = json.loads(out.read_text())["multipliers"]
    assert row["architecture"] == "smaller_a" and row["C_ref"] == C_REF
    truth = analytic_multiplier(BASE, LAWS["smaller_a"], C_REF)
    assert row["multiplier"] == pytest.approx(truth, rel=0.2)
    assert fit_main([*argv[:2], "--by=architecture", "--approach=2",
                     "--multiplier-against=gpt"]) == 2
    assert "approach 3" in capsys.readouterr().err
    assert fit_main(argv[:2] + ["--multiplier-against=gpt"]) == 2
    assert "--by" in capsys.readouterr().err


@pytest.mark.slow
def test_study_report_prints_and_writes_the_multipliers(tmp_path):
    """The architecture study's report (finish_grouped_study with ``sweep.baseline``) on a
    synthetic sweep directory: the multipliers are printed and written beside ranking.csv."""
    from attnlab.results import TABLE_FILE
    from attnlab.study import MULTIPLIERS_FILE, MULTIPLIERS_JSON_FILE, finish_grouped_study

    results = _results({"gpt": BASE, "smaller_a": LAWS["smaller_a"]}, seeds=2)
    results["run_id"] = [f"run{i:03d}" for i in range(len(results))]
    results["flops_chinchilla"] = results["flops"]
    results.to_parquet(tmp_path / TABLE_FILE)
    lines = []
    result = finish_grouped_study(tmp_path, "architecture", n_bootstrap=8, say=lines.append,
                                  baseline="gpt")
    text = "\n".join(lines)
    assert "effective compute multiplier against architecture=gpt" in text
    written = pd.read_csv(tmp_path / MULTIPLIERS_FILE)
    assert list(written["architecture"]) == ["smaller_a"]
    assert written["C_ref"].iloc[0] == pytest.approx(results["flops"].max(), rel=1e-2)
    assert written["multiplier"].iloc[0] == pytest.approx(
        analytic_multiplier(BASE, LAWS["smaller_a"], written["C_ref"].iloc[0]), rel=0.2)
    payload = json.loads((tmp_path / MULTIPLIERS_JSON_FILE).read_text())
    assert payload["base"] == "gpt" and payload["rows"][0]["architecture"] == "smaller_a"
    assert result.grouped.multipliers is not None
    assert tmp_path / MULTIPLIERS_FILE in result.json_paths
