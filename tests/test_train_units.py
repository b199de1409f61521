"""Sharding specs, mesh and batch checks, MFU peaks and the probe cache, checkpoints, workdir
files and the metrics writer: the parts of training that need no corpus."""

import dataclasses
import io
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from attnlab import rundir
from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
from attnlab.errors import ConfigError
from attnlab.train import mfu as mfu_lib
from attnlab.train import workdir as wd
from attnlab.train.checkpoint import (
    CheckpointError,
    Checkpoints,
    check_compatible,
    param_shapes,
)
from attnlab.train import metrics as metrics_lib
from attnlab.train.metrics import MetricsWriter
from attnlab.train.optimizer import make_optimizer
from attnlab.train.sharding import check_batch_divides, mesh_shape, param_spec
from attnlab.train.state import abstract_train_state, init_train_state


def make_config(**train) -> Config:
    return Config(model=ModelConfig(d_model=32, n_layers=2, n_heads=2, max_len=32),
                  data=DataConfig(seq_len=16, batch_size=8), train=TrainConfig(**train))


# -- sharding ----------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, fsdp, spec", [
    ((256, 32), 4, P("fsdp", None)),  # largest divisible dimension
    ((32, 128), 4, P(None, "fsdp")),
    ((6, 10), 4, P()),  # nothing divides: replicated
    ((32,), 8, P("fsdp")),
    ((4,), 8, P()),  # shorter than the axis
    ((), 4, P()),  # Adam's count
    ((64, 64), 2, P(None, "fsdp")),  # ties go to the last dimension
    ((64, 48), 1, P("fsdp", None)),  # size-one axis: same declaration, effectively replicated
])
def test_param_spec(shape, fsdp, spec):
    assert param_spec(shape, fsdp) == spec


def test_param_spec_of_experts_splits_the_expert_axis_and_fsdp_the_rest():
    assert param_spec((8, 32, 64), 2, experts=True) == P("expert", None, "fsdp")
    assert param_spec((8, 6, 10), 4, experts=True) == P("expert", None, None)
    assert param_spec((8, 64), 4, experts=True) == P("expert", "fsdp")  # a bias [E, width]
    # stacked layers [L, E, d, width]: the layer axis stays whole
    assert param_spec((2, 8, 32, 64), 2, stacked=True, experts=True) == P(None, "expert", None,
                                                                          "fsdp")


def test_mesh_shape():
    assert mesh_shape(make_config(), 8) == (8, 1, 1)
    assert mesh_shape(make_config(mesh_fsdp=4), 8) == (2, 4, 1)
    assert mesh_shape(make_config(mesh_data=2, mesh_fsdp=4), 8) == (2, 4, 1)
    assert mesh_shape(make_config(mesh_fsdp=2, mesh_expert=2), 8) == (2, 2, 2)
    with pytest.raises(ConfigError, match="train.mesh_fsdp"):
        mesh_shape(make_config(mesh_fsdp=3), 8)
    with pytest.raises(ConfigError, match="train.mesh_data"):
        mesh_shape(make_config(mesh_data=4, mesh_fsdp=4), 8)
    with pytest.raises(ConfigError, match="train.mesh_expert"):
        mesh_shape(make_config(mesh_fsdp=2, mesh_expert=3), 8)


def test_batch_must_divide_over_devices_and_processes():
    check_batch_divides(make_config(), 8, 1)
    check_batch_divides(make_config(grad_accum=2), 4, 2)
    with pytest.raises(ConfigError, match="data.batch_size.*micro-batch.*4 devices"):
        check_batch_divides(make_config(grad_accum=4), 4, 1)  # micro-batch of 2
    cfg = dataclasses.replace(make_config(), data=DataConfig(seq_len=16, batch_size=6))
    with pytest.raises(ConfigError, match="divide over 4 processes"):
        check_batch_divides(cfg, 4, 4)


# -- MFU ---------------------------------------------------------------------------------------

def test_peak_table():
    assert mfu_lib.table_peak("NVIDIA H100 80GB HBM3", "bfloat16") == 989e12
    assert mfu_lib.table_peak("NVIDIA H200", "bfloat16") == 989e12
    assert mfu_lib.table_peak("NVIDIA A100-SXM4-40GB", "bfloat16") == 312e12
    assert mfu_lib.table_peak("NVIDIA A100-SXM4-40GB", "float32") == 156e12  # TF32
    assert mfu_lib.table_peak("TPU v4", "float32") == 275e12
    assert mfu_lib.table_peak("TPU v5 lite", "bfloat16") == 197e12
    assert mfu_lib.table_peak("cpu", "float32") is None


def test_cpu_peak_is_probed_once_then_cached(tmp_path):
    device = jax.devices("cpu")[0]
    peak, source = mfu_lib.peak_flops_per_device(device, "float32", cache_dir=tmp_path)
    assert source == "probe" and 1e8 < peak < 1e14
    cached = json.loads((tmp_path / "peak_flops.json").read_text())
    assert list(cached.values()) == [peak]
    again, source = mfu_lib.peak_flops_per_device(device, "float32", cache_dir=tmp_path)
    assert (again, source) == (peak, "cached probe")


def test_mfu_formula():
    # 1e4 tokens/s * 6e6 FLOPs/token = 6e10 FLOP/s over 2 devices of 1e11 = 0.3
    assert mfu_lib.mfu(1e4, 6e6, 1e11, 2) == pytest.approx(0.3)


# -- checkpoints -------------------------------------------------------------------------------

def test_checkpoint_round_trip_and_retention(tmp_path):
    cfg = make_config()
    tx, _ = make_optimizer(cfg.train, cfg.total_steps, cfg.model.d_model)
    state = jax.jit(lambda: init_train_state(cfg, tx))()
    state = state.replace(step=jnp.asarray(7, jnp.int32),
                          params=jax.tree.map(lambda x: x + 1.0, state.params))
    abstract = abstract_train_state(cfg, tx)
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shardings = jax.tree.map(lambda _: sharding, abstract)
    shapes = param_shapes(abstract.params)
    meta = {"model": dataclasses.asdict(cfg.model), "param_shapes": shapes, "best_val_loss": 1.5}
    with Checkpoints(tmp_path / "ckpt", keep=2) as checkpoints:
        for step in (3, 5, 7):
            checkpoints.save(state, {**meta, "step": step})
        checkpoints.wait()
        assert checkpoints.all_steps() == [5, 7]  # keeps the newest two
    with Checkpoints(tmp_path / "ckpt", keep=2, read_only=True) as checkpoints:
        assert checkpoints.latest_step() == 7
        record = checkpoints.read_meta(7)
        assert record["best_val_loss"] == 1.5 and record["step"] == 7
        check_compatible(record, cfg.model, shapes, "here")
        restored = checkpoints.restore(7, abstract, shardings)
        params_only = checkpoints.restore_params(7, abstract.params, shardings.params)
    assert int(restored.step) == 7
    for a, b, c in zip(jax.tree.leaves(state), jax.tree.leaves(restored),
                       jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bitwise
    for a, b in zip(jax.tree.leaves(params_only), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_incompatible_checkpoint_is_named():
    cfg = make_config()
    tx, _ = make_optimizer(cfg.train, cfg.total_steps, cfg.model.d_model)
    shapes = param_shapes(abstract_train_state(cfg, tx).params)
    meta = {"format": 1, "model": dataclasses.asdict(cfg.model), "param_shapes": shapes}
    wider = dataclasses.replace(cfg.model, d_model=64)
    wider_shapes = {k: [64 if n == 32 else n for n in v] for k, v in shapes.items()}
    with pytest.raises(CheckpointError, match=r"model.d_model: checkpoint 32, config 64.*shape"):
        check_compatible(meta, wider, wider_shapes, "checkpoint X")
    with pytest.raises(CheckpointError, match="not written by attnlab"):
        check_compatible({"step": 3}, cfg.model, shapes, "checkpoint X")


# -- workdir files and metrics -----------------------------------------------------------------

def test_workdir_refuses_another_config_and_allows_launch_changes(tmp_path):
    cfg = make_config()
    assert wd.check_workdir(tmp_path / "new", cfg) is None
    rundir.write_json_atomic(tmp_path / rundir.CONFIG_FILE, cfg.to_dict())
    before = (tmp_path / rundir.CONFIG_FILE).read_bytes()
    relaunched = make_config(mesh_fsdp=2, process_id=0, num_processes=1)
    assert wd.check_workdir(tmp_path, relaunched) is None
    with pytest.raises(wd.WorkdirError,
                       match=r"(?s)train.steps: saved 1000, given 5.*another --run"):
        wd.check_workdir(tmp_path, make_config(steps=5))
    assert (tmp_path / rundir.CONFIG_FILE).read_bytes() == before
    (tmp_path / "elsewhere" / "checkpoints").mkdir(parents=True)
    with pytest.raises(wd.WorkdirError, match="no config.json"):
        wd.check_workdir(tmp_path / "elsewhere", cfg)


def test_rewind_metrics_drops_lost_steps_and_torn_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 5, "loss": 2}\n{"step": 10, "val_loss": 1.9}\n'
                    '{"step": 15, "loss": 1.5}\n{"step": 2')
    kept = rundir.rewind_metrics(path, 10)
    assert [r["step"] for r in kept] == [5, 10]
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [5, 10]


def test_summary_is_written_atomically(tmp_path):
    target = tmp_path / "summary.json"
    rundir.write_json_atomic(target, {"status": "running", "loss": math.nan})
    rundir.write_json_atomic(target, {"status": "completed"})
    assert json.loads(target.read_text()) == {"status": "completed"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # no temporaries


def test_metrics_writer_files_and_plain_lines(tmp_path):
    stream = io.StringIO()  # not a TTY: plain lines
    writer = MetricsWriter(tmp_path, total_steps=20, start_step=0, stream=stream)
    writer.log({"step": 10, "tokens": 1280, "loss": 2.5, "lr": 1e-3, "grad_norm": 0.5,
                "tokens_per_s": 1000.0, "mfu": 0.25})
    writer.log({"step": 10, "tokens": 1280, "val_loss": 2.4})
    writer.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["loss"] == 2.5 and lines[1]["val_loss"] == 2.4
    printed = stream.getvalue().splitlines()
    assert printed[0].startswith("step 10/20 | loss 2.5000 | lr 1.00e-03")
    assert "MFU 25.0%" in printed[0] and "ETA" in printed[0]
    assert printed[1] == "step 10/20 | val_loss 2.4000"
    assert any(p.name.startswith("events.out.tfevents")
               for p in (tmp_path / "tensorboard").iterdir())


def test_metrics_writer_quiet(tmp_path):
    stream = io.StringIO()
    writer = MetricsWriter(tmp_path, total_steps=20, start_step=0, progress=False, stream=stream)
    writer.log({"step": 1, "loss": 2.0})
    writer.message("hello")
    writer.close()
    assert stream.getvalue() == ""
    assert (tmp_path / "metrics.jsonl").read_text().strip() == '{"step": 1, "loss": 2.0}'


def test_throughput_leaves_out_the_first_step_and_paused_blocks_only(monkeypatch):
    """Timed rate = counted steps' tokens / their seconds: the first (compiling) step and the
    time inside ``paused()`` (evaluation, checkpoint saves; added up by name, across restarts)
    are left out, while the step right after a pause is counted from the block's end."""
    clock = [0.0]
    monkeypatch.setattr(metrics_lib.time, "perf_counter", lambda: clock[0])
    throughput = metrics_lib.Throughput(tokens_per_step=10)

    def step(seconds):
        clock[0] += seconds
        throughput.step_done()

    step(5.0)  # compiles: not counted
    step(1.0)
    step(1.0)
    with throughput.paused("evaluation"):
        clock[0] += 7.0
    step(2.0)  # after the pause: counted, 2 s
    assert throughput.rate() == pytest.approx(30 / 4.0)
    with throughput.paused("checkpoints"):
        clock[0] += 3.0
    step(1.0)
    assert throughput.rate() == pytest.approx(10 / 1.0)
    assert throughput.mean_rate() == pytest.approx(40 / 5.0)
    assert (throughput.tokens, throughput.seconds) == (40, pytest.approx(5.0))
    assert throughput.paused_seconds == {"evaluation": pytest.approx(7.0),
                                         "checkpoints": pytest.approx(3.0)}
    carried = metrics_lib.Throughput(10, throughput.tokens, throughput.seconds,
                                     throughput.paused_seconds)  # a restart, from the record
    with carried.paused("evaluation"):
        clock[0] += 1.0
    assert carried.paused_seconds["evaluation"] == pytest.approx(8.0)
