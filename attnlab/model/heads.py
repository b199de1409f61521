"""Output heads (``model.head``): what the last hidden state passes through on its way to the
logits, one class per kind.

* ``linear`` (the default): ``logits = x W_head`` (``W_head = E^T`` when tied);
* ``bert``: BERT's masked-LM head (Devlin et al. 2019; transformers' ``BertLMPredictionHead``),
  a transform before the projection and an output bias after it::

      h = Norm(act(x W_t + b_t))        W_t [d_model, d_model]
      logits = h W_head + b_out         b_out [vocab]

  ``act`` is the FFN's activation (BERT's ``hidden_act`` serves both) and ``Norm`` is
  ``model.norm`` with ``model.norm_eps``.

Shapes: ``x [batch, seq, d_model] -> logits [batch, seq, vocab]``. The head's parameters are a
module at ``head`` (``head/transform/{kernel,bias}``, ``head/norm/*``, ``head/bias``), counted
in N (non-embedding) like the norms.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError
from attnlab.model.ffn import FFN
from attnlab.model.layers import dense


@dataclasses.dataclass(frozen=True)
class Head:
    """The output head of a model built from ``cfg``, with the model's FFN kind (whose
    activation a transform reuses) and norm class (immutable, hashable).

    Class attributes: ``name`` (the ``model.head`` value), ``title``, ``fields`` (``model.*``
    fields only this kind reads), ``mup_rule``.
    """

    cfg: ModelConfig = dataclasses.field(repr=False)
    ffn: FFN
    norm: type

    name = ""
    title = ""
    fields = ()
    mup_rule = True

    def validate(self, arch) -> None:
        """Rules against the model's other parts (raises ConfigError naming the field)."""

    def build(self, rngs: nnx.Rngs) -> nnx.Module | None:
        """The head's module, or None (no parameters of its own)."""
        return None

    def param_count(self) -> int:
        return 0

    def flops_per_token(self) -> float:
        """Forward FLOPs per token besides the projection to the vocabulary."""
        return 0.0


class Linear(Head):
    name = "linear"
    title = "the linear head"


class BertHeadModule(nnx.Module):
    """``h = Norm(act(x W_t + b_t))`` (:meth:`transform`), then ``+ b_out`` on the logits
    (:meth:`add_bias`)."""

    def __init__(self, cfg: ModelConfig, activation, norm: type, *, rngs: nnx.Rngs):
        d = cfg.d_model
        self.activation = activation
        self.transform = dense(cfg, d, d, cfg.init_std, rngs, bias=True)
        self.norm = norm(d, cfg.norm_eps)
        self.bias = nnx.Param(jnp.zeros((cfg.vocab_size,), jnp.float32))

    def transform_hidden(self, x: jax.Array) -> jax.Array:
        """``[batch, seq, d_model] -> [batch, seq, d_model]``."""
        return self.norm(self.activation(self.transform(x)))

    def add_bias(self, logits: jax.Array) -> jax.Array:
        """``[batch, seq, vocab] -> [batch, seq, vocab]``."""
        return logits + self.bias[...]


class Bert(Head):
    """BERT's masked-LM head (module docstring)."""

    name = "bert"
    title = "BERT's masked-LM head (model.head=bert)"

    def validate(self, arch):
        if self.ffn.activation is None:
            raise ConfigError("model.head", f"bert's transform applies the FFN's activation; "
                              f"model.ffn={self.cfg.ffn} (model.moe={self.cfg.moe}) has none "
                              "(use gelu_erf, gelu or relu, without experts)")
        if arch.decoder is not None or self.cfg.ngpt or not arch.inputs.reads_tokens:
            raise ConfigError("model.head", "bert is built by the token decoder and the mlm "
                              "encoder only, not by the encoder-decoder, nGPT or a vector "
                              "read-in")

    def build(self, rngs):
        return BertHeadModule(self.cfg, self.ffn.activation, self.norm, rngs=rngs)

    def param_count(self):
        d = self.cfg.d_model
        return d * d + d + self.norm.param_count(d) + self.cfg.vocab_size

    def flops_per_token(self):
        return 2.0 * self.cfg.d_model ** 2
