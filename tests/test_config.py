"""Config conversion and validation: every bad field is named before anything is compiled."""

import dataclasses
import json

import pytest

from attnlab import cli
from attnlab.cli_flags import Flag, UsageError, parse
from attnlab.config import Config, ModelConfig, base_config_dict, from_config_dict
from attnlab.errors import ConfigError
from attnlab.checks import check
from attnlab.model import resolve
from repo_files import REPO, load_module


def _config(**sections):
    config = base_config_dict()
    for section, values in sections.items():
        for key, value in values.items():
            config[section][key] = value
    return config


def test_defaults_round_trip_through_json():
    cfg = from_config_dict(base_config_dict())
    assert cfg == Config()
    again = from_config_dict(json.loads(cfg.to_json()))
    assert again == cfg


def test_derived_sizes():
    m = ModelConfig(d_model=96, n_heads=6, n_kv_heads=2, ffn="swiglu")
    assert m.head_dim == 16 and m.kv_heads == 2
    assert resolve(m).ffn.width == 256  # 8/3 * 96 = 256, already a multiple of 8
    assert resolve(dataclasses.replace(m, ffn="gelu")).ffn.width == 384
    assert resolve(dataclasses.replace(m, d_ff=100)).ffn.width == 100


@pytest.mark.parametrize(
    "sections, field, words",
    [
        ({"model": {"d_model": 100, "n_heads": 3}}, "model.d_model", "not divisible by model.n_heads=3"),
        ({"model": {"n_heads": 4, "n_kv_heads": 3}}, "model.n_heads", "not divisible by model.n_kv_heads=3"),
        ({"model": {"d_model": 12, "n_heads": 4, "pos_encoding": "rope"}}, "model.pos_encoding", "even head_dim"),
        ({"model": {"pos_encoding": "xpos"}}, "model.pos_encoding", "none, sinusoidal, learned, rope, alibi"),
        ({"model": {"norm": "batchnorm"}}, "model.norm", "layernorm, rmsnorm"),
        ({"model": {"ffn": "swish"}}, "model.ffn", "relu, gelu, swiglu"),
        ({"model": {"n_layers": 0}}, "model.n_layers", "must be positive"),
        ({"model": {"d_model": -8}}, "model.d_model", "must be positive"),
        ({"model": {"n_kv_heads": 0}}, "model.n_kv_heads", "must be positive"),
        ({"data": {"seq_len": 0}}, "data.seq_len", "must be positive"),
        ({"data": {"source": "wikipedia"}}, "data.source", "valid sources"),
        ({"data": {"source": "text_files"}}, "data.path", "needs a directory"),
        ({"data": {"tokenizer": "sentencepiece"}}, "data.tokenizer", "byte, bpe, or the path"),
        ({"data": {"tokenizer": "bpe", "bpe_vocab_size": 200}}, "data.bpe_vocab_size",
         "exceed the 256 byte tokens"),
        ({"data": {"tokenizer": "bpe", "bpe_vocab_size": 2048}}, "model.vocab_size",
         "the bpe tokenizer needs >= 2048"),
        ({"model": {"vocab_size": 200}}, "model.vocab_size", "the byte tokenizer needs >= 256"),
        ({"data": {"source": "markov", "tokenizer": "vocab.json"}}, "data.tokenizer",
         "takes byte or bpe"),
        ({"data": {"source": "shards", "path": "x", "tokenizer": "bpe"}}, "data.tokenizer",
         "bpe trains on a corpus held in memory"),
        ({"data": {"source": "mqar", "loss_on": "answers"},
          "model": {"objective": "mlm", "vocab_size": 300}}, "data.loss_on",
         "model.objective=mlm chooses its own"),
        ({"train": {"schedule": "linear"}}, "train.schedule", "cosine, noam, wsd, constant"),
        ({"train": {"grad_accum": 3}}, "train.grad_accum", "not divisible"),
        ({"model": {"pos_encoding": "learned", "max_len": 64}, "data": {"seq_len": 128}},
         "data.seq_len", "learned position table"),
    ],
)
def test_each_config_error_names_its_field(sections, field, words):
    with pytest.raises(ConfigError) as info:
        check(from_config_dict(_config(**sections)))
    assert info.value.field == field
    assert words in str(info.value)
    assert str(info.value).startswith(f"config.{field}:")


def test_unknown_keys_and_types_are_named():
    with pytest.raises(ConfigError, match=r"config.model.n_layer: unknown key"):
        from_config_dict({"model": {"n_layer": 2}})
    with pytest.raises(ConfigError, match=r"config.optimizer: unknown top-level key"):
        from_config_dict({"optimizer": {}})
    with pytest.raises(ConfigError, match=r"config.model.d_model: expected an integer"):
        from_config_dict({"model": {"d_model": 12.5}})


def test_command_line_overrides(tmp_path):
    values = parse(
        ["--config=configs/default.py", "--config.model.n_kv_heads=2",
         "--config.model.pos_encoding=alibi", "--run", str(tmp_path)],
        [Flag("run", "string", None, "run directory", required=True)],
    )
    cfg = from_config_dict(values.config)
    assert cfg.model.kv_heads == 2 and cfg.model.pos_encoding == "alibi"
    assert values.run == str(tmp_path)
    # a sequence field (a trunk's kept checkpoints, docs/training.md) as a tuple literal
    values = parse(["--config=configs/tiny.py", "--config.train.keep_steps=(8,16,32)"])
    assert from_config_dict(values.config).train.keep_steps == (8, 16, 32)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--config=configs/missing.py"], "cannot load config file 'configs/missing.py'"),
        (["--config=configs/default.py", "--config.model.bogus=1"], "--config.model.bogus"),
        (["--config=configs/default.py", "--config.train.steps=many"], "config.train.steps"),
        (["--config=configs/default.py", "--no-such-flag=1"], "no-such-flag"),
        ([], "--config is required"),
        (["--config=configs/tiny.py:gpu"],
         "--config=configs/tiny.py:gpu: this config file's get_config() takes no scale"),
    ],
)
def test_bad_command_lines(argv, words):
    with pytest.raises(UsageError) as info:
        parse(argv)
    assert words in str(info.value)


def test_shipped_configs_validate():
    for path in sorted(REPO.glob("configs/*.py")):
        check(from_config_dict(load_module(path).get_config()))


def test_cli_help_and_unknown_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("model-info", "train", "sweep", "fit", "plot", "extrapolate", "generate"):
        assert command in out
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_help_of_a_config_command_lists_its_flags(capsys):
    assert cli.main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--config=FILE" in out and "--run" in out


def test_configs_validate_when_built_and_when_replaced():
    from attnlab.config import DataConfig, TrainConfig

    assert Config() == from_config_dict({})  # the defaults are valid
    with pytest.raises(ConfigError, match="must be positive") as info:
        ModelConfig(n_layers=0)
    assert info.value.field == "model.n_layers"
    # A part's name is checked where the parts live (the config is a leaf that knows none).
    bad_norm = dataclasses.replace(ModelConfig(), norm="batchnorm")
    with pytest.raises(ConfigError) as info:
        resolve(bad_norm)
    assert info.value.field == "model.norm"
    # So is a data source's, with the fields that depend on it (attnlab.data.sources).
    from attnlab.data import sources

    with pytest.raises(ConfigError) as info:
        sources.validate(DataConfig(source="text_files"))
    assert info.value.field == "data.path"
    with pytest.raises(ConfigError) as info:
        TrainConfig(schedule="linear")
    assert info.value.field == "train.schedule"
    # Rules between the model and the other sections belong to attnlab.model.check: each
    # section alone is fine.
    learned = ModelConfig(pos_encoding="learned", max_len=64)
    with pytest.raises(ConfigError, match="learned position table") as info:
        check(Config(model=learned))  # data.seq_len defaults to 128
    assert info.value.field == "data.seq_len"
    cfg = Config(model=learned, data=DataConfig(seq_len=64))
    check(cfg)
    with pytest.raises(ConfigError) as info:
        check(dataclasses.replace(cfg, data=DataConfig(seq_len=65)))
    assert info.value.field == "data.seq_len"
    with pytest.raises(ConfigError) as info:
        dataclasses.replace(cfg, train=TrainConfig(grad_accum=3))
    assert info.value.field == "train.grad_accum"


def test_fields_added_since_the_first_release_count_only_away_from_their_defaults(monkeypatch):
    """Adding a config field must not change existing run ids or refuse to resume old runs: a
    new field at its default is left out of a run's identity, and a saved config that lacks it
    compares equal. (qk_norm stands in for a field added later.)"""
    import attnlab.identity as identity_module
    from attnlab.identity import identity
    from attnlab.sweep.planner import run_id
    from attnlab.identity import config_differences

    later = identity_module.FIRST_RELEASE_FIELDS - {"model.qk_norm"}
    monkeypatch.setattr(identity_module, "FIRST_RELEASE_FIELDS", later)
    cfg = Config()
    assert "qk_norm" not in identity(cfg)["model"]
    assert identity(cfg)["model"]["d_model"] == cfg.model.d_model
    on = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, qk_norm=True))
    assert identity(on)["model"]["qk_norm"] is True
    assert run_id(on) != run_id(cfg)
    # A config.json written before the field existed resumes under today's default...
    saved = cfg.to_dict()
    del saved["model"]["qk_norm"]
    assert config_differences(saved, cfg.to_dict()) == []
    # ...and not under a non-default value.
    assert config_differences(saved, on.to_dict()) == ["model.qk_norm: saved None, given True"]


def test_prepare_reads_an_experiments_base_and_run_commands_refuse_one(tmp_path, capsys):
    """An experiment (a sweep's base and sweep sections) is not one run's config: train and
    model-info say so in one line; prepare builds its base config's corpus."""
    grid = str(REPO / "experiments" / "tiny_grid.py")
    assert cli.main(["model-info", f"--config={grid}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--config names an experiment" in err
    assert cli.main(["prepare", f"--config={grid}",
                     f"--config.base.data.cache_dir={tmp_path}"]) == 0
    assert "Corpus('pystdlib'" in capsys.readouterr().out

