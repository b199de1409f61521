"""attnlab.results: statuses, the table and the curves, from run directories written by hand in
the formats that the sweep (run.json) and training (summary.json, metrics.jsonl) write."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from repo_files import load_module

from attnlab import results
from attnlab.sweep import load_spec, plan
from attnlab.sweep.runner import prepare_run_dirs


@pytest.fixture
def sweep_dir(tmp_path):
    """A sweep directory holding the 4 planned runs of tiny_grid (run.json only)."""
    spec = load_spec("experiments/tiny_grid.py")
    runs = plan(spec)
    dirs = prepare_run_dirs(spec, runs, tmp_path)
    return tmp_path, runs, dirs


def summary(run, status="completed", **extra):
    """A summary.json in the layout attnlab.train writes."""
    tokens = run.tokens
    return {"status": status, "step": run.steps, "total_steps": run.steps,
            "params": dict(run.params), "tokens": tokens,
            "flops": {"6nd": 6.0 * run.params["non_embedding"] * tokens,
                      "chinchilla": run.flops_per_token["chinchilla"] * tokens},
            "final_val_loss": 3.5, "best_val_loss": 3.4, "final_train_loss_smoothed": 3.6,
            "wall_seconds": 12.0, "tokens_per_s": 1000.0, "mfu": 0.01, **extra}


def write(path, obj):
    path.write_text(json.dumps(obj))


def test_statuses_from_run_files(sweep_dir):
    _, runs, dirs = sweep_dir
    assert {results.run_status(d) for d in dirs} == {"pending"}
    write(dirs[0] / "summary.json", summary(runs[0]))
    write(dirs[1] / "summary.json", summary(runs[1], status="running"))  # killed mid-run
    write(dirs[2] / "summary.json", summary(runs[2], status="failed",
                                            error="KeyboardInterrupt: "))  # Ctrl-C
    write(dirs[3] / "failure.json", {"status": "failed", "error": "worker died"})
    assert [results.run_status(d) for d in dirs] == ["completed", "partial", "partial", "failed"]
    write(dirs[2] / "summary.json", summary(runs[2], status="diverged", diverged_at_step=3))
    assert results.run_status(dirs[2]) == "diverged"
    (dirs[1] / "summary.json").write_text('{"status": "compl')  # cut short: not final
    assert results.run_status(dirs[1]) == "partial"


def test_table_rows_planned_then_finished(sweep_dir):
    workdir, runs, dirs = sweep_dir
    table = results.build_table(workdir)
    assert len(table) == 4 and set(table["status"]) == {"pending"}
    assert "budget" not in table  # only isoflop sweeps have budgets
    for column in ("model.d_model", "model.n_layers", "model.n_heads", "model.pos_encoding",
                   "train.seed", "train.learning_rate"):
        assert column in table
    by_id = table.set_index("run_id")
    for run in runs:  # planned values before training
        row = by_id.loc[run.run_id]
        assert row["params"] == run.params["total"] and row["tokens"] == run.tokens
        assert row["flops"] == pytest.approx(6.0 * run.params["non_embedding"] * run.tokens)
        assert row["model.pos_encoding"] == run.cfg.model.pos_encoding
        assert math.isnan(row["final_val_loss"])
    write(dirs[0] / "summary.json", summary(runs[0]))
    write(dirs[1] / "summary.json", summary(runs[1], status="diverged", diverged_at_step=3,
                                            final_val_loss=None))
    write(dirs[2] / "failure.json", {"status": "failed", "error": "DataError: no files"})
    by_id = results.build_table(workdir).set_index("run_id")
    done = by_id.loc[runs[0].run_id]
    assert done["status"] == "completed" and done["final_val_loss"] == 3.5
    assert done["final_train_loss"] == 3.6 and done["wall_seconds"] == 12.0
    assert by_id.loc[runs[1].run_id, "error"] == "diverged at step 3"
    assert by_id.loc[runs[2].run_id, "status"] == "failed"
    assert by_id.loc[runs[2].run_id, "error"] == "DataError: no files"


def test_a_grid_of_rates_records_each_runs_multiple_of_the_rule(sweep_dir, tmp_path):
    """lr_factor: the run's rate over its rule's, so that the rule's own runs can be the
    baseline of a comparison; a sweep at one rate per point has no such column."""
    assert "lr_factor" not in results.build_table(sweep_dir[0])
    spec = load_spec("experiments/tiny_isoflop.py:cpu_tuned")
    runs = plan(spec)
    prepare_run_dirs(spec, runs, tmp_path / "tuned")
    table = results.build_table(tmp_path / "tuned").set_index("run_id")
    assert sorted(set(table["lr_factor"])) == [0.5, 1.0, 2.0]
    for run in runs:
        assert table.loc[run.run_id, "lr_factor"] == run.lr_factor
    rule = table["train.learning_rate"] / table["lr_factor"]
    per_shape = rule.groupby(table["model.d_model"]).agg(["min", "max"])
    assert np.allclose(per_shape["min"], per_shape["max"], rtol=1e-5)


def test_unique_tokens_and_epochs_columns(sweep_dir):
    """unique_tokens from the summary (written when a run starts), epochs = tokens / unique
    tokens (the planned tokens until the run finishes); a mixture's columns per source come
    last and are no axis of a seed replicate."""
    workdir, runs, dirs = sweep_dir
    unique = runs[0].tokens * 4
    write(dirs[0] / "summary.json", summary(runs[0], unique_tokens=unique, epochs=0.25,
                                            **{"unique_tokens/web": unique // 4,
                                               "tokens/web": runs[0].tokens // 2,
                                               "epochs/web": 0.5}))
    write(dirs[1] / "summary.json", {"status": "running", "step": 1, "unique_tokens": 1000})
    table = results.write_table(workdir).set_index("run_id")
    done, running = table.loc[runs[0].run_id], table.loc[runs[1].run_id]
    assert done["unique_tokens"] == unique and done["epochs"] == 0.25
    assert done["tokens/web"] == runs[0].tokens // 2 and done["epochs/web"] == 0.5
    assert running["epochs"] == runs[1].tokens / 1000 and math.isnan(running["epochs/web"])
    assert math.isnan(table.loc[runs[2].run_id, "epochs"])  # pending: nothing known yet
    assert list(table.columns[-3:]) == ["unique_tokens/web", "tokens/web", "epochs/web"]
    assert list(pd.read_csv(workdir / "results.csv").columns) == ["run_id", *table.columns]


def test_the_corpus_column_names_the_bytes_and_a_fit_notes_a_mix(sweep_dir, capsys):
    """corpus: the prepared corpus's sha256 prefix from the run's manifest (pystdlib differs
    by Python version); a fit over runs of two corpora says so, and one corpus says nothing."""
    from attnlab.scaling.compare_cli import compare_main
    from attnlab.scaling.laws.registry import law_named
    from attnlab.scaling.tables.prepare import prepare_points

    workdir, runs, dirs = sweep_dir
    for i, (run, run_dir) in enumerate(zip(runs, dirs)):
        digest = ("12" if i < 3 else "1e") * 32  # read back as text, not as numbers
        write(run_dir / "summary.json", summary(run, dataset={"sha256": digest}))
    results.write_table(workdir)
    table = pd.read_csv(workdir / "results.csv")
    corpus = dict(zip(table["run_id"], table["corpus"]))
    first, second = "sha256:" + "12" * 6, "sha256:" + "1e" * 6
    assert [corpus[run.run_id] for run in runs] == [first] * 3 + [second]
    assert results.corpus_id({"name": "no hash"}) is None and results.corpus_id(None) is None
    mixed = prepare_points(table, law=law_named("chinchilla"))
    assert [n for n in mixed.notes if "2 different corpora" in n and "121212121212 x 3" in n]
    one = prepare_points(table[table["corpus"] == first], law=law_named("chinchilla"))
    assert not [n for n in one.notes if "corpora" in n]
    code = compare_main([f"--sweep={workdir / 'results.csv'}", "--by=model.pos_encoding",
                         "--baseline=rope", "--match=model.d_model"])
    assert code == 0 and "note: the runs trained on 2 different corpora" in capsys.readouterr().out


def test_write_table_is_atomic_and_loads_back(sweep_dir):
    workdir, runs, dirs = sweep_dir
    write(dirs[0] / "summary.json", summary(runs[0]))
    written = results.write_table(workdir)
    assert sorted(p.name for p in workdir.iterdir() if p.name.startswith(".")) == []
    from_dir = results.load(workdir)
    from_csv = results.load(workdir / "results.csv")
    pd.testing.assert_frame_equal(from_dir, written)
    assert list(from_csv.columns) == list(written.columns)
    np.testing.assert_allclose(from_csv["params"], written["params"])
    assert list(from_csv["run_id"]) == list(written["run_id"])


def test_mixed_type_axis_column_still_writes_parquet(sweep_dir):
    workdir, _, dirs = sweep_dir
    record = json.loads((dirs[0] / "run.json").read_text())
    record["axes"]["model.d_ff"] = None
    write(dirs[0] / "run.json", record)
    record = json.loads((dirs[1] / "run.json").read_text())
    record["axes"]["model.d_ff"] = "auto"
    record["axes"]["train.seed"] = "seed-x"
    write(dirs[1] / "run.json", record)
    table = results.write_table(workdir)
    assert results.load(workdir)["train.seed"].tolist() == table["train.seed"].tolist()


def test_curves_merge_validation_and_survive_cut_lines(sweep_dir):
    workdir, runs, dirs = sweep_dir
    run, run_dir = runs[0], dirs[0]
    batch_tokens = 8 * 32
    lines = [{"step": s, "tokens": s * batch_tokens, "loss": 5.0 - 0.1 * s, "lr": 1e-3,
              "grad_norm": 1.0} for s in (1, 4, 8)]
    lines.append({"step": 8, "tokens": 8 * batch_tokens, "val_loss": 4.0})
    # a resumed run logged step 8 again, and a kill cut the last line short
    lines.append({"step": 8, "tokens": 8 * batch_tokens, "loss": 4.25, "lr": 1e-3,
                  "grad_norm": 1.0})
    text = "".join(json.dumps(r) + "\n" for r in lines) + '{"step": 12, "lo'
    (run_dir / "metrics.jsonl").write_text(text)
    curves = results.curves(workdir)
    assert set(curves["run_id"]) == {run.run_id}
    assert curves["step"].tolist() == [1, 4, 8]
    assert curves["loss"].tolist() == [4.9, 4.6, 4.25]
    assert math.isnan(curves["val_loss"][0]) and curves["val_loss"][2] == 4.0
    np.testing.assert_allclose(curves["flops"],
                               6.0 * run.params["non_embedding"] * curves["tokens"])
    np.testing.assert_allclose(curves["flops_chinchilla"],
                               run.flops_per_token["chinchilla"] * curves["tokens"])
    assert (curves["params"] == run.params["total"]).all()
    assert (curves["model.pos_encoding"] == run.cfg.model.pos_encoding).all()


def test_load_errors_name_the_path(tmp_path):
    with pytest.raises(results.ResultsError, match="not a sweep directory"):
        results.load(tmp_path)
    with pytest.raises(results.ResultsError, match="no such results file"):
        results.load(tmp_path / "missing.parquet")
    (tmp_path / "runs.tsv").write_text("a\tb\n1\t2\n")
    with pytest.raises(results.ResultsError, match=r"runs.tsv: .* as .parquet or .csv, not .tsv"):
        results.load(tmp_path / "runs.tsv")
    (tmp_path / "RUNS.CSV").write_text("a,b\n1,2\n")  # a suffix in capitals is still a .csv
    assert results.load(tmp_path / "RUNS.CSV").to_dict("list") == {"a": [1], "b": [2]}
    with pytest.raises(results.ResultsError, match="not a sweep directory"):
        results.curves(tmp_path)


def test_seed_spread_groups_replicates_and_ignores_unfinished_runs():
    rng = np.random.default_rng(0)
    losses = rng.normal(3.0, 0.05, size=(3, 2))  # 3 points (budget, d_model) x 2 seeds
    rows = []
    for i, (budget, width) in enumerate([(1e11, 16), (1e11, 32), (3e11, 32)]):
        for seed in (0, 1):
            rows.append({"run_id": f"r{i}{seed}", "status": "completed", "budget": budget,
                         "model.d_model": width, "train.seed": seed, "params": 1000 * width,
                         "final_val_loss": losses[i, seed]})
    rows.append({"run_id": "pending", "status": "pending", "budget": 3e11, "model.d_model": 32,
                 "train.seed": 2, "params": 32000, "final_val_loss": float("nan")})
    spread = results.seed_spread(pd.DataFrame(rows))
    assert list(spread["seeds"]) == [2, 2, 2]
    np.testing.assert_allclose(spread["range"], np.ptp(losses, axis=1))
    np.testing.assert_allclose(spread["std"], losses.std(axis=1, ddof=1))
    np.testing.assert_allclose(spread["mean"], losses.mean(axis=1))
    line = results.describe_seed_spread(pd.DataFrame(rows))
    assert "2 per point at 3 points" in line and f"{np.ptp(losses, axis=1).max():.4f}" in line
    single = pd.DataFrame([r for r in rows if r["train.seed"] == 0])
    assert results.seed_spread(single).empty and results.describe_seed_spread(single) is None


def _docs_script(name: str):
    return load_module(f"docs/scripts/{name}.py")


def test_the_docs_script_gives_an_older_table_the_factors_a_sweep_now_records(tmp_path):
    """docs/scripts/lr_factors.py, on a table written before lr_factor was a column: the
    factors it derives from the plan are the ones the sweep records; it overwrites nothing."""
    script = _docs_script("lr_factors")
    experiment = "experiments/tiny_isoflop.py:cpu_tuned"
    spec = load_spec(experiment)
    prepare_run_dirs(spec, plan(spec), tmp_path / "sweep")
    recorded = results.build_table(tmp_path / "sweep")
    older = tmp_path / "older.csv"
    recorded.drop(columns="lr_factor").to_csv(older, index=False)
    out = tmp_path / "factors.csv"
    assert script.main([str(older), experiment, str(out)]) == 0
    derived = pd.read_csv(out)
    np.testing.assert_array_equal(derived["lr_factor"], recorded["lr_factor"])
    assert script.main([str(older), experiment, str(out)]) == 2  # out exists: refused


def test_the_docs_script_names_a_run_the_plan_does_not_have(tmp_path, capsys):
    """A table from another plan (here a shape the experiment never trains): one line naming
    the run, exit 2, and no output written."""
    script = _docs_script("lr_factors")
    experiment = "experiments/tiny_isoflop.py:cpu_tuned"
    spec = load_spec(experiment)
    prepare_run_dirs(spec, plan(spec), tmp_path / "sweep")
    table = results.build_table(tmp_path / "sweep").drop(columns="lr_factor")
    table.loc[0, "model.d_model"] = 999
    older, out = tmp_path / "older.csv", tmp_path / "factors.csv"
    table.to_csv(older, index=False)
    assert script.main([str(older), experiment, str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"run {table.loc[0, 'run_id']}: no planned point" in err
    assert not out.exists()


def test_pick_noise_recovers_a_known_spread_and_the_gain_of_a_noisy_pick():
    """docs/scripts/pick_noise.py: on losses whose seeds move adjacent rates' log-loss
    difference by a known sd, the per-pair sds centre on it; and the gain of taking the better
    of two equal rates is the simulated E[min(0, D)]."""
    script = _docs_script("pick_noise")
    rng = np.random.default_rng(0)
    sd, rows = 0.01, []
    for point in range(60):
        for seed in range(8):
            for rate in (1e-3, 2e-3, 4e-3):  # independent noise per run: difference sd = sd
                noise = rng.normal(0.0, sd / np.sqrt(2))
                rows.append({"point": point, "train.seed": seed, "train.learning_rate": rate,
                             "final_val_loss": 2.0 * np.exp(noise)})
    sds = script.adjacent_rate_sds(pd.DataFrame(rows), ["point"])
    assert len(sds) == 120 and abs(np.mean(sds) - sd) < 0.1 * sd
    draws = rng.normal(0.0, sd, 400_000)
    assert script.expected_pick_gain(sd) == pytest.approx(np.minimum(draws, 0).mean(), rel=0.02)


def test_pick_gains_counts_each_points_best_factor_and_its_gain_over_the_rule():
    """docs/scripts/pick_gains.py on a table whose best factor per point is known: 2x at the
    larger size of each arm, the rule at the smaller; the gain is the pick's loss over the
    rule's, and an unfinished run's factor is never picked."""
    script = _docs_script("pick_gains")
    rows = []
    for arm in ("a", "b"):
        for params, best in ((1000, 1.0), (2000, 2.0)):
            for factor in (0.5, 1.0, 2.0):
                for seed in (0, 1):
                    loss = 2.0 * (1 + 0.01 * np.log2(factor / best) ** 2) + 1e-4 * seed
                    rows.append({"architecture": arm, "params": params, "tokens": 5e5,
                                 "lr_factor": factor, "train.seed": seed, "status": "completed",
                                 "final_val_loss": loss})
    table = pd.DataFrame(rows)
    # A diverged run at b's best factor: the pick moves to the next best.
    diverged = (table.architecture == "b") & (table.params == 2000) & (table.lr_factor == 2.0)
    table.loc[diverged & (table["train.seed"] == 0), ["status", "final_val_loss"]] = [
        "diverged", np.nan]
    gains = script.pick_gains(table, "architecture").set_index(["arm", "params"])
    assert gains["lr_factor"].to_dict() == {("a", 1000): 1.0, ("a", 2000): 2.0,
                                            ("b", 1000): 1.0, ("b", 2000): 1.0}
    assert gains.loc[("a", 2000), "gain"] == pytest.approx(-0.01 / 1.01, rel=1e-3)
    assert gains.loc[("a", 1000), "gain"] == 0 == gains.loc[("b", 2000), "gain"]
    assert script.describe(gains.reset_index()).startswith("4 points; best factor 1x: 3, 2x: 1")
