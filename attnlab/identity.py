"""A run's identity: what it computes, for run ids and resume checks.

A run directory or sweep id made by an earlier release must keep resuming and matching, so a
config field added since the first release enters the identity only when set away from its
default: adding a variant (a new config field) changes no existing run id or saved config.
"""

from __future__ import annotations

from typing import Any, Mapping

from attnlab.config import Config

# Every field of the first release.
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


# How a run is launched, not what it computes: may differ when a run is resumed. (Resharding a
# checkpoint onto another mesh is exact for the parameters; later steps then reduce in another
# order, so the continuation matches to float rounding, not bitwise.)
RESUMABLE_DIFFERENCES = frozenset({
    "data.cache_dir", "data.workers", "train.distributed", "train.coordinator_address",
    "train.num_processes", "train.process_id", "train.mesh_data", "train.mesh_fsdp",
    "train.keep_steps",
})


def flatten(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A config dict as dotted field name -> value (``{'model.d_model': 64, 'name': ...}``)."""
    flat: dict[str, Any] = {}
    for section, values in raw.items():
        if isinstance(values, Mapping):
            flat.update({f"{section}.{key}": value for key, value in values.items()})
        else:
            flat[section] = values
    return flat


def _defaults() -> dict[str, Any]:
    """Dotted field name -> default value, for every field of :class:`Config`."""
    return flatten(Config().to_dict())


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


def identity(cfg: Config) -> dict[str, Any]:
    """What the run computes: ``cfg.to_dict()`` less the fields added since the first release
    while they hold their defaults."""
    return without_new_defaults(cfg.to_dict())


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``['train.steps: saved 20, given 40', ...]`` ignoring :data:`RESUMABLE_DIFFERENCES`; a
    field the saved config predates counts as its default."""
    a, b = flatten(without_new_defaults(saved)), flatten(without_new_defaults(current))
    return [f"{k}: saved {a.get(k)!r}, given {b.get(k)!r}"
            for k in sorted(set(a) | set(b))
            if k not in RESUMABLE_DIFFERENCES and a.get(k) != b.get(k)]
