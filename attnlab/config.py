"""Typed configuration: the leaf every package reads.

Users write `ml_collections.ConfigDict`s (``configs/*.py`` each define ``get_config()``, overridden
from the command line as ``--config.model.n_layers=4``). The dict is converted exactly once, by
:func:`from_config_dict`, into the frozen dataclasses below. Each dataclass checks its own fields
when it is built (``__post_init__``, so also after ``dataclasses.replace``): types, ranges, the
rules between fields of one section that need no knowledge of the model's parts.

Which parts a model is made of (the encoding, each layer's mixer, the FFN, the block kind, the
mask, the objective), and every rule between those parts, is decided once by
``attnlab.model.architecture.resolve``; ``attnlab.model.architecture.check`` adds the rules
between the model and the data and train sections. A data source and the fields that depend on
it are checked by its class in ``attnlab.data.sources``. Entry points call ``attnlab.checks.check``
(both) before anything is compiled. This module imports nothing of the model (nor JAX): data,
sweeps and results read it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

import ml_collections

from attnlab.dataclass_io import build_dataclass
from attnlab.errors import ConfigError
from attnlab.schedules import COOLDOWN_SHAPES, COSINE_DECAY, SCHEDULES, wsd_decay_start

__all__ = ["Config", "DataConfig", "ModelConfig", "TrainConfig", "base_config_dict",
           "from_config_dict", "validate_data", "validate_model", "validate_train"]

DTYPES = ("float32", "bfloat16")

# Fields of the tasks (attnlab/data/sources.py says which source reads which) that must be
# positive, and those that may be 0 (no noise; no curriculum; the function class's default).
TASK_FIELDS = ("task_vocab", "mqar_pairs", "icl_dim", "icl_examples")
TASK_OPTIONAL_FIELDS = ("icl_noise", "icl_curriculum_every", "icl_dim_start",
                        "icl_examples_start", "icl_sparsity", "icl_hidden")
LOSS_ON = ("all", "answers")  # data.loss_on: the targets a task's loss is taken on
MOE_DISPATCHES = ("capacity", "dropless")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and architecture of the Transformer (decoder, encoder or encoder-decoder:
    ``objective``). The string fields name parts in the model's registries
    (``attnlab/model/architecture.py``), which check them when the model is resolved."""

    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # None -> n_heads (MHA); 1 -> MQA; in between -> GQA
    d_ff: int | None = None  # None -> the FFN kind's default width (4 d; SwiGLU 8/3 d)
    max_len: int = 256  # rows of the learned position table; other encodings ignore it
    pos_encoding: str = "rope"
    rope_theta: float = 10000.0
    norm: str = "layernorm"
    norm_position: str = "pre"  # the block kind: pre | post (nGPT: model.ngpt)
    norm_eps: float = 1e-5
    ffn: str = "gelu"
    tie_embeddings: bool = True
    qk_norm: bool = False
    attention_impl: str = "einsum"
    attention_chunk: int = 0  # query-block size for memory-linear attention; 0 -> one block
    dropout: float = 0.0
    dtype: str = "float32"  # compute dtype; parameters are always float32
    init_std: float = 0.02
    # Attention variants; the defaults reproduce the models made before them.
    t5_num_buckets: int = 32  # pos_encoding="t5": buckets of the relative bias (Raffel et al.)
    t5_max_distance: int = 128  # distances >= this share the last bucket
    t5_per_layer: bool = False  # False: one bias table shared by all layers (as in T5)
    rope_scaling: str = "none"  # RoPE frequencies: none | pi | yarn (attnlab extrapolate) | dynamic
    rope_factor: float = 1.0  # s of rope_scaling (evaluation length / training length)
    rope_original_len: int = 0  # YaRN, dynamic: the training context L their scaling is relative to
    attention_scale: str = "rsqrt"  # rsqrt (1/sqrt(d_k)) | mup (1/d_k) | none | learned | cosine
    cosine_tau_init: float = 10.0  # attention_scale="cosine": initial temperature tau
    attention_window: int = 0  # sliding-window attention: keys i-w+1..i; 0 -> full causal
    attention_global_tokens: int = 0  # with a window: the first n tokens stay visible to all
    # the decoder's mask; a positive attention_window: sliding_window
    attention_mask: str = "causal"
    # Sequence mixers; the defaults are softmax attention.
    mixer: str = "softmax"  # softmax | linear (elu+1) | performer (FAVOR+) | mamba
    attention_every: int = 0  # hybrid: layers k-1, 2k-1, ... are softmax attention; 0 -> none
    mixer_features: int = 64  # performer: random features m per head
    mixer_chunk: int = 64  # linear / performer: tokens per chunk of the causal prefix sum
    ssm_state: int = 16  # mamba: N, states per channel
    ssm_expand: int = 2  # mamba: E = ssm_expand * d_model channels
    ssm_conv: int = 4  # mamba: causal depthwise conv kernel
    ssm_scan: str = "associative"  # mamba: associative (O(log T) depth) | sequential (fast on CPU)
    # Mixture of experts (attnlab/model/moe.py); the defaults are a dense FFN.
    moe: str = "none"  # none | token_choice: top-k routed experts, each a model.ffn of d_ff
    moe_experts: int = 8  # E
    moe_top_k: int = 2  # k experts per token (1: Switch's gate; >1: Mixtral's softmax over k)
    # capacity (fixed buffers, overflow dropped) | dropless (grouped matmul): on CPU capacity
    # is 2-10x faster (benchmarks/moe.py, docs/moe.md)
    moe_dispatch: str = "capacity"
    moe_capacity_factor: float = 1.25  # capacity: slots per expert ceil(factor tokens k / E)
    moe_shared_experts: int = 0  # experts every token uses (DeepSeekMoE): one FFN of n d_ff
    moe_balance_coef: float = 0.01  # alpha of the Switch load-balancing loss
    moe_z_coef: float = 0.001  # beta of the ST-MoE router z-loss
    ngpt: bool = False  # nGPT blocks (Loshchilov et al. 2024): everything on the unit sphere
    # clm (causal decoder) | mlm (BERT encoder) | span (T5 encoder-decoder)
    objective: str = "clm"
    # What the model reads: tokens (ids, logits) | vectors (linear read-in of input_dim-vectors,
    # a real number out per position: in-context regression, Garg et al. 2022).
    inputs: str = "tokens"
    input_dim: int = 0  # inputs="vectors": the width of each input vector
    # Implementation choices; the defaults are the models made before them.
    linear_bias: bool = False  # biases on the attention and FFN projections (GPT-2 style)
    # model.norm of the embeddings before the first layer (BERT, Bloom)
    embedding_norm: bool = False
    head: str = "linear"  # the output head: linear | bert (transform + output bias; heads.py)
    scan_layers: bool = False  # layers as one stacked module run by a scan: compile flat in depth
    remat: str = "none"  # rematerialise each layer in the backward pass: none | full | save_dots
    # How init, learning rates and output scales depend on width: sp | mup (Yang et al. 2022);
    # mup is relative to the base width mup_base_d_model (where it equals sp).
    parameterization: str = "sp"
    mup_base_d_model: int = 0

    def __post_init__(self):
        validate_model(self)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where tokens come from and how they are cut into batches."""

    source: str = "pystdlib"  # a source of attnlab/data/sources.py, or tfds:<name>/<feature>
    path: str = ""  # text_files: a directory or a glob; shards: also several, comma-separated
    # Several sources with weights, e.g. "web@shards:/data/web=0.7,pystdlib=0.3"
    # (attnlab/data/mixture.py); each reads the rest of this section.
    mixture: str = ""
    text_field: str = "text"  # shards: the Parquet column / JSON key of each document's text
    workers: int = 0  # shards: processes that tokenize (0: one per core)
    # shards: build even where the tokenizer.json drops more than 1% of a sample's characters
    allow_lossy_tokenizer: bool = False
    max_bytes: int = 0  # >0 builds a smaller, separately cached slice of the corpus
    cache_dir: str = ""  # "" -> $ATTNLAB_DATA_DIR or ~/.cache/attnlab
    tokenizer: str = "byte"  # byte | bpe | the path of a Hugging Face tokenizer.json
    bpe_vocab_size: int = 1024
    seq_len: int = 128
    batch_size: int = 16
    seed: int = 0  # data order; batch i is a pure function of (dataset, seed, i)
    markov_order: int = 2
    markov_branching: int = 4
    markov_seed: int = 0
    markov_tokens: int = 2_000_000
    # In-context learning tasks (attnlab/data/icl.py): induction, mqar.
    task_vocab: int = 64  # the task's ids: 0 .. task_vocab - 1
    mqar_pairs: int = 8  # mqar: key-value pairs per window (and as many queries)
    loss_on: str = "all"  # mqar: "answers" scores only the queried keys' values (as Zoology)
    # In-context linear regression (Garg et al. 2022; data.source=regression): prompts of
    # icl_examples pairs x_i in R^icl_dim, y_i = w.x_i + icl_noise eps, as 2 icl_examples
    # vectors (data.seq_len = 2 icl_examples).
    icl_dim: int = 8
    icl_examples: int = 16
    icl_noise: float = 0.0
    # Garg et al.'s curriculum: training starts at icl_dim_start dimensions (the others zero)
    # and icl_examples_start scored examples, and every icl_curriculum_every steps adds one
    # dimension and two examples up to the task's; 0 = no curriculum.
    icl_curriculum_every: int = 0
    icl_dim_start: int = 0
    icl_examples_start: int = 0
    # The function class y = f(x) (attnlab/data/icl_functions.py): linear, sparse_linear (with
    # icl_sparsity non-zero weights), relu_net (icl_hidden units); 0 = the class's default.
    icl_function: str = "linear"
    icl_sparsity: int = 0
    icl_hidden: int = 0
    # Packed windows keep their documents apart: attention and recurrent states stop at the
    # end-of-document separator (attnlab/model/masks.py); reset_positions also restarts
    # positions at each document's first token.
    document_mask: bool = False
    reset_positions: bool = False

    def __post_init__(self):
        validate_data(self)

    @property
    def answers_only(self) -> bool:
        """``loss_on=answers``: a task's loss is taken on its answers alone."""
        return self.loss_on == "answers"


@dataclasses.dataclass(frozen=True, eq=False)
class TrainConfig:
    """Optimisation, evaluation, checkpointing and parallelism."""

    steps: int = 1000
    tokens: int = 0  # >0 overrides steps: steps = tokens // (batch_size * seq_len)
    seed: int = 0  # parameter initialisation
    learning_rate: float = 3e-3
    schedule: str = "cosine"
    warmup_steps: int = 100
    # The decay's settings; None: the schedule's own (its ``decay_defaults``, attnlab/schedules.py).
    min_lr_ratio: float | None = None  # cosine / wsd floor as a fraction of the peak
    decay_fraction: float | None = None  # wsd: fraction of steps spent decaying
    cooldown: str | None = None  # wsd: shape of the decay: linear | 1-sqrt | cosine
    # A cooldown branch: starts from the checkpoint at step branch_step of the run in directory
    # branch_from (relative: a sibling of this run's directory), whose schedule must equal this
    # run's up to that step (a constant-LR trunk: the stable phase of this run's wsd schedule).
    branch_from: str = ""
    branch_step: int = 0
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
    keep_steps: tuple[int, ...] = ()  # also kept for ever (a trunk's branch points)
    mesh_data: int = -1  # devices on the data-parallel axis; -1 -> all left over
    mesh_fsdp: int = 1  # devices over which parameters and optimizer state are sharded
    # devices over which a mixture of experts' experts are split (expert parallelism)
    mesh_expert: int = 1
    distributed: bool = False  # call jax.distributed.initialize (multi-host)
    coordinator_address: str = ""
    num_processes: int = 1
    process_id: int = 0
    # Also score the validation windows' T5 noise spans with every objective in its own way
    # (bits per token; attnlab/model/objectives.py Objective.span_scores).
    eval_masked_spans: bool = False
    # Multiple-choice tasks scored at every evaluation (registered names or JSON-lines files,
    # attnlab/data/tasks.py), and the examples of each generated one.
    eval_tasks: tuple[str, ...] = ()
    eval_task_examples: int = 200

    def __post_init__(self):
        validate_train(self)

    def decay(self) -> TrainConfig:
        """This section with the decay settings it leaves unset at its schedule's values: what
        the optimizer reads, and what a run's saved config and run id hold."""
        unset = {name: value for name, value in SCHEDULES[self.schedule].decay_defaults.items()
                 if getattr(self, name) is None}
        return dataclasses.replace(self, **unset) if unset else self

    def lr_schedule(self, total_steps: int, d_model: int):
        """The schedule class this section names, built with its resolved decay settings: the
        rate of every update, for the optimizer and for the laws that read a run's rates."""
        t = self.decay()
        return SCHEDULES[t.schedule](t.learning_rate, t.warmup_steps, total_steps,
                                     t.min_lr_ratio, t.decay_fraction, t.cooldown, d_model)

    # Equal when they train alike: a decay setting left unset equals its schedule's value (a
    # run's saved config.json holds the values).
    def __eq__(self, other):
        if not isinstance(other, TrainConfig):
            return NotImplemented
        return dataclasses.astuple(self.decay()) == dataclasses.astuple(other.decay())

    def __hash__(self):
        return hash(dataclasses.astuple(self.decay()))


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
        """Every field, as JSON holds it (tuples as lists), the decay settings at their
        schedule's values: equal to the saved config.json."""
        resolved = dataclasses.replace(self, train=self.train.decay())
        return json.loads(json.dumps(dataclasses.asdict(resolved)))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


_SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}


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
        sections[section] = build_dataclass(cls, values, section)
    return Config(name=str(raw.get("name", "run")), **sections)


def check_choice(path: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(path, f"unknown value {value!r}; valid values are {', '.join(valid)}")


def check_positive(path: str, value: float) -> None:
    if not value > 0:  # also NaN
        raise ConfigError(path, f"must be positive, got {value}")


def validate_model(m: ModelConfig) -> None:
    """The model section's own fields (the parts they name are checked by ``resolve``); raises
    ConfigError on the first bad one."""
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_len"):
        check_positive(f"model.{name}", getattr(m, name))
    check_choice("model.dtype", m.dtype, DTYPES)
    if m.d_model % m.n_heads:
        raise ConfigError(
            "model.d_model", f"{m.d_model} is not divisible by model.n_heads={m.n_heads}"
        )
    if m.n_kv_heads is not None:
        check_positive("model.n_kv_heads", m.n_kv_heads)
        if m.n_heads % m.n_kv_heads:
            raise ConfigError(
                "model.n_heads",
                f"{m.n_heads} is not divisible by model.n_kv_heads={m.n_kv_heads}",
            )
    if m.d_ff is not None:
        check_positive("model.d_ff", m.d_ff)
    for name in ("rope_theta", "norm_eps", "init_std"):
        check_positive(f"model.{name}", getattr(m, name))
    if m.mup_base_d_model < 0:
        raise ConfigError("model.mup_base_d_model", f"must be >= 0, got {m.mup_base_d_model}")
    if m.attention_chunk < 0:
        raise ConfigError("model.attention_chunk", f"must be >= 0, got {m.attention_chunk}")
    if not 0.0 <= m.dropout < 1.0:
        raise ConfigError("model.dropout", f"must be in [0, 1), got {m.dropout}")
    if m.attention_window < 0:
        raise ConfigError("model.attention_window",
                          f"must be >= 1 (0 = full causal attention), got {m.attention_window}")
    if m.attention_global_tokens < 0:
        raise ConfigError("model.attention_global_tokens",
                          f"must be >= 0, got {m.attention_global_tokens}")
    if m.attention_global_tokens and not m.attention_window:
        raise ConfigError("model.attention_global_tokens",
                          "global tokens need a sliding window (model.attention_window >= 1)")
    for name in ("moe_experts", "moe_top_k", "moe_capacity_factor"):
        check_positive(f"model.{name}", getattr(m, name))
    for name in ("moe_shared_experts", "moe_balance_coef", "moe_z_coef"):
        if getattr(m, name) < 0:
            raise ConfigError(f"model.{name}", f"must be >= 0, got {getattr(m, name)}")
    check_choice("model.moe_dispatch", m.moe_dispatch, MOE_DISPATCHES)
    if not 0 <= m.attention_every <= m.n_layers:
        raise ConfigError("model.attention_every",
                          f"must be in [0, model.n_layers={m.n_layers}], got "
                          f"{m.attention_every}")


def validate_data(d: DataConfig) -> None:
    """Every field of the data section alone; raises ConfigError on the first bad one. The
    source names a class in ``attnlab.data.sources``, which checks it and the fields that
    depend on it when it is resolved."""
    if d.workers < 0:
        raise ConfigError("data.workers", f"must be >= 0 (0 = one per core), got {d.workers}")
    for name in ("seq_len", "batch_size", "bpe_vocab_size", "markov_order", "markov_branching",
                 "markov_tokens"):
        check_positive(f"data.{name}", getattr(d, name))
    if d.max_bytes < 0:
        raise ConfigError("data.max_bytes", f"must be >= 0 (0 = whole corpus), got {d.max_bytes}")
    if d.reset_positions and not d.document_mask:
        raise ConfigError("data.reset_positions", "restarts positions at each document: it needs "
                          "data.document_mask=true")
    for name in TASK_FIELDS:
        check_positive(f"data.{name}", getattr(d, name))
    for name in TASK_OPTIONAL_FIELDS:
        if getattr(d, name) < 0:
            raise ConfigError(f"data.{name}", f"must be >= 0, got {getattr(d, name)}")
    check_choice("data.loss_on", d.loss_on, LOSS_ON)


def validate_train(t: TrainConfig) -> None:
    """Every field of the train section; raises ConfigError on the first bad one."""
    check_choice("train.schedule", t.schedule, tuple(SCHEDULES))
    for name in ("steps", "learning_rate", "eval_every", "eval_batches", "log_every",
                 "checkpoint_every", "keep_checkpoints", "grad_accum", "num_processes",
                 "eval_task_examples"):
        check_positive(f"train.{name}", getattr(t, name))
    for name in ("tokens", "warmup_steps", "weight_decay", "grad_clip"):
        if getattr(t, name) < 0:
            raise ConfigError(f"train.{name}", f"must be >= 0, got {getattr(t, name)}")
    if t.min_lr_ratio is not None and t.min_lr_ratio < 0:
        raise ConfigError("train.min_lr_ratio", f"must be >= 0, got {t.min_lr_ratio}")
    if not 0 <= t.b1 < 1 or not 0 <= t.b2 < 1:
        raise ConfigError("train.b1" if not 0 <= t.b1 < 1 else "train.b2", "must be in [0, 1)")
    if t.decay_fraction is not None and not 0 < t.decay_fraction <= 1:
        raise ConfigError("train.decay_fraction", f"must be in (0, 1], got {t.decay_fraction}")
    if t.cooldown is not None:
        check_choice("train.cooldown", t.cooldown, tuple(COOLDOWN_SHAPES))
    if any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in t.keep_steps):
        raise ConfigError("train.keep_steps", f"must be positive step numbers, got "
                                              f"{t.keep_steps}")
    if any(not isinstance(name, str) or not name.strip() for name in t.eval_tasks):
        raise ConfigError("train.eval_tasks", f"must be task names or JSON-lines files, got "
                                              f"{t.eval_tasks}")
    if t.branch_step < 0:
        raise ConfigError("train.branch_step", f"must be >= 0, got {t.branch_step}")
    if bool(t.branch_from) != (t.branch_step > 0):
        raise ConfigError("train.branch_step" if t.branch_from else "train.branch_from",
                          "a cooldown branch needs both train.branch_from (the trunk's run "
                          "directory) and train.branch_step > 0 (the trunk's checkpoint step)")
    if t.branch_from and not SCHEDULES[t.schedule].branches:
        stable = " or ".join(name for name, s in SCHEDULES.items() if s.branches)
        raise ConfigError("train.schedule", f"a cooldown branch (train.branch_from) decays "
                                            f"with schedule {stable}, got {t.schedule!r}")
    if t.mesh_expert < 1:
        raise ConfigError("train.mesh_expert", f"must be >= 1, got {t.mesh_expert}")
    if t.mesh_fsdp < 1 or (t.mesh_data < 1 and t.mesh_data != -1):
        raise ConfigError("train.mesh_data", "mesh sizes must be >= 1 (mesh_data may be -1 = rest)")


def validate_sections(cfg: Config) -> None:
    """The rules between sections that need no knowledge of the model's parts (those that do are
    ``attnlab.model.architecture.check``'s)."""
    if cfg.data.batch_size % cfg.train.grad_accum:
        raise ConfigError(
            "train.grad_accum",
            f"data.batch_size={cfg.data.batch_size} is not divisible by "
            f"grad_accum={cfg.train.grad_accum}",
        )
    if cfg.train.branch_from:
        start = wsd_decay_start(cfg.total_steps, cfg.train.warmup_steps,
                                cfg.train.decay().decay_fraction)
        if cfg.train.branch_step > start:
            raise ConfigError("train.branch_step", f"{cfg.train.branch_step} is past the start "
                              f"of this run's cooldown (step {start} of {cfg.total_steps}): a "
                              f"branch starts from the trunk's constant-LR phase")


def check_warmup(train: TrainConfig, total_steps: int) -> None:
    """A warmup longer than the run never reaches the peak learning rate (for the schedules that
    ask it to fit, ``warmup_within_run``: noam's warmup is its shape). Checked with the rules
    between sections, so that a sweep refuses such a run before it starts rather than recording
    it as failed."""
    if train.warmup_steps > total_steps and SCHEDULES[train.schedule].warmup_within_run:
        raise ConfigError("train.warmup_steps",
                          f"{train.warmup_steps} is longer than the run ({total_steps} steps)")


def base_config_dict() -> ml_collections.ConfigDict:
    """A ConfigDict holding every field at its default, for configs/*.py to start from.

    Optional ints (n_kv_heads, d_ff) and the decay settings become placeholders so that
    command-line overrides such as ``--config.model.n_kv_heads=2`` type-check.
    """
    raw = Config().to_dict()
    # Sequence fields as tuples: ml_collections overrides a tuple from the command line
    # (--config.train.keep_steps='(8,16)') but no list.
    raw = {section: {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
           if isinstance(fields, dict) else fields for section, fields in raw.items()}
    config = ml_collections.ConfigDict(raw)
    config.model.n_kv_heads = ml_collections.config_dict.placeholder(int)
    config.model.d_ff = ml_collections.config_dict.placeholder(int)
    # Unset, so that a config choosing train.schedule=wsd gets wsd's own decay.
    for name, value in COSINE_DECAY.items():
        config.train[name] = ml_collections.config_dict.placeholder(type(value))
    return config
