"""Sweeps end to end with real training at tiny sizes: local and Ray launchers, idempotent reruns,
failed / diverged runs, and a SIGKILL in the middle of a sweep."""

import json
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import psutil
import pytest

from attnlab import cli_flags, results
from attnlab.data import DataError, prepare
from attnlab.sweep import dry_run, load_spec, plan, run_sweep, spec_from_config_dict

ROOT = pathlib.Path(__file__).resolve().parents[1]
GRID = str(ROOT / "experiments" / "tiny_grid.py")
ISOFLOP = str(ROOT / "experiments" / "tiny_isoflop.py")
COMPARED = ["run_id", "status", "params", "tokens", "final_val_loss", "final_train_loss"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One JAX compilation cache for the module: identical programs compile once."""
    return tmp_path_factory.mktemp("jax_cache")


@pytest.fixture(scope="module")
def grid(tmp_path_factory, cache_dir):
    """tiny_grid run once, sequentially, on the local launcher."""
    workdir = tmp_path_factory.mktemp("grid")
    spec = load_spec(GRID)
    table = run_sweep(spec, workdir, progress=False, cache_dir=cache_dir)
    return spec, workdir, table


@pytest.fixture(scope="module")
def isoflop(tmp_path_factory, cache_dir):
    """tiny_isoflop at one budget (3 sizes) on two local workers."""
    workdir = tmp_path_factory.mktemp("isoflop")
    spec = load_spec(ISOFLOP, ["sweep.budgets=(2e9,)"])
    table = run_sweep(spec, workdir, parallel=2, progress=False, cache_dir=cache_dir)
    return spec, workdir, table


def mtimes(workdir):
    return {p: p.stat().st_mtime_ns for p in (workdir / "runs").glob("*/summary.json")}


def test_grid_completes_and_the_table_matches_the_plan(grid):
    spec, workdir, table = grid
    planned = {r.run_id: r for r in plan(spec)}
    assert sorted(table["run_id"]) == sorted(planned)
    assert set(table["status"]) == {"completed"}
    assert (workdir / "results.parquet").exists() and (workdir / "results.csv").exists()
    for row in table.itertuples():
        run = planned[row.run_id]
        assert row.params == run.params["total"] and row.tokens == run.tokens
        assert row.non_embedding_params == run.params["non_embedding"]
        # learned something: below the uniform byte loss ln(256)
        assert 0 < row.final_val_loss < math.log(256) and row.best_val_loss <= row.final_val_loss
        assert row.flops == pytest.approx(6.0 * run.params["non_embedding"] * run.tokens)
        assert row.wall_seconds > 0 and row.tokens_per_s > 0
        # U_D and repeats: the training split's tokens, and the tokens trained over them
        assert row.unique_tokens == prepare(run.cfg.data).num_tokens("train")
        assert row.epochs == pytest.approx(row.tokens / row.unique_tokens, rel=1e-12)
    assert sorted(table["model.pos_encoding"].unique()) == ["alibi", "rope"]
    # the columns `attnlab fit` reads
    for column in ("params", "tokens", "final_val_loss", "flops", "non_embedding_params",
                   "status"):
        assert column in table


def test_rerun_skips_finished_runs(grid):
    spec, workdir, table = grid
    before = mtimes(workdir)
    again = run_sweep(spec, workdir, progress=False)
    assert mtimes(workdir) == before  # nothing retrained, nothing rewritten
    pd.testing.assert_frame_equal(again[COMPARED], table[COMPARED])


@pytest.mark.slow
def test_compile_ahead_changes_no_result(grid, tmp_path, cache_dir):
    # The worker compiles each next run's programs while training the current one, says so in
    # its log, and trains the same numbers as the grid trained without it.
    spec, workdir, table = grid
    assert "compiled ahead" not in (workdir / "logs" / "worker-0.log").read_text()
    ahead = run_sweep(spec, tmp_path, progress=False, cache_dir=cache_dir, compile_ahead=True)
    said = (tmp_path / "logs" / "worker-0.log").read_text()
    later = [run_id for run_id in table["run_id"] if f"{run_id}: programs compiled ahead" in said]
    assert len(later) == len(table) - 1, said  # every run but the first
    pd.testing.assert_frame_equal(ahead[COMPARED], table[COMPARED])


def test_curves_hold_every_logged_step(grid):
    _, workdir, table = grid
    curves = results.curves(workdir)
    assert set(curves["run_id"]) == set(table["run_id"])
    for run_id, steps in curves.groupby("run_id"):
        assert steps["step"].tolist() == [1, 4, 8, 12, 16, 20, 24]
        assert steps.dropna(subset=["val_loss"])["step"].tolist() == [8, 16, 24]
        np.testing.assert_array_equal(steps["tokens"], steps["step"] * 8 * 32)
        final = table.set_index("run_id").loc[run_id, "final_val_loss"]
        assert steps["val_loss"].iloc[-1] == pytest.approx(final)


def test_attnlab_fit_reads_the_table(grid, capsys):
    from attnlab.cli import main

    _, workdir, _ = grid
    assert main(["fit", f"--sweep={workdir / 'results.parquet'}", "--law=kaplan", "--form=n",
                 "--bootstrap=0"]) == 0
    assert "(4 points)" in capsys.readouterr().out


def test_isoflop_sweep_on_two_workers(isoflop):
    spec, workdir, table = isoflop
    assert len(table) == 3 and set(table["status"]) == {"completed"}
    assert table["budget"].tolist() == [2e9] * 3
    planned = {r.run_id: r for r in plan(spec)}
    for row in table.itertuples():
        assert row.budget == planned[row.run_id].budget
        assert row.tokens == planned[row.run_id].tokens
    # one log per worker: the two workers shared the runs
    assert (workdir / "logs" / "worker-0.log").exists()
    assert (workdir / "logs" / "worker-1.log").exists()


def test_workers_sharing_a_machine_split_an_accelerators_memory(tmp_path, monkeypatch):
    """JAX preallocates 75% of a GPU for each process: four workers on one H200 ran out of
    memory in autotuning. Each of K workers asks for 0.9 / K of it; a lone worker keeps JAX's
    default, and an allocation setting the user made is kept."""
    from attnlab.sweep import launchers
    for name in ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE",
                 "XLA_PYTHON_CLIENT_ALLOCATOR"):
        monkeypatch.delenv(name, raising=False)
    workers = launchers.start_workers(4, cache_dir="", logs_dir=tmp_path)
    lone = launchers.start_workers(1, cache_dir="", logs_dir=tmp_path)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    chosen = launchers.start_workers(2, cache_dir="", logs_dir=tmp_path)
    try:
        shares = [psutil.Process(w.process.pid).environ().get("XLA_PYTHON_CLIENT_MEM_FRACTION")
                  for w in workers]
        assert shares == ["0.225"] * 4
        assert sum(float(s) for s in shares) <= 0.9
        assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in psutil.Process(
            lone[0].process.pid).environ()
        for worker in chosen:
            env = psutil.Process(worker.process.pid).environ()
            assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
            assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in env
    finally:
        for worker in workers + lone + chosen:
            worker.kill()
    # Ray tasks asking for a quarter of a GPU share it the same way.
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE")
    assert launchers.memory_share(0.25) == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.225"}
    assert launchers.memory_share(1) == {}


def test_concurrent_runs_start_with_the_most_expensive(tmp_path):
    from attnlab.sweep.runner import longest_first

    runs = plan(load_spec(ISOFLOP))
    run_dirs = [tmp_path / r.run_id for r in runs]
    flops = {d: r.flops() for r, d in zip(runs, run_dirs)}
    assert len(set(flops.values())) > 1  # otherwise the order says nothing
    order = longest_first([[d] for d in run_dirs[1:]], runs, run_dirs)  # a finished run stays out
    assert sorted(d for unit in order for d in unit) == sorted(run_dirs[1:])
    assert [flops[d] for d, in order] == sorted(flops[d] for d in run_dirs[1:])[::-1]
    # An ensemble counts the FLOPs of all its members.
    pair = [run_dirs[0], run_dirs[1]]
    assert longest_first([[run_dirs[2]], pair], runs, run_dirs)[0] == (
        pair if flops[run_dirs[0]] + flops[run_dirs[1]] > flops[run_dirs[2]] else [run_dirs[2]])
    with pytest.raises(ValueError):  # runs and directories must pair up
        longest_first([[d] for d in run_dirs], runs, run_dirs[1:])


@pytest.mark.slow
def test_full_tiny_isoflop(tmp_path, cache_dir, capsys):
    table = run_sweep(load_spec(ISOFLOP), tmp_path, parallel=2, progress=False,
                      cache_dir=cache_dir)
    assert len(table) == 6 and set(table["status"]) == {"completed"}
    assert sorted(table["budget"].unique()) == [1e9, 2e9]
    from attnlab.cli import main

    # The table is readable by the fits (tiny runs are too short for meaningful parabolas, so
    # this fits Kaplan's L(N), which takes any sizes).
    assert main(["fit", f"--sweep={tmp_path}", "--law=kaplan", "--form=n",
                 "--bootstrap=0"]) == 0
    assert "3 distinct model sizes (6 points)" in capsys.readouterr().out


def single_run_spec(lr=1e-2, steps=None, **data):
    """tiny_grid cut to one run (d16, rope) with the given learning rate and data fields."""
    config = cli_flags.parse([f"--config={GRID}"]).config
    if steps:
        config.base.train.steps = steps
    config.sweep.shapes = ((16, 1, 2, lr),)
    config.sweep.axes.model.pos_encoding = ("rope",)
    for key, value in data.items():
        config.base.data[key] = value
    return spec_from_config_dict(config)


@pytest.mark.slow
def test_failed_run_is_recorded_and_retried_only_when_asked(tmp_path):
    # A failure at run time: the run's directory holds a checkpoints/ folder but no config.json
    # (deleted by hand, say), which the run's own preflight refuses to resume.
    spec = single_run_spec()
    workdir = tmp_path / "sweep"
    run_dir = workdir / "runs" / plan(spec)[0].run_id
    (run_dir / "checkpoints").mkdir(parents=True)
    # The command line first: a failed run makes it exit with 1.
    result = subprocess.run(
        [sys.executable, "-m", "attnlab.cli", "sweep", f"--config={GRID}",
         f"--sweep={workdir}", "--config.sweep.shapes=((16,1,2,1e-2),)",
         "--config.sweep.axes.model.pos_encoding=('rope',)", "--noprogress"],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 1, result.stderr
    assert "1 failed" in result.stdout
    table = results.load(workdir)
    assert table["run_id"].tolist() == [run_dir.name] and table["status"].tolist() == ["failed"]
    assert "no config.json" in table["error"][0] and "cannot be resumed" in table["error"][0]
    failure = (run_dir / "failure.json").read_bytes()

    assert run_sweep(spec, workdir, progress=False)["run_id"].tolist() == [run_dir.name]
    assert (run_dir / "failure.json").read_bytes() == failure  # not retried
    table = run_sweep(spec, workdir, progress=False, retry_failed=True)
    assert table["status"].tolist() == ["failed"]  # failed again, the first failure kept
    assert len(list(run_dir.glob("failure-*.json"))) == 1


def test_a_bad_data_source_stops_the_sweep_before_any_run(tmp_path):
    empty = tmp_path / "no_text_here"
    empty.mkdir()
    workdir = tmp_path / "sweep"
    result = subprocess.run(
        [sys.executable, "-m", "attnlab.cli", "sweep", f"--config={GRID}",
         f"--sweep={workdir}", "--config.base.data.source=text_files",
         f"--config.base.data.path={empty}", "--noprogress"],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 2, result.stderr
    assert "is empty" in result.stderr and str(empty) in result.stderr
    assert "Traceback" not in result.stderr
    assert not workdir.exists()  # nothing written, no run recorded as failed
    with pytest.raises(DataError, match="is empty"):  # the dry run checks it too
        dry_run(single_run_spec(source="text_files", path=str(empty)), workdir, probe="none")
    # In-process: the worker started before the checks (to import meanwhile) is gone again.
    with pytest.raises(DataError, match="is empty"):
        run_sweep(single_run_spec(source="text_files", path=str(empty)), workdir, progress=False)
    assert not workdir.exists()
    workers = [p for p in psutil.Process().children(recursive=True)
               if "attnlab.worker" in " ".join(p.cmdline())]
    assert workers == []


def test_runs_that_repeat_data_are_named_before_the_sweep(tmp_path):
    spec = single_run_spec(max_bytes=3_000)  # 24 steps x 256 tokens: > 1 epoch
    with pytest.raises(DataError, match="validation split.*fewer than the 2 x 8"):
        dry_run(spec, tmp_path / "small", probe="none")  # and too few windows to evaluate on
    # 160 x 256 tokens: about 1.9 epochs of a 24 kB slice (pystdlib is the running Python's
    # standard library, so the slice differs between Python versions; 24 kB leaves both 3.11's and
    # 3.12's validation splits enough windows)
    spec = single_run_spec(max_bytes=24_000, steps=160)
    _, notes = dry_run(spec, tmp_path, probe="none")
    repeats = [n for n in notes if "epochs of the" in n]
    assert len(repeats) == 1 and repeats[0].startswith(plan(spec)[0].run_id)


def test_sweep_max_epochs_refuses_a_plan_that_repeats_data_on_this_machine(tmp_path):
    """The corpus is measured where the sweep runs (pystdlib differs between machines), so a
    plan that promises no repetition is checked there, before anything is written."""
    from attnlab.sweep.sections import SweepSpecError

    config = cli_flags.parse([f"--config={GRID}"]).config
    config.unlock()
    config.sweep.max_epochs = 1.0
    dry_run(spec_from_config_dict(config), tmp_path / "fits", probe="none")  # 0.03 epochs: fine
    config.base.data.max_bytes = 24_000
    config.base.train.steps = 160  # 160 x 256 tokens: about 1.9 epochs
    spec = spec_from_config_dict(config)
    with pytest.raises(SweepSpecError, match=r"sweep\.max_epochs.*4 of 4 runs would read"):
        dry_run(spec, tmp_path / "dry", probe="none")
    with pytest.raises(SweepSpecError, match="epochs of"):
        run_sweep(spec, tmp_path / "sweep", progress=False)
    assert not (tmp_path / "sweep").exists()
    config.sweep.max_epochs = -1.0
    with pytest.raises(SweepSpecError, match=r"sweep\.max_epochs.*>= 0"):
        spec_from_config_dict(config)


def test_a_dry_run_estimates_the_runs_that_fit_and_names_the_one_that_does_not(tmp_path):
    """A run too large for this machine is named and not probed (probing it would not fit);
    the others keep their time estimates."""
    config = cli_flags.parse([f"--config={GRID}"]).config
    config.unlock()
    config.sweep.shapes = ((16, 1, 2, 1e-2), (100_000, 1, 2, 1e-2))
    config.sweep.axes.model.pos_encoding = ("rope",)
    table, notes = dry_run(spec_from_config_dict(config), tmp_path / "w", probe="steps")
    large = table["d_model"] == 100_000
    assert large.sum() == 1 and table.loc[large, "est_seconds"].isna().all()
    assert (table.loc[~large, "est_seconds"] > 0).all()
    refused = [n for n in notes if n.startswith("warning:") and "--allow-large" in n]
    assert len(refused) == 1 and table.loc[large, "run_id"].item() in refused[0]
    assert any(n.startswith("estimated time to run:") for n in notes)


@pytest.mark.slow
def test_repeated_data_is_named_on_stderr_without_the_progress_bar(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "attnlab.cli", "sweep", f"--config={GRID}",
         f"--sweep={tmp_path / 'sweep'}", "--config.sweep.shapes=((16,1,2,1e-2),)",
         "--config.sweep.axes.model.pos_encoding=('rope',)", "--config.base.data.max_bytes=12000",
         "--config.base.train.steps=80", "--noprogress"],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "epochs of the" in result.stderr and "repeated data" in result.stderr


@pytest.mark.slow
def test_diverged_run_is_kept_and_restarted_on_retry(tmp_path, cache_dir):
    spec = single_run_spec(lr=1e6)  # a learning rate that blows up
    table = run_sweep(spec, tmp_path, progress=False, cache_dir=cache_dir)
    assert table["status"].tolist() == ["diverged"]
    assert table["error"][0].startswith("diverged at step")
    before = mtimes(tmp_path)
    run_sweep(spec, tmp_path, progress=False, cache_dir=cache_dir)
    assert mtimes(tmp_path) == before
    table = run_sweep(spec, tmp_path, progress=False, cache_dir=cache_dir, retry_failed=True)
    assert table["status"].tolist() == ["diverged"]
    retired = tmp_path / "retired" / f"{table['run_id'][0]}.1"
    assert (retired / "summary.json").exists()


@pytest.mark.uncached
@pytest.mark.xdist_group("ray")  # one local Ray cluster at a time
@pytest.mark.slow
def test_ray_launcher_matches_local(grid, tmp_path, cache_dir):
    """Run by Ray, the grid gives the local launcher's table. The launcher does not depend on
    the sweep's mode: the IsoFLOP case this test also ran (118 s) was dropped on 2026-11-27."""
    ray = pytest.importorskip("ray")
    spec, _, local = grid
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        table = run_sweep(spec, tmp_path, launcher="ray", progress=False, cache_dir=cache_dir)
    finally:
        ray.shutdown()
    assert table["run_id"].tolist() == local["run_id"].tolist()
    assert table["status"].tolist() == local["status"].tolist()
    # The same programs in other processes: equal to float rounding amplified by training.
    # Under jax 0.10 they agreed to 1e-6; under jax 0.12.0.1 a Ray worker's isoflop run ended
    # 8.3e-5 (relative) from the local worker's (2026-11-26; the cause, presumably a summation
    # order that depends on the process's threads, was not established).
    np.testing.assert_allclose(table["final_val_loss"], local["final_val_loss"], rtol=3e-4)
    np.testing.assert_allclose(table["final_train_loss"], local["final_train_loss"], rtol=3e-4)


def _sweep_command(workdir, cache_dir):
    return [sys.executable, "-m", "attnlab.cli", "sweep", f"--config={GRID}",
            f"--sweep={workdir}", f"--cache-dir={cache_dir}", "--noprogress"]


def _interrupted_midway(workdir):
    """True once one run has completed and another has logged a validation (and so is saving
    a checkpoint) but not finished."""
    statuses = {d: results.run_status(d) for d in results.run_dirs(workdir)}
    if "completed" not in statuses.values():
        return False
    for run_dir, status in statuses.items():
        if status == "partial" and '"val_loss"' in _read(run_dir / "metrics.jsonl"):
            return True
    return False


def _read(path):
    try:
        return path.read_text()
    except OSError:
        return ""


@pytest.mark.uncached
@pytest.mark.slow
def test_sigkill_mid_sweep_loses_nothing_and_duplicates_nothing(grid, tmp_path, cache_dir):
    _, _, uninterrupted = grid
    workdir = tmp_path / "sweep"
    sweep = subprocess.Popen(_sweep_command(workdir, cache_dir), cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    deadline = time.time() + 240
    workers = []
    while time.time() < deadline and sweep.poll() is None:
        workers = psutil.Process(sweep.pid).children() or workers
        if _interrupted_midway(workdir):
            break
        time.sleep(0.02)
    assert sweep.poll() is None, "the sweep ended before it could be interrupted"
    completed_before = {d.name: (d / "summary.json").read_bytes()
                        for d in results.run_dirs(workdir)
                        if results.run_status(d) == "completed"}
    os.kill(sweep.pid, signal.SIGKILL)  # the sweep process only: its workers must follow
    sweep.wait()
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, "a worker outlived the killed sweep"

    rerun = subprocess.run(_sweep_command(workdir, cache_dir), cwd=ROOT, capture_output=True,
                           text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    table = results.load(workdir)
    assert set(table["status"]) == {"completed"}
    assert sorted(table["run_id"]) == sorted(uninterrupted["run_id"])
    assert sorted(p.name for p in (workdir / "runs").iterdir()) == sorted(table["run_id"])
    for name, summary in completed_before.items():  # finished runs were not touched
        assert (workdir / "runs" / name / "summary.json").read_bytes() == summary
    for run_dir in results.run_dirs(workdir):  # every step logged once
        records = [json.loads(line) for line in _read(run_dir / "metrics.jsonl").splitlines()]
        train_steps = [r["step"] for r in records if "loss" in r]
        assert train_steps == [1, 4, 8, 12, 16, 20, 24]
    # nothing lost: the same final losses as the uninterrupted sweep
    merged = table.merge(uninterrupted, on="run_id", suffixes=("", "_ref"))
    np.testing.assert_allclose(merged["final_val_loss"], merged["final_val_loss_ref"],
                               rtol=1e-5)


@pytest.mark.slow
def test_dry_run_probe_estimates_from_real_steps(grid):
    spec, workdir, table = grid
    from attnlab.sweep import dry_run

    planned, notes = dry_run(spec, workdir, probe="steps")
    assert planned["run_id"].tolist() == [r.run_id for r in plan(spec)]
    assert set(planned["status"]) == {"completed"}  # read from the finished sweep
    assert (planned["est_seconds"] > 0).all()
    # Each probed shape's runs are estimated at that probe's measured rate: their tokens plus
    # a third of their evaluation tokens, over the tokens/s the note prints. (Which shape runs
    # faster is left unasserted: at these sizes the step is overhead-bound and the order noisy.)
    rates = {m["shape"]: float(m["rate"].replace(",", "")) for m in (
        re.match(r"probe (?P<shape>d\d+-l\d+): (?P<rate>[\d,]+) tokens/s", n) for n in notes)
        if m}
    assert sorted(rates) == ["d16-l1", "d32-l2"]
    for run, (_, row) in zip(plan(spec), planned.iterrows()):
        t, d = run.cfg.train, run.cfg.data
        eval_tokens = -(-run.steps // t.eval_every) * t.eval_batches * d.batch_size * d.seq_len
        expected = (run.tokens + eval_tokens / 3) / rates[f"d{row.d_model}-l{row.n_layers}"]
        assert row.est_seconds == pytest.approx(expected, rel=1e-3)
    # the estimate is within a generous factor of the measured pure step time
    measured = (table["tokens"] / table["tokens_per_s"]).sum()
    assert 0.1 < planned["est_seconds"].sum() / measured < 10


@pytest.mark.slow
def test_a_crashed_worker_fails_only_its_run(tmp_path, cache_dir):
    command = _sweep_command(tmp_path, cache_dir) + ["--config.sweep.shapes=((16,1,2,1e-2),)"]
    sweep = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    deadline = time.time() + 240
    victim = None
    while time.time() < deadline and victim is None:
        started = [d for d in results.run_dirs(tmp_path) if (d / "train.log").exists()]
        workers = psutil.Process(sweep.pid).children()
        if started and workers:
            victim = started[0].name
            workers[0].kill()  # as the kernel's out-of-memory killer would
        time.sleep(0.05)
    out, err = sweep.communicate(timeout=600)
    assert sweep.returncode == 1, err
    table = results.load(tmp_path).set_index("run_id")
    assert table.loc[victim, "status"] == "failed"
    assert "killed by SIGKILL" in table.loc[victim, "error"]
    others = table.drop(index=victim)
    assert len(others) == 1 and set(others["status"]) == {"completed"}  # a fresh worker ran it


def seeds_spec(**sweep):
    """tiny_grid's smaller shape at three seeds (and what ``sweep`` adds): runs that one
    ensemble can train."""
    from ml_collections import ConfigDict

    config = cli_flags.parse([f"--config={GRID}"]).config
    config.sweep.shapes = ((16, 1, 2, 1e-2),)
    config.sweep.axes.model = ConfigDict({"pos_encoding": ("rope",)})
    config.sweep.axes.train = ConfigDict({"seed": (0, 1, 2)})
    for key, value in sweep.items():
        config.sweep[key] = value
    return spec_from_config_dict(config, source=GRID)


def test_an_ensembled_sweep_gives_the_table_of_lone_runs(tmp_path, cache_dir):
    spec = seeds_spec()
    # On a CPU 'auto' trains every run alone (ensembles were slower there); 'on' groups them.
    assert dry_run(spec, probe="none")[0]["unit"].tolist() == [0, 1, 2]
    table, notes = dry_run(spec, probe="none", ensemble="on", ensemble_max=8)
    assert table["unit"].tolist() == [0, 0, 0] and any("3 runs in 1 units" in n for n in notes)
    assert dry_run(spec, probe="none", ensemble="on",
                   ensemble_max=2)[0]["unit"].tolist() == [0, 0, 1]
    together = run_sweep(spec, tmp_path / "together", progress=False, cache_dir=cache_dir,
                         ensemble="on")
    alone = run_sweep(spec, tmp_path / "alone", progress=False, cache_dir=cache_dir,
                      ensemble_max=1)
    assert set(together["status"]) == {"completed"}
    exact = ["run_id", "status", "params", "tokens", "unique_tokens", "epochs"]
    pd.testing.assert_frame_equal(together[exact], alone[exact])
    # Float rounding of the batched matmuls only (measured: <= 1e-6 relative after 24 steps).
    np.testing.assert_allclose(together["final_val_loss"], alone["final_val_loss"], rtol=1e-5)
    np.testing.assert_allclose(together["final_train_loss"], alone["final_train_loss"],
                               rtol=1e-5)
    first, *others = sorted((tmp_path / "together" / "runs").iterdir())
    for other in others:
        assert "trained in an ensemble" in (other / "train.log").read_text()
    # Rerunning trains nothing; each member is a run of its own.
    before = mtimes(tmp_path / "together")
    run_sweep(spec, tmp_path / "together", progress=False, cache_dir=cache_dir)
    assert mtimes(tmp_path / "together") == before


@pytest.mark.slow
def test_a_run_whose_summary_says_failed_is_retrained_by_retry_failed(tmp_path):
    """A run can be recorded failed in its summary.json too (an error inside training, after
    the summary was written): --retry-failed moves that record aside as well, and the run
    resumes from its checkpoint and completes."""
    spec = single_run_spec()
    workdir = tmp_path / "sweep"
    assert run_sweep(spec, workdir, progress=False)["status"].tolist() == ["completed"]
    run_dir = workdir / "runs" / plan(spec)[0].run_id
    summary = json.loads((run_dir / "summary.json").read_text())
    summary.update(status="failed", error="RuntimeError: the device fell over")
    (run_dir / "summary.json").write_text(json.dumps(summary))
    assert run_sweep(spec, workdir, progress=False)["status"].tolist() == ["failed"]  # kept
    table = run_sweep(spec, workdir, progress=False, retry_failed=True)
    assert table["status"].tolist() == ["completed"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"


def test_a_dry_run_warns_of_the_runs_the_sweep_would_refuse_for_memory(tmp_path):
    spec = load_spec(GRID, ["sweep.shapes=((16,1,2,1e-2),(16384,96,128,1e-4))",
                            "sweep.axes.model.pos_encoding=('rope',)"])
    _, notes = dry_run(spec, tmp_path, probe="none")
    warned = [n for n in notes if "pass --allow-large" in n]
    assert len(warned) == 1 and warned[0].startswith("warning: run d16384-l96")


@pytest.mark.slow
def test_a_run_deleted_while_the_sweep_runs_is_counted_missing(tmp_path):
    """A run directory deleted mid-sweep (its run.json gone) is listed as missing in the
    table the sweep returns (`attnlab sweep` then exits 1), not left out of its count."""
    from attnlab.sweep.runner import with_missing

    spec = single_run_spec()
    workdir = tmp_path / "sweep"
    table = run_sweep(spec, workdir, progress=False)
    run_dir = workdir / "runs" / plan(spec)[0].run_id
    (run_dir / "run.json").unlink()  # as a deletion mid-run leaves it
    results.write_table(workdir)  # as the sweep does at its end
    listed = with_missing(results.load(workdir), [run_dir])
    assert listed["status"].tolist() == ["missing"] and "vanished" in listed["error"][0]
    assert with_missing(table, [run_dir]).equals(table)  # nothing missing: unchanged
