"""Typed, validated configuration.

Users write `ml_collections.ConfigDict`s (``configs/*.py`` each define ``get_config()``, overridden
from the command line as ``--config.model.n_layers=4``). The dict is converted exactly once, by
:func:`from_config_dict`, into the frozen dataclasses below. Each dataclass validates itself when
it is built (``__post_init__``, so also after ``dataclasses.replace``), and :class:`Config` checks
the rules between sections: a config that exists is valid, and no module re-validates it.
Every module receives these dataclasses, never the raw dict.

The model section, :class:`ModelConfig`, is the model's own (``attnlab/model/config.py``, re-exported
here), so the model never imports this module; ``model.pos_encoding`` is a key of the encoding
registry (``attnlab.model.positions.ENCODINGS``), and each encoding validates its own constraints
and says how many positions it can represent.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

import ml_collections

from attnlab.errors import ConfigError
from attnlab.model.config import ModelConfig, check_choice, check_positive, validate_model
from attnlab.model.objectives import objective_for
from attnlab.model.positions import encoding_for

__all__ = ["Config", "DataConfig", "ModelConfig", "TrainConfig", "base_config_dict",
           "from_config_dict", "validate_data", "validate_model", "validate_train"]

SCHEDULES = ("cosine", "noam", "wsd", "constant")
TOKENIZERS = ("byte", "bpe")
DATA_SOURCES = ("pystdlib", "text_files", "markov")  # plus "tfds:<name>/<feature>"


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where tokens come from and how they are cut into batches."""

    source: str = "pystdlib"  # pystdlib | text_files | markov | tfds:<name>/<feature>
    path: str = ""  # text_files: a directory or a glob
    max_bytes: int = 0  # >0 builds a smaller, separately cached slice of the corpus
    cache_dir: str = ""  # "" -> $ATTNLAB_DATA_DIR or ~/.cache/attnlab
    tokenizer: str = "byte"
    bpe_vocab_size: int = 1024
    seq_len: int = 128
    batch_size: int = 16
    seed: int = 0  # data order; batch i is a pure function of (dataset, seed, i)
    markov_order: int = 2
    markov_branching: int = 4
    markov_seed: int = 0
    markov_tokens: int = 2_000_000

    def __post_init__(self):
        validate_data(self)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation, evaluation, checkpointing and parallelism."""

    steps: int = 1000
    tokens: int = 0  # >0 overrides steps: steps = tokens // (batch_size * seq_len)
    seed: int = 0  # parameter initialisation
    learning_rate: float = 3e-3
    schedule: str = "cosine"
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1  # cosine / wsd floor as a fraction of the peak
    decay_fraction: float = 0.2  # wsd: fraction of steps spent decaying
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    grad_accum: int = 1  # micro-batches per step; batch_size must divide by it
    eval_every: int = 200
    eval_batches: int = 8
    log_every: int = 50
    checkpoint_every: int = 500
    keep_checkpoints: int = 2
    mesh_data: int = -1  # devices on the data-parallel axis; -1 -> all left over
    mesh_fsdp: int = 1  # devices over which parameters and optimizer state are sharded
    distributed: bool = False  # call jax.distributed.initialize (multi-host)
    coordinator_address: str = ""
    num_processes: int = 1
    process_id: int = 0
    # Issue #16: also score the validation windows' T5 noise spans with every objective in its
    # own way (bits per token; attnlab/model/objectives.py Objective.span_scores).
    eval_masked_spans: bool = False

    def __post_init__(self):
        validate_train(self)


@dataclasses.dataclass(frozen=True)
class Config:
    """One run: model, data and training. Built once from a ConfigDict, then passed everywhere."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    name: str = "run"

    def __post_init__(self):
        validate_sections(self)

    @property
    def total_steps(self) -> int:
        if self.train.tokens > 0:
            return max(1, self.train.tokens // (self.data.batch_size * self.data.seq_len))
        return self.train.steps

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def identity(self) -> dict[str, Any]:
        """What the run computes, for run ids and resume checks: :meth:`to_dict` less the fields
        added since the first release while they hold their defaults (see
        :func:`without_new_defaults`)."""
        return without_new_defaults(self.to_dict())


# Every field of the first release (run directories and sweep ids made then must keep resuming
# and matching). A field added since enters a run's identity only when set away from its default,
# so adding a variant (a new config field) changes no existing run id or saved config.
FIRST_RELEASE_FIELDS = frozenset({
    "name", "model.vocab_size", "model.d_model", "model.n_layers", "model.n_heads",
    "model.n_kv_heads", "model.d_ff", "model.max_len", "model.pos_encoding", "model.rope_theta",
    "model.norm", "model.norm_position", "model.norm_eps", "model.ffn", "model.tie_embeddings",
    "model.qk_norm", "model.attention_impl", "model.attention_chunk", "model.dropout",
    "model.dtype", "model.init_std", "data.source", "data.path", "data.max_bytes",
    "data.cache_dir", "data.tokenizer", "data.bpe_vocab_size", "data.seq_len", "data.batch_size",
    "data.seed", "data.markov_order", "data.markov_branching", "data.markov_seed",
    "data.markov_tokens", "train.steps", "train.tokens", "train.seed", "train.learning_rate",
    "train.schedule", "train.warmup_steps", "train.min_lr_ratio", "train.decay_fraction",
    "train.b1", "train.b2", "train.eps", "train.weight_decay", "train.grad_clip",
    "train.grad_accum", "train.eval_every", "train.eval_batches", "train.log_every",
    "train.checkpoint_every", "train.keep_checkpoints", "train.mesh_data", "train.mesh_fsdp",
    "train.distributed", "train.coordinator_address", "train.num_processes", "train.process_id",
})


def _defaults() -> dict[str, Any]:
    """Dotted field name -> default value, for every field of :class:`Config`."""
    flat: dict[str, Any] = {}
    for section, values in Config().to_dict().items():
        if isinstance(values, dict):
            flat.update({f"{section}.{key}": value for key, value in values.items()})
        else:
            flat[section] = values
    return flat


def without_new_defaults(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A config dict (``Config.to_dict()`` or a saved config.json) without the fields added since
    the first release that hold their defaults; absent fields are treated as defaults, so a
    config saved before a field existed equals one saved after with the field at its default."""
    defaults = _defaults()
    out: dict[str, Any] = {}
    for section, values in raw.items():
        if not isinstance(values, Mapping):
            keep = section in FIRST_RELEASE_FIELDS or values != defaults.get(section, values)
            if keep:
                out[section] = values
            continue
        out[section] = {key: value for key, value in values.items()
                        if f"{section}.{key}" in FIRST_RELEASE_FIELDS
                        or value != defaults.get(f"{section}.{key}", object())}
    return out


_SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}


def _build_section(cls, values: Mapping[str, Any], section: str):
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(
                f"{section}.{key}", f"unknown key; valid keys are {', '.join(sorted(known))}"
            )
        kwargs[key] = _coerce(value, known[key], f"{section}.{key}")
    return cls(**kwargs)


def _coerce(value: Any, field: dataclasses.Field, path: str) -> Any:
    """Checks the value's type against the dataclass annotation (ints may stand for floats)."""
    annotation = str(field.type)
    if value is None:
        if "None" not in annotation:
            raise ConfigError(path, "must not be None")
        return None
    if annotation.startswith("bool"):
        if not isinstance(value, bool):
            raise ConfigError(path, f"expected true/false, got {value!r}")
        return value
    if annotation.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"expected an integer, got {value!r}")
        return int(value)
    if annotation.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(path, f"expected a number, got {value!r}")
        return float(value)
    if annotation.startswith("str"):
        if not isinstance(value, str):
            raise ConfigError(path, f"expected a string, got {value!r}")
        return value
    return value


def from_config_dict(config: ml_collections.ConfigDict | Mapping[str, Any]) -> Config:
    """Converts a (possibly nested) ConfigDict or plain dict into a validated :class:`Config`.

    Raises:
      ConfigError: naming the first bad field, before any JAX work happens.
    """
    raw = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
    unknown = set(raw) - set(_SECTIONS) - {"name"}
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(key, "unknown top-level key; valid keys are data, model, name, train")
    sections = {}
    for section, cls in _SECTIONS.items():
        values = raw.get(section, {}) or {}
        if not isinstance(values, Mapping):
            raise ConfigError(section, f"expected a section of keys, got {values!r}")
        sections[section] = _build_section(cls, values, section)
    return Config(name=str(raw.get("name", "run")), **sections)


def validate_data(d: DataConfig) -> None:
    """Every field of the data section; raises ConfigError on the first bad one."""
    if not (d.source in DATA_SOURCES or d.source.startswith("tfds:")):
        raise ConfigError(
            "data.source",
            f"unknown source {d.source!r}; valid sources are {', '.join(DATA_SOURCES)}, "
            "or tfds:<name>/<feature>",
        )
    if d.source == "text_files" and not d.path:
        raise ConfigError("data.path", "source text_files needs a directory or glob in data.path")
    check_choice("data.tokenizer", d.tokenizer, TOKENIZERS)
    for name in ("seq_len", "batch_size", "bpe_vocab_size", "markov_order", "markov_branching",
                 "markov_tokens"):
        check_positive(f"data.{name}", getattr(d, name))
    if d.max_bytes < 0:
        raise ConfigError("data.max_bytes", f"must be >= 0 (0 = whole corpus), got {d.max_bytes}")


def validate_train(t: TrainConfig) -> None:
    """Every field of the train section; raises ConfigError on the first bad one."""
    check_choice("train.schedule", t.schedule, SCHEDULES)
    for name in ("steps", "learning_rate", "eval_every", "eval_batches", "log_every",
                 "checkpoint_every", "keep_checkpoints", "grad_accum", "num_processes"):
        check_positive(f"train.{name}", getattr(t, name))
    for name in ("tokens", "warmup_steps", "weight_decay", "grad_clip", "min_lr_ratio"):
        if getattr(t, name) < 0:
            raise ConfigError(f"train.{name}", f"must be >= 0, got {getattr(t, name)}")
    if not 0 <= t.b1 < 1 or not 0 <= t.b2 < 1:
        raise ConfigError("train.b1" if not 0 <= t.b1 < 1 else "train.b2", "must be in [0, 1)")
    if not 0 < t.decay_fraction <= 1:
        raise ConfigError("train.decay_fraction", f"must be in (0, 1], got {t.decay_fraction}")
    if t.mesh_fsdp < 1 or (t.mesh_data < 1 and t.mesh_data != -1):
        raise ConfigError("train.mesh_data", "mesh sizes must be >= 1 (mesh_data may be -1 = rest)")


def validate_sections(cfg: Config) -> None:
    """The rules between sections (each section has validated itself when it was built)."""
    if cfg.data.batch_size % cfg.train.grad_accum:
        raise ConfigError(
            "train.grad_accum",
            f"data.batch_size={cfg.data.batch_size} is not divisible by grad_accum={cfg.train.grad_accum}",
        )
    encoding = encoding_for(cfg.model)
    limit = encoding.max_positions()
    if limit is not None and cfg.data.seq_len > limit:
        raise ConfigError(
            "data.seq_len",
            f"{cfg.data.seq_len} exceeds the {limit} positions of the {encoding.range_name}",
        )
    if cfg.model.attention_window > cfg.data.seq_len:
        raise ConfigError(
            "model.attention_window",
            f"{cfg.model.attention_window} is longer than the training context data.seq_len="
            f"{cfg.data.seq_len}: it would train full attention (0 = full causal attention)",
        )
    if cfg.model.ngpt and (cfg.train.weight_decay or cfg.train.warmup_steps):
        name = "train.weight_decay" if cfg.train.weight_decay else "train.warmup_steps"
        raise ConfigError(name, "nGPT trains without weight decay or warmup (Loshchilov et al. "
                                "2024): set train.weight_decay=0 and train.warmup_steps=0")
    if cfg.data.tokenizer == "byte" and cfg.model.vocab_size < 256:
        raise ConfigError("model.vocab_size", f"the byte tokenizer needs >= 256, got {cfg.model.vocab_size}")
    if objective_for(cfg.model).uses_mask:
        # [MASK] is the model's last id (model.vocab_size - 1): it must lie past every token id.
        ids = 256 if cfg.data.tokenizer == "byte" else cfg.data.bpe_vocab_size
        if cfg.data.source != "markov" and cfg.model.vocab_size <= ids:
            raise ConfigError("model.vocab_size",
                              f"model.objective={cfg.model.objective} needs a [MASK] id after the "
                              f"{cfg.data.tokenizer} tokenizer's {ids} ids: set model.vocab_size "
                              f">= {ids + 1}, got {cfg.model.vocab_size}")


def base_config_dict() -> ml_collections.ConfigDict:
    """A ConfigDict holding every field at its default, for configs/*.py to start from.

    Optional ints (n_kv_heads, d_ff) become placeholders so that command-line overrides such as
    ``--config.model.n_kv_heads=2`` type-check.
    """
    raw = Config().to_dict()
    config = ml_collections.ConfigDict(raw)
    config.model.n_kv_heads = ml_collections.config_dict.placeholder(int)
    config.model.d_ff = ml_collections.config_dict.placeholder(int)
    return config
