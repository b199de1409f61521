"""Position-wise feed-forward nets (``model.ffn``), ``d_model -> width -> d_model`` (Vaswani et
al. 2017, eq. 2), one class per kind:

* ``relu`` / ``gelu``: ``act(x W_in) W_out`` (GELU is the tanh approximation, as in GPT-2);
* ``gelu_erf``: the same with the exact GELU ``x Phi(x)`` (BERT's, transformers' ``"gelu"``);
* ``swiglu`` (Shazeer 2020): ``(silu(x W_gate) * (x W_in)) W_out``;
* ``geglu`` (Shazeer 2020; T5 v1.1's "gated-gelu"): ``(gelu(x W_gate) * (x W_in)) W_out``, GELU
  the tanh approximation as in T5 v1.1.
* ``none``: no FFN sublayer at all (nor its norm): the attention-only Transformer of Elhage et
  al. 2021 and Olsson et al. 2022, whose layers only mix positions.

Every ``x W`` is ``x W + b`` with ``model.linear_bias`` (biases ``[width]``, ``[d_model]``).
``W_out`` is a residual output projection: GPT-2 init scales its std by ``1/sqrt(2 n_layers)``.
Shapes: ``[batch, seq, d_model] -> [batch, seq, d_model]``.

    ffn = resolve(cfg).ffn        # FFNS[cfg.ffn](cfg)
    module = ffn.build(rngs)      # parameters w_in (, w_gate), w_out
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from attnlab.config import ModelConfig, TrainConfig
from attnlab.errors import ConfigError
from attnlab.model.layers import dense


def gelu_tanh(x: jax.Array) -> jax.Array:
    """GELU, tanh approximation (Hendrycks & Gimpel 2016; GPT-2)."""
    return jax.nn.gelu(x, approximate=True)


def gelu_erf(x: jax.Array) -> jax.Array:
    """GELU, exact: ``x Phi(x) = x (1 + erf(x / sqrt 2)) / 2`` (Hendrycks & Gimpel 2016, eq. 1;
    BERT)."""
    return jax.nn.gelu(x, approximate=False)


class MLP(nnx.Module):
    """``act(x W_in) W_out``."""

    def __init__(self, cfg: ModelConfig, width: int, activation: Callable, *, rngs: nnx.Rngs):
        residual_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
        self.activation = activation
        self.w_in = dense(cfg, cfg.d_model, width, cfg.init_std, rngs, bias=cfg.linear_bias)
        self.w_out = dense(cfg, width, cfg.d_model, residual_std, rngs, bias=cfg.linear_bias)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.w_out(self.activation(self.w_in(x)))


class GatedMLP(nnx.Module):
    """``(act(x W_gate) * (x W_in)) W_out`` (GLU variants, Shazeer 2020; act = SiLU: SwiGLU)."""

    def __init__(self, cfg: ModelConfig, width: int, *, rngs: nnx.Rngs,
                 activation: Callable = jax.nn.silu):
        d, bias = cfg.d_model, cfg.linear_bias
        self.activation = activation
        residual_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
        self.w_in = dense(cfg, d, width, cfg.init_std, rngs, bias=bias)  # drawn first
        self.w_gate = dense(cfg, d, width, cfg.init_std, rngs, bias=bias)
        self.w_out = dense(cfg, width, d, residual_std, rngs, bias=bias)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.w_out(self.activation(self.w_gate(x)) * self.w_in(x))


@dataclasses.dataclass(frozen=True)
class FFN:
    """One FFN kind of a model built from ``cfg`` (immutable, hashable).

    Class attributes: ``name`` (the ``model.ffn`` value), ``inputs`` (input projections: 1, or
    2 for a gated FFN), ``fields`` (``model.*`` fields only this kind reads), ``sublayer``
    (False: the block has no FFN branch and no norm for it).
    """

    cfg: ModelConfig = dataclasses.field(repr=False)

    name = ""
    title = ""
    inputs = 1
    fields = ()
    sublayer = True
    mup_rule = True  # a published muP rule exists (model.parameterization=mup)
    undecayed = ()  # names of its module's own parameters kept out of weight decay
    activation = None  # a one-input kind's nonlinearity (a staticmethod)

    def default_width(self) -> int:
        return 4 * self.cfg.d_model

    @property
    def width(self) -> int:
        """The hidden width: ``model.d_ff``, or the kind's default."""
        return self.default_width() if self.cfg.d_ff is None else self.cfg.d_ff

    def build(self, rngs: nnx.Rngs) -> nnx.Module:
        raise NotImplementedError

    def param_count(self) -> int:
        """Matrices ``(inputs + 1) d width`` and, with ``model.linear_bias``, their biases."""
        d, width = self.cfg.d_model, self.width
        biases = self.inputs * width + d if self.cfg.linear_bias else 0
        return (self.inputs + 1) * d * width + biases

    def flops_per_token(self) -> float:
        """Forward FLOPs per token: ``2 d width`` per matrix (activations not counted)."""
        return 2.0 * (self.inputs + 1) * self.cfg.d_model * self.width

    # A routed FFN (moe.py) stands in the FFN's place; these are what it adds to the interface.

    def validate(self) -> None:
        """Rules across fields of the model section (raises ConfigError naming the field)."""

    def check_train(self, train: TrainConfig) -> None:
        """Rules between the FFN and the train section: a dense FFN has no experts to split."""
        if train.mesh_expert > 1:
            raise ConfigError("train.mesh_expert", f"{train.mesh_expert} splits a mixture of "
                              f"experts' experts, and this model has none (model.moe=none)")

    def active_param_count(self) -> int:
        """Parameters one token uses (all of them, for a dense FFN)."""
        return self.param_count()

    def computed_flops_per_token(self) -> float:
        """Forward FLOPs the implementation runs per token (padding included)."""
        return self.flops_per_token()

    def losses(self, sown) -> tuple[jax.Array, dict[str, jax.Array]]:
        """``(auxiliary loss, metrics)`` from the ``nnx.Intermediate`` state a forward pass
        left: none for a dense FFN."""
        return jnp.zeros((), jnp.float32), {}


class ReLU(FFN):
    name = "relu"
    activation = staticmethod(jax.nn.relu)

    def build(self, rngs):
        return MLP(self.cfg, self.width, self.activation, rngs=rngs)


class GELU(FFN):
    name = "gelu"
    activation = staticmethod(gelu_tanh)

    def build(self, rngs):
        return MLP(self.cfg, self.width, self.activation, rngs=rngs)


class GELUErf(GELU):
    """The GELU MLP with the exact (erf) GELU, as BERT's (Devlin et al. 2019)."""

    name = "gelu_erf"
    activation = staticmethod(gelu_erf)


class SwiGLU(FFN):
    name = "swiglu"
    inputs = 2

    def default_width(self) -> int:
        # Shazeer 2020: 8/3 d keeps SwiGLU's three matrices at the cost of a 4d two-matrix FFN.
        return -(-(8 * self.cfg.d_model // 3) // 8) * 8

    def build(self, rngs):
        return GatedMLP(self.cfg, self.width, rngs=rngs)


class GeGLU(SwiGLU):
    """The GELU-gated FFN (Shazeer 2020; T5 v1.1's feed-forward); SwiGLU's default width."""

    name = "geglu"

    def build(self, rngs):
        return GatedMLP(self.cfg, self.width, rngs=rngs, activation=gelu_tanh)


class NoFFN(FFN):
    """No FFN: each block is its mixer alone (attention-only; Olsson et al. 2022)."""

    name = "none"
    title = "model.ffn=none"
    inputs = 0
    sublayer = False

    @property
    def width(self) -> int:
        return 0

    def build(self, rngs):
        return None  # the block builds no FFN branch

    def param_count(self) -> int:
        return 0

    def flops_per_token(self) -> float:
        return 0.0
