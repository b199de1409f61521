"""--law=loss_to_loss (Brandfonbrener et al. 2025): the equation against a float64 reference,
recovery of known parameters, held-out targets beside a direct approach-3 fit of the target,
the law off its own form, and bad input refused before any fit."""

import json

import jax
import numpy as np
import pandas as pd
import pytest

from attnlab.scaling import equations, parametric
from attnlab.scaling.cli import fit_main
from attnlab.scaling.huber import with_delta
from attnlab.scaling.laws import approach3
from attnlab.scaling.laws import loss_to_loss as l2l
from attnlab.scaling.laws.registry import law_named

TRUE = {"K": 1.3, "kappa": 1.2, "E_source": 1.5, "E_target": 0.9}
SOURCE_LAW = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}
# Off the law's form: the target's own Chinchilla law scales N and D with other exponents.
TARGET_LAW = {"E": 2.1, "A": 90.0, "B": 2500.0, "alpha": 0.22, "beta": 0.40}
COLUMNS = "--columns=source:val_loss,target:task_ce"
SMALL_GRID = {"log_k": (-1.0, 1.0), "kappa": (0.5, 1.5), "z": (0.0, 2.0),
              "log_e_target": (-1.0, 0.5)}


def reference(params, source):
    """Brandfonbrener et al. eq. 2 written out in float64."""
    source = np.asarray(source, np.float64)
    return params["K"] * (source - params["E_source"]) ** params["kappa"] + params["E_target"]


def ladder():
    """(N, D) of 6 sizes x 4 tokens-per-parameter ratios."""
    n = np.repeat([1e7, 2e7, 4e7, 8e7, 1.6e8, 3.2e8], 4)
    return n, n * np.tile([5.0, 10.0, 20.0, 40.0], 6)


def write_table(path, source, target, n, d):
    pd.DataFrame({"params": n, "tokens": d, "val_loss": source, "task_ce": target}).to_csv(
        path, index=False)
    return str(path)


def test_equation_equals_float64_reference():
    source = np.linspace(1.6, 6.0, 17)
    np.testing.assert_allclose(l2l.loss_to_loss(TRUE, source), reference(TRUE, source),
                               rtol=1e-15)
    law = law_named("loss_to_loss")
    np.testing.assert_allclose(law.run_loss(TRUE, None, None, source=source),
                               reference(TRUE, source), rtol=1e-15)
    # The objective's prediction is the same equation: at a delta far above the residuals,
    # Huber is r^2/2 of log reference - log observed.
    observed = reference(TRUE, source) * np.exp(np.linspace(-0.01, 0.01, 17))
    least = source.min()
    theta = np.array([np.log(TRUE["K"]), TRUE["kappa"],
                      np.log(TRUE["E_source"] / (least - TRUE["E_source"])),
                      np.log(TRUE["E_target"])])
    data = with_delta((source, np.full(17, least), np.log(observed)), 10.0)
    expected = 0.5 * np.sum((np.log(reference(TRUE, source)) - np.log(observed)) ** 2)
    with jax.enable_x64(True):  # as multistart runs the objectives
        value = float(l2l.huber_objective(theta, data, np.ones(17)))
    assert value == pytest.approx(expected, rel=1e-10)
    assert l2l.params_from(theta, least)["E_source"] == pytest.approx(TRUE["E_source"],
                                                                      rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recovers_known_parameters(seed):
    """Source losses spanning 0.05-4 above E_source, target with 0.05% noise: K within 5%,
    kappa within 0.03, E_source and E_target within 0.03."""
    rng = np.random.default_rng(seed)
    source = TRUE["E_source"] + np.geomspace(0.05, 4.0, 24)
    target = reference(TRUE, source) * np.exp(rng.normal(0, 5e-4, 24))
    fit = l2l.fit_loss_to_loss(source, target)
    found = fit.params
    print(f"seed {seed}: " + ", ".join(f"{k} {found[k]:.4f} (true {v})" for k, v in TRUE.items()))
    assert found["K"] == pytest.approx(TRUE["K"], rel=0.05)
    assert found["kappa"] == pytest.approx(TRUE["kappa"], abs=0.03)
    assert found["E_source"] == pytest.approx(TRUE["E_source"], abs=0.03)
    assert found["E_target"] == pytest.approx(TRUE["E_target"], abs=0.03)
    assert found["E_source"] < source.min()


def test_fix_holds_e_source_and_refuses_it_above_the_least_source():
    source = TRUE["E_source"] + np.geomspace(0.05, 4.0, 12)
    fit = l2l.fit_loss_to_loss(source, reference(TRUE, source), fixed={"E_source": 1.5},
                               grid=SMALL_GRID)
    assert fit.params["E_source"] == 1.5
    assert fit.params["kappa"] == pytest.approx(TRUE["kappa"], abs=1e-3)
    with pytest.raises(Exception, match="E_source=9 must lie in"):
        l2l.fit_loss_to_loss(source, reference(TRUE, source), fixed={"E_source": 9.0},
                             grid=SMALL_GRID)


@pytest.fixture
def coarse_direct_fit(monkeypatch):
    """The direct approach-3 baseline on 3^5 starts, not Hoffmann et al.'s 4,500 (speed)."""
    grid = approach3.InitGrid(a=(0.0, 6.0, 12.0), b=(0.0, 6.0, 12.0), e=(-1.0, 0.0, 1.0),
                              alpha=(0.2, 0.5, 1.0), beta=(0.2, 0.5, 1.0))
    monkeypatch.setattr(l2l.DirectFit, "grid", grid)


def _holdout(tmp_path, source, target, capsys):
    n, d = ladder()
    path = write_table(tmp_path / "runs.csv", source, target, n, d)
    out = tmp_path / "fit.json"
    assert fit_main([f"--sweep={path}", "--law=loss_to_loss", COLUMNS, "--bootstrap=20",
                     "--holdout=params>2e8", f"--json={out}"]) == 0
    printed = capsys.readouterr().out
    payload = json.loads(out.read_text())
    law = payload["mean_abs_relative_error"]
    direct = payload["forecasters"]["chinchilla"]
    print(printed)
    print(f"held-out target: law {100 * law:.3f}%, direct approach 3 of the target "
          f"{100 * direct['other']:.3f}% on {direct['runs']} runs")
    return payload, law, direct


def test_holdout_on_the_law_beats_a_direct_chinchilla_fit(tmp_path, capsys,
                                                          coarse_direct_fit):
    """Targets made by the law from Chinchilla-law source losses (0.1% noise): the held-out
    largest size is predicted from its observed source better than by approach 3 of the
    target on (N, D), whose form the target does not have."""
    rng = np.random.default_rng(0)
    n, d = ladder()
    source = equations.chinchilla_loss(SOURCE_LAW, n, d) * np.exp(rng.normal(0, 1e-3, 24))
    target = reference(TRUE, source) * np.exp(rng.normal(0, 1e-3, 24))
    payload, law, direct = _holdout(tmp_path, source, target, capsys)
    assert payload["held_out_runs"] == 4 and direct["runs"] == 4
    assert law < 0.01
    assert law < direct["other"]
    assert payload["with_interval"] == 4


def test_off_its_form_the_law_misses_what_a_direct_fit_gets(tmp_path, capsys,
                                                            coarse_direct_fit):
    """Source and target from two Chinchilla laws with different exponents: the target is no
    single function of the source (runs of one source loss differ in D/N and so in target).
    The law then leaves residuals far above the noise, ordered by D/N, and the direct fit of
    the target on (N, D), which has its form, predicts the held-out size better."""
    rng = np.random.default_rng(1)
    n, d = ladder()
    source = equations.chinchilla_loss(SOURCE_LAW, n, d) * np.exp(rng.normal(0, 5e-4, 24))
    target = equations.chinchilla_loss(TARGET_LAW, n, d) * np.exp(rng.normal(0, 5e-4, 24))
    fit = l2l.fit_loss_to_loss(source, target)
    residual = np.log(target / l2l.loss_to_loss(fit.params, source))
    ratio = d / n
    by_ratio = [residual[ratio == r].mean() for r in np.unique(ratio)]
    print(f"in-sample rms residual {100 * np.sqrt(np.mean(residual ** 2)):.2f}% (noise 0.05%); "
          f"mean residual by D/N {np.unique(ratio)}: {np.round(100 * np.array(by_ratio), 2)}%")
    assert np.sqrt(np.mean(residual ** 2)) > 4 * 5e-4
    assert np.all(np.diff(by_ratio) > 0) or np.all(np.diff(by_ratio) < 0)
    _, law, direct = _holdout(tmp_path, source, target, capsys)
    assert direct["other"] < law


@pytest.fixture
def no_fit(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a fit ran before the input was refused")
    monkeypatch.setattr(parametric, "minimise_many", refuse)


@pytest.mark.parametrize("frame_change, columns, named", [
    (None, "--columns=target:task_ce", "--columns=source:COLUMN"),
    (None, "--columns=source:val_loss", "--columns=target:COLUMN"),
    (None, "--columns=source:nope,target:task_ce", "'nope'"),
    ({"val_loss": -1.0}, COLUMNS, "'val_loss' (source)"),
    ({"task_ce": 0.0}, COLUMNS, "'task_ce' (target)"),
    ("copy", "--columns=source:val_loss,target:copy", "equals target column 'copy'"),
    (None, "--columns=source:val_loss,target:val_loss", "mapped twice"),
])
def test_bad_input_is_one_line_naming_the_field(tmp_path, capsys, no_fit, frame_change, columns,
                                                named):
    n, d = ladder()
    source = equations.chinchilla_loss(SOURCE_LAW, n, d)
    frame = pd.DataFrame({"params": n, "tokens": d, "val_loss": source,
                          "task_ce": reference(TRUE, source)})
    if frame_change == "copy":
        frame["copy"] = frame["val_loss"]
    elif frame_change:
        for column, value in frame_change.items():
            frame.loc[3, column] = value
    frame.to_csv(tmp_path / "runs.csv", index=False)
    code = fit_main([f"--sweep={tmp_path / 'runs.csv'}", "--law=loss_to_loss", columns])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and named in err, err


def test_fix_of_e_source_above_the_least_source_is_refused_before_the_fit(tmp_path, capsys,
                                                                          no_fit):
    n, d = ladder()
    source = equations.chinchilla_loss(SOURCE_LAW, n, d)
    path = write_table(tmp_path / "runs.csv", source, reference(TRUE, source), n, d)
    code = fit_main([f"--sweep={path}", "--law=loss_to_loss", COLUMNS, "--fix=E_source=99"])
    err = capsys.readouterr().err
    assert code == 2 and "--fix: E_source=99 must lie in" in err and err.count("\n") == 1
