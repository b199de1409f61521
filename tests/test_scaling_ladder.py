"""Approach 2 on a ladder: IsoFLOP slices interpolated along each size's branches, against a
Chinchilla law written out in float64 (Hoffmann et al. 2022, eq. 2 and its fitted values), and
the exponent a = beta / (alpha + beta) it implies (their eq. 4)."""

import numpy as np
import pandas as pd
import pytest

from attnlab.scaling.errors import FitInputError
from attnlab.scaling.laws.approach2 import fit_approach2
from attnlab.scaling.laws.registry import law_named
from attnlab.scaling.tables.ladder import isoflop_slices
from attnlab.scaling.tables.prepare import prepare_points

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized

E, A, B, ALPHA, BETA = 1.69, 406.4, 410.7, 0.34, 0.28  # Hoffmann et al. 2022, eq. 10


def law(n, d):
    return E + A / n**ALPHA + B / d**BETA


def ladder_table(sizes, tokens_per_param):
    """A ladder's results table: per size a trunk row and one branch per D = ratio x N."""
    rows = []
    for n in sizes:
        rows.append({"run_id": f"trunk{n:g}", "status": "completed", "role": "trunk",
                     "params": n, "tokens": 160 * n, "flops": 6 * n * 160 * n,
                     "final_val_loss": 9.0})  # a trunk's loss is no point: it must be dropped
        for r in tokens_per_param:
            d = r * n
            rows.append({"run_id": f"b{n:g}-{r}", "status": "completed", "role": "branch",
                         "params": n, "tokens": d, "flops": 6 * n * d,
                         "final_val_loss": law(n, d)})
    return pd.DataFrame(rows)


def test_slices_interpolate_each_size_between_its_branches():
    # Neighbours 1.58x apart: three sizes share a slice of a 32x ladder (at most 32^(1/4)).
    sizes = np.geomspace(1e5, 1e8, 16)
    table = prepare_points(ladder_table(sizes, (5, 10, 20, 40, 80, 160)),
                           law=law_named("chinchilla"))
    assert len(table) == 16 * 6  # trunks dropped
    sliced = isoflop_slices(table).frame
    for _, p in sliced.iterrows():
        assert p["flops"] == pytest.approx(6 * p["params"] * p["tokens"])
        ratio = p["tokens"] / p["params"]
        assert 5 * (1 - 1e-9) <= ratio <= 160 * (1 + 1e-9)  # never extrapolated
        # L is convex in x = log D (B e^(-beta x)), so the chord between branches a factor 2
        # apart lies above it, by at most h^2/8 max|L''| = (ln 2)^2 / 8 beta^2 B / D_lo^beta.
        true = law(p["params"], p["tokens"])
        bound = np.log(2) ** 2 / 8 * BETA**2 * B / (p["tokens"] / 2) ** BETA
        assert true - 1e-12 <= p["loss"] <= true + bound
    assert (sliced.groupby("budget").size() >= 3).all()


def test_approach2_on_ladder_slices_recovers_the_allocation_exponent():
    sizes = np.geomspace(1e5, 1e8, 16)
    sliced = isoflop_slices(prepare_points(ladder_table(sizes, (5, 10, 20, 40, 80, 160)),
                                           law=law_named("chinchilla")))
    f = sliced.frame
    fit = fit_approach2(f["params"], f["tokens"], f["loss"], f["flops"], budget=f["budget"])
    a = BETA / (ALPHA + BETA)
    assert fit.params["a"] == pytest.approx(a, abs=0.03)
    assert fit.params["b"] == pytest.approx(1 - a, abs=0.03)


def test_sizes_whose_branches_do_not_overlap_are_an_error():
    table = prepare_points(ladder_table(np.geomspace(1e5, 1e8, 7), (5, 10, 20, 40, 80, 160)),
                           law=law_named("chinchilla"))  # 3.2x apart: no three sizes share a slice
    with pytest.raises(FitInputError, match="IsoFLOP slices"):
        isoflop_slices(table)


def test_attnlab_fit_slices_a_ladder_table_for_approach_2(tmp_path, capsys):
    from attnlab import cli

    path = tmp_path / "ladder.csv"
    ladder_table(np.geomspace(1e5, 1e8, 16), (5, 10, 20, 40, 80, 160)).to_csv(path, index=False)
    code = cli.main(["fit", f"--sweep={path}", "--law=chinchilla", "--approach=2",
                     "--bootstrap=0"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "IsoFLOP slices" in out and "ladder trunk" in out


# -- over-training: fit approach 3 on a ladder, predict past the compute-optimal token count ------

def chinchilla_optimum(c):
    """Hoffmann et al. 2022 eq. 4 in float64: N_opt = G (C/6)^a, D_opt = G^-1 (C/6)^b."""
    a, b = BETA / (ALPHA + BETA), ALPHA / (ALPHA + BETA)
    g = (ALPHA * A / (BETA * B)) ** (1 / (ALPHA + BETA))
    return g * (c / 6) ** a, (c / 6) ** b / g


def test_trained_longer_prediction_matches_the_law(tmp_path, capsys):
    from attnlab import cli

    path = tmp_path / "ladder.csv"
    ladder_table(np.geomspace(1e5, 1e8, 8), (5, 10, 20, 40, 80, 160)).to_csv(path, index=False)
    out_json = tmp_path / "fit.json"
    code = cli.main(["fit", f"--sweep={path}", "--law=chinchilla", "--approach=3",
                     "--bootstrap=0", "--budget=1e18", "--train-longer=10,100",
                     f"--json={out_json}"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "trained longer" in out
    import json
    rows = json.loads(out_json.read_text())["trained_longer"]
    n_opt, d_opt = chinchilla_optimum(1e18)
    for row, m in zip(rows, (10, 100)):
        assert row["N"] == pytest.approx(n_opt, rel=0.02)
        assert row["D"] == pytest.approx(m * d_opt, rel=0.02)
        want = law(row["N"], row["D"])
        assert row["loss"] == pytest.approx(want, rel=1e-3)
        assert row["change"] == pytest.approx(want - law(row["N"], row["D"] / m), abs=1e-3)
        assert row["change"] < 0  # more tokens at fixed N: the D term falls...
    # ... by less than the compute spent buys at the optimum: the 10x budget's optimum is lower.
    n10, d10 = chinchilla_optimum(1e19)
    assert law(n10, d10) < rows[0]["loss"]


def test_held_out_overtrained_branches_are_predicted(tmp_path, capsys):
    """Fit on branches up to 40 tokens per parameter, predict those at 80 and 160: exact law
    points, so the predictions are the law's (a check of the held-out path, not of noise)."""
    from attnlab import cli

    path = tmp_path / "ladder.csv"
    ladder_table(np.geomspace(1e5, 1e8, 8), (5, 10, 20, 40, 80, 160)).to_csv(path, index=False)
    code = cli.main(["fit", f"--sweep={path}", "--law=chinchilla", "--approach=3",
                     "--bootstrap=0", "--holdout=tokens_per_param>60"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "predicting 16" in out and "mean |error| 0.00%, max 0.00%" in out


def test_curves_of_a_ladder_keep_each_branch_s_last_step_and_no_trunk():
    """Approach 1's envelope on a ladder: a cooldown's earlier steps end no schedule, and a
    trunk's steps are at a constant learning rate, so only the branches' final points count."""
    from attnlab.scaling.tables.prepare import prepare_curves

    rows = []
    for step in range(1, 9):  # the trunk: steps 1..8
        rows.append({"run_id": "trunk", "role": "trunk", "status": "completed", "params": 1e5,
                     "step": step, "tokens": 100 * step, "loss": 5.0 - 0.1 * step})
    for run, (start, end) in {"b6": (5, 6), "b10": (8, 10)}.items():
        for step in range(start + 1, end + 1):
            rows.append({"run_id": run, "role": "branch", "status": "completed",
                         "params": 1e5, "step": step, "tokens": 100 * step,
                         "loss": 4.0 - 0.1 * step})
    table = prepare_curves(pd.DataFrame(rows), law=law_named("chinchilla"))
    kept = table.frame.sort_values("step")
    assert list(kept["run_id"]) == ["b6", "b10"] and list(kept["step"]) == [6, 10]
    assert any("trunk" in note for note in table.notes)


def test_grouped_fits_slice_each_group_s_ladder_for_approach_2():
    from attnlab.scaling.tables.grouped import fit_by

    sizes = np.geomspace(1e5, 1e8, 16)
    frames = [ladder_table(sizes, (5, 10, 20, 40, 80, 160)).assign(arm=name)
              for name in ("x", "y")]
    grouped = fit_by(pd.concat(frames, ignore_index=True), "arm", law=law_named("chinchilla", 2),
                     n_bootstrap=0)
    a = BETA / (ALPHA + BETA)
    assert set(grouped.fits) == {"x", "y"}
    for fit in grouped.fits.values():
        assert fit.params["a"] == pytest.approx(a, abs=0.03)


@pytest.mark.slow  # approach 3's 4,500-start grid
def test_the_quickstart_fits_approach_2_on_a_ladder_sweep(tmp_path):
    from attnlab.study.quickstart import fit_study

    ladder_table(np.geomspace(1e5, 1e8, 16), (5, 10, 20, 40, 80, 160)).to_csv(
        tmp_path / "results.csv", index=False)
    _, fit3, fit2, messages = fit_study(tmp_path / "results.csv", n_bootstrap=0)
    assert fit2 is not None, messages
    assert fit2.params["a"] == pytest.approx(BETA / (ALPHA + BETA), abs=0.03)
    assert fit3 is not None and fit3.params["alpha"] == pytest.approx(ALPHA, abs=0.02)
