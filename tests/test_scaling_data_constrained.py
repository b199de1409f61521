"""The data-constrained law (Muennighoff et al. 2023): its formula against the paper's equations
in float64, known answers from synthetic runs of its own form, --fix, and its refusals."""

import json

import numpy as np
import pandas as pd
import pytest

from attnlab.scaling import equations, synthetic
from attnlab.scaling.laws import data_constrained as dc
from attnlab.scaling.laws.registry import law_named

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized

TRUTH = synthetic.MUENNIGHOFF_PUBLISHED
CHINCHILLA_PART = {k: TRUTH[k] for k in ("E", "A", "B", "alpha", "beta")}
FIX = "--fix=" + ",".join(f"{k}={v}" for k, v in CHINCHILLA_PART.items())
# Starts off the truth (2 per axis, 128 in all): the joint fit must find it, not start on it.
SMALL_GRID = {"a": (4.0, 9.0), "b": (4.0, 9.0), "e": (0.0, 1.0), "alpha": (0.2, 0.5),
              "beta": (0.2, 0.5), "r_d": (1.0, 3.5), "r_n": (1.0, 3.5)}


def runs(seed: int, noise: float = 0.005) -> pd.DataFrame:
    """84 runs: 4 sizes (10M-3B, some beyond U_D's compute-optimal size) x 3 unique-token
    counts x 1-64 epochs."""
    return synthetic.repeated_points(TRUTH, sizes=np.geomspace(1e7, 3e9, 4),
                                     unique_tokens=(1e8, 1e9, 1e10),
                                     epochs=(1, 2, 4, 8, 16, 32, 64),
                                     noise=noise, rng=np.random.default_rng(seed))


def paper_loss(p, n, d, u):
    """Muennighoff et al. 2023 eqs. 5-7 as written, in float64: U_N the compute-optimal size
    for U_D tokens, taken from Hoffmann et al.'s eq. 4 allocation of the same law (the budget
    whose D_opt is U_D)."""
    a, b = equations.allocation_exponents(p["alpha"], p["beta"])
    g = equations.allocation_coefficient(p["A"], p["B"], p["alpha"], p["beta"])
    budget = 6.0 * (g * u) ** (1.0 / b)  # D_opt(C) = G^-1 (C/6)^b = U_D
    u_n = np.minimum(n, g * (budget / 6.0) ** a)
    r_d, r_n = d / u - 1.0, n / u_n - 1.0
    d_eff = u + u * p["R_D"] * (1.0 - np.exp(-r_d / p["R_D"]))
    n_eff = u_n + u_n * p["R_N"] * (1.0 - np.exp(-r_n / p["R_N"]))
    return p["E"] + p["A"] / n_eff ** p["alpha"] + p["B"] / d_eff ** p["beta"]


def test_the_law_is_the_papers_equations_in_float64():
    params = {**TRUTH, "alpha": 0.34, "beta": 0.28}  # unequal exponents: U_N's exponent shows
    n = np.array([1e7, 3e8, 2e9, 8e9, 8e9])
    d = np.array([1e9, 5e10, 4e10, 1e12, 1e11])
    u = np.array([1e9, 1e9, 1e10, 1e10, 1e11])
    assert dc.data_constrained_loss(params, n, d, u) == pytest.approx(
        paper_loss(params, n, d, u), rel=1e-12)


def test_without_repeats_or_excess_parameters_it_is_chinchillas_law():
    n, d = np.array([1e7, 1e8]), np.array([1e10, 1e11])  # N well below N_opt(U_D = D)
    assert dc.data_constrained_loss(TRUTH, n, d, d) == pytest.approx(
        equations.chinchilla_loss(TRUTH, n, d), rel=1e-14)


def test_repeated_tokens_are_worth_less_and_saturate_at_r_star():
    u = 1e9
    epochs = np.array([1.0, 2.0, 4.0, 1e4])
    loss = dc.data_constrained_loss(TRUTH, 1e7, epochs * u, u)  # N < N_opt(U_D) = 5e7
    assert np.all(np.diff(loss) < 0)  # more epochs still help ...
    saturated = equations.chinchilla_loss(TRUTH, 1e7, u * (1 + TRUTH["R_D"]))
    assert loss[-1] == pytest.approx(saturated, rel=1e-9)  # ... up to D' = U_D (1 + R*_D)
    assert loss[1] > equations.chinchilla_loss(TRUTH, 1e7, 2 * u)  # worse than 2x fresh tokens


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decay_constants_recovered_with_the_chinchilla_part_frozen(seed):
    """As Muennighoff et al. fit them: R*_D within 10% and R*_N within 8% of the truth at 0.5%
    noise, each inside its 95% interval (20 refits)."""
    frame = runs(seed)
    fit = dc.fit_data_constrained(frame.params, frame.tokens, frame.unique_tokens, frame.loss,
                                  fixed=CHINCHILLA_PART, n_bootstrap=20, seed=seed,
                                  grid_starts=0)  # refits from the estimate only: cheaper
    for name, tolerance in (("R_D", 0.10), ("R_N", 0.08)):
        assert fit.params[name] == pytest.approx(TRUTH[name], rel=tolerance)
        low, high = fit.ci[name]
        assert low <= TRUTH[name] <= high, (name, low, high)
    assert not fit.unpinned and not fit.intervals_refused


def test_all_seven_parameters_recovered_jointly_from_starts_off_the_truth():
    frame = runs(0, noise=0.003)
    fit = dc.fit_data_constrained(frame.params, frame.tokens, frame.unique_tokens, frame.loss,
                                  grid=SMALL_GRID)
    assert fit.params["E"] == pytest.approx(TRUTH["E"], rel=0.02)
    for name in ("alpha", "beta"):
        assert fit.params[name] == pytest.approx(TRUTH[name], abs=0.02)
    for name in ("A", "B"):
        assert fit.params[name] == pytest.approx(TRUTH[name], rel=0.15)
    for name in ("R_D", "R_N"):
        assert fit.params[name] == pytest.approx(TRUTH[name], rel=0.15)


def test_decay_constant_without_repeats_is_not_pinned():
    frame = runs(0).query("epochs == 1")
    fit = dc.fit_data_constrained(frame.params, frame.tokens, frame.unique_tokens, frame.loss,
                                  fixed=CHINCHILLA_PART)
    assert "R_D" in fit.unpinned
    assert any("no run has repeats R_D > 0" in w for w in fit.warnings)


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "runs.csv"
    runs(0).to_csv(path, index=False)
    return path


def test_fix_holds_values_exactly_and_json_names_parameters_top_level(table, tmp_path, fit_cli):
    out_json = tmp_path / "fit.json"
    code, out, err = fit_cli([f"--sweep={table}", "--law=data_constrained", FIX,
                           "--bootstrap=10", f"--json={out_json}"])
    assert code == 0, err
    written = json.loads(out_json.read_text())
    for name, value in CHINCHILLA_PART.items():
        assert written[name] == value  # exactly, not exp(log(value))
        assert written["ci"][name] == [value, value]
    assert written["law"] == "data_constrained"
    assert {"R_D", "R_N"} <= set(written) and {"R_D", "R_N"} <= set(written["ci"])
    assert "every interval is conditional on these values" in out  # not the held ones' own
    assert [line.split()[0] for line in out.splitlines() if line.endswith("held by --fix")] \
        == list(CHINCHILLA_PART)


def test_epochs_column_gives_the_unique_tokens_fit(tmp_path, fit_cli):
    frame = runs(1)
    fits = []
    for name, columns in (("unique", ["epochs"]), ("epochs", ["unique_tokens"])):
        path, out_json = tmp_path / f"{name}.csv", tmp_path / f"{name}.json"
        frame.drop(columns=columns).to_csv(path, index=False)
        code, _, err = fit_cli([f"--sweep={path}", "--law=data_constrained", FIX,
                             "--bootstrap=0", f"--json={out_json}"])
        assert code == 0, err
        fits.append(json.loads(out_json.read_text()))
    assert fits[0]["R_D"] == pytest.approx(fits[1]["R_D"], rel=1e-6)


def test_holdout_reports_the_law_beside_a_naive_baseline(table, fit_cli):
    code, out, err = fit_cli([f"--sweep={table}", "--law=data_constrained", FIX,
                           "--bootstrap=0", "--holdout=tokens_per_param>300"])
    assert code == 0, err
    assert "naive baseline" in out and "the law beats the baseline" in out


def test_cluster_resampling_is_respected(tmp_path, fit_cli):
    frame = runs(0)
    frame["seed_group"] = (np.arange(len(frame)) // 2).astype(str)
    path, out_json = tmp_path / "runs.csv", tmp_path / "fit.json"
    frame.to_csv(path, index=False)
    code, _, err = fit_cli([f"--sweep={path}", "--law=data_constrained", FIX, "--bootstrap=10",
                         "--cluster=seed_group", f"--json={out_json}"])
    assert code == 0, err
    assert json.loads(out_json.read_text())["resampling"] == {
        "unit": "cluster", "column": "seed_group", "clusters": len(frame) // 2}


@pytest.mark.parametrize("fix, message", [
    ("--fix=R_X=3", "error: --fix: R_X is not a parameter --law=data_constrained can hold"),
    ("--fix=R_D=-1", "error: --fix: R_D=-1 must be > 0"),
    ("--fix=E", "error: --fix: 'E' is not NAME=VALUE with a finite number"),
])
def test_fix_refuses_what_cannot_be_held(table, fit_cli, fix, message):
    code, _, err = fit_cli([f"--sweep={table}", "--law=data_constrained", fix])
    assert code == 2 and err.startswith(message) and "\n" not in err


def test_fix_is_refused_naming_the_parameter_for_a_law_that_holds_none(table, fit_cli):
    code, _, err = fit_cli([f"--sweep={table}", "--law=kaplan", "--fix=alpha_N=0.07"])
    assert code == 2 and err.startswith("error: --fix: alpha_N cannot be held") \
        and "\n" not in err


@pytest.mark.parametrize("change, message", [
    (lambda f: f.drop(columns=["unique_tokens", "epochs"]), "missing column 'unique_tokens'"),
    (lambda f: f.drop(columns=["epochs"]).assign(unique_tokens=0),
     "column 'unique_tokens' (unique_tokens) has 84 non-positive"),
    (lambda f: f.drop(columns=["unique_tokens"]).assign(epochs=-1.0),
     "column 'epochs' (epochs) has 84 non-positive"),
])
def test_bad_repeats_are_one_line_naming_the_column(tmp_path, fit_cli, change, message):
    path = tmp_path / "runs.csv"
    change(runs(0)).to_csv(path, index=False)
    code, _, err = fit_cli([f"--sweep={path}", "--law=data_constrained", FIX])
    assert code == 2 and message in err and "\n" not in err


def test_a_run_that_read_less_than_its_corpus_saw_as_many_unique_tokens(tmp_path, fit_cli):
    """attnlab's tables record the corpus's unique tokens and epochs below 1 for a run shorter
    than its corpus: such a run has no repeats (U_D = D), the same fit as a table saying so."""
    path, same = tmp_path / "runs.csv", tmp_path / "same.csv"
    frame = runs(0)
    short = frame.epochs <= 1.0
    frame.assign(unique_tokens=np.where(short, frame.tokens * 3, frame.unique_tokens),
                 epochs=np.where(short, 1 / 3, frame.epochs)).to_csv(path, index=False)
    frame.to_csv(same, index=False)
    outputs, reports = [], []
    for table in (path, same):
        code, out, err = fit_cli([f"--sweep={table}", "--law=data_constrained", FIX,
                                  "--bootstrap=0", f"--json={tmp_path / table.stem}.json"])
        assert code == 0, err
        reports.append(out)
        outputs.append(json.loads((tmp_path / f"{table.stem}.json").read_text()))
    assert f"{int(short.sum())} run(s) read less than their corpus once" in reports[0]
    assert outputs[0]["R_D"] == outputs[1]["R_D"] and outputs[0]["R_N"] == outputs[1]["R_N"]


def test_columns_maps_another_epochs_column(tmp_path, fit_cli):
    path = tmp_path / "runs.csv"
    runs(0).drop(columns=["unique_tokens"]).rename(columns={"epochs": "Epochs"}).to_csv(
        path, index=False)
    code, _, err = fit_cli([f"--sweep={path}", "--law=data_constrained", FIX, "--bootstrap=0",
                         "--columns=epochs:Epochs"])
    assert code == 0, err


def test_approach3_holds_a_fixed_exponent_exactly(tmp_path, fit_cli):
    rng = np.random.default_rng(0)
    path, out_json = tmp_path / "grid.csv", tmp_path / "fit.json"
    synthetic.grid_points(synthetic.CHINCHILLA_PUBLISHED, n_points=40, rng=rng).to_csv(
        path, index=False)
    code, _, err = fit_cli([f"--sweep={path}", "--law=chinchilla", "--fix=alpha=0.34,E=1.69",
                         "--grid=a:0:20:10,b:0:20:10", "--bootstrap=10",
                         f"--json={out_json}"])
    assert code == 0, err
    written = json.loads(out_json.read_text())
    assert (written["alpha"], written["E"]) == (0.34, 1.69)
    assert written["ci"]["alpha"] == [0.34, 0.34]
    assert written["beta"] == pytest.approx(0.28, abs=0.03)


@pytest.mark.slow
def test_decay_constant_intervals_cover_the_truth_over_many_draws():
    """30 draws of the 84 runs, the Chinchilla part frozen, 95% intervals of 100 refits each.
    Measured: R*_N inside in 30 of 30 draws, R*_D in 25 of 30 (also with 4 grid starts per
    refit): the percentile intervals of R*_D, whose objective is flat, are too narrow (about
    83% for a nominal 95%, docs/scaling.md); this guards against their getting worse."""
    hits = {"R_D": [], "R_N": []}
    for seed in range(30):
        frame = runs(100 + seed)
        fit = dc.fit_data_constrained(frame.params, frame.tokens, frame.unique_tokens,
                                      frame.loss, fixed=CHINCHILLA_PART, n_bootstrap=100,
                                      seed=seed, grid_starts=0)
        for name in hits:
            hits[name].append(fit.ci[name][0] <= TRUTH[name] <= fit.ci[name][1])
    print({name: float(np.mean(inside)) for name, inside in hits.items()})  # the coverage
    assert 0.75 <= np.mean(hits["R_D"]) and 0.85 <= np.mean(hits["R_N"]), hits


def test_other_laws_note_runs_that_repeated_their_data():
    """A law that does not model repetition says how many runs read their data more than once;
    the data-constrained law, which reads the column, does not."""
    from attnlab.scaling import prepare_points

    df = pd.DataFrame({"params": [1e5, 2e5, 4e5], "tokens": [4e6, 2e6, 1e6],
                       "loss": [3.0, 3.1, 3.3], "epochs": [2.5, 1.0, 0.5]})
    notes = prepare_points(df, law=law_named("chinchilla")).notes
    assert [n for n in notes if n.startswith("1 of 3 runs read their training data more than "
                                             "once (up to 2.50 epochs)")], notes
    once = prepare_points(df.assign(epochs=[1.0, 0.5, 0.25]), law=law_named("chinchilla"))
    assert not [n for n in once.notes if "more than once" in n]
    assert not [n for n in prepare_points(df, law=law_named("data_constrained")).notes
                if "more than once" in n]


def test_a_decay_constant_spanning_orders_of_magnitude_is_not_pinned():
    """R*_N's 95% interval on the CPU study, [90, 1.3e14], pins nothing though it is finite:
    a decay constant is pinned within a factor 10 (R*_D's [0.95, 1.71] is)."""
    import dataclasses

    from attnlab.scaling.result import pin_rule

    frame = runs(0)
    fit = dc.fit_data_constrained(frame.params, frame.tokens, frame.unique_tokens, frame.loss,
                                  fixed=CHINCHILLA_PART)
    samples = dict(fit.samples, R_D=np.linspace(0.95, 1.71, 40),
                   R_N=np.geomspace(90.0, 1.3e14, 40))
    wide = dataclasses.replace(fit, samples=samples, n_bootstrap_requested=40)
    assert set(wide.too_wide) == {"R_N"} and "factor 10" in wide.too_wide["R_N"]
    assert wide.to_dict()["unpinned"] == ["R_N"]
    assert "R_D or R_N's spanning more than a factor 10" in wide.to_dict()["pin_rule"]
    from attnlab.scaling.laws import registry

    assert "factor" not in pin_rule(registry.law_named("chinchilla"))
