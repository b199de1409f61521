"""The whole study on experiments/tiny_pe.py: real sweep runs, evaluation, table, plots, report,
and resuming without redoing finished work."""

import pytest

from attnlab import cli
from attnlab.extrapolation import EvalSettings, run_study
from attnlab.sweep import load_spec

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def spec_with(data_dir, *encodings):
    overrides = [f"base.data.cache_dir={data_dir}"]
    if encodings:
        overrides.append(f"sweep.axes.model.pos_encoding={tuple(encodings)!r}")
    return load_spec("experiments/tiny_pe.py", overrides)


@pytest.mark.slow  # ~15 s alone, 40 s on a loaded 2-core machine: two sweep workers start JAX
def test_study_evaluates_every_run_and_resumes_without_redoing_work(tmp_path):
    workdir = tmp_path / "study"
    spec = spec_with(tmp_path / "data", "rope", "learned")
    settings = EvalSettings(multipliers=(1, 2, 4))
    study = run_study(spec, workdir, settings, progress=False)

    table = study.table
    assert len(table) == 2 * 3 and set(table["pos_encoding"]) == {"rope", "learned"}
    learned = table[table["pos_encoding"] == "learned"].set_index("length")
    assert learned.loc[32, "status"] == "ok"  # max_len = 32 = L_train
    assert (learned.loc[[64, 128], "status"] == "not_applicable").all()
    rope = table[table["pos_encoding"] == "rope"].set_index("length")
    assert (rope["status"] == "ok").all() and rope.loc[32, "ppl_ratio"] == 1.0
    assert table.groupby("run_id")["n_scored"].max().nunique() == 1  # same tokens for every run
    assert set(study.curves.groupby("pos_encoding")["position"].max()) == {31, 127}

    names = {p.name for p in study.files}
    for stem in ("extrapolation_ratio", "extrapolation_positions"):
        assert {f"{stem}.png", f"{stem}.pdf"} <= names
        assert (workdir / f"{stem}.png").read_bytes().startswith(PNG_MAGIC)
        assert (workdir / f"{stem}.pdf").read_bytes().startswith(b"%PDF")
    report = (workdir / "extrapolation_report.md").read_text()
    assert "| learned | 1 | n/a | n/a |" in report and "## Checks" in report

    # Rerunning trains nothing and re-evaluates nothing: every report is current.
    stamps = {p: p.stat().st_mtime_ns for p in workdir.glob("runs/*/extrapolation.json")}
    checkpoints = sorted(p.name for p in workdir.glob("runs/*/checkpoints/*"))
    again = run_study(spec, workdir, settings, progress=False)
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps and len(stamps) == 2
    assert sorted(p.name for p in workdir.glob("runs/*/checkpoints/*")) == checkpoints
    assert again.table.equals(table)


@pytest.mark.slow
def test_command_runs_the_five_encoding_study(tmp_path, capsys):
    code = cli.main(["extrapolate", "--config=experiments/tiny_pe.py",
                     f"--sweep={tmp_path / 'study'}", "--multipliers=1,2,4", "--noprogress",
                     f"--config.base.data.cache_dir={tmp_path / 'data'}"])
    out = capsys.readouterr().out
    assert code in (0, 1)  # 1: red flags, which 8-step models may well raise
    for encoding in ("none", "sinusoidal", "learned", "rope", "alibi"):
        assert encoding in out
    assert (tmp_path / "study" / "extrapolation.csv").exists()


@pytest.mark.slow
def test_study_compares_rope_rescalings_and_windows(tmp_path):
    spec = load_spec("experiments/tiny_pe.py", [
        f"base.data.cache_dir={tmp_path / 'data'}", "sweep.axes.model.pos_encoding=('rope', 't5')",
        "sweep.axes.model.attention_window=(0, 8)"])
    study = run_study(spec, tmp_path / "study", EvalSettings(multipliers=(1, 2),
                                                             rope_scaling="all"), progress=False)
    labels = set(study.table["pos_encoding"])
    assert labels == {"rope", "rope+ntk", "rope+pi", "rope+yarn", "rope+w8", "rope+w8+ntk",
                      "rope+w8+pi", "rope+w8+yarn", "t5", "t5+w8"}
    assert (study.table["status"] == "ok").all()
    assert (tmp_path / "study" / "extrapolation-rope_all_report.md").exists() or any(
        "rope_all" in p.name for p in study.files)
