"""--law=two_step (Bhagia et al. 2024): both steps against float64 references, recovery of
known parameters, the chained prediction's bootstrap interval, held-out accuracies beside step
2 alone and a power law in compute, the law off its own form, and bad input refused before any
fit."""

import json

import numpy as np
import pandas as pd
import pytest

from attnlab.scaling import equations, parametric
from attnlab.scaling.cli import fit_main
from attnlab.scaling.huber import with_delta
from attnlab.scaling.law import identifying_design
from attnlab.scaling.laws import approach3, two_step
from attnlab.scaling.laws.registry import law_named

STEP1 = {"E": 1.9, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}
STEP2 = {"a": 0.6, "k": -2.0, "L0": 4.5, "b": 0.25}
GRID = approach3.InitGrid(a=(0.0, 6.0, 12.0), b=(0.0, 6.0, 12.0), e=(-1.0, 0.0, 1.0),
                          alpha=(0.2, 0.5, 1.0), beta=(0.2, 0.5, 1.0))
GRID_FLAG = "--grid=a:0:12:6,b:0:12:6,e:-1:1:1,alpha:0.2:1:0.4,beta:0.2:1:0.4"
COLUMNS = "--columns=task_loss:gold_ce,accuracy:acc"


def task_loss_reference(p, n, d):
    """E + A/N^alpha + B/D^beta in float64."""
    return p["E"] + p["A"] / np.asarray(n, np.float64) ** p["alpha"] \
        + p["B"] / np.asarray(d, np.float64) ** p["beta"]


def accuracy_reference(p, loss):
    """Bhagia et al. eq. 2: a / (1 + exp(-k (L - L0))) + b in float64."""
    return p["a"] / (1.0 + np.exp(-p["k"] * (np.asarray(loss, np.float64) - p["L0"]))) + p["b"]


def runs(seed, loss_noise=1e-3, acc_noise=2e-3, accuracy=None):
    """A 7-size x 4-ratio ladder: (N, D, task loss, accuracy) from the known steps."""
    rng = np.random.default_rng(seed)
    n = np.repeat(np.geomspace(5e6, 3.2e8, 7), 4)
    d = n * np.tile([5.0, 10.0, 20.0, 40.0], 7)
    loss = task_loss_reference(STEP1, n, d) * np.exp(rng.normal(0, loss_noise, len(n)))
    acc = (accuracy or (lambda x: accuracy_reference(STEP2, x)))(loss)
    return n, d, loss, acc + rng.normal(0, acc_noise, len(n))


def write(path, n, d, loss, acc):
    pd.DataFrame({"params": n, "tokens": d, "gold_ce": loss, "acc": acc}).to_csv(path,
                                                                                index=False)
    return str(path)


def test_both_steps_equal_float64_references():
    n, d = np.geomspace(1e7, 1e10, 9), np.geomspace(1e8, 1e12, 9)
    params = STEP1 | STEP2
    loss = task_loss_reference(STEP1, n, d)
    np.testing.assert_allclose(two_step.accuracy(STEP2, loss), accuracy_reference(STEP2, loss),
                               rtol=1e-15)
    np.testing.assert_allclose(law_named("two_step").run_loss(params, n, d),
                               accuracy_reference(STEP2, loss), rtol=1e-14)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recovers_known_parameters(seed):
    """Task loss with 0.1% noise and accuracy with 0.002: alpha and beta within 0.03, E within
    3%; the sigmoid's a within 0.02, b within 0.01, L0 within 0.03, k within 10%."""
    n, d, loss, acc = runs(seed)
    fit = two_step.fit_two_step(n, d, loss, acc, grid=GRID)
    found = fit.params
    print(f"seed {seed}: " + ", ".join(f"{k} {found[k]:.4g} (true {v})"
                                       for k, v in (STEP1 | STEP2).items()))
    assert found["alpha"] == pytest.approx(STEP1["alpha"], abs=0.03)
    assert found["beta"] == pytest.approx(STEP1["beta"], abs=0.03)
    assert found["E"] == pytest.approx(STEP1["E"], rel=0.03)
    assert found["a"] == pytest.approx(STEP2["a"], abs=0.02)
    assert found["b"] == pytest.approx(STEP2["b"], abs=0.01)
    assert found["L0"] == pytest.approx(STEP2["L0"], abs=0.03)
    assert found["k"] == pytest.approx(STEP2["k"], rel=0.1)


def test_chained_prediction_has_an_interval_over_refits_of_both_steps(tmp_path, capsys):
    """--accuracy-at beyond the ladder (1e9 parameters, 2e10 tokens): the interval over refits
    of both steps holds the true accuracy, and is wider than step 2's alone would make it."""
    path = write(tmp_path / "runs.csv", *runs(0))
    out = tmp_path / "fit.json"
    assert fit_main([f"--sweep={path}", "--law=two_step", COLUMNS, GRID_FLAG, "--bootstrap=30",
                     "--accuracy-at=1e9:2e10", f"--json={out}"]) == 0
    print(capsys.readouterr().out)
    row = json.loads(out.read_text())["accuracy_at"][0]
    truth = accuracy_reference(STEP2, task_loss_reference(STEP1, 1e9, 2e10))
    low, high = row["accuracy_ci"]
    print(f"accuracy at (1e9, 2e10): {row['accuracy']:.4f} [{low:.4f}, {high:.4f}], true "
          f"{truth:.4f}")
    assert low <= truth <= high and high - low > 0
    assert row["task_loss_ci"][0] <= task_loss_reference(STEP1, 1e9, 2e10) <= \
        row["task_loss_ci"][1]


def _holdout(tmp_path, capsys, table):
    path = write(tmp_path / "runs.csv", *table)
    out = tmp_path / "fit.json"
    assert fit_main([f"--sweep={path}", "--law=two_step", COLUMNS, GRID_FLAG, "--bootstrap=20",
                     "--holdout=params>2e8", f"--json={out}"]) == 0
    print(capsys.readouterr().out)
    payload = json.loads(out.read_text())
    forecasters = payload["forecasters"]
    print(f"held-out accuracy: two-step {100 * payload['mean_abs_relative_error']:.2f}%, "
          f"step 2 alone on the observed task loss "
          f"{100 * forecasters['step2 alone']['other']:.2f}%, power law of 1 - Acc in C (no floor) "
          f"{100 * forecasters['power in C']['other']:.2f}%")
    return payload, forecasters


def test_holdout_beats_a_power_law_in_compute(tmp_path, capsys):
    """The largest size held out: the chained prediction from (N, D) within 2% of the observed
    accuracy and better than the error's power law in compute (which ignores that runs of one
    compute differ in D/N); step 2 alone, given the observed task loss, is printed beside."""
    payload, forecasters = _holdout(tmp_path, capsys, runs(0))
    assert payload["held_out_runs"] == 4
    assert payload["mean_abs_relative_error"] < 0.02
    assert payload["mean_abs_relative_error"] < forecasters["power in C"]["other"]
    assert forecasters["step2 alone"]["runs"] == 4


def test_off_its_form_a_sigmoid_misses_a_saturating_accuracy(tmp_path, capsys):
    """Accuracy generated as 0.25 + 0.6 exp(-((L - 3)/2)^2) (a Gaussian decay, not a
    logistic): step 2's sigmoid is only approximate, its residuals exceed the noise, and the
    error it adds shows in step 2 alone's held-out error."""
    def bump(loss):
        return 0.25 + 0.6 * np.exp(-((loss - 3.0) / 2.0) ** 2)

    n, d, loss, acc = runs(0, acc_noise=5e-4, accuracy=bump)
    fit = two_step.fit_two_step(n, d, loss, acc, grid=GRID)
    residual = acc - two_step.accuracy(fit.params, loss)
    rms = float(np.sqrt(np.mean(residual ** 2)))
    print(f"step 2 off its form: rms accuracy residual {rms:.4f} (noise 0.0005)")
    assert rms > 4 * 5e-4
    _, forecasters = _holdout(tmp_path, capsys, (n, d, loss, acc))
    assert forecasters["step2 alone"]["other"] > 0.002


@pytest.fixture
def no_fit(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a fit ran before the input was refused")
    monkeypatch.setattr(parametric, "minimise_many", refuse)
    monkeypatch.setattr(approach3, "minimise_many", refuse)


@pytest.mark.parametrize("change, columns, named", [
    (None, "--columns=accuracy:acc", "--columns=task_loss:COLUMN"),
    (None, "--columns=task_loss:gold_ce", "--columns=accuracy:COLUMN"),
    (None, "--columns=task_loss:missing,accuracy:acc", "'missing'"),
    ({"gold_ce": -2.0}, COLUMNS, "'gold_ce' (task_loss)"),
    ({"acc": 1.5}, COLUMNS, "'acc' (accuracy) has values above 1"),
    ({"acc": 0.0}, COLUMNS, "'acc' (accuracy)"),
    (None, "--columns=task_loss:acc,accuracy:acc", "mapped twice"),
])
def test_bad_input_is_one_line_naming_the_field(tmp_path, capsys, no_fit, change, columns,
                                                named):
    n, d, loss, acc = runs(0)
    frame = pd.DataFrame({"params": n, "tokens": d, "gold_ce": loss, "acc": acc})
    for column, value in (change or {}).items():
        frame.loc[2, column] = value
    frame.to_csv(tmp_path / "runs.csv", index=False)
    code = fit_main([f"--sweep={tmp_path / 'runs.csv'}", "--law=two_step", columns])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and named in err, err


def test_accuracy_at_refuses_a_bad_pair(tmp_path, capsys, no_fit):
    path = write(tmp_path / "runs.csv", *runs(0))
    code = fit_main([f"--sweep={path}", "--law=two_step", COLUMNS, "--accuracy-at=1e9"])
    assert code == 2 and "--accuracy-at: '1e9' is not N:D" in capsys.readouterr().err


def test_given_draws_are_refitted_and_the_kept_ones_named():
    """parametric.bootstrap_refits refits the draws it is given and names those it kept (the
    two-step bootstrap refits step 2 on the same draws): a draw of one model size cannot
    determine approach 3 and is not kept; draws of the whole table refit to the estimate."""
    n, d, loss, _ = runs(0)
    fit = approach3.fit_approach3(n, d, loss, grid=GRID)
    theta = np.array([fit.details["theta"][k] for k in approach3.THETA_NAMES])
    weights = np.ones((3, len(n)))
    weights[1] = 0.0
    weights[1, :4] = 1.0  # the smallest size's four runs alone
    design = identifying_design(approach3.Parametric(), {"params": n, "tokens": d})
    refits = parametric.bootstrap_refits(
        approach3.huber_objective, theta, GRID.points(),
        with_delta((np.log(n), np.log(d), np.log(loss))), len(n), n_bootstrap=3, grid_starts=2,
        seed=0, clusters=None, admissible=parametric.admissible, max_steps=500, design=design,
        weights=weights)
    assert list(refits.kept) == [0, 2] and refits.unidentified == 1
    np.testing.assert_allclose(refits.params, [theta, theta], atol=1e-4)
