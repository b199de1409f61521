"""``attnlab fit --best-over``: each (N, D) point fitted at its own best learning rate. On a
table whose loss grows away from a known best rate per size, the fit equals the fit of the runs
at that rate alone, and a value with an unfinished run is never picked."""

import json

import numpy as np
import pandas as pd
import pytest

from attnlab.scaling.cli import fit_main
from attnlab.scaling.synthetic import CHINCHILLA_PUBLISHED, isoflop_points

pytestmark = pytest.mark.optimized

FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
SMALL_GRID = "--grid=a:0:20:10,b:0:20:10,e:-1:1:1,alpha:0:2:1,beta:0:2:1"


def best_rate(params, shift=1.0):
    """A best rate falling with size, as muP-like rules have it."""
    return shift * 0.01 * (np.asarray(params) / 1e8) ** -0.3


def lr_table(shift=1.0, seed=0, spread=1e-3) -> pd.DataFrame:
    """IsoFLOP points of Chinchilla's surface, each trained at 5 rates around its best rate and
    2 seeds: the loss rises by 0.05 per squared octave off the best rate; a seed's offset is
    the same at every rate, so the mean over seeds is lowest exactly at the best rate."""
    points = isoflop_points(CHINCHILLA_PUBLISHED, np.geomspace(1e18, 1e21, 4),
                            rng=np.random.default_rng(seed))
    rows = []
    for _, point in points.iterrows():
        for factor in FACTORS:
            for s, offset in ((0, -spread), (1, spread)):
                rate = float(best_rate(point["params"])) * factor
                penalty = 0.05 * np.log2(factor / shift) ** 2
                rows.append({**point.to_dict(), "train.learning_rate": rate,
                             "train.seed": s, "status": "completed",
                             "loss": point["loss"] + penalty + offset})
    return pd.DataFrame(rows)


def fit_json(tmp_path, table, name, *flags) -> dict:
    path, out = tmp_path / f"{name}.csv", tmp_path / f"{name}.json"
    table.to_csv(path, index=False)
    rc = fit_main([f"--sweep={path}", f"--json={out}", *flags])
    assert rc == 0
    return json.loads(out.read_text())


def test_the_fit_at_each_points_best_rate_is_the_fit_of_those_runs(tmp_path, capsys):
    table = lr_table()
    flags = ("--law=chinchilla", "--approach=3", "--bootstrap=0", SMALL_GRID)
    picked = fit_json(tmp_path, table, "all", "--best-over=train.learning_rate", *flags)
    at_best = table[np.isclose(table["train.learning_rate"], best_rate(table["params"]))]
    alone = fit_json(tmp_path, at_best, "alone", *flags)
    for name in ("E", "A", "B", "alpha", "beta"):
        assert picked[name] == pytest.approx(alone[name], rel=1e-6)  # rows in another order
    assert picked["n_points"] == alone["n_points"] == len(at_best)
    picks = pd.DataFrame(picked["picks"])
    assert picked["best_over"] == "train.learning_rate"
    assert len(picks) == len(at_best) // 2 and (picks["runs"] == 2).all()
    assert np.allclose(picks["train.learning_rate"], best_rate(picks["params"]))
    assert (picks["edge"] == "").all() and (picks["tried"] == len(FACTORS)).all()
    assert "each (N, D) point at its best train.learning_rate" in capsys.readouterr().out


def test_a_fit_that_pools_the_rates_says_so(tmp_path, capsys):
    """Without --best-over a point's runs at five rates are fitted as replicates: one note says
    so and names the flag; at each point's best rate, or with the seeds alone varying, no note."""
    table = lr_table()
    flags = ("--law=chinchilla", "--approach=2", "--bootstrap=0")
    note = "rows at one (N, D) differ in train.learning_rate: fitted as replicates"
    pooled = fit_json(tmp_path, table, "pooled", *flags)
    assert any(n.startswith(note) and "--best-over=train.learning_rate" in n
               for n in pooled["notes"])
    at_best = table[np.isclose(table["train.learning_rate"], best_rate(table["params"]))]
    assert not any("rows at one (N, D)" in n
                   for n in fit_json(tmp_path, at_best, "seeds", *flags)["notes"])
    picked = fit_json(tmp_path, table, "picked", "--best-over=train.learning_rate", *flags)
    assert not any("rows at one (N, D)" in n for n in picked["notes"])


def test_a_rate_with_an_unfinished_run_is_not_picked(tmp_path, capsys):
    table = lr_table()
    point = table["params"] == table["params"].iloc[0]
    best = point & np.isclose(table["train.learning_rate"], best_rate(table["params"]))
    diverged = best & (table["train.seed"] == 1)
    table.loc[diverged, ["status", "loss"]] = ["diverged", np.nan]
    result = fit_json(tmp_path, table, "diverged", "--best-over=train.learning_rate",
                      "--law=chinchilla", "--approach=2", "--bootstrap=0")
    picks = pd.DataFrame(result["picks"])
    pick = picks[picks["params"] == table["params"].iloc[0]]
    assert len(pick) == 1
    assert not np.isclose(pick["train.learning_rate"].iloc[0],
                          best_rate(table["params"].iloc[0]))
    assert pick["runs"].iloc[0] == 2


def test_each_group_picks_its_own_rate(tmp_path, capsys):
    # arm b's best rate is twice arm a's: on the same grid, b's picks sit one octave higher
    table = pd.concat([lr_table().assign(arm="a"), lr_table(shift=2.0, seed=1).assign(arm="b")])
    result = fit_json(tmp_path, table, "by", "--best-over=train.learning_rate", "--by=arm",
                      "--law=chinchilla", "--approach=2", "--bootstrap=0")
    picks = pd.DataFrame(result["picks"])
    for arm, shift in (("a", 1.0), ("b", 2.0)):
        mine = picks[picks["arm"] == arm]
        assert len(mine) == (table["arm"] == arm).sum() // (2 * len(FACTORS))
        assert np.allclose(mine["train.learning_rate"], best_rate(mine["params"], shift))
    assert set(result["groups"]) == {"a", "b"}


@pytest.mark.parametrize("flags, message", [
    (("--law=hparams",), "--best-over does not apply to --law=hparams"),
    (("--law=chinchilla", "--approach=1"), "--best-over does not apply to --law=chinchilla"),
    (("--law=chinchilla", "--approach=2", "--best-over=train.lr"),
     "column 'train.lr' is not in the results table"),
    (("--law=chinchilla", "--approach=2", "--best-over=params"),
     "--best-over=params: params is also --by or --match"),
    (("--law=chinchilla", "--approach=2", "--best-over=batch"),
     "--best-over=batch: 1 of 360 runs have no value of batch"),
    (("--law=chinchilla", "--approach=2", "--pair=train.sed"),
     "column 'train.sed' is not in the results table"),
])
def test_bad_best_over_is_one_line(tmp_path, capsys, flags, message):
    path = tmp_path / "runs.csv"
    table = lr_table()
    table.assign(batch=np.where(np.arange(len(table)) == 0, np.nan, 8.0)).to_csv(path,
                                                                              index=False)
    over = [] if any(f.startswith("--best-over") for f in flags) else [
        "--best-over=train.learning_rate"]
    assert fit_main([f"--sweep={path}", *over, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


def test_a_study_of_several_rates_fits_each_point_at_its_best(tmp_path):
    """attnlab quickstart on a plan with learning-rate factors fits what --best-over fits."""
    from attnlab.study.quickstart import fit_study
    from attnlab.sweep import load_spec

    assert load_spec("experiments/quickstart.py:cpu_tuned").tries_rates
    assert not load_spec("experiments/quickstart.py").tries_rates
    table = lr_table()
    path = tmp_path / "runs.csv"
    table.to_csv(path, index=False)
    at_best = table[np.isclose(table["train.learning_rate"], best_rate(table["params"]))]
    picked, _, fit2, messages = fit_study(path, n_bootstrap=0, best_over="train.learning_rate")
    at_best.to_csv(tmp_path / "alone.csv", index=False)
    alone, _, alone2, _ = fit_study(tmp_path / "alone.csv", n_bootstrap=0)
    assert len(picked) == len(alone) == len(at_best)
    assert fit2.params["a"] == pytest.approx(alone2.params["a"], rel=1e-9)
    assert any("fitted at its best train.learning_rate" in m for m in messages)


def test_a_study_of_variants_reads_each_variants_own_best_rate(tmp_path):
    from attnlab.study.common import study_results

    table = pd.concat([lr_table().assign(arm="a"), lr_table(shift=2.0).assign(arm="b")])
    path = tmp_path / "runs.csv"
    table.to_csv(path, index=False)
    kept, notes = study_results(path, by="arm", best_over="train.learning_rate")
    for arm, shift in (("a", 1.0), ("b", 2.0)):
        mine = kept[kept["arm"] == arm]
        assert len(mine) == (table["arm"] == arm).sum() // len(FACTORS)
        assert np.allclose(mine["train.learning_rate"], best_rate(mine["params"], shift))
    assert "fitted at its best train.learning_rate" in notes[0]
    everything, none = study_results(path, by="arm")
    assert len(everything) == len(table) and none == []


def test_pair_draws_a_seed_with_its_runs_at_every_rate(tmp_path, capsys):
    """A seed's offset (here 0.1, twice the loss one octave off the best rate) is shared by its
    runs at every rate: drawn whole (--pair), it cancels and every pick is firm; drawn within
    each rate, the same picks look soft. The fit itself is the same."""
    table = lr_table(spread=0.1)
    flags = ("--law=chinchilla", "--approach=2", "--bootstrap=0",
             "--best-over=train.learning_rate")
    paired = fit_json(tmp_path, table, "paired", *flags, "--pair=train.seed")
    alone = fit_json(tmp_path, table, "alone", *flags)
    assert paired["pair"] == "train.seed" and "pair" not in alone
    firm, soft = (pd.DataFrame(fit["picks"])["stability"] for fit in (paired, alone))
    assert (firm == 1.0).all() and soft.max() < 0.9
    assert paired["a"] == alone["a"]


def test_pair_without_best_over_is_one_line(tmp_path, capsys):
    path = tmp_path / "runs.csv"
    lr_table().to_csv(path, index=False)
    assert fit_main([f"--sweep={path}", "--law=chinchilla", "--pair=train.seed"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--pair applies to the picks of --best-over" in err


def test_a_fit_at_each_points_best_rate_and_batch_is_the_fit_of_those_runs(tmp_path, capsys):
    # every rate at two batch sizes; the larger batch costs 0.02 at every rate
    table = pd.concat([lr_table().assign(**{"train.batch_size": 16}),
                       lr_table().assign(**{"train.batch_size": 32}).eval("loss = loss + 0.02")])
    flags = ("--law=chinchilla", "--approach=3", "--bootstrap=0", SMALL_GRID)
    picked = fit_json(tmp_path, table, "both", "--best-over=train.learning_rate,train.batch_size",
                      *flags)
    best = (np.isclose(table["train.learning_rate"], best_rate(table["params"]))
            & (table["train.batch_size"] == 16))
    alone = fit_json(tmp_path, table[best], "alone", *flags)
    for name in ("E", "A", "B", "alpha", "beta"):
        assert picked[name] == pytest.approx(alone[name], rel=1e-6)
    picks = pd.DataFrame(picked["picks"])
    assert (picks["train.batch_size"] == 16).all() and (picks["tried"] == 2 * len(FACTORS)).all()
    assert (picks["edge"] == "lowest train.batch_size").all()
