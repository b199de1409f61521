"""Reliability regressions outside the errors table: a model's build is linear in its depth (and
draws the same parameters as ``nnx.Rngs``), damaged-checkpoint messages carry no TensorStore
internals, the workdir probes leave nothing behind and ``allow_nonempty`` lets a directory of
someone else's files be used."""

import json
import gc
import time

import jax
import numpy as np
import pytest
from flax import nnx

from attnlab.cli_flags import parse
from attnlab.config import from_config_dict
from attnlab.model import build_model, init_model
from attnlab.rundir import WorkdirError, check_can_create_dir, check_can_write_file
from attnlab.train.checkpoint import describe_error
from attnlab.train.state import abstract_model

TINY = "configs/tiny.py"


def _cfg(*overrides):
    return from_config_dict(parse([f"--config={TINY}", *overrides]).config)


@pytest.mark.parametrize("seed", [0, 7])
def test_param_keys_draw_what_nnx_rngs_draws(seed):
    """init_model's Python-counted keys give the model nnx.Rngs(params=seed) gives, bit for bit
    (checkpoints and seeds written before keep their meaning); a typed key works as well."""
    cfg = _cfg("--config.model.linear_bias=True").model  # biases draw keys too
    _, ours = init_model(cfg, seed)
    _, theirs = nnx.split(build_model(cfg, nnx.Rngs(params=seed)))
    _, keyed = init_model(cfg, jax.random.key(seed))
    for a, b, c in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), jax.tree.leaves(keyed)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_array_equal(np.asarray(a), np.asarray(c))


def test_building_the_abstract_model_is_linear_in_depth():
    """Was quadratic or worse (every draw of nnx.Rngs under eval_shape walked the whole trace):
    100 layers took 4 s, 200 layers 29 s, 400 layers 290 s. Four times the depth must cost well
    under the 16x of a quadratic build (linear gives 4.2x on a quiet machine). A ratio, not a
    time; the best of three interleaved builds each, so a burst of load on a shared machine
    does not fail it (25 layers is too short to measure: fixed costs make 25 -> 50 cost 3x).
    Python's garbage collector is off while timing: its passes over the heap of a test worker
    that has run hundreds of tests made 50 -> 200 layers cost 4x-9.5x from run to run (4.0x
    steady without them), and it is the build's own cost this measures."""
    def seconds(n_layers):
        cfg = _cfg(f"--config.model.n_layers={n_layers}")
        start = time.perf_counter()
        abstract_model(cfg)
        return time.perf_counter() - start

    seconds(4)  # imports and caches warmed
    gc.collect()
    gc.disable()
    try:
        rounds = [(seconds(50), seconds(200)) for _ in range(3)]
    finally:
        gc.enable()
    shallow, deep = min(r[0] for r in rounds), min(r[1] for r in rounds)
    assert deep / shallow < 9, rounds


def test_damaged_checkpoint_messages_drop_tensorstore_internals():
    """The shape of TensorStore's read errors (driver chain, JSON specs, file names) and of
    orbax's appended repr; what is left names the array and the fault."""
    spec = "'{\\\"driver\\\":\\\"zarr\\\",\\\"kvstore\\\":{\\\"path\\\":\\\"/r/c/20/params/\\\"}}'"
    error = ValueError(
        'OUT_OF_RANGE: Error opening "cast" driver: Error opening "zarr" driver: Error reading '
        '"token_embedding.value/.zarray" in OCDBT database at local file "/r/c/20/params/": '
        'Requested byte range [0, 1839) is not valid for value of size 100 '
        f"[tensorstore_spec={spec}] [tensorstore_spec[1]={spec}]. See full TensorStore details: "
        "<bound method pybind11_detail_function_record_v1_system_libstdcpp_gxx_abi_1xxx."
        "__repr__ of <tensorstore.TensorStore object at 0x7f>>")
    text = describe_error(error)
    assert text == ('ValueError: OUT_OF_RANGE: Error reading "token_embedding.value/.zarray": '
                    "Requested byte range [0, 1839) is not valid for value of size 100"), text
    assert describe_error(KeyError()) == "KeyError"


def test_probes_leave_nothing_behind(tmp_path):
    (tmp_path / "existing").mkdir()
    (tmp_path / "file.json").write_text("{}")
    check_can_create_dir(tmp_path / "new" / "deeper", "--run")
    check_can_create_dir(tmp_path / "existing", "--run")
    check_can_write_file(tmp_path / "out.png", "--plot")
    check_can_write_file(tmp_path / "file.json", "--json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing", "file.json"]
    assert not any((tmp_path / "existing").iterdir())
    assert (tmp_path / "file.json").read_text() == "{}"
    with pytest.raises(WorkdirError, match="exists and is not a directory"):
        check_can_create_dir(tmp_path / "file.json", "--run")


def test_allow_nonempty_uses_a_directory_of_other_files(tmp_path):
    from attnlab.sweep.runner import SweepDirError, check_sweep_dir
    from attnlab.train.workdir import check_workdir

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    cfg = _cfg()
    with pytest.raises(WorkdirError, match="--allow-nonempty"):
        check_workdir(mine, cfg)
    assert check_workdir(mine, cfg, allow_nonempty=True) is None
    with pytest.raises(SweepDirError, match="--allow-nonempty"):
        check_sweep_dir(mine, "tiny_grid")
    check_sweep_dir(mine, "tiny_grid", allow_nonempty=True)
    # A file of the user's that shares a name with attnlab's does not make it a run or a sweep
    # (it would be overwritten); the file a command writes first does.
    (mine / "results.csv").write_text("a,b\n1,2\n")
    with pytest.raises(SweepDirError, match="--allow-nonempty"):
        check_sweep_dir(mine, "tiny_grid")
    (mine / "jax_cache").mkdir()  # what a dry run's probe leaves
    with pytest.raises(SweepDirError, match="--allow-nonempty"):
        check_sweep_dir(mine, "tiny_grid")
    (mine / ".sweep.lock").write_text("")
    check_sweep_dir(mine, "tiny_grid")
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text('{"mine": 1}')
    with pytest.raises(WorkdirError, match="--allow-nonempty"):
        check_workdir(run, cfg)
    (run / "summary.json").unlink()
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))  # a run killed after its start
    (run / "notes.txt").write_text("x")
    assert check_workdir(run, cfg) is None
    cache = tmp_path / "cache_only"
    (cache / "jax_cache").mkdir(parents=True)  # a dry run on a new directory: a sweep's own
    check_sweep_dir(cache, "tiny_grid")


@pytest.mark.parametrize("error", [
    OSError(28, "No space left on device", "/full/fit.json"),
    OSError(30, "Read-only file system", "/ro/run/extrapolation.json"),
    FileNotFoundError(2, "No such file or directory", "/proc/.rel_hf.tmp"),
], ids=["ENOSPC", "EROFS", "ENOENT"])
def test_an_os_error_from_any_command_is_one_line(error, monkeypatch, capsys):
    """A full disk, a read-only file system, a pseudo file system: one line naming the file
    and exit 2, from whichever command met it (here `env`, made to meet it)."""
    from attnlab import cli
    from attnlab.train import cli as train_cli

    def fails(argv):
        raise error

    monkeypatch.setattr(train_cli, "env_main", fails)
    assert cli.main(["env"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert error.filename in lines[0] and error.strerror in lines[0], lines


def test_an_out_of_memory_under_allow_large_is_one_line_and_a_recorded_failure(tmp_path,
                                                                                capsys):
    """--allow-large skips the estimate; XLA then refuses the allocation: one line with the
    size, and the run's summary records the failure (not a traceback)."""
    import json

    from attnlab import cli

    workdir = tmp_path / "run"
    assert cli.main(["train", f"--config={TINY}", "--noprogress", "--allow-large",
                     "--config.model.d_model=1000000", f"--run={workdir}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: out of memory: ") and "bytes" in err[-1]
    assert "Traceback" not in "\n".join(err)
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["status"] == "failed" and "Out of memory" in summary["error"]


def test_coord_check_refuses_widths_beyond_the_machine_before_allocating(capsys):
    from attnlab import cli

    assert cli.main(["coord-check", f"--config={TINY}", "--steps=2",
                     "--widths=1000000,2000000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --widths: training d_model=2000000") and err.count("\n") == 1
