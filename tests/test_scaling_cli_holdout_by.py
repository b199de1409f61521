"""``attnlab fit --holdout / --by / --profile`` and ``attnlab plot --kind=holdout|frontiers``:
the reports, JSON and figures, and one clear error (exit 2) for each bad input."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from attnlab import cli_flags
from attnlab.plots.cli import plot_flags, plot_main
from attnlab.plots.figures import FIGURES
from attnlab.scaling.cli import fit_main
from attnlab.scaling.request import FitRequest
from attnlab.scaling.synthetic import CHINCHILLA_PUBLISHED, isoflop_points

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized

SMALL_GRID = "--grid=a:0:20:10,b:0:20:10,e:-1:1:1,alpha:0:2:1,beta:0:2:1"  # 243 starts
OTHER = {"E": 1.8, "A": 500.0, "B": 300.0, "alpha": 0.30, "beta": 0.36}


@pytest.fixture(scope="module")
def sweep_csv(tmp_path_factory):
    """Two encodings, each an IsoFLOP suite of 4 budgets x 7 sizes, in one results table."""
    frames = []
    for name, law in (("rope", CHINCHILLA_PUBLISHED), ("alibi", OTHER)):
        frame = isoflop_points(law, np.geomspace(1e18, 1e21, 4), sizes_per_budget=7,
                               noise=0.003, rng=np.random.default_rng(len(name)))
        frame["model.pos_encoding"] = name
        frames.append(frame)
    path = tmp_path_factory.mktemp("by") / "results.csv"
    pd.concat(frames, ignore_index=True).to_csv(path, index=False)
    return path


def _rope_only(sweep_csv, tmp_path):
    frame = pd.read_csv(sweep_csv)
    path = tmp_path / "rope.csv"
    frame[frame["model.pos_encoding"] == "rope"].to_csv(path, index=False)
    return path


def test_fit_holdout_reports_the_error_on_the_largest_budget(sweep_csv, tmp_path, capsys):
    out = tmp_path / "holdout.json"
    rc = fit_main([f"--sweep={_rope_only(sweep_csv, tmp_path)}", "--law=chinchilla",
                   "--holdout=largest-budget", "--bootstrap=20", SMALL_GRID, f"--json={out}"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "fitted on 21 runs, predicting 7" in captured.out
    saved = json.loads(out.read_text())
    assert saved["held_out_runs"] == 7 and saved["kept_runs"] == 21
    assert saved["mean_abs_relative_error"] < 0.02
    assert len(saved["runs"]) == 7 and saved["fit"]["n_points"] == 21


def test_fit_by_fits_each_group_side_by_side(sweep_csv, tmp_path, capsys):
    out = tmp_path / "by.json"
    rc = fit_main([f"--sweep={sweep_csv}", "--law=chinchilla", "--approach=2",
                   "--by=model.pos_encoding", "--bootstrap=30", f"--json={out}",
                   "--budget=1e22"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "one fit per model.pos_encoding" in captured.out
    saved = json.loads(out.read_text())
    assert set(saved["groups"]) == {"alibi", "rope"}
    assert saved["groups"]["rope"]["a"] == pytest.approx(0.28 / 0.62, abs=0.04)
    assert saved["groups"]["alibi"]["a"] == pytest.approx(0.36 / 0.66, abs=0.04)


def test_fit_profile_whole_is_selectable(sweep_csv, tmp_path, capsys):
    rc = fit_main([f"--sweep={_rope_only(sweep_csv, tmp_path)}", "--law=chinchilla",
                   "--approach=2", "--profile=whole", "--bootstrap=0"])
    assert rc == 0
    assert "a parabola over each budget's whole ladder" in capsys.readouterr().out


@pytest.mark.parametrize("kind, extra", [("holdout", ["--holdout=largest-budget"]),
                                         ("frontiers", ["--by=model.pos_encoding"])])
def test_plot_holdout_and_frontiers(kind, extra, sweep_csv, tmp_path, capsys):
    out = tmp_path / f"{kind}.png"
    results = sweep_csv if kind == "frontiers" else _rope_only(sweep_csv, tmp_path)
    rc = plot_main([f"--sweep={results}", f"--kind={kind}", f"--plot={out}", "--bootstrap=5",
                    SMALL_GRID, *extra])
    assert rc == 0, capsys.readouterr().err
    assert out.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("argv, message", [
    (["--holdout=flops>=1e18", "--law=chinchilla"], "keeps 0 of 28 runs, fewer than the 5"),
    (["--holdout=everything", "--law=chinchilla"], "--holdout: 'everything' is not one of"),
    (["--holdout=largest-budget", "--law=chinchilla", "--approach=2"],
     "approach 2 models no loss"),
    (["--by=model.mixer", "--law=chinchilla"], "--by: .* has no column 'model.mixer'"),
    (["--by=model.pos_encoding", "--holdout=largest-budget", "--law=chinchilla"],
     "--by and --holdout"),
    (["--law=chinchilla", "--approach=2", "--profile=cubic"], "--profile"),
    (["--law=chinchilla", "--form=n"], "--form does not apply to --law=chinchilla --approach=3"),
    (["--law=kaplan", "--approach=3"], "--approach does not apply to --law=kaplan --form=nd"),
    (["--law=chinchilla", "--approach=3", "--profile=whole"],
     "--profile does not apply to --law=chinchilla --approach=3"),
])
def test_bad_holdout_and_by_input_is_one_line_exit_2(argv, message, sweep_csv, tmp_path,
                                                     capsys):
    results = sweep_csv if "--by" in " ".join(argv) else _rope_only(sweep_csv, tmp_path)
    # Approach 2 and Kaplan's laws refuse --grid.
    grid = [] if {"--approach=2", "--law=kaplan"} & set(argv) else [SMALL_GRID]
    rc = fit_main([f"--sweep={results}", "--bootstrap=0", *grid, *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert re.search(message, err), err


def test_plot_kinds_need_their_flags(sweep_csv, tmp_path, capsys):
    for kind, message in (("holdout", "--kind=holdout needs --holdout"),
                          ("frontiers", "--kind=frontiers needs --by")):
        rc = plot_main([f"--sweep={sweep_csv}", f"--kind={kind}",
                        f"--plot={tmp_path / 'x.png'}"])
        assert rc == 2 and message in capsys.readouterr().err


def _figure(argv):
    values = cli_flags.parse(argv, plot_flags(), prog="attnlab plot", takes_config=False)
    figure = FIGURES[values["kind"].value]()
    return figure.draw(FitRequest.from_flags(values, law=figure.law(values)))


def _drawn(figure) -> list:
    """Each axes' title, lines and scattered points."""
    return [(ax.get_title(), [line.get_xydata() for line in ax.get_lines()],
             [np.asarray(c.get_offsets()) for c in ax.collections
              if len(np.asarray(c.get_offsets()))]) for ax in figure.get_axes()]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(
        ta == tb and len(la) == len(lb) and len(pa) == len(pb)
        and all(x.shape == y.shape and np.allclose(x, y, rtol=1e-6, equal_nan=True)
                for x, y in zip(la + pa, lb + pb))
        for (ta, la, pa), (tb, lb, pb) in zip(a, b))


@pytest.mark.parametrize("kind", ["isoflop", "allocation", "contours", "loss-vs-params",
                                  "loss-vs-compute"])
def test_plot_by_draws_each_group_as_it_draws_that_group_alone(kind, sweep_csv, tmp_path):
    """--by: one row per group, titled by it, whose axes are the figure of that group's rows
    drawn without --by: the same points, the same fitted lines."""
    law = "--law=kaplan" if kind == "loss-vs-params" else "--law=chinchilla"
    args = [f"--kind={kind}", "--plot=x.png", law,
            *([SMALL_GRID] if kind in ("allocation", "contours") else [])]
    grouped = _figure([f"--sweep={sweep_csv}", "--by=model.pos_encoding", *args])
    rows = grouped.subfigs
    assert [row._suptitle.get_text() for row in rows] == ["model.pos_encoding = alibi",
                                                          "model.pos_encoding = rope"]
    alone = _figure([f"--sweep={_rope_only(sweep_csv, tmp_path)}", *args])
    assert _same(_drawn(rows[1]), _drawn(alone)) and not _same(_drawn(rows[0]), _drawn(alone))
    assert any(lines or points for _, lines, points in _drawn(alone))
    out = tmp_path / f"{kind}.png"
    assert plot_main([f"--sweep={sweep_csv}", "--by=model.pos_encoding", *args[:1],
                      f"--plot={out}", *args[2:]]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("argv, message", [
    (["--kind=holdout", "--holdout=largest-budget", "--by=model.pos_encoding"],
     "--by and --holdout"),
    (["--kind=isoflop", "--holdout=largest-budget"],
     "--holdout draws --kind=holdout; --kind=isoflop would ignore it"),
    (["--kind=frontiers", "--holdout=largest-budget", "--by=model.pos_encoding"],
     "--kind=frontiers would ignore it"),
    (["--kind=isoflop", SMALL_GRID], "--grid does not apply to --law=chinchilla --approach=2"),
    (["--kind=contours", "--window=1"], "--window does not apply to --law=chinchilla --approach=3"),
    # A figure of one law refuses another's name rather than draw its own under it.
    (["--kind=isoflop", "--approach=3"],
     "--kind=isoflop draws Chinchilla approach 2, not Chinchilla approach 3"),
    (["--kind=contours", "--law=kaplan"],
     "--kind=contours draws Chinchilla approach 3, not Kaplan L(N, D)"),
    (["--kind=isoflop", "--law=overtrain"], "--kind=isoflop draws Chinchilla approach 2, not"),
    (["--kind=loss-vs-compute", "--approach=2"],
     "--kind=loss-vs-compute fits nothing without --curves"),
    # What `fit` refuses for a law, `plot` refuses too.
    (["--kind=allocation", "--law=overtrain", "--by=model.pos_encoding"],
     "--by does not apply to --law=overtrain"),
])
def test_a_plot_flag_the_kind_would_ignore_is_one_error(argv, message, sweep_csv, tmp_path,
                                                        capsys):
    assert plot_main([f"--sweep={sweep_csv}", f"--plot={tmp_path / 'x.png'}", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--kind=isoflop", "--law=chinchilla"],
                                  ["--kind=isoflop", "--approach=2"],
                                  ["--kind=contours", "--law=chinchilla", "--approach=3"]])
def test_a_plot_takes_the_name_of_the_law_it_draws(argv, sweep_csv, tmp_path):
    """--law=chinchilla alone names the figure's own approach (what is not given is the
    figure's)."""
    out = tmp_path / "x.png"
    assert plot_main([f"--sweep={sweep_csv}", f"--plot={out}", *argv]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_every_predicted_loss_has_its_naive_baseline(sweep_csv, tmp_path, capsys):
    """--by and --holdout with --budget: each predicted compute-optimal loss has the best run
    that spent at most that compute beside it, in the report and the JSON; a budget below every
    run says that nothing sets the law against it."""
    frame = pd.read_csv(sweep_csv)
    out = tmp_path / "by.json"
    rc = fit_main([f"--sweep={sweep_csv}", "--law=chinchilla", "--by=model.pos_encoding",
                   "--bootstrap=0", SMALL_GRID, f"--json={out}", "--budget=2e21,1e17"])
    text = capsys.readouterr().out
    assert rc == 0
    for group, rows in frame.groupby("model.pos_encoding"):
        prediction = json.loads(out.read_text())["groups"][group]["predictions"][0]
        assert prediction["baseline"]["loss"] == pytest.approx(rows["loss"].min())
    assert re.search(r"naive@2e\+21 +[\d.]+ +[\d.]+", text)
    assert re.search(r"naive@1e\+17 +- +-", text)
    out = tmp_path / "holdout.json"
    rope = _rope_only(sweep_csv, tmp_path)
    rc = fit_main([f"--sweep={rope}", "--law=chinchilla", "--holdout=largest-budget",
                   "--bootstrap=0", SMALL_GRID, f"--json={out}", "--budget=5e20,1e17"])
    text = capsys.readouterr().out
    assert rc == 0
    kept = pd.read_csv(rope).query("budget < 1e21")
    [at, below] = json.loads(out.read_text())["predictions"]
    assert at["baseline"]["loss"] == pytest.approx(kept["loss"].min()) and below["baseline"] is None
    assert "no run spent at most 1e+17 FLOPs" in text
