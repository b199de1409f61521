"""What a model reads and writes (``model.inputs``), one class per kind:

* ``tokens`` (the default): token ids through the embedding table ``E``, logits ``x W_head``
  (``W_head = E^T`` when tied): :class:`~attnlab.model.transformer.TransformerLM`;
* ``vectors``: real vectors ``z_t`` of ``model.input_dim`` through a linear read-in
  ``z_t W_in + b_in``, and one real number per position through a linear read-out
  ``x_t w_out + b_out`` (Garg et al. 2022, section 3: a GPT-2 backbone for in-context
  regression, prompts ``x_1, (y_1, 0..), ..``):
  :class:`~attnlab.model.transformer.VectorTransformer`.

Shapes: ``tokens [batch, seq] -> logits [batch, seq, vocab]``;
``vectors [batch, seq, input_dim] -> predictions [batch, seq]``.
"""

from __future__ import annotations

import dataclasses

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Inputs:
    """The read-in / read-out kind of a model built from ``cfg`` (immutable, hashable).

    Class attributes: ``name`` (the ``model.inputs`` value), ``title``, ``fields`` (``model.*``
    fields only this kind reads), ``reads_tokens`` (it reads token ids: what every corpus of
    ``data.source`` yields, so ``attnlab train`` can train it)."""

    cfg: ModelConfig = dataclasses.field(repr=False)

    name = ""
    title = ""
    fields = ()
    mup_rule = True  # model.parameterization=mup is built for it
    reads_tokens = True

    def validate(self, objective) -> None:
        """Rules against the objective (raises ConfigError naming the field)."""

    def read_in_params(self) -> int:
        raise NotImplementedError

    def read_out_params(self) -> int:
        raise NotImplementedError

    def flops_per_token(self) -> float:
        """Forward FLOPs of the read-in and read-out per position."""
        raise NotImplementedError

    def read_out_flops(self) -> float:
        """Forward FLOPs of the read-out alone per position."""
        raise NotImplementedError


class Tokens(Inputs):
    name = "tokens"
    title = "token ids"

    def validate(self, objective):
        if objective.reads_vectors:
            raise ConfigError("model.inputs", f"model.objective={objective.name} reads prompts "
                              "of vectors: set model.inputs=vectors (and model.input_dim)")

    def read_in_params(self):
        return self.cfg.vocab_size * self.cfg.d_model

    def read_out_params(self):
        return 0 if self.cfg.tie_embeddings else self.cfg.d_model * self.cfg.vocab_size

    def flops_per_token(self):
        return 4.0 * self.cfg.vocab_size * self.cfg.d_model  # the embedding (as a matmul), head

    def read_out_flops(self):
        return 2.0 * self.cfg.d_model * self.cfg.vocab_size


class Vectors(Inputs):
    name = "vectors"
    title = "real vectors (model.inputs=vectors)"
    fields = ("input_dim",)
    mup_rule = False  # its read-in and read-out would need muP's input and output rules
    reads_tokens = False  # trained on in-context regression prompts (data.source=regression)

    def validate(self, objective):
        if self.cfg.input_dim < 1:
            raise ConfigError("model.input_dim", f"must be positive for model.inputs=vectors, "
                              f"got {self.cfg.input_dim}")
        if not objective.causal or objective.encoder_decoder:
            raise ConfigError("model.inputs", f"vectors are read by a causal decoder; "
                              f"model.objective={self.cfg.objective} is not one")

    def read_in_params(self):
        return (self.cfg.input_dim + 1) * self.cfg.d_model

    def read_out_params(self):
        return self.cfg.d_model + 1

    def flops_per_token(self):
        return 2.0 * self.cfg.input_dim * self.cfg.d_model + self.read_out_flops()

    def read_out_flops(self):
        return 2.0 * self.cfg.d_model
