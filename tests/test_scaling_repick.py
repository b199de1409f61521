"""Intervals that redraw the picks of a fit at each point's best rate (``attnlab fit --best-over
--pair``): the draws keep each seed's runs together; a pick the seeds cannot single out widens
the intervals that a bootstrap holding it fixed reports as a point; every replicate counts."""

import json

import numpy as np
import pandas as pd
import pytest

from attnlab.scaling.cli import fit_main
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.synthetic import CHINCHILLA_PUBLISHED, isoflop_points
from attnlab.scaling.tables.repick import OUTER, redraws_possible, repicked_fit, seeds_drawn

pytestmark = pytest.mark.optimized

SMALL_GRID = "--grid=a:4:8:2,b:6:10:2,e:0:1:1,alpha:0.2:0.5:0.3,beta:0.2:0.5:0.3"
POINT = ["params", "tokens"]


def soft_table(spread: float) -> pd.DataFrame:
    """Points exactly on Chinchilla's surface, each run at two rates by 3 seeds. At rate 1 every
    seed scores the surface's loss; at rate 2 seed 0 scores ``spread`` lower and seeds 1-2 0.6x
    ``spread`` higher: rate 1 wins on the mean (by 0.067 ``spread``), and any draw with seed 0
    twice or more picks rate 2."""
    points = isoflop_points(CHINCHILLA_PUBLISHED, np.geomspace(1e18, 1e21, 4), noise=0.0,
                            sizes_per_budget=5, rng=np.random.default_rng(0))
    offsets = {0: -spread, 1: 0.6 * spread, 2: 0.6 * spread}
    rows = [{**point.to_dict(), "train.learning_rate": rate, "train.seed": seed,
             "status": "completed", "loss": point["loss"] + (rate == 2.0) * offsets[seed]}
            for _, point in points.iterrows() for rate in (1.0, 2.0) for seed in range(3)]
    return pd.DataFrame(rows)


def test_a_draw_keeps_each_seed_with_its_runs_at_every_rate():
    table = soft_table(0.1)
    draw = seeds_drawn(table, point=POINT, pair="train.seed", rng=np.random.default_rng(1))
    assert len(draw) == len(table)
    for _, cell in draw.groupby(POINT):
        assert cell["train.seed"].nunique() == 3  # "s/k": a seed drawn twice is two pairs
        assert (cell.groupby("train.seed")["train.learning_rate"].nunique() == 2).all()
    source = dict(zip(zip(table["params"], table["train.learning_rate"],
                          table["train.seed"].astype(str)), table["loss"]))
    for _, run in draw.iterrows():  # every drawn run is a real run, relabelled
        seed = run["train.seed"].split("/")[0]
        assert source[run["params"], run["train.learning_rate"], seed] == run["loss"]
    assert redraws_possible(table, point=POINT, pair="train.seed")
    assert not redraws_possible(table[table["train.seed"] == 0], point=POINT, pair="train.seed")


def fit_json(tmp_path, table, name, *flags) -> dict:
    path, out = tmp_path / f"{name}.csv", tmp_path / f"{name}.json"
    table.to_csv(path, index=False)
    assert fit_main([f"--sweep={path}", f"--json={out}", "--law=chinchilla", "--approach=3",
                     "--best-over=train.learning_rate", SMALL_GRID, *flags]) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("spread", [0.05, 0.1, 0.2])
def test_picks_the_seeds_cannot_single_out_widen_the_intervals(tmp_path, capsys, spread):
    """Every pick is rate 1, whose runs lie exactly on the surface: a bootstrap holding the
    picks fixed refits the same law every time (an interval of width ~0). Redrawn, the draws
    that pick rate 2 somewhere move the fit: the exponents' intervals open up."""
    table = soft_table(spread)
    fit = fit_json(tmp_path, table, "soft", "--pair=train.seed", "--bootstrap=40")
    picks = pd.DataFrame(fit["picks"])
    assert (picks["train.learning_rate"] == 1.0).all() and (picks["stability"] < 0.9).all()
    fixed, redrawn = fit["details"]["fixed_pick_ci"], fit["ci"]
    for name in ("alpha", "beta"):
        assert fixed[name][1] - fixed[name][0] < 1e-3, (name, fixed[name])
        assert redrawn[name][1] - redrawn[name][0] > 20 * (fixed[name][1] - fixed[name][0]
                                                           + 1e-6), (name, redrawn[name])
    assert fit["n_bootstrap_requested"] == OUTER * 2
    assert any("intervals redraw the picks" in note for note in fit["notes"])
    assert "hold the picks fixed" not in capsys.readouterr().out


def test_each_group_of_by_redraws_its_own_picks(tmp_path, capsys):
    """--by: each group's intervals redraw that group's picks alone (group b's seeds do not
    straddle its picks, so its redrawn intervals stay as narrow as its fixed ones)."""
    firm = soft_table(0.1)
    firm.loc[firm["train.learning_rate"] == 2.0, "loss"] += 0.5  # rate 2 loses at every draw
    table = pd.concat([soft_table(0.1).assign(arm="a"), firm.assign(arm="b")])
    fit = fit_json(tmp_path, table, "by", "--pair=train.seed", "--bootstrap=20", "--by=arm")
    widths = {arm: {kind: np.subtract(*ci["alpha"][::-1])
                    for kind, ci in (("fixed", group["details"]["fixed_pick_ci"]),
                                     ("redrawn", group["ci"]))}
              for arm, group in fit["groups"].items()}
    assert widths["a"]["redrawn"] > 20 * (widths["a"]["fixed"] + 1e-6)
    assert widths["b"]["redrawn"] < 1e-3
    assert all(any("intervals redraw the picks" in n for n in group["notes"])
               for group in fit["groups"].values())


def test_without_two_seeds_anywhere_the_picks_are_held_fixed_and_said_so(tmp_path, capsys):
    table = soft_table(0.1)
    one = table[table["train.seed"] == 0]
    paired = fit_json(tmp_path, one, "one", "--pair=train.seed", "--bootstrap=20")
    plain = fit_json(tmp_path, one, "plain", "--bootstrap=20")
    assert paired["ci"] == plain["ci"]
    assert "the intervals hold the picks fixed: no point ran two train.seed values" in \
        paired["notes"]


def test_a_draw_that_cannot_be_fitted_counts_all_its_refits_as_failed():
    from attnlab.scaling.laws.registry import law_named
    from attnlab.scaling.tables.fitting import fit_table
    from attnlab.scaling.tables.prepare import prepare_points

    table = soft_table(0.1)
    kept = table[(table["train.learning_rate"] == 1.0)]
    fit = fit_table(prepare_points(kept, law=law_named("chinchilla"), source="t"),
                    law=law_named("chinchilla", 2), n_bootstrap=10)
    calls = []

    def failing(draw, n, seed):
        calls.append((n, seed))
        raise FitInputError("no profile")

    out = repicked_fit(fit, table, point=POINT, pair="train.seed", n_bootstrap=10, seed=3,
                       fit_picks=failing)
    assert len(calls) == OUTER and {n for n, _ in calls} == {1}
    assert len({seed for _, seed in calls}) == OUTER  # each draw's refits seeded apart
    assert out.n_bootstrap_requested == OUTER and out.n_bootstrap == 0
    assert out.intervals_refused and out.ci == {}
    assert f"{OUTER} draws could not be fitted" in out.notes[-1]
