"""``attnlab fit --coverage``: the fitted law simulated at the table's own design with the
residual structure estimated from its residuals, each simulation refitted as the table was, and
the intervals' actual coverage reported and flagged."""

import json

import numpy as np
import pandas as pd
import pytest

from attnlab.scaling.cli import fit_main
from attnlab.scaling.laws.approach3 import InitGrid
from attnlab.scaling.laws.registry import law_named
from attnlab.scaling.synthetic import CHINCHILLA_PUBLISHED, ladder_points
from attnlab.scaling.tables.coverage import (Coverage, residual_structure, simulated_coverage,
                                             simulated_table)
from attnlab.scaling.tables.fitting import fit_table
from attnlab.scaling.tables.prepare import prepare_points

pytestmark = pytest.mark.optimized

SMALL_GRID = InitGrid(a=(4.0, 6.0, 8.0), b=(4.0, 6.0, 8.0), e=(0.0, 1.0), alpha=(0.2, 0.5),
                      beta=(0.2, 0.5))
LAW = law_named("chinchilla", 3)


def _ladder(trunks, seed=0, trunk_noise=0.01, noise=0.002):
    frame = ladder_points(CHINCHILLA_PUBLISHED, np.geomspace(1e7, 1e9, 6), trunks_per_size=trunks,
                          trunk_noise=trunk_noise, noise=noise, rng=np.random.default_rng(seed))
    return prepare_points(frame, law=LAW)


def test_the_residual_structure_recovers_the_simulated_variance_components():
    table = _ladder(trunks=8)
    fit = fit_table(table, law=LAW, grid=SMALL_GRID)
    found = residual_structure(table, fit)
    assert found["clusters"] == 48
    assert found["row_sd"] == pytest.approx(0.002, rel=0.3)
    assert found["cluster_sd"] == pytest.approx(0.01, rel=0.35)
    # Drawn again from the fit with that structure, the table's components come back.
    drawn = simulated_table(table, fit, found, np.random.default_rng(1))
    again = residual_structure(drawn, fit)
    assert again["row_sd"] == pytest.approx(found["row_sd"], rel=0.3)
    assert again["cluster_sd"] == pytest.approx(found["cluster_sd"], rel=0.5)
    assert np.array_equal(drawn.array("params"), table.array("params"))


def test_every_simulation_is_counted_once_and_coverage_is_a_share_of_them():
    table = _ladder(trunks=2)
    fit = fit_table(table, law=LAW, grid=SMALL_GRID, n_bootstrap=15)
    result = simulated_coverage(table, fit, sims=4, n_bootstrap=15, grid=SMALL_GRID)
    assert result.with_interval + result.refused + result.failed == 4
    assert set(result.covered) >= {"E", "alpha", "beta", "a"}
    for name in result.covered:
        assert 0 <= result.covered[name] <= result.with_interval
        rate, low, high = result.rate(name)
        assert low <= rate <= high
    payload = result.to_dict()
    assert payload["sims"] == 4 and payload["flag_below"] == 0.9


def test_coverage_below_ninety_percent_is_flagged():
    result = Coverage(sims=40, level=0.95, structure={}, covered={"E": 39, "alpha": 30},
                      with_interval=40, refused=0, failed=0)
    assert result.flagged() == ["alpha"]
    assert result.rate("alpha")[0] == 0.75


def test_fit_prints_the_coverage_table(tmp_path, capsys):
    path, out = tmp_path / "ladder.csv", tmp_path / "fit.json"
    ladder_points(CHINCHILLA_PUBLISHED, np.geomspace(1e7, 1e9, 5), trunks_per_size=2,
                  rng=np.random.default_rng(3)).to_csv(path, index=False)
    assert fit_main([f"--sweep={path}", "--law=chinchilla", "--approach=3", "--bootstrap=12",
                     "--coverage=2", "--grid=a:4:8:2,b:4:8:2,e:0:1:1,alpha:0.2:0.5:0.3,"
                     "beta:0.2:0.5:0.3", f"--json={out}"]) == 0
    text = capsys.readouterr().out
    assert "coverage at this design: 2 tables simulated from the fitted law" in text
    assert json.loads(out.read_text())["coverage"]["sims"] == 2


@pytest.mark.parametrize("flags, message", [
    (["--law=chinchilla", "--approach=2"], "--coverage needs a law of each run's loss"),
    (["--law=chinchilla", "--by=trunk"], "--coverage checks one fit's intervals"),
    (["--law=chinchilla", "--bootstrap=0"], "--bootstrap must be >= 1"),
])
def test_a_coverage_the_request_cannot_check_is_refused_in_one_line(tmp_path, capsys, flags,
                                                                     message):
    path = tmp_path / "ladder.csv"
    pd.DataFrame({"params": [1e7, 1e8], "tokens": [1e9, 1e9], "loss": [3.0, 2.5],
                  "trunk": ["a", "b"]}).to_csv(path, index=False)
    assert fit_main([f"--sweep={path}", "--coverage=5", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
