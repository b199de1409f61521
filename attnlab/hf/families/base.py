"""What every Hugging Face family shares: the error, the generic config keys, the
:class:`Family` interface, the config reader and the two widths a tensor map needs."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from attnlab.config import ModelConfig
from attnlab.errors import AttnlabError
from attnlab.hf.tensors import Tensor


class HFError(AttnlabError):
    """An HF checkpoint directory or config that attnlab cannot read or represent."""


# Keys every transformers PretrainedConfig may carry that do not change the model's function.
BOOKKEEPING = frozenset({
    "_name_or_path", "architectures", "model_type", "torch_dtype", "dtype", "transformers_version",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "use_cache", "return_dict", "output_attentions", "output_hidden_states", "torchscript",
    "is_encoder_decoder", "is_decoder", "add_cross_attention", "tie_encoder_decoder",
    "chunk_size_feed_forward", "pruned_heads", "id2label", "label2id", "problem_type",
    "task_specific_params", "finetuning_task", "tokenizer_class", "prefix",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "temperature",
    "top_k", "top_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate",
    "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "initializer_range",  # mapped to model.init_std where the family says so
    # Dropout rates: training settings, not the function (attnlab's model.dropout is set by the
    # fine-tuning config; import writes 0).
    "attention_dropout", "attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_first_dropout",
    # GPT-2's sequence-summary head (GPT2DoubleHeadsModel only; not in the LM).
    "summary_activation", "summary_proj_to_labels", "summary_type", "summary_use_proj",
})

# ModelConfig fields that choose how the function is computed, not which function.
IMPLEMENTATION_FIELDS = frozenset({"attention_impl", "attention_chunk", "dropout", "dtype",
                                   "init_std", "scan_layers", "remat"})


class Family:
    """One HF ``model_type``: its config map (:meth:`model_config`, :meth:`hf_config`) and its
    tensor map (:meth:`tensors`)."""

    model_type = ""
    architecture = ""  # transformers class written to config.json's "architectures"
    ignored_tensors: tuple[str, ...] = ()  # suffixes of buffers some checkpoints carry
    # (prefix, replacement): key spellings of other saves (a base model's vs the LM's)
    aliases: tuple[tuple[str, str], ...] = ()

    def canonical(self, key: str) -> str:
        """``key`` as :meth:`tensors` spells it."""
        for prefix, replacement in self.aliases:
            if key.startswith(prefix):
                return replacement + key[len(prefix):]
        return key

    def model_config(self, hf: dict[str, Any]) -> ModelConfig:
        raise NotImplementedError

    def hf_config(self, cfg: ModelConfig, context: int) -> dict[str, Any]:
        """The HF config of ``cfg`` (``context``: the run's ``data.seq_len``, written where the
        family records its context, e.g. ``max_position_embeddings``)."""
        raise NotImplementedError

    def represents(self, cfg: ModelConfig) -> bool:
        """Whether ``cfg`` is this family's kind of model (the choice of family on export);
        :meth:`hf_config` then checks every other field."""
        raise NotImplementedError

    def tensors(self, cfg: ModelConfig) -> list[Tensor]:
        raise NotImplementedError

    def context_length(self, cfg_hf: dict[str, Any]) -> int:
        """The training context recorded in the imported run's ``data.seq_len``."""
        raise NotImplementedError

    def tied_copies(self, cfg: ModelConfig) -> dict[str, str]:
        """``{HF key: attnlab path}``: tensors some saves write although they are tied to a
        parameter (a tied head); accepted on import only when equal to it, never exported."""
        return {"lm_head.weight": "token_embedding"} if cfg.tie_embeddings else {}

    def folded(self) -> dict[str, str]:
        """``{HF key: the HF key it is folded into}``: tensors attnlab holds inside another
        parameter (:meth:`fold` adds them on import, :meth:`unfolded` writes them on export)."""
        return {}

    def fold(self, key: str, tensor: np.ndarray, read) -> np.ndarray:
        """Import: the tensor ``key`` with what :meth:`folded` puts into it (``read(key)``
        reads another tensor of the checkpoint, checked)."""
        return tensor

    def unfolded(self, cfg: ModelConfig) -> dict[str, np.ndarray]:
        """Export: the tensors :meth:`folded` names, as attnlab's model has them."""
        return {}

    def notes(self, hf: dict[str, Any]) -> list[str]:
        """What an import of ``hf`` should tell the user (an exact restriction, e.g. inputs of
        one token type)."""
        return []


class Reader:
    """Reads an HF config: each key once, so that whatever is left is unknown to attnlab."""

    def __init__(self, hf: dict[str, Any], family: str):
        self.hf, self.family, self.read = hf, family, set(BOOKKEEPING)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return self.hf.get(key, default)

    def need(self, key: str) -> Any:
        self.read.add(key)
        if key not in self.hf:
            raise HFError(f"config.json: {key} is missing (needed by model_type={self.family})")
        return self.hf[key]

    def expect(self, key: str, allowed: tuple, what: str) -> Any:
        """``hf[key]`` (absent counts as ``allowed[0]``), refused unless in ``allowed``."""
        value = self.get(key, allowed[0])
        if value not in allowed:
            raise HFError(f"config.json: {key}={value!r} is not representable in attnlab "
                          f"({what}; accepted: {', '.join(map(repr, allowed))})")
        return value

    def done(self) -> None:
        unknown = sorted(set(self.hf) - self.read)
        if unknown:
            raise HFError(f"config.json: {unknown[0]}={self.hf[unknown[0]]!r} is a setting "
                          f"attnlab has no equivalent for (model_type={self.family}); refusing "
                          "rather than approximating")


def refuse_fields(cfg: ModelConfig, family: str, required: dict[str, Any],
                   mapped: set[str]) -> None:
    """Export: every field not mapped to an HF key must hold the value the family computes
    (``required``) or its default; the first that does not is refused, naming it."""
    default = ModelConfig()
    for field in dataclasses.fields(ModelConfig):
        name = field.name
        if name in mapped or name in IMPLEMENTATION_FIELDS:
            continue
        want = required.get(name, getattr(default, name))
        if getattr(cfg, name) != want:
            raise HFError(f"model.{name}={getattr(cfg, name)!r} has no {family} equivalent "
                          f"(a {family} checkpoint needs {want!r})")


def lm_width(cfg: ModelConfig) -> int:
    """The FFN width a config builds (``model.d_ff`` or the kind's default)."""
    from attnlab.model import resolve

    return resolve(cfg).ffn.width


def resolve_inputs(cfg: ModelConfig) -> int:
    """The FFN's input projections (2 for a gated FFN)."""
    from attnlab.model import resolve

    return resolve(cfg).ffn.inputs
