"""Every sequence mixer trains end to end through `attnlab train` on configs/tiny.py with an
override, generates from its run directory, and runs in a tiny sweep (experiments/tiny_mixers.py)."""

import json
import pathlib

import pytest

from attnlab import cli
from attnlab.sweep import load_spec, run_sweep

ROOT = pathlib.Path(__file__).resolve().parents[1]

OVERRIDES = {
    "linear": ["--config.model.mixer=linear", "--config.model.mixer_chunk=8"],
    "performer": ["--config.model.mixer=performer", "--config.model.mixer_features=16"],
    "mamba": ["--config.model.mixer=mamba", "--config.model.pos_encoding=none"],
    "hybrid": ["--config.model.mixer=mamba", "--config.model.attention_every=2"],
}


# The default lane trains the two mixers without a scan; Mamba and the hybrid run with the slow
# lane (their decoding equals their forward pass in tests/test_model_mixers.py's default lane).
SLOW_MIXERS = ("mamba", "hybrid")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow if n in SLOW_MIXERS
                                               else ()) for n in OVERRIDES])
def test_each_mixer_trains_and_generates_through_the_cli(name, tmp_path, capsys):
    workdir = tmp_path / name
    argv = ["train", "--config=configs/tiny.py", f"--run={workdir}", *OVERRIDES[name],
            "--config.train.steps=3", "--config.train.eval_every=3",
            "--config.train.checkpoint_every=3", "--config.train.log_every=1"]
    assert cli.main(argv) == 0
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["status"] == "completed"
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["model"]["mixer"] == OVERRIDES[name][0].split("=")[1]
    capsys.readouterr()
    assert cli.main(["generate", f"--run={workdir}", "--prompt=def ",
                     "--max-new-tokens=8"]) == 0
    assert capsys.readouterr().out.startswith("def ")


def test_model_info_counts_each_mixer(capsys):
    for overrides in OVERRIDES.values():
        assert cli.main(["model-info", "--config=configs/tiny.py", *overrides]) == 0
        out = capsys.readouterr().out
        assert "chinchilla" in out and "sequence mixers by layer: " in out


def test_a_bad_combination_is_one_line_and_exit_2(tmp_path, capsys):
    argv = ["train", "--config=configs/tiny.py", f"--run={tmp_path / 'x'}",
            "--config.model.mixer=performer", "--config.model.pos_encoding=alibi"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "model.pos_encoding" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_the_tiny_mixer_sweep_completes(tmp_path):
    spec = load_spec(str(ROOT / "experiments" / "tiny_mixers.py"))
    table = run_sweep(spec, tmp_path / "sweep", progress=False)
    assert sorted(table["model.mixer"]) == ["linear", "mamba", "performer", "softmax"]
    assert set(table["status"]) == {"completed"}
    assert (table["final_val_loss"] < 5.6).all()  # below ln(256) = 5.55 + noise: it learns


def test_a_checkpoint_written_before_the_mixer_fields_existed_still_loads():
    import dataclasses

    from attnlab.model import ModelConfig
    from attnlab.train.checkpoint import FORMAT_VERSION, check_compatible

    model = ModelConfig()
    record = dataclasses.asdict(model)
    for new_field in ("mixer", "attention_every", "mixer_features", "mixer_chunk", "ssm_state",
                      "ssm_expand", "ssm_conv", "ngpt"):
        record.pop(new_field)
    meta = {"format": FORMAT_VERSION, "model": record, "param_shapes": {"w": [1]}}
    check_compatible(meta, model, {"w": [1]}, "checkpoint")  # absent = default: compatible
    with pytest.raises(Exception, match="model.mixer"):
        check_compatible(meta, ModelConfig(mixer="linear"), {"w": [1]}, "checkpoint")


@pytest.mark.slow
def test_a_mamba_run_is_evaluated_at_16x_its_training_context(tmp_path, capsys):
    workdir = tmp_path / "mamba"
    assert cli.main(["train", "--config=configs/tiny.py", f"--run={workdir}",
                     *OVERRIDES["mamba"], "--config.train.steps=2",
                     "--config.train.eval_every=2", "--config.train.checkpoint_every=2"]) == 0
    assert cli.main(["extrapolate", f"--run={workdir}", "--multipliers=1,16",
                     "--max-tokens=4096", "--progress=false"]) == 0
    report = json.loads((workdir / "extrapolation.json").read_text())
    assert "512" in json.dumps(report)  # 16 x seq_len 32 was scored


@pytest.mark.slow
def test_ngpt_and_a_hybrid_run_through_a_tiny_sweep(tmp_path):
    """The two variants that are more than a value of model.mixer go through the same sweep
    machinery with overrides: nGPT (with the paper's rules: SwiGLU, no weight decay, no warmup)
    and a Mamba stack with softmax attention every 2nd layer."""
    ngpt = load_spec(str(ROOT / "experiments" / "tiny_mixers.py"), [
        "sweep.axes.model.mixer=('softmax',)", "base.model.ngpt=True",
        "base.model.ffn=swiglu", "base.train.weight_decay=0.0", "base.train.warmup_steps=0"])
    table = run_sweep(ngpt, tmp_path / "ngpt", progress=False)
    assert list(table["status"]) == ["completed"]
    saved = json.loads(next((tmp_path / "ngpt" / "runs").glob("*/config.json")).read_text())
    assert saved["model"]["ngpt"] is True
    hybrid = load_spec(str(ROOT / "experiments" / "tiny_mixers.py"), [
        "sweep.axes.model.mixer=('mamba',)", "base.model.mixer=mamba",
        "base.model.attention_every=2"])
    table = run_sweep(hybrid, tmp_path / "hybrid", progress=False)
    assert list(table["status"]) == ["completed"]
    assert (table["final_val_loss"] < 5.6).all()
    saved = json.loads(next((tmp_path / "hybrid" / "runs").glob("*/config.json")).read_text())
    assert saved["model"]["mixer"] == "mamba" and saved["model"]["attention_every"] == 2
