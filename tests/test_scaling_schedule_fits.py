"""Fits of whole curves held out by run (``--holdout=run:NAME``) through ``attnlab fit``: each
held-out curve's errors beside the S1-only baseline's, the JSON, predicted schedules and the
refusals."""

import dataclasses
import json

import numpy as np
import pytest

from attnlab.plots.cli import plot_main
from attnlab.scaling import curvefit
from attnlab.scaling.cli import fit_main
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.laws.multipower import MultiPower
from attnlab.scaling.synthetic_curves import (MULTIPOWER_PUBLISHED, curves_frame,
                                              from_schedule, observed, two_stage, with_losses)
from attnlab.scaling.tables.schedule_fits import fit_schedules

PEAK, WARMUP, T = 3e-4, 30, 500
WSD = f"wsd:peak={PEAK},warmup_steps={WARMUP},total_steps={T},decay_fraction=0.3"


def curves():
    runs = [from_schedule(f"constant:peak={PEAK},warmup_steps={WARMUP},total_steps={T}", 10,
                          "constant"),
            from_schedule(f"cosine:peak={PEAK},warmup_steps={WARMUP},total_steps={T}", 10,
                          "cosine"),
            observed("two_stage", two_stage(PEAK, T, 300, 0.3, WARMUP), 10),
            from_schedule(WSD, 10, "wsd")]
    return with_losses(MultiPower(), MULTIPOWER_PUBLISHED, runs)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = tmp_path_factory.mktemp("curves") / "curves.csv"
    curves_frame(curves()).to_csv(path, index=False)
    return path


def test_held_out_curve_is_predicted_and_the_baseline_is_not():
    law = MultiPower()
    held = fit_schedules(law, curves(), holdout="run:wsd", settings=law.options({}))
    errors = held.errors().set_index("run_id")
    assert held.fit.details["runs"] == ["constant", "cosine", "two_stage"]
    assert errors.loc["wsd", "heldout"] and not errors.loc["cosine", "heldout"]
    assert errors.loc["wsd", "max_relative_error"] <= 1e-4
    cosine = curves()[1]
    last = dataclasses.replace(cosine, steps=cosine.steps[-1:], loss=cosine.loss[-1:])
    assert errors.loc["cosine", "final_error"] == pytest.approx(
        held.predicted(last)[0] / cosine.loss[-1] - 1, abs=1e-15)
    assert errors.loc["wsd", "baseline_max_relative_error"] > 1e-3
    wsd = curves()[3].fitted()
    expected = np.abs(curvefit.s1_loss(held.baseline, wsd) / wsd.loss - 1).mean()
    assert errors.loc["wsd", "baseline_mean_relative_error"] == pytest.approx(expected)


def test_fit_writes_each_runs_errors_and_the_predicted_schedule(table, tmp_path, capsys):
    out = tmp_path / "fit.json"
    longer = WSD.replace(f"total_steps={T}", f"total_steps={3 * T}")
    assert fit_main([f"--curves={table}", "--law=multipower", "--holdout=run:wsd",
                     "--bootstrap=0", f"--predict-schedule={longer}", f"--json={out}"]) == 0
    text = capsys.readouterr().out
    assert "held out" in text and "S1 mean" in text and f"predicted curve of {longer}" in text
    payload = json.loads(out.read_text())
    runs = {row["run_id"]: row for row in payload["runs"]}
    assert set(runs["wsd"]) >= {"run_id", "heldout", "mean_relative_error",
                                "max_relative_error"}
    assert runs["wsd"]["heldout"] and payload["holdout"] == ["wsd"]
    assert payload["alpha"] == pytest.approx(MULTIPOWER_PUBLISHED["alpha"], rel=1e-3)
    predicted = payload["predicted_schedules"][0]
    assert predicted["step"][-1] == 3 * T and predicted["step"][0] > WARMUP
    truth = with_losses(MultiPower(), MULTIPOWER_PUBLISHED, [from_schedule(longer, 1)])[0]
    np.testing.assert_allclose(predicted["loss"], truth.loss[np.array(predicted["step"]) - 1],
                               rtol=1e-4)


@pytest.mark.parametrize("flags,named", [
    (["--holdout=largest-budget"], "--holdout=run:NAME"),
    (["--holdout=run:nope"], "no run nope"),
    (["--holdout=run:wsd,cosine,constant"], "leaves 1 run"),
    (["--by=run_id", "--sweep=x"], "--by does not apply to --law=multipower"),
    (["--budget=1e18"], "--budget does not apply to --law=multipower"),
    (["--annealing-decay=0.9"], "--annealing-decay applies to --law=annealing only"),
    (["--predict-schedule=cosine:peak=3e-4"], "needs total_steps"),
    (["--predict-schedule=step:peak=3e-4"], "must be one of"),
])
def test_bad_flags_are_one_line_and_exit_2(table, capsys, flags, named):
    assert fit_main([f"--curves={table}", "--law=multipower", "--bootstrap=0"] + flags) == 2
    error = capsys.readouterr().err
    assert named in error and error.count("\n") == 1


def test_missing_rate_column_names_it(tmp_path, capsys):
    path = tmp_path / "curves.csv"
    curves_frame(curves()).drop(columns="lr").to_csv(path, index=False)
    assert fit_main([f"--curves={path}", "--law=annealing"]) == 2
    error = capsys.readouterr().err
    assert "missing column 'lr'" in error and str(path) in error


def test_holdout_of_unknown_form_is_refused_before_fitting():
    with pytest.raises(FitInputError, match="run:NAME"):
        fit_schedules(MultiPower(), curves(), holdout="budget:1e18")


def test_plot_draws_the_curves_with_the_held_out_run(table, tmp_path, capsys):
    out = tmp_path / "curves.png"
    assert plot_main([f"--curves={table}", "--kind=curves", "--holdout=run:wsd",
                      f"--predict-schedule={WSD}", f"--plot={out}"]) == 0
    assert out.stat().st_size > 10_000
    assert plot_main([f"--curves={table}", "--kind=curves", "--law=chinchilla",
                      f"--plot={out}"]) == 2
    assert "--kind=curves draws a law of whole curves" in capsys.readouterr().err


def test_four_runs_give_intervals_and_the_predicted_curve_carries_them():
    law = MultiPower()
    longer = WSD.replace(f"total_steps={T}", f"total_steps={2 * T}")
    held = fit_schedules(law, curves(), settings=law.options({"predict-schedule": longer}),
                         n_bootstrap=30, seed=0)
    assert not held.fit.intervals_refused and held.fit.n_bootstrap_failed < 3
    for name, value in MULTIPOWER_PUBLISHED.items():  # noiseless: every refit is the truth
        low, high = held.fit.ci[name]
        assert low == pytest.approx(value, rel=1e-6) and high == pytest.approx(value, rel=1e-6)
    prediction = held.prediction(held.settings["predict"][0])
    assert len(prediction["ci"]) == len(prediction["step"])
    low, high = prediction["ci"][-1]
    last = prediction["loss"][-1]
    assert low <= last * (1 + 1e-9) and high >= last * (1 - 1e-9)
