"""The base class of a data source (:mod:`attnlab.data.sources` registers the sources): what a
source yields, which data fields only it reads, the rules it adds (raising ConfigError naming the
field) and how it is built. The defaults describe a text corpus of documents, tokenized by
``data.tokenizer``, each document ended by the separator."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnlab.data import corpus
from attnlab.data.cache import cache_root
from attnlab.data.tfds_build import TfdsBuild
from attnlab.data.tokenizer import tokenizer_class
from attnlab.errors import ConfigError


class Source:
    """A ``data.source``. The defaults describe a text corpus of documents, tokenized by
    ``data.tokenizer``, each document ended by the separator."""

    name = ""
    documents = True  # False: one stream without end-of-document separators
    vectors = False  # batches are prompts of vectors (in-context regression), not token ids
    is_task = False  # sampled as it is read (attnlab/data/icl.py): nothing to build
    fields: tuple[str, ...] = ()  # the data fields that only sources of this kind read
    scores_answers = False  # data.loss_on=answers means something here
    tokenizer_files = False  # data.tokenizer may be the path of a tokenizer.json
    reads_path = False  # data.path says where its files are
    slices = False  # data.max_bytes > 0 builds a slice of it (in a mixture: of those that do)

    def reads(self, d) -> tuple[str, ...]:
        """The source-specific data fields this source reads (:attr:`fields`)."""
        return self.fields

    @property
    def mixable(self) -> bool:
        """Whether it can be an entry of a mixture: a corpus, not a task sampled as read."""
        return not self.is_task

    def validate(self, d) -> None:
        """The data section's rules that depend on this source."""

    def token_ids(self, d) -> int | None:
        """The ids a [MASK] id must lie past: the tokenizer's; None when the source's ids are
        its own."""
        return tokenizer_class(d.tokenizer).ids(d)

    def check_model(self, cfg) -> None:
        """The rules between this source and the model section's sizes."""
        ids = tokenizer_class(cfg.data.tokenizer).ids(cfg.data)
        if cfg.model.vocab_size < ids:
            raise ConfigError("model.vocab_size", f"the {cfg.data.tokenizer} tokenizer needs "
                                                  f">= {ids}, got {cfg.model.vocab_size}")

    def check_architecture(self, cfg, arch) -> None:
        """The rules between this source and the model's resolved parts."""
        if arch.inputs.reads_tokens == self.vectors:
            raise ConfigError("model.inputs",
                              f"{cfg.model.inputs} models cannot be trained on data.source="
                              f"{cfg.data.source}, whose batches are "
                              + ("prompts of vectors: set model.inputs=vectors and "
                                 "model.objective=regression" if arch.inputs.reads_tokens else
                                 "token ids; they are trained on in-context regression prompts "
                                 "(data.source=regression)"))
        if arch.objective.reads_vectors != self.vectors:
            raise ConfigError("model.objective", f"{cfg.model.objective} cannot be trained on "
                              f"data.source={cfg.data.source} (in-context regression prompts "
                              "are trained with model.objective=regression, token windows "
                              "without)")
        if cfg.data.answers_only and not arch.objective.weights_targets:
            raise ConfigError("data.loss_on", f"{cfg.data.loss_on} weights next-token targets; "
                              f"model.objective={cfg.model.objective} chooses its own")
        ids = self.token_ids(cfg.data)
        # [MASK] is the model's last id (model.vocab_size - 1): it must lie past every token id.
        if arch.objective.uses_mask and ids is not None and cfg.model.vocab_size <= ids:
            raise ConfigError("model.vocab_size",
                              f"model.objective={cfg.model.objective} needs a [MASK] id after "
                              f"the {cfg.data.tokenizer} tokenizer's {ids} ids: set "
                              f"model.vocab_size >= {ids + 1}, got {cfg.model.vocab_size}")

    def task(self, d):
        """The in-context-learning task of ``d``, checked; None for a corpus."""
        return None

    def build(self, d, root: Path) -> TfdsBuild:
        """The TFDS builder a corpus of this source is prepared from."""
        raise NotImplementedError

    def prepare(self, d):
        """This source's corpus of the data section ``d``: built once, then loaded."""
        root = cache_root(d.cache_dir)
        return corpus.prepare_built(self.build(d, root), d, root)

    def separator_id(self, d) -> int | None:
        """The end-of-document id, known before the corpus is built (None: no documents)."""
        if not self.documents:
            return None
        return tokenizer_class(d.tokenizer).separator(d)

    def window_layout(self, d) -> tuple[tuple[int, ...], type]:
        """``(shape, dtype)`` of one row of a batch: token windows ``[seq_len + 1]`` int32."""
        return (d.seq_len + 1,), np.int32
