"""Clark et al. 2022's law for routed models, log10 L = a log10 N + b log10 Ê + c log10 N log10 Ê + d
(attnlab/scaling/laws/clark.py, ``attnlab fit --law=clark``): the saturating transform against its
equation, recovery of known coefficients, the t intervals' coverage in simulation, the bootstrap,
and one-line refusals."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from attnlab.plots.cli import plot_main
from attnlab.scaling.cli import fit_main
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.laws.clark import CLARK_2022, PARAMS, fit_clark, saturate

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized

S_BASE = CLARK_2022["S-BASE"]
TRUE = {p: S_BASE[p] for p in PARAMS}


def reference_log_loss(n, e, a, b, c, d, e_start=None, e_max=None):
    """Eq. 1 of Clark et al., written out element by element in float64."""
    out = []
    for n_i, e_i in zip(n, e):
        if e_start is None:
            e_hat = float(e_i)
        else:
            e_hat = 1.0 / (1.0 / (e_i - 1.0 + 1.0 / (1.0 / e_start - 1.0 / e_max)) + 1.0 / e_max)
        out.append(a * math.log10(n_i) + b * math.log10(e_hat)
                   + c * math.log10(n_i) * math.log10(e_hat) + d)
    return np.array(out)


def grid(sizes, experts):
    """Every (N, E) pair, as the sweep plans them."""
    n, e = np.meshgrid(np.asarray(sizes, float), np.asarray(experts, float), indexing="ij")
    return n.ravel(), e.ravel()


def test_saturation_follows_eq1():
    e = np.array([1.0, 2.0, 4.0, 16.0, 512.0, 1e9])
    e_hat = saturate(e, S_BASE["e_start"], S_BASE["e_max"])
    reference = [10 ** reference_log_loss([10.0], [v], 0, 1, 0, 0, S_BASE["e_start"],
                                          S_BASE["e_max"])[0] for v in e]
    np.testing.assert_allclose(e_hat, reference, rtol=1e-12)
    assert e_hat[0] == pytest.approx(S_BASE["e_start"], rel=1e-12)  # Ê(1) = E_start
    assert e_hat[-1] == pytest.approx(S_BASE["e_max"], rel=1e-6)  # saturates at E_max
    assert np.all(np.diff(e_hat) > 0)
    np.testing.assert_array_equal(saturate(e), e)  # no transform: Ê = E
    with pytest.raises(FitInputError, match="E_start < E_max"):
        saturate(e, 5.0, 2.0)


@pytest.mark.parametrize("saturation", [None, (S_BASE["e_start"], S_BASE["e_max"])])
def test_recovers_known_coefficients_exactly(saturation):
    n, e = grid(np.geomspace(1.5e7, 1.3e9, 4), [1, 2, 4, 8, 16, 64, 256])
    loss = 10 ** reference_log_loss(n, e, **TRUE, **dict(zip(("e_start", "e_max"),
                                                             saturation or (None, None))))
    fit = fit_clark(n, e, loss, saturation=saturation)
    for p in PARAMS:
        assert fit.params[p] == pytest.approx(TRUE[p], abs=1e-10)
    assert fit.residual_std < 1e-12 and fit.dof == len(n) - 4
    np.testing.assert_allclose(fit.predict(n, e), loss, rtol=1e-10)
    # The routing slope d log10 L / d log10 E = b + c log10 N, and its sign change at
    # N = 10^(-b/c) (Clark et al.'s N_cutoff): 1e12 for S-BASE's rounded coefficients.
    # Saturated, it is per log E (not per log Ê): the derivative of the fitted log10 L along
    # log10 E, here by central differences in float64.
    cutoff = 10 ** (-TRUE["b"] / TRUE["c"])
    for at in ((None,) if saturation is None else (2.0, 64.0)):
        slope = fit.expert_slope(1e8, at)["slope"]
        if saturation is None:
            assert slope == pytest.approx(TRUE["b"] + 8 * TRUE["c"], abs=1e-10)
        else:
            h = 1e-5
            up, down = (np.log10(fit.predict([1e8], [at * 10 ** s])) for s in (h, -h))
            assert slope == pytest.approx((up - down)[0] / (2 * h), rel=1e-6)
        assert fit.expert_slope(cutoff, at)["slope"] == pytest.approx(0, abs=1e-9)
    assert fit.size_slope(8.0)["slope"] == pytest.approx(TRUE["a"] + math.log10(8) * TRUE["c"],
                                                         abs=1e-10)


def test_intervals_cover_at_the_nominal_rate():
    """Gaussian noise in log10 L on the sweep's design (3 sizes x E in 1-16, 15 runs): the 95%
    t intervals of a, b, c, d and of the routing slope cover the truth in 95% of 2,000 simulated
    sweeps (binomial 3-sigma band), and the estimates are unbiased. The covariance is checked
    against the normal equations solved independently."""
    rng = np.random.default_rng(0)
    n, e = grid([6e3, 2.5e4, 9.8e4], [1, 2, 4, 8, 16])
    mean = reference_log_loss(n, e, **TRUE)
    sigma, sims, level = 0.01, 2000, 0.95
    hits = {p: 0 for p in (*PARAMS, "slope")}
    estimates = {p: [] for p in PARAMS}
    slope_true = TRUE["b"] + TRUE["c"] * math.log10(2.5e4)
    for i in range(sims):
        loss = 10 ** (mean + sigma * rng.standard_normal(len(n)))
        fit = fit_clark(n, e, loss, ci_level=level)
        for p in PARAMS:
            low, high = fit.ci[p]
            hits[p] += low <= TRUE[p] <= high
            estimates[p].append(fit.params[p])
        low, high = fit.expert_slope(2.5e4)["ci"]
        hits["slope"] += low <= slope_true <= high
        if i == 0:  # float64 reference: normal equations, s^2 (X^T X)^-1
            x = np.stack([np.log10(n), np.log10(e), np.log10(n) * np.log10(e),
                          np.ones(len(n))], axis=1)
            y = np.log10(loss)
            theta = np.linalg.solve(x.T @ x, x.T @ y)
            s2 = np.sum((y - x @ theta) ** 2) / (len(y) - 4)
            np.testing.assert_allclose([fit.params[p] for p in PARAMS], theta, rtol=1e-9)
            np.testing.assert_allclose(fit.covariance, s2 * np.linalg.inv(x.T @ x), rtol=1e-8)
    band = 3 * math.sqrt(level * (1 - level) / sims)
    for name, count in hits.items():
        assert abs(count / sims - level) < band, (name, count / sims)
    for p in PARAMS:
        values = np.array(estimates[p])
        assert abs(values.mean() - TRUE[p]) < 4 * values.std() / math.sqrt(sims), p


def test_bootstrap_over_runs():
    rng = np.random.default_rng(1)
    n, e = grid([6e3, 2.5e4, 9.8e4], [1, 2, 4, 8, 16])
    loss = 10 ** (reference_log_loss(n, e, **TRUE) + 0.01 * rng.standard_normal(len(n)))
    fit = fit_clark(n, e, loss, n_bootstrap=300, seed=3)
    again = fit_clark(n, e, loss, n_bootstrap=300, seed=3)
    assert fit.bootstrap_ci == again.bootstrap_ci  # seeded
    assert 0 < fit.n_bootstrap <= 300 and fit.n_bootstrap_requested == 300
    for p in PARAMS:
        low, high = fit.bootstrap_ci[p]
        assert low < fit.params[p] < high
    # Two values of E at three sizes: draws often miss one E or one N, and are skipped.
    n2, e2 = grid([6e3, 2.5e4, 9.8e4], [1, 16])
    sparse = fit_clark(n2, e2, 10 ** (reference_log_loss(n2, e2, **TRUE)
                                      + 0.01 * rng.standard_normal(6)), n_bootstrap=200)
    assert sparse.n_bootstrap < 150


@pytest.mark.parametrize("n, e, message", [
    ([1e4, 2e4, 4e4, 8e4, 1.6e5], [8] * 5, "at least 2 values of E"),
    ([1e4] * 5, [1, 2, 4, 8, 16], "at least 2 values of N"),
    ([1e4, 1e4, 2e4, 2e4], [1, 2, 1, 2], "at least 5 runs"),
    # log10 E = log10 N - 4: the four columns span three dimensions.
    ([1e4, 2e4, 4e4, 8e4, 1.6e5], [1, 2, 4, 8, 16], "collinear"),
    ([1e4, 2e4, 1e4, 2e4, 4e4], [0.5, 1, 2, 2, 4], "E must be >= 1"),
    ([1e4, -2e4, 1e4, 2e4, 4e4], [1, 1, 2, 2, 4], "N has 1 non-positive"),
])
def test_refusals(n, e, message):
    with pytest.raises(FitInputError, match=message) as error:
        fit_clark(n, e, np.full(len(n), 3.0))
    assert "\n" not in str(error.value)


@pytest.fixture(scope="module")
def sweep_csv(tmp_path_factory):
    """A results table as ``experiments/moe.py`` writes it, losses from S-BASE's law (noise
    0.005 in log10 L), plus a failed run."""
    rng = np.random.default_rng(2)
    n, e = grid([6e3, 2.5e4, 9.8e4], [1, 2, 4, 8, 16])
    loss = 10 ** (reference_log_loss(n, e, **TRUE) + 0.005 * rng.standard_normal(len(n)))
    frame = pd.DataFrame({
        "run_id": [f"r{i}" for i in range(len(n))], "status": "completed",
        "model.moe_experts": e.astype(int), "params": n * e + 5000,
        "active_non_embedding_params": n, "tokens": 500_000, "final_val_loss": loss})
    failed = frame.iloc[:1].assign(run_id="bad", status="failed", final_val_loss=np.nan)
    path = tmp_path_factory.mktemp("clark") / "results.csv"
    pd.concat([frame, failed]).to_csv(path, index=False)
    return path


def test_cli_fits_a_sweep_table(sweep_csv, tmp_path, capsys):
    out = tmp_path / "clark.json"
    rc = fit_main([f"--sweep={sweep_csv}", "--law=clark", "--bootstrap=100", f"--json={out}"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "Clark et al. 2022" in captured.out and "S-BASE" in captured.out
    assert "N = active_non_embedding_params, E = model.moe_experts" in captured.out
    assert "dropped 1 of 16 runs" in captured.out
    result = json.loads(out.read_text())
    assert result["n_points"] == 15 and result["dof"] == 11 and result["n_bootstrap"] > 0
    assert result["experts"] == [1, 2, 4, 8, 16]
    for p in PARAMS:
        low, high = result["ci"][p]
        assert low < result[p] < high
        assert abs(result[p] - TRUE[p]) < 5 * result["std_errors"][p]
    # Fitting N = all parameters instead: the note says which column was used.
    rc = fit_main([f"--sweep={sweep_csv}", "--law=clark", "--bootstrap=0",
                   "--columns=params:params"])
    assert rc == 0 and "N = params, E = model.moe_experts" in capsys.readouterr().out


def test_cli_saturation_flag(tmp_path, capsys):
    n, e = grid([1e7, 1e8, 1e9], [1, 2, 8, 64, 512])
    sat = (S_BASE["e_start"], S_BASE["e_max"])
    loss = 10 ** reference_log_loss(n, e, **TRUE, e_start=sat[0], e_max=sat[1])
    path = tmp_path / "r.csv"
    pd.DataFrame({"params": n, "experts": e, "loss": loss}).to_csv(path, index=False)
    out = tmp_path / "fit.json"
    assert fit_main([f"--sweep={path}", "--law=clark", "--saturation=1.847,314.478",
                     f"--json={out}"]) == 0
    result = json.loads(out.read_text())
    assert result["saturation"] == list(sat)
    for p in PARAMS:
        assert result[p] == pytest.approx(TRUE[p], abs=1e-9)
    capsys.readouterr()


@pytest.mark.parametrize("extra, message", [
    (["--by=model.d_model"], "--by does not apply to --law=clark"),
    (["--budget=1e12"], "--budget does not apply"),
    (["--saturation=2"], "--saturation: '2' is not E_START,E_MAX"),
    (["--columns=experts:nope"], "no column 'nope'"),
])
def test_cli_refusals(sweep_csv, extra, message, capsys):
    assert fit_main([f"--sweep={sweep_csv}", "--law=clark"] + extra) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_cli_refuses_a_single_expert_count(tmp_path, capsys):
    path = tmp_path / "dense.csv"
    pd.DataFrame({"params": [1e4, 2e4, 4e4, 8e4, 1.6e5], "model.moe_experts": 1,
                  "loss": [3.0, 2.9, 2.8, 2.7, 2.6]}).to_csv(path, index=False)
    assert fit_main([f"--sweep={path}", "--law=clark"]) == 2
    err = capsys.readouterr().err
    assert "at least 2 values of E" in err and err.count("\n") == 1
    assert plot_main([f"--sweep={path}", "--law=clark", "--kind=loss-vs-params",
                      f"--plot={tmp_path / 'x.png'}"]) == 2
    assert "attnlab fit --law=clark" in capsys.readouterr().err


def test_saturation_is_refused_for_the_other_laws(sweep_csv, capsys):
    assert fit_main([f"--sweep={sweep_csv}", "--law=kaplan", "--saturation=2,300"]) == 2
    assert "--saturation applies to --law=clark only" in capsys.readouterr().err


def test_lack_of_fit_with_replicates():
    """Two seeds per (N, E): the F test's p is uniform when the law holds (its 5% level rejects
    in 5% of 1,000 simulated sweeps, binomial 3-sigma band) and tiny when the loss bends in
    log E, as a law linear in log E cannot; without replicates there is no test."""
    rng = np.random.default_rng(5)
    n, e = grid([6e3, 2.5e4, 5.6e4, 9.9e4], [1, 2, 4, 8, 16])
    n, e = np.repeat(n, 2), np.repeat(e, 2)
    mean = reference_log_loss(n, e, **TRUE)
    sims, rejected = 1000, 0
    for _ in range(sims):
        fit = fit_clark(n, e, 10 ** (mean + 0.01 * rng.standard_normal(len(n))))
        assert (fit.lack_of_fit["df_lack_of_fit"], fit.lack_of_fit["df_pure_error"]) == (16, 20)
        rejected += fit.lack_of_fit["p"] < 0.05
    assert abs(rejected / sims - 0.05) < 3 * math.sqrt(0.05 * 0.95 / sims)
    bent = mean + 0.2 * np.log10(e) ** 2 + 0.01 * rng.standard_normal(len(n))
    assert fit_clark(n, e, 10 ** bent).lack_of_fit["p"] < 1e-6
    assert fit_clark(n[::2], e[::2], 10 ** mean[::2]).lack_of_fit is None
