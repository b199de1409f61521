"""Output flags never clobber inputs (attnlab/outputs.py): a run's or sweep's own files are
refused whatever the flags, an existing file the command did not write needs --overwrite, a
figure flag takes figure names only, and writes are atomic."""

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from attnlab import cli, outputs  # noqa: E402

FLAGS = [(command, flag, figure) for command, flags in cli.OUTPUT_FLAGS.items()
         for flag, figure in flags.items()]


@pytest.fixture(autouse=True)
def _own_ledger(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def sweep_dir(tmp_path):
    """A sweep directory with one run, as a sweep leaves them (contents are placeholders:
    nothing is read, only protected)."""
    sweep = tmp_path / "sweep"
    run = sweep / "runs" / "d16-l1-s0-0123abcd"
    (run / "checkpoints" / "4").mkdir(parents=True)
    (run / "checkpoints" / "4" / "_CHECKPOINT_METADATA").write_text("{}")
    (run / "tensorboard").mkdir()
    for name in ("config.json", "summary.json", "run.json", "metrics.jsonl", "train.log"):
        (run / name).write_text(json.dumps({"name": name}))
    for name in ("sweep.json", "results.csv"):
        (sweep / name).write_text(name)
    return sweep


def _targets(sweep):
    run = next((sweep / "runs").iterdir())
    return [run / "config.json", run / "summary.json", run / "metrics.jsonl", run / "run.json",
            run / "checkpoints" / "4" / "_CHECKPOINT_METADATA", sweep / "sweep.json",
            sweep / "results.csv"]


@pytest.mark.parametrize("command, flag, figure", FLAGS, ids=[f"{c}--{f}" for c, f, _ in FLAGS])
def test_no_output_flag_overwrites_a_run_or_sweep_file(command, flag, figure, sweep_dir,
                                                       capsys):
    for target in _targets(sweep_dir):
        before = target.read_bytes()
        assert cli.main([command, f"--{flag}={target}", "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert f"--{flag}" in err and err.count("\n") == 1, err
        assert target.read_bytes() == before


@pytest.mark.parametrize("command, flag", [(c, f) for c, f, figure in FLAGS if figure])
def test_a_figure_flag_refuses_a_name_that_is_no_figure(command, flag, tmp_path, capsys):
    assert cli.main([command, f"--{flag}={tmp_path / 'maps.json'}"]) == 2
    assert ".png" in capsys.readouterr().err
    assert not (tmp_path / "maps.json").exists()


def test_a_file_the_command_did_not_write_needs_overwrite(tmp_path, capsys):
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": true}')
    assert cli.main(["env", f"--json={notes}"]) == 2
    assert "did not write it" in capsys.readouterr().err
    assert json.loads(notes.read_text()) == {"mine": True}
    assert cli.main(["env", f"--json={notes}", "--overwrite"]) == 0
    assert "versions" in json.loads(notes.read_text())
    # written by env now: rewriting it needs no flag, but another command may not
    assert cli.main(["env", f"--json={notes}"]) == 0
    assert cli.main(["compare", f"--json={notes}", "--sweep=x", "--by=y"]) == 2
    assert "attnlab compare did not write it" in capsys.readouterr().err
    # a file changed since env wrote it is someone else's again
    notes.write_text("edited")
    assert cli.main(["env", f"--json={notes}"]) == 2


def test_a_failed_figure_write_leaves_the_old_figure_whole(tmp_path):
    path = tmp_path / "loss.png"
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3])
    outputs.save_figure(fig, path)
    before = path.read_bytes()

    def full_disk(target, **kwargs):
        with open(target, "wb") as handle:
            handle.write(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    fig.savefig = full_disk
    with pytest.raises(OSError):
        outputs.save_figure(fig, path)
    plt.close(fig)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["loss.png"]  # no temporary left
