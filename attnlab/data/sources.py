"""Data sources, resolved once: ``data.source`` names a class in :data:`SOURCES` (or, by its
prefix, in :data:`PREFIXES`), which says what the source yields, which data fields only it
reads, the rules it adds (raising ConfigError naming the field) and how it is built.

    source = source_named(cfg.data.source)   # raises ConfigError("data.source", ...)
    source = validate(cfg.data)         # and every rule of the data section with that source
    corpus = prepare(cfg.data)          # built once into the cache, then memory-mapped

Adding a source is one class (a :class:`attnlab.data.source.Source`) here or in its own module,
and one line in :data:`SOURCES`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds

from attnlab.config import DataConfig, validate_data
from attnlab.data import builders, corpus, icl, icl_regression, mixture, shards
from attnlab.data.cache import cache_root
from attnlab.data.errors import DataError, UnknownDatasetError
from attnlab.data.tfds_build import TfdsBuild, check_feature
from attnlab.data.files import SPLITS
from attnlab.data.source import Source
from attnlab.data.tokenizer import TOKENIZERS, is_tokenizer_file, tokenizer_class
from attnlab.errors import ConfigError


def own_build(name: str, builder, separated: bool = True) -> TfdsBuild:
    """The build of one of attnlab's own TFDS builders (attnlab/data/builders.py)."""
    return TfdsBuild(name=name, builder=builder, feature=builders.TEXT_FEATURE,
                     split_names={s: s for s in SPLITS}, separated=separated, own_builder=True,
                     key=Path(builder.name) / builder.builder_config.name / str(builder.version))


class Pystdlib(Source):
    """The ``.py`` files of the running interpreter's standard library (the default)."""

    name = "pystdlib"
    slices = True

    def build(self, d, root):
        config = builders.pystdlib_config(d.max_bytes)
        return own_build(self.name, builders.AttnlabPystdlib(
            config=config, data_dir=builders.builder_data_dir(root)))


class TextFiles(Source):
    """Text files under ``data.path`` (a directory or a glob), one document per file."""

    name = "text_files"
    reads_path = True
    slices = True

    def validate(self, d):
        if not d.path:
            raise ConfigError("data.path", "source text_files needs a directory or glob in "
                                           "data.path")

    def build(self, d, root):
        config = builders.text_files_config(d.path, d.max_bytes)
        return own_build(self.name, builders.AttnlabTextFiles(
            config=config, data_dir=builders.builder_data_dir(root)))


class Markov(Source):
    """A stream sampled from a random Markov chain over bytes (known entropy rate)."""

    name = "markov"
    documents = False

    def token_ids(self, d):
        return None

    def build(self, d, root):
        config = builders.markov_config(d.markov_order, d.markov_branching, d.markov_seed,
                                        d.markov_tokens)
        builder = builders.AttnlabMarkov(config=config, data_dir=builders.builder_data_dir(root))
        return own_build(self.name, builder, separated=False)


class Tfds(Source):
    """Any text feature of a TFDS catalog dataset: ``tfds:<name>/<feature>``."""

    prefix = "tfds:"

    def __init__(self, name: str):
        self.name = name

    def build(self, d, root):
        name, _, feature = self.name[len(self.prefix):].rpartition("/")
        if not name or not feature:
            raise UnknownDatasetError(f"data.source: {self.name!r} should be "
                                      "tfds:<name>/<feature>, e.g. tfds:lm1b/text")
        # Datasets the user prepared elsewhere (TFDS's own convention) are found via TFDS_DATA_DIR.
        data_dir = os.environ.get("TFDS_DATA_DIR") or builders.builder_data_dir(root)
        try:
            builder = tfds.builder(name, data_dir=data_dir)
        except tfds.core.DatasetNotFoundError as e:
            raise UnknownDatasetError(
                f"data.source: no TFDS dataset named {name!r} (see tfds.list_builders())"
            ) from e
        except (ValueError, KeyError, AttributeError) as e:
            raise UnknownDatasetError(f"data.source: TFDS cannot load {name!r}: {e}") from e
        check_feature(builder, name, feature)
        config_name = builder.builder_config.name if builder.builder_config else "default"
        return TfdsBuild(name=self.name, builder=builder, feature=feature,
                         split_names={},  # known once the dataset is prepared
                         separated=True, own_builder=False,
                         key=Path("tfds") / builder.name / config_name / str(builder.version)
                         / feature)


def _trained_tokenizer(d) -> bool:
    """Whether ``data.tokenizer`` learns from the corpus (and so needs it whole in memory)."""
    kind = tokenizer_class(d.tokenizer)
    return bool(kind and kind.trained)


class Shards(Source):
    """Local Parquet, JSON-lines and text shards under ``data.path`` (attnlab/data/shards.py),
    tokenized by ``byte`` or a tokenizer.json in ``data.workers`` processes."""

    name = "shards"
    fields = ("text_field", "workers", "allow_lossy_tokenizer")
    tokenizer_files = True
    reads_path = True

    def validate(self, d):
        if not d.path:
            raise ConfigError("data.path", "source shards needs a directory, a glob or several "
                                           "of them (comma-separated) in data.path")
        if _trained_tokenizer(d):
            raise ConfigError("data.tokenizer", "shards are tokenized by byte or a tokenizer.json "
                              "(train one on a sample with the tokenizers library); "
                              f"{d.tokenizer} trains on a corpus held in memory")
        if d.max_bytes:
            raise ConfigError("data.max_bytes", "slices pystdlib and text_files; name fewer "
                                                "shards in data.path")
        self.tokenizer(d)

    def tokenizer(self, d) -> dict:
        """:func:`attnlab.data.shards.tokenizer_record` of ``data.tokenizer``, checked."""
        if not is_tokenizer_file(d.tokenizer):
            return shards.tokenizer_record(d.tokenizer)
        path = Path(d.tokenizer).expanduser()
        if not path.is_file():
            raise ConfigError("data.tokenizer", f"no tokenizer.json at {str(path)!r}")
        try:
            record = shards.tokenizer_record(d.tokenizer)
        except Exception as e:  # noqa: BLE001 - tokenizers raises its own exception types
            raise ConfigError("data.tokenizer", f"{path}: not a readable tokenizer.json "
                                                f"({e})") from None
        if record["eos_id"] is None:
            raise ConfigError("data.tokenizer", f"{path} has none of the end-of-document "
                                                f"tokens {', '.join(shards.EOS_TOKENS)}")
        return record

    def token_ids(self, d):
        return self.tokenizer(d)["vocab_size"]

    def check_model(self, cfg):
        ids = self.token_ids(cfg.data)
        if cfg.model.vocab_size < ids:
            raise ConfigError("model.vocab_size", f"{cfg.model.vocab_size} is smaller than the "
                              f"{ids} ids of data.tokenizer={cfg.data.tokenizer}")

    def separator_id(self, d):
        return self.tokenizer(d)["eos_id"]

    def prepare(self, d):
        files = shards.shard_files(d.path)
        tokenizer = self.tokenizer(d)
        root = cache_root(d.cache_dir)
        directory = root / "prepared" / shards.corpus_key(files, d, tokenizer)
        if not directory.exists():
            shards.check_tokenizer(files, d, tokenizer)
            shards.build(files, d, tokenizer, directory, root)
        return corpus.load_corpus(directory, self.name)


class TokenTaskSource(Source):
    """A synthetic in-context-learning token task (attnlab/data/icl.py): no text, no
    tokenizer; windows are sampled as they are read."""

    documents = False
    is_task = True
    task_class: type[icl.TokenTask] = icl.TokenTask
    fields = ("task_vocab",)

    def check_model(self, cfg):
        if cfg.model.vocab_size < cfg.data.task_vocab:
            raise ConfigError("model.vocab_size", f"{cfg.model.vocab_size} is smaller than the "
                              f"task's data.task_vocab={cfg.data.task_vocab} ids")

    def task(self, d):
        return icl.token_task(self.task_class, d)

    def prepare(self, d):
        return icl.TaskCorpus(self.task(d), target_weights(d))


class Induction(TokenTaskSource):
    name = icl.InductionTask.name
    task_class = icl.InductionTask


class Mqar(TokenTaskSource):
    name = icl.MQARTask.name
    task_class = icl.MQARTask
    fields = ("task_vocab", "mqar_pairs")
    scores_answers = True


class Regression(Source):
    """In-context regression (Garg et al. 2022): prompts of ``2 data.icl_examples`` vectors."""

    name = icl_regression.RegressionTask.name
    documents = False
    vectors = True
    is_task = True
    fields = ("icl_dim", "icl_examples", "icl_noise", "icl_curriculum_every", "icl_dim_start",
              "icl_examples_start", "icl_sparsity", "icl_hidden", "icl_function")

    def validate(self, d):
        if d.seq_len != 2 * d.icl_examples:
            raise ConfigError("data.seq_len", f"a regression prompt of data.icl_examples="
                              f"{d.icl_examples} pairs is {2 * d.icl_examples} vectors, got "
                              f"{d.seq_len}")
        for name, full in (("icl_dim_start", d.icl_dim), ("icl_examples_start", d.icl_examples)):
            if getattr(d, name) > full:
                raise ConfigError(f"data.{name}", f"{getattr(d, name)} exceeds the task's "
                                  f"{full} (data.{name.removesuffix('_start')})")
            if getattr(d, name) and not d.icl_curriculum_every:
                raise ConfigError(f"data.{name}", "starts a curriculum: set "
                                  "data.icl_curriculum_every > 0 (steps per stage)")

    def check_model(self, cfg):
        """Prompts of vectors: no vocabulary to size."""

    def check_architecture(self, cfg, arch):
        super().check_architecture(cfg, arch)
        if cfg.model.input_dim != cfg.data.icl_dim:
            raise ConfigError("model.input_dim", f"{cfg.model.input_dim} differs from the "
                              f"regression prompts' data.icl_dim={cfg.data.icl_dim}")
        if cfg.train.eval_masked_spans:
            raise ConfigError("train.eval_masked_spans", "in-context regression prompts have no "
                              "token spans to score")

    def task(self, d):
        return icl_regression.regression_task(d)

    def prepare(self, d):
        return icl_regression.RegressionCorpus(self.task(d))

    def window_layout(self, d):
        """Prompts ``[seq_len, icl_dim + 1]`` float32 (:meth:`RegressionTask.window`)."""
        return (d.seq_len, d.icl_dim + 1), np.float32


class Mixture(Source):
    """Several sources with weights (``data.mixture``, attnlab/data/mixture.py). Each entry is
    the data section with its source and path: checked, prepared and cached by its own class
    as it would be alone; data.tokenizer is theirs, so they share one vocabulary."""

    name = "mixture"
    fields = ("mixture",)
    tokenizer_files = True  # and data.document_mask: each entry's source decides
    mixable = False  # entries are sources, not mixtures

    def parts(self, d) -> list[tuple[mixture.Entry, Source, object]]:
        """``(entry, its source, its data section)`` of each entry, each checked."""
        paths = tuple(n for n, cls in SOURCES.items() if cls.reads_path)
        out = []
        for entry in mixture.parse(d.mixture, paths):
            source = mixture.for_entry(entry, source_named, entry.source)
            if not source.mixable:
                raise ConfigError("data.mixture", f"{entry.text!r}: a mixture mixes corpora; "
                                  f"{entry.source} is not one")
            others = {f for cls in SOURCES.values() for f in cls.fields} - set(source.fields)
            if not source.slices:  # data.max_bytes slices the entries that can be sliced
                others.add("max_bytes")
            section = dataclasses.replace(d, source=entry.source, path=entry.path,
                                          **{f: _DEFAULTS[f] for f in others})  # and mixture
            mixture.for_entry(entry, validate, section)
            out.append((entry, source, section))
        return out

    def reads(self, d):
        return self.fields + tuple(f for _, s, _ in self.parts(d) for f in s.fields)

    def validate(self, d):
        if d.path:
            raise ConfigError("data.path", "a mixture's paths are its entries': "
                              "data.mixture='<source>:<path>=<weight>,...'")
        if _trained_tokenizer(d):
            raise ConfigError("data.tokenizer", "a mixture's sources share one tokenizer (byte "
                              f"or a tokenizer.json); {d.tokenizer} would train one per source")
        self.parts(d)

    def token_ids(self, d):
        ids = [s.token_ids(section) for _, s, section in self.parts(d)]
        return max((i for i in ids if i is not None), default=None)

    def check_model(self, cfg):
        for _, source, section in self.parts(cfg.data):
            source.check_model(dataclasses.replace(cfg, data=section))

    def check_architecture(self, cfg, arch):
        for _, source, section in self.parts(cfg.data):
            source.check_architecture(dataclasses.replace(cfg, data=section), arch)

    def separator_id(self, d):
        ids = (s.separator_id(section) for _, s, section in self.parts(d))
        return next((i for i in ids if i is not None), None)

    def prepare(self, d):
        parts = self.parts(d)
        corpora = [mixture.for_entry(e, s.prepare, section, errors=DataError)
                   for e, s, section in parts]
        return mixture.MixtureCorpus(d.mixture, [e for e, _, _ in parts], corpora)


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(DataConfig)}
SOURCES = {s.name: s for s in (Pystdlib, TextFiles, Markov, Induction, Mqar, Regression,
                                Shards, Mixture)}
PREFIXES = {Tfds.prefix: Tfds}  # sources named by a prefix and the rest of the name


def source_named(name: str) -> Source:
    """The source ``data.source`` names. Raises ConfigError("data.source") when none does."""
    if name in SOURCES:
        return SOURCES[name]()
    for prefix, cls in PREFIXES.items():
        if name.startswith(prefix):
            return cls(name)
    forms = ", ".join(f"{p}<name>/<feature>" for p in PREFIXES)
    raise ConfigError("data.source", f"unknown source {name!r}; valid sources are "
                                     f"{', '.join(SOURCES)}, or {forms}")


def source_of(d) -> Source:
    """The source of the data section ``d``: its mixture when ``data.mixture`` is set (with
    data.source unset or ``mixture``)."""
    if not d.mixture:
        return source_named(d.source)
    if d.source not in (_DEFAULTS["source"], Mixture.name):
        raise ConfigError("data.mixture", f"names the sources and data.source={d.source} names "
                          "one: put it in data.mixture and leave data.source unset")
    return Mixture()


def validate(d) -> Source:
    """The data section ``d`` with its source's rules (raises ConfigError naming the field)."""
    source = source_of(d)
    readers = {}
    for cls in SOURCES.values():
        for field in cls.fields:
            readers.setdefault(field, []).append(cls.name)
    read = source.reads(d)
    for field, names in readers.items():
        if field not in read and getattr(d, field) != _DEFAULTS[field]:
            raise ConfigError(f"data.{field}", f"is read only by data.source "
                              f"{' or '.join(names)}; data.source={d.source} does not use it")
    kind = tokenizer_class(d.tokenizer)  # None: a tokenizer.json
    if kind:
        kind.check(d)
    elif not source.tokenizer_files:
        readers = " or ".join(n for n, cls in SOURCES.items() if cls.tokenizer_files)
        raise ConfigError("data.tokenizer", f"a tokenizer.json tokenizes data.source {readers}; "
                          f"data.source={d.source} takes {' or '.join(TOKENIZERS)}")
    if d.document_mask and not source.documents:
        raise ConfigError("data.document_mask", f"data.source={d.source} is one stream without "
                          "documents (no end-of-document separator)")
    if d.answers_only and not source.scores_answers:
        scored = " or ".join(n for n, cls in SOURCES.items() if cls.scores_answers)
        raise ConfigError("data.loss_on", f"answers are {scored}'s (data.source={scored}); "
                          f"data.source={d.source} is scored on every target (all)")
    source.validate(d)
    return source


def prepare(d):
    """Builds (once, cached) or loads the corpus the data section ``d`` describes; a token
    task or in-context regression (:mod:`attnlab.data.icl`) is sampled as it is read, with
    nothing to build.

    Raises:
      ConfigError: a bad field of ``d``.
      DataSourceError: missing / empty / unreadable input, an empty split.
      UnknownDatasetError: an unknown TFDS name or feature.
      CacheError: the cache cannot be written or read back.
    """
    validate_data(d)
    return validate(d).prepare(d)


def task_sources() -> tuple[str, ...]:
    """The sources that are in-context-learning tasks (what ``attnlab icl`` evaluates)."""
    return tuple(name for name, cls in SOURCES.items() if cls.is_task)


def task_of(d):
    """The in-context-learning task of the data section ``d``, checked; None for a corpus."""
    return source_of(d).task(d)


def target_weights(d) -> np.ndarray | None:
    """``[seq_len]`` float32: each next-token target's weight in the loss of the data section
    ``d``, or None (every target, ``data.loss_on=all``). ``answers``: MQAR's answers alone, as
    Zoology trains (its labels are ignored elsewhere): the random keys and values of the
    context are noise no model can predict, and they would outweigh the recall 3 to 1."""
    if not d.answers_only:
        return None
    return task_of(d).answer_targets().astype(np.float32)


def separator_id(d) -> int | None:
    """The end-of-document id of the corpus ``d`` prepares (None: no documents)."""
    return source_of(d).separator_id(d)


def window_layout(d) -> tuple[tuple[int, ...], type]:
    """``(shape, dtype)`` of one row of a batch of the data section ``d``."""
    return source_of(d).window_layout(d)


def check(cfg) -> Source:
    """The data section with its source's rules and those between the source and the model's
    sizes (raises ConfigError naming the field); the rules with the model's parts are
    :meth:`Source.check_architecture`'s."""
    source = validate(cfg.data)
    source.check_model(cfg)
    return source
