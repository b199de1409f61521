"""A new data source is one class and one registry line: here a source of documents that count
("one two three ..."), written by the source itself and built like text files, with a rule of
its own. Checked, prepared and trained end to end by ``attnlab.train.run``; the config, the
checks and the training loop ask the registry and nothing else changes."""

import dataclasses
import json

import numpy as np
import pytest

from attnlab.checks import check
from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
from attnlab.data import builders, prepare, sources
from attnlab.errors import ConfigError
from attnlab.train import run

WORDS = "zero one two three four five six seven eight nine".split()


def counting_documents() -> list[bytes]:
    return [" ".join(WORDS[(start + i) % 10] for i in range(40 + start)).encode()
            for start in range(60)]


class Counting(sources.Source):
    name = "counting"

    def validate(self, d):
        if d.max_bytes:
            raise ConfigError("data.max_bytes", "counting documents are never sliced")

    def build(self, d, root):
        directory = root / "counting"
        directory.mkdir(parents=True, exist_ok=True)
        for i, text in enumerate(counting_documents()):
            (directory / f"{i:03d}.txt").write_bytes(text)
        config = builders.text_files_config(str(directory), d.max_bytes)
        builder = builders.AttnlabTextFiles(config=config,
                                            data_dir=builders.builder_data_dir(root))
        return sources.own_build(self.name, builder)


@pytest.fixture
def counting(monkeypatch):
    monkeypatch.setitem(sources.SOURCES, Counting.name, Counting)


def tiny(cache_dir, **data) -> Config:
    return Config(
        model=ModelConfig(d_model=16, n_layers=1, n_heads=2, max_len=32),
        data=DataConfig(source="counting", seq_len=16, batch_size=4, cache_dir=str(cache_dir),
                        **data),
        train=TrainConfig(steps=4, warmup_steps=1, log_every=2, eval_every=4, eval_batches=1,
                          checkpoint_every=4))


def test_a_registered_source_is_checked_built_and_trained_end_to_end(counting, tmp_path):
    cfg = tiny(tmp_path / "cache")
    check(cfg)
    corpus = prepare(cfg.data)
    assert corpus.manifest["name"] == "counting"
    # Every document, byte-encoded and followed by the separator, is in exactly one split.
    total = sum(corpus.num_tokens(s) for s in corpus.splits)
    assert total == sum(len(doc) + 1 for doc in counting_documents())
    stream = np.concatenate([corpus.tokens(s) for s in corpus.splits])
    assert int((stream == corpus.tokenizer.eos_id).sum()) == len(counting_documents())
    summary = run(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed"
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["data"]["source"] == "counting"


def test_a_registered_source_adds_its_rules_and_shares_the_common_ones(counting, tmp_path):
    with pytest.raises(ConfigError) as error:
        check(tiny(tmp_path, max_bytes=1000))
    assert error.value.field == "data.max_bytes"
    with pytest.raises(ConfigError) as error:  # a task's field, read by no counting source
        check(tiny(tmp_path, mqar_pairs=4))
    assert error.value.field == "data.mqar_pairs"
    assert "read only by data.source mqar" in error.value.reason
    check(dataclasses.replace(tiny(tmp_path), data=DataConfig(source="counting",
                                                               document_mask=True)))


def test_an_unregistered_source_is_refused_with_the_registered_names(counting):
    with pytest.raises(ConfigError) as error:
        sources.source_named("countin")
    assert error.value.field == "data.source"
    assert "counting" in error.value.reason and "pystdlib" in error.value.reason
    assert "tfds:<name>/<feature>" in error.value.reason
