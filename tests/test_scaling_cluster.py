"""The cluster bootstrap (a ladder's trunk with its branches drawn whole), the refusal of an
interval when too many refits fail, and what fits say about both."""

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from repo_files import load_module

from attnlab.scaling.bootstrap import (MAX_FAILED_SHARE, cluster_index, identified,
                                       resample_rows, resample_weights)
from attnlab.scaling.cli import fit_main
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.law import axis_levels
from attnlab.scaling.laws.approach3 import InitGrid
from attnlab.scaling.laws.registry import law_named
from attnlab.scaling.result import ScalingFit
from attnlab.scaling.synthetic import CHINCHILLA_PUBLISHED, ladder_points
from attnlab.scaling.tables.fitting import fit_table
from attnlab.scaling.tables.ladder import isoflop_slices
from attnlab.scaling.tables.prepare import prepare_points

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized

ROOT = Path(__file__).resolve().parents[1]
MARKOV = str(ROOT / "docs/results/markov_ladder_gpu.csv")
COVERAGE_SCRIPT = ROOT / "docs/scripts/cluster_coverage.py"
SMALL_GRID = InitGrid(a=(4.0, 6.0, 8.0), b=(4.0, 6.0, 8.0), e=(0.0, 1.0), alpha=(0.2, 0.5),
                      beta=(0.2, 0.5))


def test_singleton_clusters_draw_exactly_the_row_bootstrap():
    old = np.random.default_rng(3).integers(0, 17, size=(40, 17))
    rows = np.stack([np.bincount(r, minlength=17) for r in old]).astype(float)
    assert np.array_equal(resample_weights(17, 40, np.random.default_rng(3)), rows)
    assert np.array_equal(resample_weights(17, 40, np.random.default_rng(3), np.arange(17)), rows)
    assert np.array_equal(resample_rows(9, np.random.default_rng(5)),
                          np.random.default_rng(5).integers(0, 9, 9))


def test_a_cluster_is_drawn_whole():
    clusters = cluster_index(["t0", "t0", "t1", "t2", "t2", "t2", None])
    weights = resample_weights(len(clusters), 500, np.random.default_rng(0), clusters)
    for c in range(clusters.max() + 1):  # every member of a cluster counts as often
        members = weights[:, clusters == c]
        assert np.all(members == members[:, :1])
    # G draws of clusters per replicate (not as many rows as the table has)
    per_cluster = weights[:, [np.flatnonzero(clusters == c)[0] for c in range(4)]]
    assert np.all(per_cluster.sum(axis=1) == 4)
    rows = resample_rows(len(clusters), np.random.default_rng(1), clusters)
    drawn = pd.Series(clusters[rows]).value_counts()
    sizes = np.bincount(clusters)
    assert all(count % sizes[c] == 0 for c, count in drawn.items())


def test_a_ladder_table_clusters_by_trunk_and_says_so():
    raw = pd.read_csv(MARKOV)
    table = prepare_points(raw, law=law_named("chinchilla"))
    assert table.resampling() == {"unit": "cluster", "column": "trunk", "clusters": 5}
    assert any("'trunk'" in note and "chosen automatically" in note for note in table.notes)
    assert prepare_points(raw, law=law_named("chinchilla"), cluster="none").clusters is None
    by_size = prepare_points(raw, law=law_named("chinchilla"), cluster="model.d_model")
    assert by_size.resampling()["clusters"] == 5
    with pytest.raises(FitInputError, match="no column 'seed_group'"):
        prepare_points(raw, law=law_named("chinchilla"), cluster="seed_group")
    sliced = isoflop_slices(table)  # every slice point keeps its size's trunk
    assert sliced.resampling()["clusters"] == 5
    assert sliced.frame.groupby("params")["cluster"].nunique().eq(1).all()


def test_rows_without_a_cluster_value_are_their_own_clusters():
    raw = pd.read_csv(MARKOV)
    raw.loc[raw.index[:7], "trunk"] = np.nan  # the 115k size's branches lose their trunk
    table = prepare_points(raw, law=law_named("chinchilla"))
    assert table.resampling()["clusters"] == 4 + 6


def _fit(requested, kept):
    samples = {"a": np.linspace(0.4, 0.6, kept), "b": np.linspace(0.4, 0.6, kept),
               "k_N": np.ones(kept), "k_D": np.ones(kept)}
    return ScalingFit(part=law_named("chinchilla", 2), params={"a": 0.5, "b": 0.5, "k_N": 1.0,
                                                               "k_D": 1.0},
                      samples=samples, ci_level=0.95, n_points=20, objective=0.0,
                      objective_name="", n_bootstrap_requested=requested)


def test_an_interval_is_refused_from_fewer_than_ten_refits():
    """One or two refits make a zero-width "95%" interval that need not hold the estimate."""
    assert _fit(9, 9).refusal_reason == "9 bootstrap refits, fewer than 10"
    assert _fit(9, 9).ci == {} and not _fit(10, 10).intervals_refused


def test_a_law_through_every_point_has_no_interval():
    """Five points for approach 3's five parameters: every refit interpolates its draw too, so
    the intervals would have zero width; with one parameter held by --fix there is a residual."""
    p = CHINCHILLA_PUBLISHED
    n = np.geomspace(1e7, 1e9, 5)
    d = n * np.array([5.0, 80.0, 20.0, 40.0, 10.0])
    loss = p["E"] + p["A"] / n ** p["alpha"] + p["B"] / d ** p["beta"]
    frame = pd.DataFrame({"params": n, "tokens": d, "loss": loss * (1 + 0.01 * np.sin(n))})
    table = prepare_points(frame, law=law_named("chinchilla", 3), source="five")
    fit = fit_table(table, law=law_named("chinchilla", 3), n_bootstrap=10, grid=SMALL_GRID)
    assert fit.refusal_reason == "5 points for 5 free parameters leave no residual"
    assert fit.ci == {} and set(fit.not_pinned) >= {"E", "alpha", "beta"}
    held = fit_table(table, law=law_named("chinchilla", 3), n_bootstrap=10, grid=SMALL_GRID,
                     fixed={"E": 1.69})
    assert held.free_parameters == 4 and held.refusal_reason != fit.refusal_reason


def test_an_interval_is_refused_when_too_many_refits_fail():
    limit = int(MAX_FAILED_SHARE * 100)
    kept = _fit(100, 100 - limit)  # at the limit: computed
    assert not kept.intervals_refused and set(kept.ci) == {"a", "b", "k_N", "k_D"}
    refused = _fit(100, 100 - limit - 1)
    assert refused.intervals_refused and refused.ci == {}
    assert refused.predict_optimal(1e15)["ci"] == {}
    out = refused.to_dict([1e15])
    assert out["ci"] == {} and out["intervals_refused"] and out["n_bootstrap_failed"] == limit + 1
    # Without an interval nothing is shown to be pinned: the exponents are named, not headlined.
    assert kept.to_dict()["unpinned"] == [] and set(out["unpinned"]) == {"a", "b"}
    assert out["too_wide"]["a"] == f"no 95% interval: {limit + 1} of 100 bootstrap refits failed"
    from attnlab.scaling.tables.report import format_report

    assert "not pinned, no interval to show it: a, b\n" in format_report(refused, "t.csv", [])
    # A table of fits per group says which group's intervals were refused, and why.
    from attnlab.scaling.tables.grouped import GroupedFits, format_grouped

    text = format_grouped(GroupedFits("arm", {"x": kept, "y": refused}, {}, {}))
    assert f"intervals [y]: not computed: {limit + 1} of 100 bootstrap refits failed" in text
    assert "intervals [x]" not in text


def test_approach2_on_the_markov_ladder_refuses_rather_than_conditions(tmp_path, capsys):
    out = tmp_path / "fit.json"
    assert fit_main([f"--sweep={MARKOV}", "--law=chinchilla", "--approach=2",
                     "--bootstrap=100", f"--json={out}"]) == 0
    report = capsys.readouterr().out
    payload = json.loads(out.read_text())
    assert payload["resampling"] == {"unit": "cluster", "column": "trunk", "clusters": 5}
    assert payload["n_bootstrap_failed"] > MAX_FAILED_SHARE * 100
    assert payload["intervals_refused"] and payload["ci"] == {}
    assert "resampling 5 clusters" in report and "intervals not computed" in report
    assert "smallest size at this budget" in report and "of the ladder" not in report


def test_every_row_its_own_cluster_keeps_the_row_bootstrap_fit():
    rng = np.random.default_rng(0)
    frame = ladder_points(CHINCHILLA_PUBLISHED, np.geomspace(1e7, 1e9, 4), trunks_per_size=2,
                          rng=rng)
    plain = prepare_points(frame.drop(columns="trunk"), law=law_named("kaplan"))
    singletons = prepare_points(frame.assign(trunk=[f"r{i}" for i in range(len(frame))]),
                                law=law_named("kaplan"))
    assert singletons.clusters is None
    a, b = (fit_table(t, law=law_named("kaplan"), n_bootstrap=20, seed=1)
            for t in (plain, singletons))
    assert a.to_dict() == b.to_dict()
    assert a.resampling == {"unit": "row", "column": None, "clusters": len(frame)}


def test_kaplan_and_approach3_resample_whole_trunks():
    rng = np.random.default_rng(0)
    frame = ladder_points(CHINCHILLA_PUBLISHED, np.geomspace(1e7, 1e9, 4), trunks_per_size=3,
                          rng=rng)
    for name, options in (("kaplan", {}), ("chinchilla", {"grid": SMALL_GRID})):
        law = law_named(name)
        fit = fit_table(prepare_points(frame, law=law), law=law, n_bootstrap=20, **options)
        assert fit.resampling == {"unit": "cluster", "column": "trunk", "clusters": 12}
        assert fit.n_bootstrap_requested == 20 and fit.ci


def test_the_fit_report_states_a_row_bootstrap(tmp_path, capsys):
    frame = ladder_points(CHINCHILLA_PUBLISHED, np.geomspace(1e7, 1e9, 4), trunks_per_size=2,
                          rng=np.random.default_rng(2))
    path = tmp_path / "runs.csv"
    frame.to_csv(path, index=False)
    assert fit_main([f"--sweep={path}", "--law=kaplan", "--bootstrap=10",
                     "--cluster=none"]) == 0
    assert f"bootstrap (resampling {len(frame)} rows): 10 of 10 refits" in capsys.readouterr().out


@pytest.mark.slow
def test_cluster_bootstrap_covers_where_the_row_bootstrap_does_not():
    """The contract of docs/results/cluster_coverage.csv at 60 simulations: a correct cluster
    bootstrap covers ~95% (binomial se ~3%), the row bootstrap ~55-85% on the parameters a
    trunk's shared effect moves; the thresholds sit >= 3 standard errors from both."""
    script = load_module(COVERAGE_SCRIPT)
    frame = script.coverage(60, n_bootstrap=100, seed=11)
    rate = frame.groupby(["method", "parameter"])["covered"].mean()

    def mean(method, names):
        return float(np.mean([rate[method, name] for name in names]))

    for name in ("alpha", "E"):
        assert rate["cluster", name] >= 0.85, rate
    assert mean("row", ("alpha", "E")) <= 0.80, rate
    assert mean("cluster", ("alpha", "E", "a")) - mean("row", ("alpha", "E", "a")) >= 0.12, rate
    assert not frame["refused"].any()


def test_intervals_too_wide_to_act_on_are_unpinned_and_shown_by_name():
    from attnlab.scaling.tables.report import format_report

    fit = _fit(100, 100)  # a, b in [0.4, 0.6]: width ~0.2, pinned
    assert fit.too_wide == {} and fit.to_dict()["unpinned"] == []
    wide = dataclasses.replace(fit, samples={**fit.samples, "a": np.linspace(0.2, 0.6, 100)})
    assert set(wide.too_wide) == {"a"} and wide.to_dict()["unpinned"] == ["a"]
    report = format_report(wide, "runs.csv", [])
    assert "not pinned, an interval too wide to act on (an exponent's interval wider than " \
        "0.25, E's wider than 30% of E): a\n" in report
    rows = [line.split()[0] for line in report.splitlines() if line.startswith("  ")]
    assert rows[-1] == "a"  # below the pinned ones
    row = next(line for line in report.splitlines() if line.strip().startswith("a "))
    assert "not pinned" in row and "0.5" not in row.split()[1]
    e = ScalingFit(part=law_named("chinchilla", 3), params={"E": 2.0}, ci_level=0.95,
                   samples={"E": np.linspace(1.6, 2.4, 200)}, n_points=20, objective=0.0,
                   objective_name="", n_bootstrap_requested=200)
    assert "E" in e.too_wide  # width 0.78 > 30% of 2.0
    narrow = dataclasses.replace(e, samples={"E": np.linspace(1.8, 2.2, 200)})
    assert narrow.too_wide == {}


def test_a_draw_counts_distinct_levels_along_each_axis():
    levels = np.array([0, 0, 1, 1, 2, 2])
    design = {"N": (levels, 3)}
    weights = np.array([[1, 1, 1, 1, 1, 1],   # every size
                        [2, 0, 2, 0, 0, 2],   # every size, unevenly
                        [3, 0, 0, 3, 0, 0]],  # two sizes
                       dtype=float)
    assert identified(weights, design).tolist() == [True, True, False]
    assert identified(weights, None).all()
    # Values within 1% of each other are one level; the law's need falls with what --fix holds.
    assert axis_levels([1e6, 1.005e6, 2e6, 4e6]).tolist() == [0, 0, 1, 2]
    law = law_named("chinchilla", 3)
    assert law.distinct_needed() == {"N": 3, "D": 3}
    assert law.distinct_needed({"E": 1.7}) == {"N": 2, "D": 2}
    assert law.distinct_needed({"A": 400.0, "alpha": 0.34}) == {"D": 3}
    assert law_named("kaplan").distinct_needed() == {"N": 2, "D": 2}
    assert law_named("overtrain").distinct_needed() == {"D/N": 2}


def test_draws_of_too_few_sizes_fail_rather_than_narrow_the_interval(tmp_path, capsys):
    """Five trunks, one a size: about 15% of cluster draws hold two sizes, where E + A/N^alpha
    is flat along E. Such a draw is a failed refit, so the interval is refused, not read off the
    draws that happened to hold three sizes."""
    out = tmp_path / "fit.json"
    assert fit_main([f"--sweep={MARKOV}", "--law=chinchilla", "--approach=3",
                     "--bootstrap=100", f"--json={out}"]) == 0
    report = capsys.readouterr().out
    payload = json.loads(out.read_text())
    # Of 5^5 equally likely draws of 5 trunks, 5 + 10 (2^5 - 2) hold at most two: 9.8%.
    found = re.search(r"(\d+) of 100 bootstrap draws held fewer distinct N than 3", report)
    assert found and 2 <= int(found[1]) <= 25
    assert int(found[1]) <= payload["n_bootstrap_failed"]
    assert payload["intervals_refused"] == (payload["n_bootstrap_failed"] > 10)
