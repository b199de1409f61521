"""``--best-over`` naming several columns: each combination of their values is one candidate.
A size x rate grid at one budget (rates refined per size) is picked jointly, exactly as through
one column that spells each combination out; the grid's ends are named per column."""

import json

import numpy as np
import pandas as pd
import pytest

from attnlab.scaling.compare_cli import compare_main
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.tables.picks import at_best, heldout_picks

MATCH = ("budget",)
# Each size tries its own rates, as a refined grid does: the larger sizes, lower rates.
RATES = {32: (0.01, 0.02, 0.04), 64: (0.005, 0.01, 0.02), 128: (0.0025, 0.005)}


def size_rate_grid(rng, optima, seeds=3, noise=0.002) -> pd.DataFrame:
    """Per arm: loss = floor + 0.05 (log2 d - log2 d*)^2 + 0.1 (log2 lr - log2 lr*)^2 + a seed's
    offset, shared by its runs at every candidate, + run noise."""
    rows = []
    for arm, (size_best, rate_best, floor) in optima.items():
        offsets = 0.01 * rng.standard_normal(seeds)
        for size, rates in RATES.items():
            for rate in rates:
                for seed in range(seeds):
                    loss = (floor + 0.05 * np.log2(size / size_best) ** 2
                            + 0.1 * np.log2(rate / rate_best) ** 2 + offsets[seed]
                            + noise * rng.standard_normal())
                    rows.append(dict(arch=arm, budget=1e12, d_model=size, lr=rate, seed=seed,
                                     status="completed", loss=loss))
    return pd.DataFrame(rows)


def spelled_out(df: pd.DataFrame) -> pd.DataFrame:
    """The same table with one column naming each (size, rate) combination."""
    return df.assign(config=df["d_model"].astype(str) + "@" + df["lr"].astype(str))


def test_a_joint_pick_is_the_pick_of_one_column_spelling_each_combination_out():
    df = size_rate_grid(np.random.default_rng(0), {"gpt": (64, 0.01, 2.0),
                                                   "mamba": (32, 0.02, 1.9)})
    args = dict(by="arch", match=MATCH, metric="loss", pair="seed")
    kept, picks = at_best(df, over="d_model,lr", **args)
    kept_one, picks_one = at_best(spelled_out(df), over="config", **args)
    best = picks.set_index("arch")
    assert (best.loc["gpt", "d_model"], best.loc["gpt", "lr"]) == (64, 0.01)
    assert (best.loc["mamba", "d_model"], best.loc["mamba", "lr"]) == (32, 0.02)
    assert (picks["tried"] == 8).all() and (picks["runs"] == 3).all()
    assert "_candidate" not in kept.columns
    assert sorted(kept.index) == sorted(kept_one.index)
    for column in ("loss", "runs", "tried", "stability"):
        np.testing.assert_array_equal(picks[column], picks_one[column])


def test_a_joint_heldout_pick_is_that_of_one_spelled_out_column():
    df = size_rate_grid(np.random.default_rng(1), {"gpt": (64, 0.01, 2.0)}, noise=0.03)
    args = dict(by="arch", match=MATCH, metric="loss", pair="seed")
    rows, notes = heldout_picks(df, over="d_model,lr", **args)
    rows_one, _ = heldout_picks(spelled_out(df), over="config", **args)
    assert notes == [] and len(rows) == 3
    np.testing.assert_array_equal(rows["loss"], rows_one["loss"])
    spelled = rows["d_model"].astype(str) + "@" + rows["lr"].astype(str)
    assert spelled.tolist() == rows_one["config"].tolist()


def test_each_end_of_the_grid_is_named_by_its_column():
    """Outer column first: a size's end among all sizes, a rate's among the rates its size
    tried."""
    # gpt's best rate lies above every rate its best size tried (though size 32 tried 0.04);
    # mamba's best size lies below 32
    df = size_rate_grid(np.random.default_rng(2), {"gpt": (64, 0.025, 2.0),
                                                   "mamba": (16, 0.02, 1.9)}, noise=1e-4)
    _, picks = at_best(df, by="arch", match=MATCH, metric="loss", over="d_model,lr")
    picks = picks.set_index("arch")
    assert picks.loc["gpt", ["d_model", "lr"]].tolist() == [64, 0.02]
    assert picks.loc["gpt", "edge"] == "highest lr"
    assert picks.loc["mamba", ["d_model", "lr"]].tolist() == [32, 0.02]
    assert picks.loc["mamba", "edge"] == "lowest d_model"
    full = pd.DataFrame([dict(arch="gpt", budget=1, d_model=d, lr=lr, status="completed",
                              loss=(d - 64) ** 2 + (lr - 0.01) ** 2)
                         for d in (32, 64, 128) for lr in (0.005, 0.01, 0.02)])
    _, picks = at_best(full, by="arch", match=MATCH, metric="loss", over="d_model,lr")
    assert picks["edge"].tolist() == [""]


@pytest.mark.parametrize("over, message", [
    ("d_model,budget", "--best-over=d_model,budget: budget is also --by or --match"),
    ("d_model,rate", "column 'rate' is not in the results table"),
    ("d_model,lr", "--best-over=d_model,lr: 1 of 48 runs have no value of lr"),
    (" , ", "--best-over=' , ': name a column"),
])
def test_a_bad_column_list_is_one_error_naming_the_column(over, message):
    df = size_rate_grid(np.random.default_rng(3), {"gpt": (64, 0.01, 2.0), "b": (64, 0.01, 2.0)})
    df.loc[0, "lr"] = np.nan
    with pytest.raises(FitInputError, match=message.replace("(", r"\(").replace("'", "'")):
        at_best(df, by="arch", match=MATCH, metric="loss", over=over)


def test_compare_picks_each_arm_jointly_and_writes_both_columns(tmp_path, capsys):
    path, out = tmp_path / "results.csv", tmp_path / "compare.json"
    size_rate_grid(np.random.default_rng(4), {"gpt": (64, 0.01, 2.0),
                                              "mamba": (32, 0.02, 1.9)}).to_csv(path, index=False)
    assert compare_main([f"--sweep={path}", "--by=arch", "--baseline=gpt", "--match=budget",
                         "--metric=loss", "--pair=seed", "--best-over=d_model,lr",
                         f"--json={out}"]) == 0
    assert "each arm at its best d_model,lr" in capsys.readouterr().out
    payload = json.loads(out.read_text())
    picks = pd.DataFrame(payload["picks"]).set_index("arch")
    assert picks.loc["mamba", ["d_model", "lr"]].tolist() == [32, 0.02]
    held = pd.DataFrame(payload["heldout_rows"])
    assert {"d_model", "lr"} <= set(payload["picks"][0]) and len(held) == 2
    pooled = held.iloc[-1]
    assert pooled["lo"] < -0.1 < pooled["hi"]  # mamba's floor is 0.1 below gpt's
