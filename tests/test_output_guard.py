"""The output guard sees every spelling absl reads, and special files are never opened, replaced
or waited on. Each case is a command a user ran (../shared/notes/bad-inputs.md, 2026-12-01):
one line naming the flag or file, exit 2, and nothing written outside what the command created.
"""

import os
import pathlib

import pytest

from attnlab import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
TABLE = str(ROOT / "docs" / "results" / "quickstart_cpu.csv")
FIT = ["fit", f"--sweep={TABLE}", "--law=kaplan", "--bootstrap=0"]


@pytest.fixture
def place(tmp_path):
    """A run's directory (config.json, summary.json), a sweep's results table, a user's file."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"kept": 1}')
    (run / "summary.json").write_text('{"status": "completed"}')
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text("{}")
    (sweep / "results.csv").write_text("run_id\nx\n")
    (tmp_path / "user.json").write_text("mine")
    return tmp_path


def _contents(root: pathlib.Path) -> dict:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _refused(argv, capsys, *needles):
    code = cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    for needle in needles:
        assert needle in err[0], err
    return err[0]


@pytest.mark.parametrize("spelling", ["-json={}", "-json {}", "--json {}"])
def test_every_spelling_of_json_is_checked(place, capsys, spelling):
    before = _contents(place)
    argv = FIT + spelling.format(place / "run" / "config.json").split(" ")
    _refused(argv, capsys, "is a file of the run")
    assert _contents(place) == before


def test_a_flagfile_is_read_before_the_check(place, capsys):
    flags = place / "out.flags"
    flags.write_text(f"--json={place / 'run' / 'config.json'}\n")
    before = _contents(place)
    _refused(FIT + [f"--flagfile={flags}"], capsys, "is a file of the run")
    assert _contents(place) == before
    _refused(FIT + [f"--flagfile={place / 'none.flags'}"], capsys, "--flagfile")


def test_one_dash_does_not_replace_a_users_file_or_a_sweeps_table(place, capsys):
    before = _contents(place)
    _refused(FIT + [f"-json={place / 'user.json'}"], capsys, "--overwrite")
    _refused(FIT + [f"-json={place / 'sweep' / 'results.csv'}"], capsys, "file of the sweep")
    assert _contents(place) == before


def test_a_fifo_is_refused_without_being_opened(place, capsys):
    fifo = place / "pipe.json"
    os.mkfifo(fifo)  # opening it for writing would wait for a reader forever
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so that a regression fails, not hangs
    try:
        _refused(FIT + [f"--json={fifo}"], capsys, "named pipe")
        _refused(FIT + [f"--json={fifo}", "--overwrite"], capsys, "named pipe")
    finally:
        os.close(reader)
    assert fifo.is_fifo()


def test_a_device_is_never_replaced_and_the_null_device_is_a_sink(place, capsys):
    code = cli.main(FIT + ["--json=/dev/null"])
    captured = capsys.readouterr()
    assert code == 0 and "null device: the output is discarded" in captured.err
    assert pathlib.Path("/dev/null").is_char_device()
    if os.geteuid() == 0:  # a copy of /dev/null's node: only root may make one
        node = place / "node"
        os.mknod(node, 0o666 | 0o020000, os.makedev(1, 3))
        _refused(FIT + [f"--json={node}", "--overwrite"], capsys, "is a device")
        assert node.is_char_device()


def test_two_outputs_on_one_file_are_refused(place, capsys):
    out = place / "both.png"
    _refused(["coord-check", "--config=configs/tiny.py", "--widths=32,64", f"--plot={out}",
              f"--json={out}"], capsys, "--json and --plot both name")
    assert not out.exists()


@pytest.mark.parametrize("argv, needle", [
    (["train", f"--config={ROOT / 'configs' / 'tiny.py'}", "--workdir=A", "--run=B"],
     "--workdir and --run both given"),
    (FIT[:1] + [f"--results={TABLE}"] + FIT[1:], "--results and --sweep both given"),
    (FIT + ["--seed=3", "--bootstrap-seed=4"], "--seed and --bootstrap-seed both given"),
])
def test_a_former_and_a_current_spelling_together_are_refused(argv, needle, capsys, tmp_path,
                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    _refused(argv, capsys, needle)
    assert not (tmp_path / "A").exists() and not (tmp_path / "B").exists()


def test_an_output_under_a_file_names_the_file(place, capsys):
    (place / "afile").write_text("x")
    _refused(FIT + [f"--json={place / 'afile' / 'x.json'}"], capsys, "is a file, not a directory")


@pytest.mark.parametrize("flag, needle", [
    ("--widths=abc", "--widths: expected comma-separated integers"),
    ("--steps=0", "--steps must be >= 1"), ("--seeds=0", "--seeds must be >= 1")])
def test_coord_check_names_its_own_flags(flag, needle, capsys):
    argv = ["coord-check", "--config=configs/tiny.py", "--widths=32,64", flag]
    line = _refused(argv, capsys, needle)
    assert "config.--" not in line


def test_import_hf_names_a_missing_or_file_source(tmp_path, capsys):
    _refused(["import-hf", f"--from={tmp_path / 'none'}", f"--run={tmp_path / 'r'}"], capsys,
             "no such directory")
    (tmp_path / "afile").write_text("x")
    _refused(["import-hf", f"--from={tmp_path / 'afile'}", f"--run={tmp_path / 'r'}"], capsys,
             "is a file; give the checkpoint's directory")


def test_messages_name_what_the_user_wrote(tmp_path, capsys):
    table = tmp_path / "nan.csv"
    table.write_text("params,tokens,loss\n1e4,1e6,\n2e4,1e6,\n4e4,1e6,\n")
    line = _refused(["fit", f"--sweep={table}", "--law=kaplan", "--bootstrap=0"], capsys,
                    "holds no value in any row")
    assert "missing column" not in line
    plain = tmp_path / "plain.csv"
    plain.write_text("params,tokens,loss\n" + "".join(
        f"{n},{d},{1.7 + 400 / n ** 0.34 + 400 / d ** 0.28}\n"
        for n in (1e4, 3e4, 1e5) for d in (1e6, 3e6, 1e7)))
    line = _refused(["fit", f"--sweep={plain}", "--law=chinchilla", "--bootstrap=0",
                     "--best-over=train.learning_rate"], capsys, "is not in the results table")
    assert "_fit" not in line and "_score" not in line


def test_an_os_error_without_errno_still_says_what_failed():
    assert cli._one_line(OSError("1024 requested and 0 written")) == "1024 requested and 0 written"


def _runs(path, rows):
    path.write_text(rows)
    return str(path)


def test_laws_refuse_an_axis_the_table_does_not_vary(tmp_path, capsys):
    """One tokens-per-parameter ratio cannot place M* (the over-training law printed M_opt 1742.8
    and a penalty of 4.48 from such a table); one batch size cannot place batch*."""
    one_ratio = _runs(tmp_path / "m.csv", "params,tokens,loss\n" + "".join(
        f"{n:.0f},{20 * n:.0f},{1.7 + 400 / n ** 0.3 + 400 / (20 * n) ** 0.3}\n"
        for n in (1e4, 2e4, 4e4, 8e4, 1.6e5, 3.2e5, 6.4e5, 1.28e6)))
    _refused(["fit", f"--sweep={one_ratio}", "--law=overtrain", "--bootstrap=0"], capsys,
             "every run has D/N = 20", "determines neither a, b nor M*")
    grid = "".join(f"{n:.0f},{d:.0f},{lr},512,{2 + (lr - 0.01) ** 2 + 1 / n}\n"
                   for n in (1e4, 3e4, 1e5) for d in (1e6, 3e6) for lr in (0.003, 0.01, 0.03))
    one_batch = _runs(tmp_path / "b.csv", "params,tokens,lr,batch,loss\n" + grid)
    _refused(["fit", f"--sweep={one_batch}", "--law=hparams", "--bootstrap=0"], capsys,
             "every run has batch = 512", "cannot place batch*")


def test_compare_says_why_its_intervals_are_nan(tmp_path, capsys):
    rows = "".join(f"{arm},{n},0,{2.0 + (arm == 'wsd') * 0.01 + n * 1e-6}\n"
                   for arm in ("cosine", "wsd") for n in (1, 2, 3))
    table = _runs(tmp_path / "c.csv", "schedule,params,train.seed,final_val_loss\n" + rows)
    code = cli.main(["compare", f"--sweep={table}", "--by=schedule", "--baseline=cosine",
                     "--match=params", "--pair=train.seed"])
    out = capsys.readouterr().out
    assert code == 0 and "intervals are NaN: a point with one train.seed value" in out, out


def test_an_override_without_its_config_file_says_so(tmp_path, capsys):
    _refused(["import-hf", f"--from={tmp_path}", "--config.model.d_model=64",
              f"--run={tmp_path / 'r'}"], capsys, "--config.model.* cannot be set")
    line = _refused(["import-hf", f"--from={tmp_path}", "--config.train.steps=64",
                     f"--run={tmp_path / 'r'}"], capsys, "give --config=FILE with it")
    assert "Unknown command line flag" not in line
