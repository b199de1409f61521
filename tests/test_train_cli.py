"""`attnlab model-info` (counts from the config alone, optional forward pass) and usage errors of
`attnlab train` / `attnlab generate`. (Training and generation themselves: test_train_loop.py.)"""

import math
import re

import pytest

import configs.default
import configs.gpt2_small
import configs.tiny
from attnlab import cli
from attnlab.config import from_config_dict
from attnlab.model import flops_per_token, param_counts


def printed_counts(out: str) -> dict[str, float]:
    """``{'total': 123.0, ...}`` from model-info's '  name   1,234' lines."""
    counts = {}
    for name, value in re.findall(r"^  (\w+)\s+([\d,.e+]+)$", out, flags=re.M):
        counts[name] = float(value.replace(",", ""))
    return counts


@pytest.mark.parametrize("module", [configs.default, configs.gpt2_small])
def test_model_info_prints_counts_and_flops(module, capsys):
    path = f"configs/{module.__name__.split('.')[-1]}.py"
    assert cli.main(["model-info", f"--config={path}"]) == 0
    shown = printed_counts(capsys.readouterr().out)
    cfg = from_config_dict(module.get_config())
    counts = param_counts(cfg.model)
    for key in ("total", "non_embedding", "embedding"):
        assert shown[key] == counts[key]
    for key, value in flops_per_token(cfg.model, cfg.data.seq_len).items():
        assert shown[key] == pytest.approx(value, rel=1e-3)


def test_model_info_gpt2_small_is_124m(capsys):
    assert cli.main(["model-info", "--config=configs/gpt2_small.py"]) == 0
    shown = printed_counts(capsys.readouterr().out)
    assert 123e6 < shown["total"] < 125e6  # Radford et al. 2019: 124M (with a 50304 vocab)


def test_model_info_overrides(capsys):
    assert cli.main(["model-info", "--config=configs/default.py",
                     "--config.model.n_layers=8"]) == 0
    shown = printed_counts(capsys.readouterr().out)
    cfg = from_config_dict(configs.default.get_config())
    per_layer = param_counts(cfg.model)["per_layer"]
    assert shown["non_embedding"] == param_counts(cfg.model)["non_embedding"] + 4 * per_layer


def test_model_info_forward_is_near_uniform_at_init(tmp_path, capsys):
    code = cli.main(["model-info", "--config=configs/tiny.py", "--forward",
                     f"--config.data.cache_dir={tmp_path}", "--config.data.max_bytes=200000"])
    assert code == 0
    out = capsys.readouterr().out
    loss = float(re.search(r"loss (\d+\.\d+) nats/token", out).group(1))
    # small init (std 0.02) -> near-uniform predictions over 256 bytes
    assert abs(loss - math.log(256)) < 0.2


def test_model_info_forward_reads_a_regression_loss_against_predicting_zero(capsys):
    """A vector model's loss is a squared error, read against the loss of predicting 0
    (E[y^2] = d), not in nats against a vocabulary."""
    assert cli.main(["model-info", "--config=configs/icl_regression.py", "--forward"]) == 0
    out = capsys.readouterr().out
    found = re.search(r"loss (\d+\.\d+) squared error per y \(predicting 0, without noise: "
                      r"E\[y\^2\] = d = (\d+\.\d+)\)", out)
    assert found, out
    loss, reference = float(found.group(1)), float(found.group(2))
    assert reference == 8.0  # configs/icl_regression.py: d = 8
    # an untrained read-out predicts near 0; one batch's mean of y^2 is within its spread of d
    assert abs(loss - reference) < 3, loss
    assert "nats" not in out.split("forward pass")[1]


@pytest.mark.parametrize("argv, message", [
    (["model-info"], "--config is required"),
    (["train", "--config=configs/tiny.py"], "--run is required"),
    (["train", "--config=configs/nope.py", "--run=x"], "cannot"),
    (["generate", "--prompt=x"], "--run is required"),
])
def test_usage_errors_exit_2(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_generate_needs_a_run_directory(tmp_path, capsys):
    assert cli.main(["generate", f"--run={tmp_path}", "--prompt=def "]) == 2
    assert "is not a run directory" in capsys.readouterr().err


def test_model_info_prints_total_and_active_counts_of_a_mixture_of_experts(capsys):
    overrides = ["--config.model.moe=token_choice", "--config.model.moe_experts=8",
                 "--config.model.moe_top_k=2"]
    assert cli.main(["model-info", "--config=configs/tiny.py", *overrides]) == 0
    shown = printed_counts(capsys.readouterr().out)
    cfg = from_config_dict(configs.tiny.get_config())
    cfg = from_config_dict({**cfg.to_dict(), "model": {**cfg.to_dict()["model"], "moe":
                            "token_choice", "moe_experts": 8, "moe_top_k": 2}})
    counts = param_counts(cfg.model)
    for key in ("total", "non_embedding", "active", "active_non_embedding"):
        assert shown[key] == counts[key]
    assert counts["active"] < counts["total"]
    assert shown["kaplan_6n"] == pytest.approx(6 * counts["active_non_embedding"], rel=1e-3)
