"""``attnlab compare``: per-point and pooled differences of a sweep's arms, Welch and paired t
intervals checked against the formulas in float64 and for coverage, the report and its JSON."""

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from attnlab.scaling.compare_cli import compare_main
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.tables.compare import POOLED, paired_differences
from attnlab.scaling.tables.picks import at_best, format_picks

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized


def _table(rng, shifts=(0.0, -0.02), seeds=(3, 4), sizes=(1000, 2000), noise=0.01):
    rows = []
    for params in sizes:
        for arm, shift, n in zip(("cosine", "wsd"), shifts, seeds):
            rows += [dict(run_id=f"{params}-{arm}-{s}", status="completed", schedule=arm,
                          params=params, tokens=5e5, seed=s,
                          final_val_loss=2.0 + shift + noise * rng.standard_normal())
                     for s in range(n)]
    rows.append(dict(run_id="failed", status="failed", schedule="wsd", params=1000,
                     tokens=5e5, final_val_loss=np.nan))
    return pd.DataFrame(rows)


def _welch_reference(a, b, level):
    """mean(a) - mean(b) +- t_{dof} * se, Welch (1947), written out in float64."""
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = stats.t.ppf(0.5 + level / 2, dof) * np.sqrt(va + vb)
    d = np.mean(a) - np.mean(b)
    return d, d - half, d + half


def test_points_and_pool_match_the_welch_formula():
    df = _table(np.random.default_rng(0))
    frame = paired_differences(df, by="schedule", baseline="cosine", level=0.9)
    assert list(frame["params"]) == [1000, 2000, POOLED]
    done = df[df.status == "completed"]
    cells = {}
    for params in (1000, 2000):
        base = done[(done.params == params) & (done.schedule == "cosine")].final_val_loss
        arm = done[(done.params == params) & (done.schedule == "wsd")].final_val_loss
        cells[params] = (base.to_numpy(), arm.to_numpy())
        row = frame[frame.params == params].iloc[0]
        d, lo, hi = _welch_reference(arm.to_numpy(), base.to_numpy(), 0.9)
        assert (row.n_base, row.n_arm) == (3, 4)  # the failed run is left out
        np.testing.assert_allclose([row["diff"], row.lo, row.hi], [d, lo, hi], rtol=1e-12)
    # Pooled: the mean of the two differences; its variance the sum of the four terms / 4.
    terms = [np.var(c, ddof=1) / len(c) / 4 for pair in cells.values() for c in pair]
    dof = sum(terms) ** 2 / sum(t**2 / (len(c) - 1) for t, c in
                                zip(terms, [c for pair in cells.values() for c in pair]))
    d = np.mean([a.mean() - b.mean() for b, a in cells.values()])
    half = stats.t.ppf(0.95, dof) * np.sqrt(sum(terms))
    pooled = frame[frame.params == POOLED].iloc[0]
    np.testing.assert_allclose([pooled["diff"], pooled.lo, pooled.hi], [d, d - half, d + half],
                               rtol=1e-12)
    assert (pooled.n_base, pooled.n_arm) == (6, 8)


def test_the_interval_covers_the_true_difference_at_its_level():
    rng = np.random.default_rng(1)
    covered = [[], []]
    for _ in range(200):
        frame = paired_differences(_table(rng, seeds=(3, 3)), by="schedule",
                                   baseline="cosine", level=0.9)
        for i, row in enumerate(frame.itertuples()):
            if i < 2:
                covered[0].append(row.lo <= -0.02 <= row.hi)
            else:
                covered[1].append(row.lo <= -0.02 <= row.hi)
    # 400 per-point and 200 pooled intervals at 90%: binomial 3-sigma bands.
    assert 0.855 <= np.mean(covered[0]) <= 0.945
    assert 0.835 <= np.mean(covered[1]) <= 0.965


def test_a_single_run_has_no_interval():
    frame = paired_differences(_table(np.random.default_rng(2), seeds=(1, 3)),
                               by="schedule", baseline="cosine")
    assert frame["lo"].isna().all() and frame["hi"].isna().all()
    assert np.isfinite(frame["diff"]).all()


def test_a_numeric_baseline_names_the_arm_of_equal_value():
    """--by=lr_factor --baseline=1: the rule's own runs (lr_factor 1.0) are the baseline."""
    df = _table(np.random.default_rng(6), shifts=(0.0, -0.03))
    df["lr_factor"] = df["schedule"].map({"cosine": 1.0, "wsd": 2.0})
    frame = paired_differences(df, by="lr_factor", baseline="1")
    named = paired_differences(df.assign(lr_factor=df["schedule"]), by="lr_factor",
                               baseline="cosine")
    assert set(frame["arm"]) == {"2.0"}
    np.testing.assert_allclose(frame["diff"], named["diff"], rtol=0, atol=1e-15)
    with pytest.raises(FitInputError, match="'3' is not a value of column 'lr_factor'"):
        paired_differences(df, by="lr_factor", baseline="3")


def test_the_command_reports_the_baseline_arm_it_resolved(tmp_path, capsys):
    df = _table(np.random.default_rng(6), shifts=(0.0, -0.03))
    df["lr_factor"] = df["schedule"].map({"cosine": 1.0, "wsd": 2.0})
    path, out = tmp_path / "results.csv", tmp_path / "compare.json"
    df.to_csv(path, index=False)
    assert compare_main([f"--sweep={path}", "--by=lr_factor", "--baseline=1",
                         f"--json={out}"]) == 0
    assert "minus '1.0'" in capsys.readouterr().out
    assert json.loads(out.read_text())["baseline"] == "1.0"


def test_compare_command_prints_and_writes_json(tmp_path, capsys):
    path = tmp_path / "results.csv"
    _table(np.random.default_rng(3)).to_csv(path, index=False)
    out = tmp_path / "compare.json"
    assert compare_main([f"--sweep={path}", "--by=schedule", "--baseline=cosine",
                         f"--json={out}"]) == 0
    text = capsys.readouterr().out
    assert "minus 'cosine' at the same params, tokens" in text and POOLED in text
    payload = json.loads(out.read_text())
    assert payload["baseline"] == "cosine" and len(payload["rows"]) == 3
    assert payload["rows"][2]["params"] == POOLED


@pytest.mark.parametrize("argv, words", [
    (["--by=schedule"], "--baseline is required"),
    (["--by=schedule", "--baseline=cosine", "--match="], "--match"),
    (["--by=schedule", "--baseline=cosine", "--metric=nope"], "column 'nope'"),
    (["--by=schedule", "--baseline=cosine", "--pair=params"], "--pair=params: two finished runs"),
])
def test_bad_input_is_one_line(tmp_path, capsys, argv, words):
    path = tmp_path / "results.csv"
    _table(np.random.default_rng(4)).to_csv(path, index=False)
    assert compare_main([f"--sweep={path}", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and words in err


def test_paired_intervals_are_the_t_interval_of_the_per_seed_differences():
    rng = np.random.default_rng(5)
    df = _table(rng, seeds=(4, 3))  # cosine ran seeds 0-3, wsd 0-2: seed 3 has no pair
    frame = paired_differences(df, by="schedule", baseline="cosine", pair="seed", level=0.95)
    done = df[df.status == "completed"]
    terms = []
    for params in (1000, 2000):
        cell = done[done.params == params].pivot_table(index="seed", columns="schedule",
                                                       values="final_val_loss").dropna()
        d = (cell["wsd"] - cell["cosine"]).to_numpy()
        half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
        row = frame[frame.params == params].iloc[0]
        assert (row.n_base, row.n_arm) == (3, 3)
        np.testing.assert_allclose([row["diff"], row.lo, row.hi],
                                   [d.mean(), d.mean() - half, d.mean() + half], rtol=1e-12)
        terms.append(d)
    var = [d.var(ddof=1) / len(d) / 4 for d in terms]
    dof = sum(var) ** 2 / sum(v**2 / (len(d) - 1) for v, d in zip(var, terms))
    mean = np.mean([d.mean() for d in terms])
    half = stats.t.ppf(0.975, dof) * np.sqrt(sum(var))
    pooled = frame[frame.params == POOLED].iloc[0]
    np.testing.assert_allclose([pooled["diff"], pooled.lo, pooled.hi],
                               [mean, mean - half, mean + half], rtol=1e-12)


def test_a_shared_seed_noise_cancels_in_the_paired_interval():
    """Each seed moves both arms alike (the same initialisation and data): pairing removes that
    spread, so its interval is far narrower than Welch's and still covers the truth."""
    rng = np.random.default_rng(6)
    df = _table(rng, seeds=(5, 5), noise=0.001)
    df["final_val_loss"] += df["seed"].map(dict(enumerate(0.05 * rng.standard_normal(5))))
    welch = paired_differences(df, by="schedule", baseline="cosine").iloc[-1]
    paired = paired_differences(df, by="schedule", baseline="cosine", pair="seed").iloc[-1]
    assert paired.hi - paired.lo < 0.2 * (welch.hi - welch.lo)
    assert paired.lo <= -0.02 <= paired.hi


def _rate_grid(rng, optima, rates=(1e-3, 2e-3, 4e-3, 8e-3), seeds=3, noise=1e-4):
    """Loss = floor + 0.1 (log2 lr - log2 lr*)^2 + seed noise, per schedule and size: each arm's
    best rate is its own ``optima[arm]``."""
    rows = []
    for params in (1000, 2000):
        for arm, (best, floor) in optima.items():
            for lr in rates:
                for seed in range(seeds):
                    loss = floor + 0.1 * np.log2(lr / best) ** 2 + noise * rng.standard_normal()
                    rows.append(dict(run_id=f"{params}-{arm}-{lr}-{seed}", status="completed",
                                     schedule=arm, params=params, tokens=5e5, seed=seed,
                                     learning_rate=lr, final_val_loss=loss))
    return pd.DataFrame(rows)


def test_each_arm_is_compared_at_its_own_best_rate():
    # cosine is best at 4e-3, wsd at 2e-3: at one shared rate the comparison would mislead.
    df = _rate_grid(np.random.default_rng(7), {"cosine": (4e-3, 2.0), "wsd": (2e-3, 1.95)})
    kept, picks = at_best(df, by="schedule", match=("params", "tokens"),
                          metric="final_val_loss", over="learning_rate")
    best = picks.set_index(["schedule", "params"])["learning_rate"]
    assert best.xs("cosine", level=0).tolist() == [4e-3, 4e-3]
    assert best.xs("wsd", level=0).tolist() == [2e-3, 2e-3]
    assert (picks["edge"] == "").all() and (picks["runs"] == 3).all()
    assert len(kept) == 12
    frame = paired_differences(kept, by="schedule", baseline="cosine", pair="seed")
    pooled = frame[frame.params == POOLED].iloc[0]
    assert abs(pooled["diff"] + 0.05) < 1e-3 and pooled.lo <= -0.05 <= pooled.hi


def test_a_rate_with_an_unfinished_run_is_not_picked_and_an_end_pick_is_named():
    df = _rate_grid(np.random.default_rng(8), {"cosine": (4e-3, 2.0), "wsd": (16e-3, 1.9)})
    # One seed of cosine's best rate diverged: its other two seeds alone would win.
    hit = (df.schedule == "cosine") & (df.learning_rate == 4e-3) & (df.seed == 0)
    df.loc[hit, ["status", "final_val_loss"]] = ["diverged", np.nan]
    _, picks = at_best(df, by="schedule", match=("params", "tokens"),
                       metric="final_val_loss", over="learning_rate")
    cosine = picks[(picks.schedule == "cosine") & (picks.params == 1000)].iloc[0]
    assert cosine.learning_rate != 4e-3
    wsd = picks[picks.schedule == "wsd"]
    assert (wsd.learning_rate == 8e-3).all() and (wsd.edge == "highest").all()
    assert "2 of 4 picks are the learning_rate grid's lowest or highest value" in \
        format_picks(picks, over="learning_rate", metric="final_val_loss")


def test_compare_best_over_prints_the_picks_and_writes_them(tmp_path, capsys):
    path = tmp_path / "results.csv"
    _rate_grid(np.random.default_rng(9), {"cosine": (4e-3, 2.0), "wsd": (2e-3, 1.95)}
               ).to_csv(path, index=False)
    out = tmp_path / "compare.json"
    assert compare_main([f"--sweep={path}", "--by=schedule", "--baseline=cosine",
                         "--pair=seed", "--best-over=learning_rate", f"--json={out}"]) == 0
    text = capsys.readouterr().out
    assert text.index("each arm at its best learning_rate") < text.index("minus 'cosine'")
    payload = json.loads(out.read_text())
    assert payload["best_over"] == "learning_rate" and len(payload["picks"]) == 4
    assert compare_main([f"--sweep={path}", "--by=schedule", "--baseline=cosine",
                         "--best-over=params"]) == 2
    assert "--best-over=params: params is also --by or --match" in capsys.readouterr().err


def test_a_comparison_that_pools_the_rates_says_so(tmp_path, capsys):
    """Without --best-over an arm's runs at four rates are compared as its seeds: one note
    names the column and the flags; with it, or with the rate matched, no note."""
    path = tmp_path / "results.csv"
    _rate_grid(np.random.default_rng(10), {"cosine": (4e-3, 2.0), "wsd": (2e-3, 1.95)}).rename(
        columns={"learning_rate": "train.learning_rate"}).to_csv(path, index=False)
    flags = [f"--sweep={path}", "--by=schedule", "--baseline=cosine"]
    assert compare_main(flags) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert notes == ["note: an arm's runs at one point differ in train.learning_rate: compared "
                     "as its seeds; --best-over=train.learning_rate takes each point's best, "
                     "--match=params,tokens,train.learning_rate compares each value alone"]
    for more in ("--best-over=train.learning_rate", "--match=params,tokens,train.learning_rate"):
        assert compare_main(flags + [more, "--pair=seed"]) == 0
        assert "compared as its seeds" not in capsys.readouterr().out


def test_best_over_with_no_finished_value_anywhere_is_one_error(tmp_path, capsys):
    df = _rate_grid(np.random.default_rng(10), {"cosine": (4e-3, 2.0), "wsd": (2e-3, 1.95)})
    df.loc[df.seed == 0, ["status", "final_val_loss"]] = ["diverged", np.nan]
    path = tmp_path / "results.csv"
    df.to_csv(path, index=False)
    assert compare_main([f"--sweep={path}", "--by=schedule", "--baseline=cosine",
                         "--best-over=learning_rate"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "--best-over=learning_rate: no point has a value of learning_rate whose runs all " \
        "finished" in err


def test_a_pick_the_seeds_single_out_is_stable_and_a_tie_is_not():
    """stability: the share of seed resamples that keep the pick. Rates far apart against the
    seed noise: 1; two rates with the same expected loss: about a half; one seed: NaN."""
    firm = _rate_grid(np.random.default_rng(11), {"cosine": (4e-3, 2.0)}, noise=1e-4)
    _, picks = at_best(firm, by="schedule", match=("params", "tokens"),
                       metric="final_val_loss", over="learning_rate")
    assert (picks["stability"] == 1.0).all()
    assert "hold the picks fixed" not in format_picks(picks, over="learning_rate",
                                                      metric="final_val_loss")
    # Optimum halfway between 2e-3 and 4e-3 in log: the two tie, and the seeds pick either.
    tied = _rate_grid(np.random.default_rng(12), {"cosine": (2.8284271e-3, 2.0)}, seeds=5,
                      noise=0.01)
    _, picks = at_best(tied, by="schedule", match=("params", "tokens"),
                       metric="final_val_loss", over="learning_rate")
    assert ((picks["stability"] > 0.2) & (picks["stability"] < 0.9)).all()
    assert f"{len(picks)} of {len(picks)} picks have stability under 0.9" in format_picks(
        picks, over="learning_rate", metric="final_val_loss")
    one = _rate_grid(np.random.default_rng(13), {"cosine": (4e-3, 2.0)}, seeds=1)
    _, picks = at_best(one, by="schedule", match=("params", "tokens"),
                       metric="final_val_loss", over="learning_rate")
    assert picks["stability"].isna().all()
    text = format_picks(picks, over="learning_rate", metric="final_val_loss")
    assert "stability: the share of 1000 resamples" in text
    assert f"0 of {len(picks)} picks have stability under 0.9, and {len(picks)} cannot say " \
        "(one seed per value)" in text


def test_a_seed_shared_by_every_rate_is_resampled_whole():
    """Each seed ran at every rate with the same initialisation and data order, so its offset is
    common to its runs: resampled whole (pair), it cancels and the pick is firm; resampled
    within each rate, it does not, and the same pick looks soft."""
    df = _rate_grid(np.random.default_rng(14), {"cosine": (3.4e-3, 2.0)}, seeds=4, noise=1e-4)
    df["final_val_loss"] += df["seed"].map(dict(enumerate(0.2 * np.random.default_rng(15)
                                                          .standard_normal(4))))
    args = dict(by="schedule", match=("params", "tokens"), metric="final_val_loss",
                over="learning_rate")
    _, paired = at_best(df, pair="seed", **args)
    _, alone = at_best(df, **args)
    assert (paired["learning_rate"] == 4e-3).all() and (paired["stability"] == 1.0).all()
    assert (alone["stability"] < 0.9).all()


def test_a_heldout_pick_is_what_the_other_seeds_pick():
    """Per seed, the value the arm's other seeds' mean is lowest at, and the seed's own run
    there: written out by hand on one arm and point."""
    from attnlab.scaling.tables.picks import heldout_picks

    loss = {(0, 1.0): 2.0, (0, 2.0): 1.5, (1, 1.0): 2.0, (1, 2.0): 2.6,
            (2, 1.0): 2.0, (2, 2.0): 1.8}
    df = pd.DataFrame([dict(schedule="wsd", params=1, tokens=1, seed=s, lr=lr, status="completed",
                            loss=v) for (s, lr), v in loss.items()])
    rows, notes = heldout_picks(df, by="schedule", match=("params", "tokens"), metric="loss",
                                over="lr", pair="seed")
    # leave 0 out: seeds 1, 2 average 2.0 at lr 1, 2.2 at lr 2 -> lr 1, seed 0 scores 2.0;
    # leave 1 out: 2.0 against 1.65 -> lr 2, seed 1 scores 2.6; leave 2 out: 2.0 against
    # 2.05 -> lr 1, seed 2 scores 2.0.
    assert rows.set_index("seed")["lr"].to_dict() == {0: 1.0, 1: 2.0, 2: 1.0}
    assert rows.set_index("seed")["loss"].to_dict() == {0: 2.0, 1: 2.6, 2: 2.0}
    assert notes == []
    df.loc[(df.seed == 1) & (df.lr == 2.0), ["status", "loss"]] = ["diverged", np.nan]
    rows, notes = heldout_picks(df, by="schedule", match=("params", "tokens"), metric="loss",
                                over="lr", pair="seed")
    assert rows.empty and "did not finish; the point is left out" in notes[0]


def test_heldout_picks_remove_the_winners_curse():
    """Every rate has the same expected loss as the baseline's one rate: picking the best of 4
    from the seeds that are then scored makes the tuned arm look better by a selection bias;
    scoring each seed at the others' pick does not. Over 200 points, the fixed picks' mean
    difference sits far below 0 and the held-out one within its standard error of 0."""
    from attnlab.scaling.tables.compare import heldout_differences

    rng = np.random.default_rng(16)
    rows = []
    for point in range(200):
        rows += [dict(arm="rule", params=point, tokens=1, seed=s, lr=1.0, status="completed",
                      loss=2.0 + 0.01 * rng.standard_normal()) for s in range(3)]
        rows += [dict(arm="tuned", params=point, tokens=1, seed=s, lr=lr, status="completed",
                      loss=2.0 + 0.01 * rng.standard_normal())
                 for s in range(3) for lr in (0.5, 1.0, 2.0, 4.0)]
    df = pd.DataFrame(rows)
    args = dict(by="arm", match=("params", "tokens"), metric="loss", over="lr", pair="seed")
    kept, _ = at_best(df, **args)
    fixed = paired_differences(kept, by="arm", baseline="rule", match=args["match"],
                               metric="loss", pair="seed").iloc[-1]
    held, notes = heldout_differences(df, baseline="rule", level=0.95, **args)
    pooled = held.iloc[-1]
    assert pooled["params"] == POOLED and notes == []
    # the best of 4 means of 3 seeds: E[min of 4 normals] = -1.029 sd, sd 0.01 / sqrt(3)
    assert fixed["lo"] < -1.029 * 0.01 / np.sqrt(3) < fixed["hi"] < -0.003
    half = (pooled["hi"] - pooled["lo"]) / 2
    assert abs(pooled["diff"]) < half and half < 0.004
    points = held[held["params"] != POOLED]  # independent points: their intervals' coverage
    assert 0.91 <= np.mean((points["lo"] <= 0) & (0 <= points["hi"])) <= 0.99


def test_the_heldout_intervals_widen_by_the_dependence_of_their_picks():
    """A seed's held-out pick is made by the others, so its difference depends on theirs: by
    simulation, ~1.2x the independent sd with 3 seeds and 4 rates (~1.45x when both arms pick),
    and none without a choice (one rate each) or without a second seed."""
    from attnlab.scaling.tables.compare import heldout_inflation

    rng = np.random.default_rng(0)
    one_picks = heldout_inflation(3, 4, 1, rng=rng)
    both_pick = heldout_inflation(3, 4, 4, rng=rng)
    assert 1.12 < one_picks < 1.3 and one_picks + 0.1 < both_pick < 1.6
    assert abs(heldout_inflation(3, 1, 1, rng=rng) - 1.0) < 0.05
    assert heldout_inflation(1, 4, 4, rng=rng) == 1.0


def test_compare_best_over_pair_reports_the_heldout_differences(tmp_path, capsys):
    path, out = tmp_path / "results.csv", tmp_path / "compare.json"
    _rate_grid(np.random.default_rng(9), {"cosine": (4e-3, 2.0), "wsd": (2e-3, 1.95)}
               ).to_csv(path, index=False)
    assert compare_main([f"--sweep={path}", "--by=schedule", "--baseline=cosine", "--pair=seed",
                         "--best-over=learning_rate", f"--json={out}"]) == 0
    text = capsys.readouterr().out
    assert text.index("minus 'cosine'") < text.index("leave one seed out")
    payload = json.loads(out.read_text())
    held = pd.DataFrame(payload["heldout_rows"])
    assert set(held["arm"]) == {"wsd"} and (held["params"] == POOLED).sum() == 1
    one = pd.read_csv(path).query("seed == 0")
    one.to_csv(path, index=False)
    assert compare_main([f"--sweep={path}", "--by=schedule", "--baseline=cosine", "--pair=seed",
                         "--best-over=learning_rate"]) == 0
    assert "nothing to hold out" in capsys.readouterr().out


def test_runs_read_twice_count_once_and_runs_without_a_loss_are_named(tmp_path, capsys):
    """A run in two tables (or a row repeated) is one run, said in a note; its completed copy
    wins over a failed one; copies with different losses are refused; a diverged run is
    named, and a loss that is not a number in a completed run is refused."""
    frame = pd.DataFrame({"run_id": [f"r{i}" for i in range(8)],
                          "arm": ["a", "b"] * 4, "params": 1e4, "tokens": 1e6,
                          "train.seed": [0, 0, 1, 1, 2, 2, 3, 3],
                          "final_val_loss": [2.0, 1.9, 2.1, 2.0, 2.05, 1.95, 2.0, 1.92],
                          "status": "completed"})
    frame.to_csv(tmp_path / "all.csv", index=False)
    failed = frame.assign(status=lambda f: np.where(f["run_id"] == "r1", "failed", "completed"))
    failed.to_csv(tmp_path / "failed.csv", index=False)
    args = ["--by=arm", "--baseline=a", "--pair=train.seed"]
    assert compare_main([f"--sweep={tmp_path / 'all.csv'}"] + args) == 0
    once = capsys.readouterr().out
    assert compare_main([f"--sweep={tmp_path / 'failed.csv'},{tmp_path / 'all.csv'}"]
                        + args) == 0
    twice = capsys.readouterr().out
    assert "note: 8 row(s) repeat a run_id already read" in twice
    assert twice.replace(twice[twice.index("note: 8 row(s)"):].split("\n")[0] + "\n", "") == once
    frame.assign(final_val_loss=frame["final_val_loss"] + 0.1).to_csv(tmp_path / "other.csv",
                                                                      index=False)
    assert compare_main([f"--sweep={tmp_path / 'all.csv'},{tmp_path / 'other.csv'}"]
                        + args) == 2
    assert "run r0 appears more than once with different final_val_loss" in \
        capsys.readouterr().err
    failed.assign(status=lambda f: f["status"].replace("failed", "diverged")).to_csv(
        tmp_path / "diverged.csv", index=False)
    assert compare_main([f"--sweep={tmp_path / 'diverged.csv'}"] + args) == 0
    assert "dropped 1 of 8 rows whose status is not 'completed' (diverged: 1)" in \
        capsys.readouterr().out
    frame.astype({"final_val_loss": object}).assign(
        final_val_loss=lambda f: f["final_val_loss"].where(f.index != 2, "oops")).to_csv(
        tmp_path / "text.csv", index=False)
    assert compare_main([f"--sweep={tmp_path / 'text.csv'}"] + args) == 2
    assert "is not a finite number in 1 completed run(s) (row 2: 'oops')" in \
        capsys.readouterr().err


def test_holm_adjusts_as_the_step_down_formula_says():
    from attnlab.scaling.tables.compare import holm
    # Sorted 0.005, 0.01, 0.03, 0.04 -> 4(0.005), 3(0.01), max(prev, 2(0.03)), max(prev, 0.04).
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    assert holm([0.6, 0.9])[1] == 1.0 and np.isnan(holm([np.nan, 0.01])[0])
    assert holm([np.nan, 0.01])[1] == pytest.approx(0.01)  # a NaN is not a comparison


def _arms(rng, shifts, seeds=3):
    rows = [dict(run_id=f"{arm}-{p}-{s}", status="completed", arm=arm, params=p, tokens=1e6,
                 seed=s, final_val_loss=2.0 + shift + 0.01 * rng.standard_normal())
            for arm, shift in shifts.items() for p in (1000, 2000) for s in range(seeds)]
    return pd.DataFrame(rows)


def test_several_arms_are_one_family_with_joint_coverage():
    """Five arms equal to the baseline, 300 draws: uncorrected 95% pooled intervals miss some
    arm in ~1 - 0.95^5 = 23% of draws; the Bonferroni family intervals miss in <= 5%, and Holm
    calls some arm different in <= 5%."""
    shifts = {"base": 0.0, **{f"arm{i}": 0.0 for i in range(5)}}
    miss_plain = miss_family = called = 0
    for draw in range(300):
        frame = paired_differences(_arms(np.random.default_rng(draw), shifts), by="arm",
                                   baseline="base")
        pooled = frame[frame["params"] == POOLED]
        miss_plain += bool(((pooled.lo > 0) | (pooled.hi < 0)).any())
        miss_family += bool(((pooled.lo_family > 0) | (pooled.hi_family < 0)).any())
        called += bool((pooled.p_holm < 0.05).any())
        assert frame.loc[frame["params"] != POOLED, "p_holm"].isna().all()
    assert 0.12 < miss_plain / 300 < 0.35
    assert miss_family / 300 <= 0.07 and called / 300 <= 0.07
    # A real difference is still found: one arm 3% lower.
    frame = paired_differences(_arms(np.random.default_rng(0), shifts | {"arm0": -0.06}),
                               by="arm", baseline="base")
    row = frame[(frame["params"] == POOLED) & (frame.arm == "arm0")].iloc[0]
    assert row.p_holm < 0.01 and row.hi_family < 0


def test_the_report_says_the_pooled_rows_are_one_family(capsys, tmp_path):
    path = tmp_path / "arms.csv"
    _arms(np.random.default_rng(1), {"base": 0.0, "a": 0.0, "b": -0.02}).to_csv(path)
    assert compare_main([f"--sweep={path}", "--by=arm", "--baseline=base"]) == 0
    out = capsys.readouterr().out
    assert "the 2 'all' rows are one family of claims: p_holm is Holm's adjusted p-value" in out
    assert "p_holm" in out.splitlines()[1]
