"""``attnlab fit`` / ``attnlab plot``: reports, JSON, sweep tables, column mapping, figures, and
one clear error (exit code 2, no traceback) for each kind of bad input."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnlab.cli import main as attnlab_main
from attnlab.plots.cli import plot_main
from attnlab.scaling.cli import fit_main
from attnlab.scaling.synthetic import (CHINCHILLA_PUBLISHED, KAPLAN_PUBLISHED, grid_points,
                                       isoflop_points, learning_curves)

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized

SMALL_GRID = "--grid=a:0:20:10,b:0:20:10,e:-1:1:1,alpha:0:2:1,beta:0:2:1"  # 243 starts


@pytest.fixture(scope="module")
def chinchilla_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("fit") / "results.csv"
    grid_points(CHINCHILLA_PUBLISHED, n_points=250, noise=0.01,
                rng=np.random.default_rng(0)).to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def isoflop_csv(tmp_path_factory):
    """Renamed columns, as a spreadsheet might have them."""
    path = tmp_path_factory.mktemp("iso") / "isoflop.csv"
    frame = isoflop_points(CHINCHILLA_PUBLISHED, np.geomspace(1e18, 1e21, 5),
                           rng=np.random.default_rng(1))
    frame.rename(columns={"params": "Model Size", "tokens": "Tokens", "loss": "Loss",
                          "budget": "Budget"}).drop(columns="flops").to_csv(path, index=False)
    return path


def test_fit_chinchilla_approach3_report_and_json(chinchilla_csv, tmp_path, capsys):
    out = tmp_path / "fit.json"
    rc = fit_main([f"--sweep={chinchilla_csv}", "--law=chinchilla", "--approach=3",
                   "--bootstrap=20", "--budget=1e21", f"--json={out}", SMALL_GRID])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "Chinchilla approach 3" in captured.out
    assert "compute-optimal at C = 1e+21" in captured.out and "N_opt" in captured.out
    result = json.loads(out.read_text())
    for name in ("E", "A", "B", "alpha", "beta", "a", "b", "G"):
        assert np.isfinite(result[name])
        low, high = result["ci"][name]
        assert low <= high
    assert result["approach"] == 3 and result["n_points"] == 250
    assert result["objective"] > 0 and "Huber" in result["objective_name"]
    assert result["details"]["grid"]["starts"] == 243  # the grid is reported
    assert result["alpha"] == pytest.approx(0.34, abs=0.03)
    prediction = result["predictions"][0]
    assert prediction["C"] == 1e21
    low, high = prediction["ci"]["N_opt"]
    assert low < prediction["N_opt"] < high and prediction["loss"] > 1.69


def test_fit_kaplan_on_a_sweep_results_table(tmp_path, capsys):
    """A sweep's results.parquet: unfinished runs are dropped with a note, the loss falls back to
    final_val_loss and Kaplan uses the non-embedding parameter count."""
    frame = grid_points(KAPLAN_PUBLISHED, law="kaplan", n_range=(1e6, 1e9),
                        d_range=(1e7, 1e10), n_points=60, noise=0.005,
                        rng=np.random.default_rng(2))
    table = pd.DataFrame({
        "run_id": [f"r{i}" for i in range(60)], "status": ["completed"] * 57 + ["failed"] * 3,
        "params": frame["params"] * 1.3, "non_embedding_params": frame["params"],
        "tokens": frame["tokens"], "flops": frame["flops"],
        "final_val_loss": frame["loss"].where(np.arange(60) < 57),
        "best_val_loss": frame["loss"], "final_train_loss": frame["loss"]})
    path = tmp_path / "results.parquet"
    table.to_parquet(path)
    out = tmp_path / "kaplan.json"
    rc = fit_main([f"--sweep={path}", "--law=kaplan", "--bootstrap=30", f"--json={out}"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "dropped 3 of 60 rows whose status is not 'completed' (failed: 3)" in captured.out
    result = json.loads(out.read_text())
    assert result["n_points"] == 57 and result["approach"] is None
    assert set(result["ci"]) == {"N_c", "D_c", "alpha_N", "alpha_D"}
    assert result["alpha_N"] == pytest.approx(0.076, abs=0.005)
    assert any("non_embedding_params" in note for note in result["notes"])


def test_fit_approach2_with_mapped_columns(isoflop_csv, capsys):
    rc = fit_main([f"--sweep={isoflop_csv}", "--law=chinchilla", "--approach=2",
                   "--columns=params:Model Size,tokens:Tokens,loss:Loss,budget:Budget",
                   "--bootstrap=50", "--budget=1e22"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "IsoFLOP" in captured.out and "no FLOPs column: C = 6·N·D" in captured.out
    assert "models no loss" in captured.out  # approach 2 predicts N and D, not the loss


def test_fit_approach1_from_curves(tmp_path, capsys):
    path = tmp_path / "curves.csv"
    learning_curves(CHINCHILLA_PUBLISHED, np.geomspace(1e7, 3e9, 12),
                    rng=np.random.default_rng(3)).to_csv(path, index=False)
    out = tmp_path / "a1.json"
    rc = fit_main([f"--curves={path}", "--law=chinchilla", "--approach=1", "--bootstrap=10",
                   f"--json={out}"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    result = json.loads(out.read_text())
    assert result["approach"] == 1 and result["n_points"] == 12
    assert result["a"] == pytest.approx(0.28 / 0.62, abs=0.06)


def test_attnlab_dispatcher_runs_fit(isoflop_csv, capsys):
    rc = attnlab_main(["fit", f"--sweep={isoflop_csv}", "--law=chinchilla", "--approach=2",
                       "--bootstrap=0", "--columns=params:Model Size,tokens:Tokens,loss:Loss"])
    assert rc == 0, capsys.readouterr().err


def _write(tmp_path, frame, name="bad.csv"):
    path = tmp_path / name
    frame.to_csv(path, index=False)
    return path


def _good_frame(n=30, seed=4):
    return grid_points(CHINCHILLA_PUBLISHED, n_points=n, rng=np.random.default_rng(seed))


@pytest.mark.parametrize("case, message", [
    ("missing_column", "missing column 'tokens'"),
    ("non_positive", "column 'loss' (loss) has 1 non-positive or non-finite value(s) (rows 3"),
    ("non_finite", "column 'params' (params) has 2 non-positive or non-finite value(s)"),
    ("too_few_points", "approach 3 fits 5 parameters (E, A, B, alpha, beta) but has only 4"),
    ("single_budget", "approach 2 needs IsoFLOP profiles at two or more compute budgets"),
    ("missing_file", "no such results file"),
    ("bad_mapping", "no column 'Size' (mapped to params by --columns)"),
    ("mapped_twice", "--columns: params is mapped twice in 'params:a,params:b'"),
    ("infinite_budget", "--budget: FLOP budgets must be finite and > 0, got '1e20,inf'"),
])
def test_bad_input_gives_one_clear_error(case, message, tmp_path, capsys):
    frame = _good_frame()
    args = ["--law=chinchilla", "--approach=3", "--bootstrap=0", SMALL_GRID]
    if case == "missing_column":
        path = _write(tmp_path, frame.drop(columns="tokens"))
    elif case == "non_positive":
        frame.loc[3, "loss"] = 0.0
        path = _write(tmp_path, frame)
    elif case == "non_finite":
        frame.loc[[5, 7], "params"] = [np.inf, np.nan]
        path = _write(tmp_path, frame)
    elif case == "too_few_points":
        path = _write(tmp_path, frame.head(4))
    elif case == "single_budget":
        path = _write(tmp_path, isoflop_points(CHINCHILLA_PUBLISHED, [1e19],
                                               rng=np.random.default_rng(5)))
        args = ["--law=chinchilla", "--approach=2"]
    elif case == "missing_file":
        path = tmp_path / "nowhere.csv"
    elif case == "mapped_twice":
        path = _write(tmp_path, frame)
        args.append("--columns=params:a,params:b")
    elif case == "infinite_budget":
        path = _write(tmp_path, frame)
        args.append("--budget=1e20,inf")
    else:
        path = _write(tmp_path, frame)
        args.append("--columns=params:Size")
    rc = fit_main([f"--sweep={path}"] + args)
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.err.startswith("error: ") and message in captured.err, captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.out == ""


@pytest.mark.parametrize("kind, extra", [
    ("loss-vs-params", []),
    ("loss-vs-compute", []),
    ("isoflop", ["--columns=params:Model Size,tokens:Tokens,loss:Loss,budget:Budget"]),
    ("allocation", ["--approach=2", "--bootstrap=30",
                    "--columns=params:Model Size,tokens:Tokens,loss:Loss,budget:Budget"]),
])
def test_plot_writes_png_and_pdf(kind, extra, isoflop_csv, tmp_path, capsys):
    if kind in ("loss-vs-params", "loss-vs-compute"):
        source = _write(tmp_path, isoflop_points(CHINCHILLA_PUBLISHED,
                                                 np.geomspace(1e18, 1e20, 3),
                                                 rng=np.random.default_rng(6)), "iso.csv")
    else:
        source = isoflop_csv
    for suffix, magic in ((".png", b"\x89PNG"), (".pdf", b"%PDF")):
        out = tmp_path / f"{kind}{suffix}"
        rc = plot_main([f"--sweep={source}", f"--kind={kind}", f"--plot={out}"] + extra)
        assert rc == 0, capsys.readouterr().err
        assert out.read_bytes()[:4] == magic


def test_plot_draws_the_runs_when_the_law_does_not_converge(tmp_path, capsys):
    """The Markov ladder's losses sit on a floor Kaplan's law has no term for: `fit` refuses
    (no start converges), `plot --kind=loss-vs-params` still draws the runs, noting why there
    are no lines, with one warning line."""
    table = Path(__file__).resolve().parents[1] / "docs/results/markov_ladder_gpu.csv"
    assert fit_main([f"--sweep={table}", "--law=kaplan"]) == 2
    assert "did not converge" in capsys.readouterr().err
    out = tmp_path / "points.png"
    assert plot_main([f"--sweep={table}", "--kind=loss-vs-params", f"--plot={out}"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: no fitted lines: ") and "did not converge" in err
    assert err.count("\n") == 1 and out.read_bytes()[:4] == b"\x89PNG"


def test_plot_contours_and_curves(chinchilla_csv, tmp_path, capsys):
    out = tmp_path / "contours.png"
    assert plot_main([f"--sweep={chinchilla_csv}", "--kind=contours", f"--plot={out}",
                      SMALL_GRID]) == 0
    curves = tmp_path / "curves.csv"
    learning_curves(CHINCHILLA_PUBLISHED, np.geomspace(1e7, 1e9, 8),
                    rng=np.random.default_rng(7)).to_csv(curves, index=False)
    out = tmp_path / "frontier.png"
    assert plot_main([f"--curves={curves}", "--kind=loss-vs-compute", f"--plot={out}"]) == 0
    assert out.stat().st_size > 10_000


def test_plot_rejects_unknown_format(chinchilla_csv, tmp_path, capsys):
    rc = plot_main([f"--sweep={chinchilla_csv}", "--kind=loss-vs-params",
                    f"--plot={tmp_path / 'figure.svg'}"])
    assert rc == 2 and "must end in .png or .pdf" in capsys.readouterr().err


def _fake_sweep(root, sizes):
    """A sweep directory as attnlab.sweep writes it (run.json, summary.json, metrics.jsonl per
    run), with losses drawn from Chinchilla's law along each run."""
    from attnlab.scaling import equations

    steps = np.unique(np.geomspace(1, 4000, 80).astype(int))
    for i, n in enumerate(sizes):
        run = root / "runs" / f"run{i}"
        run.mkdir(parents=True)
        tokens_per_step = n / 10
        loss = equations.chinchilla_loss(CHINCHILLA_PUBLISHED, n, steps * tokens_per_step)
        (run / "run.json").write_text(json.dumps({
            "run_id": f"run{i}", "sweep": "fake", "mode": "curves", "axes": {},
            "params": {"total": n, "non_embedding": 0.9 * n, "embedding": 0.1 * n},
            "tokens": float(steps[-1] * tokens_per_step), "steps": int(steps[-1]),
            "tokens_per_step": tokens_per_step,
            "flops_per_token": {"kaplan_6n": 6 * 0.9 * n, "chinchilla": 6 * n}}))
        (run / "metrics.jsonl").write_text("".join(
            json.dumps({"step": int(s), "loss": float(v)}) + "\n" for s, v in zip(steps, loss)))
        (run / "summary.json").write_text(json.dumps({
            "status": "completed", "step": int(steps[-1]),
            "tokens": float(steps[-1] * tokens_per_step),
            "flops": {"6nd": 6 * 0.9 * n * steps[-1] * tokens_per_step,
                      "chinchilla": 6 * n * steps[-1] * tokens_per_step},
            "final_val_loss": float(loss[-1])}))


def test_fit_from_a_sweep_directory(tmp_path, capsys):
    """approach 1 reads the runs' learning curves through attnlab.results.curves."""
    _fake_sweep(tmp_path, np.geomspace(1e7, 3e9, 10))
    out = tmp_path / "fit.json"
    rc = fit_main([f"--sweep={tmp_path}", "--law=chinchilla", "--approach=1",
                   "--bootstrap=0", f"--json={out}"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    result = json.loads(out.read_text())
    assert result["n_points"] == 10
    assert result["a"] == pytest.approx(0.28 / 0.62, abs=0.05)
    assert any("flops_chinchilla" in note for note in result["notes"])


def test_a_table_with_no_completed_run_says_so(tmp_path, capsys):
    table = pd.DataFrame({
        "run_id": ["a", "b"], "status": ["failed", "diverged"], "params": [1e6, 2e6],
        "tokens": [1e7, 1e7], "final_val_loss": [np.nan, np.nan]})
    path = tmp_path / "results.csv"
    table.to_csv(path, index=False)
    assert fit_main([f"--sweep={path}", "--law=chinchilla", "--bootstrap=0"]) == 2
    err = capsys.readouterr().err
    assert "none of the 2 runs has status 'completed' (failed: 1, diverged: 1)" in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("form, curve", [("n", True), ("d", False), ("nd", False)])
def test_loss_vs_params_draws_the_size_curve_only_of_a_law_fitted_per_size(form, curve):
    """Kaplan's L(N) is drawn as its own line; the law says whether it has one (no name
    compared), and L(D) and L(N, D) draw their lines per D instead."""
    from attnlab.plots.scaling import plot_loss_vs_params
    from attnlab.scaling import fit_table
    from attnlab.scaling.laws import registry
    from attnlab.scaling.tables.prepare import prepare_points

    frame = isoflop_points(CHINCHILLA_PUBLISHED, np.geomspace(1e18, 1e20, 3),
                           rng=np.random.default_rng(6))
    law = registry.law_named("kaplan", None, form)
    table = prepare_points(frame, law=law)
    figure = plot_loss_vs_params(table.frame, fit_table(table, law=law))
    labels = [line.get_label() for line in figure.axes[0].get_lines()]
    assert ("L(N) fit" in labels) == curve


@pytest.mark.parametrize("command, args, message", [
    ("fit", ["--law=chinchilla", "--approach=3", "--curves={csv}"],
     "--curves: Chinchilla approach 3 fits each run's final loss"),
    ("fit", ["--law=chinchilla", "--approach=2", "--train-longer=10", "--budget=1e20"],
     "--train-longer does not apply to Chinchilla approach 2"),
    ("fit", ["--law=kaplan", "--form=n", "--budget=1e20"],
     "--budget does not apply to Kaplan L(N): it models one of N and D"),
    ("fit", ["--law=chinchilla", "--approach=1", "--curves={csv}", "--cluster=trunk"],
     "--cluster does not apply to --law=chinchilla"),
    ("plot", ["--kind=contours", "--bootstrap=50"],
     "--bootstrap: --kind=contours draws no interval bands"),
    ("plot", ["--kind=isoflop", "--ci-level=0.9"],
     "--ci-level: --kind=isoflop draws no interval bands"),
    ("plot", ["--kind=loss-vs-compute", "--fix=E=1.7"],
     "--fix: --kind=loss-vs-compute without --curves draws the runs and fits nothing"),
])
def test_a_flag_the_fit_or_figure_would_ignore_is_refused(command, args, message,
                                                          chinchilla_csv, tmp_path, capsys):
    argv = [f"--sweep={chinchilla_csv}"] + [a.format(csv=chinchilla_csv) for a in args]
    if command == "plot":
        rc = plot_main(argv + [f"--plot={tmp_path / 'x.png'}"])
    else:
        rc = fit_main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "x.png").exists()
