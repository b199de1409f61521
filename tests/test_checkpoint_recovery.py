"""A damaged checkpoint (truncated array files, a corrupt record) with real orbax checkpoints:
resuming falls back to the newest intact step and says so in one line, the damaged step is
moved aside (``checkpoints/corrupt-<step>``), never deleted, and the resumed run ends with the
same parameters as the undamaged one; ``generate`` / ``extrapolate --force`` on it print one line
and exit 2."""

import asyncio
import gc
import hashlib
import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from attnlab.config import from_config_dict
from attnlab.train import load_params, run
from attnlab.train import checkpoint as _checkpoint  # noqa: F401 - installs its log filters

# No signals or timings (a kill is simulated by copying the run): the slow lane runs these two
# at a time, with the shared compilation cache.

ROOT = pathlib.Path(__file__).resolve().parents[1]
OVERRIDES = {"train.steps": 20, "train.checkpoint_every": 10, "train.keep_checkpoints": 3}


def _config():
    import configs.tiny

    config = configs.tiny.get_config()
    for key, value in OVERRIDES.items():
        section, field = key.split(".")
        setattr(config[section], field, value)
    return from_config_dict(config)


def _cli(*argv, timeout=300):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "attnlab.cli", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _train_argv(workdir):
    return ["train", "--config=configs/tiny.py", f"--run={workdir}", "--noprogress",
            *(f"--config.{k}={v}" for k, v in OVERRIDES.items())]


def _tree_hash(directory: pathlib.Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 20-step run with checkpoints at 10 and 20, and its final parameters."""
    workdir = tmp_path_factory.mktemp("trained") / "run"
    summary = run(_config(), workdir, progress=False)
    assert summary["status"] == "completed"
    _, _, params = load_params(workdir)
    return workdir, jax.device_get(params), summary


def _killed_copy(trained, tmp_path) -> pathlib.Path:
    """The run as a kill after its last checkpoint leaves it: summary status 'running'."""
    workdir = tmp_path / "run"
    shutil.copytree(trained[0], workdir)
    summary = json.loads((workdir / "summary.json").read_text())
    summary["status"] = "running"
    (workdir / "summary.json").write_text(json.dumps(summary))
    return workdir


def _truncate_arrays(step_dir: pathlib.Path) -> None:
    for path in step_dir.rglob("*"):
        if path.is_file() and path.parent.name == "d":  # OCDBT data files
            data = path.read_bytes()
            path.write_bytes(data[: len(data) // 2])


def _garble_record(step_dir: pathlib.Path) -> None:
    (step_dir / "meta" / "metadata").write_text('{"step": 20, "format": 1, "param_sh')


def _empty_arrays(step_dir: pathlib.Path) -> None:
    for path in (step_dir / "params").rglob("*"):
        if path.is_file():
            path.write_bytes(b"")


DAMAGE = {"truncated arrays": _truncate_arrays, "cut-short record": _garble_record,
          "emptied parameter files": _empty_arrays}


@pytest.mark.slow
@pytest.mark.parametrize("damage", DAMAGE)
def test_resume_falls_back_to_the_newest_intact_checkpoint(trained, tmp_path, damage):
    workdir = _killed_copy(trained, tmp_path)
    step_dir = workdir / "checkpoints" / "20"
    DAMAGE[damage](step_dir)
    damaged = _tree_hash(step_dir)

    result = _cli(*_train_argv(workdir))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "never retrieved" not in result.stderr, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if "damaged" in line]
    assert len(said) == 1, result.stderr
    assert "step 20" in said[0] and "corrupt-20" in said[0] and "from step 10" in said[0]
    # kept aside, byte for byte; a fresh step 20 written by the resumed run
    aside = workdir / "checkpoints" / "corrupt-20"
    assert _tree_hash(aside) == damaged
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["10", "20",
                                                                           "corrupt-20"]
    # steps 11-20 redone: the same parameters, bit for bit, and the same result
    _, _, params = load_params(workdir)
    for want, got in zip(jax.tree.leaves(trained[1]), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(want), np.asarray(got))
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["final_val_loss"] == trained[2]["final_val_loss"]
    assert any("corrupt-20" in w for w in summary["warnings"])
    steps = [r["step"] for r in map(json.loads, (workdir / "metrics.jsonl").read_text()
                                    .splitlines()) if "loss" in r]
    assert steps == sorted(set(steps)), "a step was logged twice"


@pytest.mark.slow
def test_every_checkpoint_damaged_starts_over_and_keeps_them_all(trained, tmp_path):
    workdir = _killed_copy(trained, tmp_path)
    for step in ("10", "20"):
        _truncate_arrays(workdir / "checkpoints" / step)
    result = _cli(*_train_argv(workdir))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "never retrieved" not in result.stderr, result.stderr[-3000:]
    # attnlab's own lines (orbax may also log its failed reads, which name this test's
    # directory, ".../test_every_checkpoint_damaged_0/...")
    said = [line for line in result.stderr.splitlines()
            if line.startswith("warning: checkpoint step") and "is damaged" in line]
    assert len(said) == 2 and "starting from step 0" in said[1], result.stderr
    assert {"corrupt-10", "corrupt-20"} <= {p.name for p in (workdir / "checkpoints").iterdir()}
    _, _, params = load_params(workdir)
    for want, got in zip(jax.tree.leaves(trained[1]), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(want), np.asarray(got))


@pytest.mark.slow
def test_generate_and_extrapolate_on_a_damaged_checkpoint_say_one_line(trained, tmp_path):
    workdir = _killed_copy(trained, tmp_path)
    _truncate_arrays(workdir / "checkpoints" / "20")
    before = _tree_hash(workdir)
    for argv in (["generate", f"--run={workdir}", "--prompt=def ", "--max-new-tokens=4"],
                 ["extrapolate", f"--run={workdir}", "--force", "--lengths=32",
                  "--noprogress"]):
        result = _cli(*argv)
        assert result.returncode == 2, (argv, result.stderr[-3000:])
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, result.stderr)
        assert "checkpoints/20" in lines[0] and "--step=10" in lines[0]
        assert not any(noise in lines[0] for noise in ("tensorstore_spec", "TensorStore details",
                                                       "bound method", "local file")), lines[0]
    assert _tree_hash(workdir) == before  # reading never moves or rewrites anything
    ok = _cli("generate", f"--run={workdir}", "--prompt=def ", "--max-new-tokens=4", "--step=10")
    assert ok.returncode == 0, ok.stderr[-3000:]


def test_damaged_record_is_a_damaged_checkpoint_error(trained, tmp_path):
    """In-process: load_params names the step and offers the older one."""
    from attnlab.train.checkpoint import DamagedCheckpointError

    workdir = _killed_copy(trained, tmp_path)
    _garble_record(workdir / "checkpoints" / "20")
    with pytest.raises(DamagedCheckpointError, match=r"checkpoints/20.*--step=10"):
        load_params(workdir)
    cfg, _, params = load_params(workdir, 10)
    assert cfg.train.steps == 20 and jax.tree.leaves(params)


@pytest.mark.slow
def test_extrapolate_does_not_serve_a_report_of_a_checkpoint_that_changed(trained, tmp_path):
    """A cached extrapolation report is reused only while its checkpoint's files are unchanged;
    once the checkpoint is damaged, `extrapolate` (without --force) re-reads it and exits 2."""
    from attnlab.extrapolation import evaluate as ev

    workdir = _killed_copy(trained, tmp_path)
    settings = ev.EvalSettings(multipliers=(1,), max_tokens=2000)
    ev.evaluate_run(workdir, settings, progress=False)
    assert ev.is_current(workdir, settings)
    _truncate_arrays(workdir / "checkpoints" / "20")
    assert not ev.is_current(workdir, settings)
    result = _cli("extrapolate", f"--run={workdir}", "--multipliers=1", "--max-tokens=2000",
                  "--noprogress")
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "checkpoints/20" in lines[0], result.stderr


def _unretrieved_failure(message: str) -> None:
    """A future that fails with ``message`` and is dropped unawaited: asyncio reports it when it
    is garbage-collected, as it does for orbax's sibling reads of a damaged checkpoint."""
    loop = asyncio.new_event_loop()
    future = loop.create_future()
    future.set_exception(ValueError(message))
    del future
    gc.collect()
    loop.close()


def test_unawaited_reads_of_a_damaged_checkpoint_are_not_reported(caplog):
    caplog.set_level(logging.ERROR, logger="asyncio")
    _unretrieved_failure('OUT_OF_RANGE: Error opening "zarr" driver: Error reading "step/.zarray" '
                         'in OCDBT database at local file "/w/checkpoints/20/opt_state/"')
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text
    _unretrieved_failure("something else went wrong")  # other reports still get through
    assert [r for r in caplog.records if "never retrieved" in r.getMessage()], caplog.text
