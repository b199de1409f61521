"""A new scaling law is one class and one registry line: here Kaplan's L(N) with an irreducible
loss, L(N) = E + (N_c/N)^alpha_N (Kaplan et al. 2020 Sec. 6.3's "L(N) plus a constant"), fitted
by least squares on L, as a ``--law=kaplan_floor`` that ``attnlab fit`` (report, JSON, hold-out)
asks like any other law. The registry's own rules are tested beside it."""

import json

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import least_squares

from attnlab.scaling.cli import fit_main
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.law import Law
from attnlab.scaling.laws import registry
from attnlab.scaling.result import ScalingFit

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized

TRUTH = {"E": 1.5, "N_c": 3e8, "alpha_N": 0.3}


class KaplanFloor(Law):
    name = "kaplan_floor"
    title = "L(N) = E + (N_c/N)^alpha_N"
    n_parameters = 3
    capabilities = frozenset({"table", "run-loss"})

    def run_loss(self, params, n, d):
        return params["E"] + np.power(params["N_c"] / np.asarray(n, np.float64),
                                      params["alpha_N"]) + 0 * np.asarray(d, np.float64)

    def fit(self, table, *, n_bootstrap=0, ci_level=0.95, seed=0, **_):
        n, loss = table.array("params"), table.array("loss")

        def solve(index):
            def residual(theta):
                params = {"E": theta[0], "N_c": np.exp(theta[1]), "alpha_N": theta[2]}
                return self.run_loss(params, n[index], 0) - loss[index]
            x = least_squares(residual, [1.0, np.log(np.median(n)), 0.5]).x
            return {"E": float(x[0]), "N_c": float(np.exp(x[1])), "alpha_N": float(x[2])}

        params = solve(np.arange(len(n)))
        rng = np.random.default_rng(seed)
        draws = [solve(rng.integers(0, len(n), len(n))) for _ in range(n_bootstrap)]
        samples = {k: np.array([d[k] for d in draws]) for k in params} if draws else {}
        residual = self.run_loss(params, n, 0) - loss
        return ScalingFit(part=self, params=params, samples=samples, ci_level=ci_level,
                          n_points=len(n), objective=float(residual @ residual),
                          objective_name="sum of squared residuals of L",
                          n_bootstrap_requested=n_bootstrap)


@pytest.fixture
def floor_law(monkeypatch):
    monkeypatch.setitem(registry.LAWS, (KaplanFloor.name, KaplanFloor.variant), KaplanFloor)


@pytest.fixture
def results(tmp_path):
    rng = np.random.default_rng(0)
    n = np.geomspace(1e6, 1e9, 12)
    loss = KaplanFloor().run_loss(TRUTH, n, 0) * np.exp(0.002 * rng.standard_normal(12))
    path = tmp_path / "results.csv"
    pd.DataFrame({"params": n, "tokens": 20 * n, "loss": loss}).to_csv(path, index=False)
    return path


def test_a_registered_law_is_fitted_reported_and_held_out_by_attnlab_fit(
        floor_law, results, tmp_path, capsys):
    out = tmp_path / "fit.json"
    assert fit_main([f"--sweep={results}", "--law=kaplan_floor", "--bootstrap=20",
                     f"--json={out}"]) == 0
    assert KaplanFloor.title in capsys.readouterr().out
    fitted = json.loads(out.read_text())
    assert fitted["law"] == "kaplan_floor" and fitted["model"] == KaplanFloor.title
    for name, value in TRUTH.items():
        assert fitted[name] == pytest.approx(value, rel=0.15)
        low, high = fitted["ci"][name]
        assert low <= fitted[name] <= high
    held = tmp_path / "held.json"
    assert fit_main([f"--sweep={results}", "--law=kaplan_floor", "--holdout=params>5e8",
                     f"--json={held}"]) == 0
    summary = json.loads(held.read_text())
    assert summary["held_out_runs"] == 2 and summary["mean_abs_relative_error"] < 0.01


def test_an_unregistered_law_is_refused_with_the_registered_names(results, capsys):
    assert fit_main([f"--sweep={results}", "--law=kaplan_floor"]) == 2
    names = registry.names()
    assert names[:6] == ("kaplan", "chinchilla", "clark", "hparams", "data_constrained",
                         "overtrain")
    assert capsys.readouterr().err.strip() == (
        f"error: --law must be one of {', '.join(names)}, not 'kaplan_floor'")


@pytest.mark.parametrize("law, approach, form, expected", [
    ("chinchilla", None, "n", ("chinchilla", 3)),   # each family reads only its own selector
    ("chinchilla", 2, None, ("chinchilla", 2)),
    ("kaplan", 1, None, ("kaplan", "nd")),
    ("kaplan", None, "d", ("kaplan", "d")),
    ("clark", 3, "n", ("clark", None)),
])
def test_resolve_reads_each_familys_selector(law, approach, form, expected):
    part = registry.law_named(law, approach, form)
    assert (part.name, part.variant) == expected
    assert type(part) is registry.LAWS[expected]


def test_resolve_refuses_a_variant_the_family_lacks():
    with pytest.raises(FitInputError, match=r"--approach must be one of 1, 2, 3 for "
                                            r"--law=chinchilla, not 4"):
        registry.law_named("chinchilla", approach=4)


def test_every_law_declares_what_its_fit_can_answer():
    for (name, variant), cls in registry.LAWS.items():
        part = cls()
        assert part.name == name and part.title and part.n_parameters > 0
        assert not part.can("loss-model") or part.can("run-loss")  # L(N, D) gives a run's loss
        assert not part.can("closed-frontier") or (part.can("loss-model")
                                                   and part.can("allocation"))
        assert set(part.flag_names).isdisjoint(part.refused)
        if part.selector:  # the flag that picks a variant offers every registered one
            assert part.selector.enum_values == tuple(
                str(v) for v in registry.variants(part.name))
