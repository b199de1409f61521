"""attnlab.rundir: the on-disk names, atomic writes under concurrent writers, tolerant reads."""

import errno
import json
import multiprocessing
import os

import pytest

from attnlab import rundir
from attnlab.errors import AttnlabError


def test_file_names_are_the_on_disk_format():
    # Existing run and sweep directories are found by these names: changing one orphans them.
    assert (rundir.CONFIG_FILE, rundir.METRICS_FILE, rundir.SUMMARY_FILE, rundir.RUN_FILE,
            rundir.FAILURE_FILE, rundir.RETRIED_FAILURE_FILE.format(time="T"),
            rundir.CHECKPOINT_DIR, rundir.TENSORBOARD_DIR, rundir.LOG_FILE, rundir.LOCK_FILE) == (
        "config.json", "metrics.jsonl", "summary.json", "run.json", "failure.json",
        "failure-T.json", "checkpoints", "tensorboard", "train.log", ".lock")
    assert (rundir.RUNS_DIR, rundir.SWEEP_FILE, rundir.TABLE_FILE, rundir.CSV_FILE,
            rundir.JAX_CACHE_DIR, rundir.LOGS_DIR, rundir.RETIRED_DIR) == (
        "runs", "sweep.json", "results.parquet", "results.csv", "jax_cache", "logs", "retired")
    assert rundir.SUMMARY_STATUSES == ("running", "completed", "diverged", "failed")
    assert rundir.FINAL_STATUSES == ("completed", "diverged", "failed")


def test_the_compilation_cache_is_the_flag_then_jaxs_own_then_the_sweeps(tmp_path, monkeypatch):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    assert rundir.compilation_cache_dir(tmp_path) == tmp_path / "jax_cache"
    assert rundir.compilation_cache_dir(None) is None
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "shared"))
    assert rundir.compilation_cache_dir(tmp_path) == tmp_path / "shared"
    assert rundir.compilation_cache_dir(None) == tmp_path / "shared"
    assert rundir.compilation_cache_dir(tmp_path, tmp_path / "given") == tmp_path / "given"


def _write_many(path: str, writer: int, times: int) -> None:
    for i in range(times):
        # Large enough that a torn read or a shared temporary would show.
        rundir.write_json_atomic(path, {"writer": writer, "i": i, "pad": "x" * 200_000})


def test_concurrent_writers_never_tear_or_collide(tmp_path):
    """Two processes rewrite one file while it is read: every read is one whole version, no
    writer fails (with a shared temporary name, one writer's os.replace finds it gone), and no
    temporary is left behind."""
    target = tmp_path / "summary.json"
    rundir.write_json_atomic(target, {"writer": -1, "i": 0, "pad": ""})
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_write_many, args=(str(target), w, 40)) for w in (0, 1)]
    for process in writers:
        process.start()
    reads = 0
    while any(p.is_alive() for p in writers):
        record = json.loads(target.read_text())  # raises on a torn file
        assert record["writer"] in (-1, 0, 1)
        reads += 1
    for process in writers:
        process.join()
    assert [p.exitcode for p in writers] == [0, 0]
    assert json.loads(target.read_text())["i"] == 39
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
    assert reads > 0


def test_written_files_get_ordinary_permissions(tmp_path):
    # Tables and summaries are read by other users and tools (not private temporaries).
    reference = tmp_path / "plain.txt"
    reference.write_text("x")
    rundir.write_text_atomic(tmp_path / "results.csv", "x")
    assert (tmp_path / "results.csv").stat().st_mode == reference.stat().st_mode


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "results.csv"
    rundir.write_text_atomic(target, "old\n")
    with pytest.raises(RuntimeError):
        with rundir.atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("writer died")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv"]


def test_a_full_disk_names_the_file_asked_for_not_the_temporary(tmp_path):
    # A write that runs out of space raises an OSError with no file name; the one error line
    # the commands print must still say which file could not be written.
    target = tmp_path / "fit.json"
    target.write_text("old\n")
    with pytest.raises(OSError) as caught:
        with rundir.atomic_path(target) as tmp:
            tmp.write_text("half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(target)
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit.json"]
    # An error about another file keeps its own name.
    other = tmp_path / "elsewhere" / "x"
    with pytest.raises(FileNotFoundError) as caught:
        with rundir.atomic_path(target):
            other.read_text()
    assert caught.value.filename == str(other)


def test_reads_say_what_missing_or_partial_means(tmp_path):
    partial = tmp_path / "run.json"
    partial.write_text('{"run_id": "d16-')
    missing = tmp_path / "summary.json"
    assert rundir.read_json_or_none(partial) is None
    assert rundir.read_json_or_none(missing) is None
    for path in (partial, missing):
        with pytest.raises(rundir.WorkdirError, match=f"cannot read {path}") as info:
            rundir.read_json(path)
        assert isinstance(info.value, AttnlabError)  # the CLI prints it as one error line
    rundir.write_json_atomic(partial, {"run_id": "x", "loss": float("nan")})
    assert rundir.read_json(partial)["run_id"] == "x"


def test_metrics_lines_cut_short_are_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert rundir.read_metrics(path) == []
    path.write_text('{"step": 1, "loss": 3}\n"not a record"\n{"val_loss": 2}\n{"step": 2, "lo')
    assert rundir.read_metrics(path) == [{"step": 1, "loss": 3}]


def test_run_status_from_the_files(tmp_path):
    run = tmp_path / "run"
    assert rundir.run_status(run) == "pending"  # not even created yet
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    assert rundir.run_status(run) == "partial"
    rundir.write_json_atomic(run / "summary.json", {"status": "failed",
                                                    "error": "SystemExit: 1"})
    assert rundir.run_status(run) == "partial"  # interrupted, not broken
    rundir.write_json_atomic(run / "summary.json", {"status": "completed"})
    assert rundir.run_status(run) == "completed"


def test_a_killed_writers_temporaries_are_removed_and_nothing_else(tmp_path):
    """SIGKILL between an atomic write's temporary and its rename leaves the temporary: the
    next holder of the directory's lock removes it (and only such files)."""
    from attnlab.rundir import atomic_path, remove_stale_temporaries
    from attnlab.worker import _run_lock

    target = tmp_path / "summary.json"
    target.write_text("{}")
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            left = tmp.with_name(tmp.name.replace(tmp.name.split(".")[-2], "ab" * 16))
            tmp.rename(left)  # as a kill would leave it: cleanup cannot find it
            raise KeyboardInterrupt
    kept = [tmp_path / ".notes.tmp", tmp_path / "x.json.tmp", target]
    for path in kept[:2]:
        path.write_text("mine")
    with _run_lock(tmp_path) as held:
        assert held and not left.exists()
    assert all(p.exists() for p in kept) and remove_stale_temporaries(tmp_path) == []
