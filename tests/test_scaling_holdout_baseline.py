"""A naive baseline beside every hold-out (the nearest kept run), the law's skill against it,
and predictions below a known floor flagged."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnlab.scaling.cli import fit_main
from attnlab.scaling.laws.registry import law_named
from attnlab.scaling.synthetic import CHINCHILLA_PUBLISHED, grid_points
from attnlab.scaling.tables.baselines import BASELINE_RULES, frontier_baseline, naive_baseline
from attnlab.scaling.tables.holdout import format_holdout, holdout_prediction
from attnlab.scaling.tables.prepare import prepare_points

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized

MARKOV = str(Path(__file__).resolve().parents[1] / "docs/results/markov_ladder_gpu.csv")


def test_the_baseline_takes_the_nearest_smaller_size_at_the_same_tokens():
    kept = pd.DataFrame({"params": [1e6, 2e6, 2e6, 4e6, 4e6],
                         "tokens": [1e8, 1e8, 1e8, 5e7, 2e7],
                         "loss": [3.0, 2.6, 2.8, 2.5, 2.9]})
    # two seeds of the nearest smaller size at D = 1e8: their mean
    assert naive_baseline(kept, 4e6, 1.02e8) == (pytest.approx(2.7), BASELINE_RULES[0])
    # no smaller size at D = 1e9: the same size's last observed point (most tokens below)
    assert naive_baseline(kept, 4e6, 1e9) == (2.5, BASELINE_RULES[1])
    loss, rule = naive_baseline(kept, 8e6, 1e9)  # neither
    assert np.isnan(loss) and rule is None


def test_a_predicted_optimum_has_the_best_run_within_its_compute_beside_it(tmp_path, capsys):
    """The naive forecast of the compute-optimal loss at C: the lowest loss of the runs that
    spent at most C (the planner's rounding allowed), none below every run's compute."""
    frame = pd.DataFrame({"params": [1e5, 2e5, 4e5, 2e5], "tokens": [1e7, 5e6, 2.5e6, 2e7],
                          "flops": [6e12, 6.0006e12, 6e12, 2.4e13],
                          "loss": [2.2, 2.1, 2.3, 1.9]})
    base = frontier_baseline(frame, 6e12)
    assert (base["loss"], base["N"], base["C"]) == (2.1, 2e5, 6.0006e12)
    assert frontier_baseline(frame, 1e14)["loss"] == 1.9
    assert frontier_baseline(frame, 1e12) is None
    table, out = tmp_path / "runs.csv", tmp_path / "fit.json"
    points = grid_points(CHINCHILLA_PUBLISHED, n_points=40, noise=0.0,
                         rng=np.random.default_rng(0))
    points.to_csv(table, index=False)
    rc = fit_main([f"--sweep={table}", "--law=chinchilla", "--approach=3", "--bootstrap=0",
                   "--budget=1e20", f"--json={out}"])
    assert rc == 0
    (prediction,) = json.loads(out.read_text())["predictions"]
    expected = frontier_baseline(prepare_points(points, law=law_named("chinchilla")).frame, 1e20)
    assert prediction["baseline"] == pytest.approx(expected)
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  naive ")]
    assert float(line.split()[1]) == pytest.approx(expected["loss"], rel=1e-4)
    assert "the best run with at most this compute" in line


def test_markov_ladder_holdout_prints_the_baseline_that_beats_the_law():
    table = prepare_points(pd.read_csv(MARKOV), law=law_named("kaplan"))
    held = holdout_prediction(table, law=law_named("kaplan", form="n"), holdout="params>1000000",
                              n_bootstrap=0, floor=3.7384)
    summary = held.summary()
    baseline = summary["baseline"]
    assert baseline["runs"] == 6 and baseline["rule_counts"][BASELINE_RULES[0]] == 6
    # the 936k size's six branches against the 1.64M size's: 0.35% (issue 46)
    assert baseline["mean_abs_relative_error"] == pytest.approx(0.00353, abs=5e-5)
    assert baseline["skill"] == pytest.approx(
        baseline["law_mean_abs_relative_error"] / baseline["mean_abs_relative_error"])
    expected_low = int((held.frame["predicted"] < 3.7384).sum())
    assert summary["below_floor"] == expected_low
    text = format_holdout(held)
    assert "naive baseline (smaller size, same D: 6): mean |error| 0.35%" in text
    assert "skill (law / baseline mean |error|)" in text and "floor 3.7384" in text
    # The figure shows the baseline's predictions beside the law's, and the skill in its title.
    from attnlab.plots.scaling import plot_holdout

    ax = plot_holdout(held).axes[0]
    baseline_points = [c for c in ax.collections if c.get_label() == "naive baseline"]
    assert len(baseline_points) == 1
    assert np.allclose(np.sort(baseline_points[0].get_offsets()[:, 1]),
                       np.sort(held.frame["baseline"].to_numpy()))
    assert f"skill {baseline['skill']:.2f} against the baseline" in ax.get_title()


def test_floor_flags_budget_predictions_in_report_and_json(tmp_path, capsys):
    path, out = tmp_path / "runs.csv", tmp_path / "fit.json"
    grid_points(CHINCHILLA_PUBLISHED, n_points=60, rng=np.random.default_rng(0)).to_csv(path)
    args = [f"--sweep={path}", "--law=chinchilla", "--bootstrap=0", "--budget=1e20,1e22",
            "--grid=a:4:8:2,b:4:8:2,e:0:1:1,alpha:0.2:0.5:0.3,beta:0.2:0.5:0.3"]
    assert fit_main(args + ["--floor=100", f"--json={out}"]) == 0
    payload = json.loads(out.read_text())
    assert payload["floor"] == 100 and all(p["below_floor"] for p in payload["predictions"])
    assert "below the floor 100" in capsys.readouterr().out
    assert fit_main(args + ["--floor=0.01", f"--json={out}"]) == 0
    assert not any(p["below_floor"] for p in json.loads(out.read_text())["predictions"])
    assert "below the floor" not in capsys.readouterr().out
    assert fit_main(args + ["--floor=-1"]) == 2
    assert "--floor must be a loss > 0" in capsys.readouterr().err
