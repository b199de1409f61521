"""Output heads (``model.head``): what the last hidden state passes through on its way to the
logits ``x W_head`` (``W_head = E^T`` when tied), one class per kind.

* ``linear`` (the default): ``logits = x W_head``;
* ``bert``: BERT's masked-LM head (Devlin et al. 2019; transformers' ``BertLMPredictionHead``),
  a transform before the projection and an output bias after it::

      h = Norm(act(x W_t + b_t))        W_t [d_model, d_model]
      logits = h W_head + b_out         b_out [vocab]

  ``act`` is the FFN's activation (BERT's ``hidden_act`` serves both) and ``Norm`` is
  ``model.norm`` with ``model.norm_eps``. Its parameters are a module at ``head``
  (``head/transform/{kernel,bias}``, ``head/norm/*``, ``head/bias``), counted in N
  (non-embedding) like the norms.
* ``t5``: T5's tied head (Raffel et al. 2020; transformers' ``T5ForConditionalGeneration`` with
  ``tie_word_embeddings``): ``logits = (x d_model^-0.5) E^T``, the hidden state rescaled
  because the head shares the embedding table. No parameters.

Every head acts after the stack's final norm. Shapes: ``x [batch, seq, d_model] -> logits
[batch, seq, vocab]``; :meth:`Head.hidden` maps ``x`` before the projection, :meth:`Head.output`
the logits after it, each given the head's module (:meth:`Head.build`, None without one).
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
    fields only this kind reads).
    """

    cfg: ModelConfig = dataclasses.field(repr=False)
    ffn: FFN
    norm: type

    name = ""
    title = ""
    fields = ()

    def validate(self, arch) -> None:
        """Rules against the model's other parts (raises ConfigError naming the field)."""

    def build(self, rngs: nnx.Rngs) -> nnx.Module | None:
        """The head's module, or None (no parameters of its own)."""
        return None

    def hidden(self, module, x: jax.Array) -> jax.Array:
        """``x [batch, seq, d_model]`` as the projection to the vocabulary reads it."""
        return x

    def output(self, module, logits: jax.Array) -> jax.Array:
        """``logits float32 [batch, seq, vocab]`` after the projection."""
        return logits

    def param_count(self) -> int:
        return 0

    def flops_per_token(self) -> float:
        """Forward FLOPs per token besides the projection to the vocabulary."""
        return 0.0


class LinearHead(Head):
    name = "linear"
    title = "the linear head"


class BertHeadModule(nnx.Module):
    """BERT's transform ``Norm(act(x W_t + b_t))`` and output bias ``b_out [vocab]``."""

    def __init__(self, cfg: ModelConfig, activation, norm: type, *, rngs: nnx.Rngs):
        d = cfg.d_model
        self.activation = activation
        self.transform = dense(cfg, d, d, cfg.init_std, rngs, bias=True)
        self.norm = norm(d, cfg.norm_eps)
        self.bias = nnx.Param(jnp.zeros((cfg.vocab_size,), jnp.float32))


class BertHead(Head):
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

    def hidden(self, module, x):
        return module.norm(module.activation(module.transform(x)))

    def output(self, module, logits):
        return logits + module.bias[...]

    def param_count(self):
        d = self.cfg.d_model
        return d * d + d + self.norm.param_count(d) + self.cfg.vocab_size

    def flops_per_token(self):
        return 2.0 * self.cfg.d_model ** 2


class T5Head(Head):
    """T5's tied head: the hidden state times ``d_model^-0.5`` (module docstring)."""

    name = "t5"
    title = "T5's rescaled tied head (model.head=t5)"

    def validate(self, arch):
        if not self.cfg.tie_embeddings:
            raise ConfigError("model.head", "t5 rescales the hidden state for the head tied to "
                              "the embeddings; model.tie_embeddings=false (T5 v1.1) has no "
                              "rescale: use linear")
        if self.cfg.ngpt or not arch.inputs.reads_tokens:
            raise ConfigError("model.head", "t5 is built for token models without nGPT's "
                              "logit scale")

    def hidden(self, module, x):
        return x * jnp.asarray(self.cfg.d_model ** -0.5, x.dtype)
