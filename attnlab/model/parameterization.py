"""How a model's initialisation, learning rates and output scales depend on its width
(``model.parameterization``), one class per choice:

* ``sp``: the standard parameterisation: every matrix drawn at ``model.init_std`` (the residual
  output projections at ``init_std / sqrt(2 n_layers)``), one Adam learning rate, the logits as
  they come. The default.
* ``mup``: the maximal-update parameterisation for Adam (Yang et al. 2022, "Tensor Programs V",
  arXiv 2203.03466, Table 3 in the form of its Table 8), relative to a base model of width
  ``model.mup_base_d_model`` whose standard parameterisation it equals exactly.

With width multiplier ``m = fan_in / base_fan_in`` of each parameter (Tensor Programs V, sec. 4
and App. B, "base shapes"): a dimension of a parameter is *infinite* when it differs between
this model and the base model (the same config at ``d_model = mup_base_d_model``, ``d_ff`` scaled
in proportion), and

| parameter | infinite dims | init std | Adam LR | forward |
|---|---|---|---|---|
| hidden weights (q, k, v, o, FFN) ``[fan_in, fan_out]`` | 2 | ``sp_std / sqrt(m)`` | ``lr / m`` | |
| embeddings, norms, biases, untied head ``[d, V]`` | <= 1 | ``sp_std`` | ``lr`` | |
| logits ``h W_head`` | | | | ``x (1 / m_d)``, ``m_d = d / d_base`` |
| attention scores ``q.k`` | | | | ``sqrt(base_head_dim) / head_dim`` |

The hidden weights' ``1 / fan_in`` variance and ``1 / fan_in`` Adam learning rate, the constant
input and output weights with a ``1 / width`` multiplier on the logits (Table 8's equivalent of
Table 3's ``1 / fan_in^2`` output variance), and ``1/d_k`` attention (sec. 4; here times the base
model's ``sqrt(d_k)``, so that at the base width the scale is ``1/sqrt(d_k)`` and the model is the
standard one). AdamW's decoupled weight decay ``lr * wd * W`` is kept per step as at the base
width (the ``mup`` package's ``MuAdamW``: ``wd`` times ``m`` where ``lr`` is divided by ``m``).

Scalars and tables whose shape does not grow with width keep the standard rule. Parts with no
published muP rule (mixers other than softmax attention, nGPT, the encoder-decoder's
cross-attention) declare ``mup_rule = False`` and are refused.

    p = resolve(cfg).parameterization
    p.init_scales(params)    # per-parameter factors on the standard init (a pytree of floats)
    p.lr_multipliers_fn()    # params -> per-parameter factors on Adam's lr (None for sp)
    p.logit_multiplier()     # None, or 1 / m_d
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError


def path_name(path) -> str:
    """A parameter's path in a ``nnx.State`` as ``'blocks/0/attn/q_proj/kernel'``."""
    names = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
    return "/".join(names[:-1] if names and names[-1] == "value" else names)


@dataclasses.dataclass(frozen=True)
class Parameterization:
    """One choice of ``model.parameterization`` for a model built from ``cfg`` (immutable).

    Class attributes: ``name`` (the config value), ``title`` (for messages), ``fields`` (the
    ``model.*`` fields only this choice reads), ``transfers_learning_rate`` (the best learning
    rate, tuned at one width, holds at every width: what a sweep's ``transfer`` rule needs).
    """

    cfg: ModelConfig = dataclasses.field(repr=False)

    name = ""
    title = ""
    fields = ()
    transfers_learning_rate = False

    def validate(self, arch) -> None:
        """Rules between this choice and the model's parts (raises ConfigError)."""

    def anchored(self, score_scale):
        """The score scale as this choice uses it (the standard one: as configured)."""
        return score_scale

    def logit_multiplier(self) -> float | None:
        """The factor on the logits, or None (the logits as they come)."""
        return None

    def init_scales(self, params, shapes_of):
        """Per-parameter factors on the standard init: a pytree of floats like ``params``.
        ``shapes_of(model_cfg) -> {path: shape}`` gives another model's parameter shapes (the
        model's builder, which imports this module: handed in, not imported)."""
        return jax.tree.map(lambda _: 1.0, params)

    def lr_multipliers_fn(self, shapes_of):
        """``params -> factors`` on each parameter's Adam learning rate (a pytree of floats
        like ``params``), or None: one learning rate for all."""
        return None


class Standard(Parameterization):
    """The standard parameterisation (the default): the model as attnlab always built it."""

    name = "sp"
    title = "the standard parameterisation"


class MuP(Parameterization):
    """muP for Adam relative to the base width ``model.mup_base_d_model`` (module docstring)."""

    name = "mup"
    title = "muP"
    fields = ("mup_base_d_model",)
    transfers_learning_rate = True  # muTransfer (Tensor Programs V, sec. 5)

    @property
    def width_multiplier(self) -> float:
        """``m_d = d_model / mup_base_d_model``."""
        return self.cfg.d_model / self.cfg.mup_base_d_model

    def base_config(self) -> ModelConfig:
        """The same model at the base width (standard parameterisation): ``d_model`` and an
        explicit ``d_ff`` scaled, heads, layers and vocabulary kept."""
        cfg, base = self.cfg, self.cfg.mup_base_d_model
        d_ff = None if cfg.d_ff is None else cfg.d_ff * base // cfg.d_model
        return dataclasses.replace(cfg, d_model=base, d_ff=d_ff, parameterization=Standard.name,
                                   mup_base_d_model=0)

    def validate(self, arch) -> None:
        cfg, base = self.cfg, self.cfg.mup_base_d_model
        if base <= 0:
            raise ConfigError("model.mup_base_d_model",
                              "muP needs the base width its learning rate is tuned at "
                              "(e.g. the smallest model of the sweep), got 0")
        if base % cfg.n_heads:
            raise ConfigError("model.mup_base_d_model",
                              f"{base} is not divisible by model.n_heads={cfg.n_heads}")
        if cfg.d_ff is not None and (cfg.d_ff * base) % cfg.d_model:
            raise ConfigError("model.d_ff",
                              f"muP scales d_ff with d_model; {cfg.d_ff} x "
                              f"mup_base_d_model={base} / d_model={cfg.d_model} is not an integer")
        for stack in filter(None, (arch.stack, arch.decoder)):
            for layer in stack.layers:
                if not layer.mixer.mup_rule:
                    raise ConfigError("model.mixer",
                                      f"{layer.mixer.name} has no published muP rule (Tensor "
                                      "Programs V defines it for softmax attention); use "
                                      "model.parameterization=sp")
                if not layer.mup_rule:
                    raise ConfigError(layer.setting().partition("=")[0],
                                      f"{layer.title} has no published muP rule (its weights "
                                      "live on the unit sphere); use model.parameterization=sp")
        for field, part in (("model.moe", arch.ffn), ("model.inputs", arch.inputs)):
            if not part.mup_rule:
                raise ConfigError(field, f"muP is not built for {part.title}; use "
                                  "model.parameterization=sp")
        if not arch.objective.mup_rule:
            raise ConfigError("model.objective",
                              f"muP is not implemented for the encoder-decoder "
                              f"(model.objective={cfg.objective}: its cross-attention); "
                              "use clm or mlm")
        if any(layer.mixer.forms_scores for layer in arch.stack.layers) \
                and not arch.score_scale.mup_rule:
            raise ConfigError("model.attention_scale",
                              f"muP scales attention scores by 1/d_k (Tensor Programs V, sec. 4): "
                              f"set model.attention_scale=mup, got {cfg.attention_scale}")

    def anchored(self, score_scale):
        """The ``1/d_k`` scale anchored at the base head width: ``sqrt(base_d_k) / d_k``, which
        is ``1/sqrt(d_k)`` at the base."""
        return dataclasses.replace(score_scale,
                                   base_head_dim=self.cfg.mup_base_d_model // self.cfg.n_heads)

    def logit_multiplier(self) -> float:
        """``1 / m_d`` (Table 8's output multiplier; the head is a vector-like weight)."""
        return 1.0 / self.width_multiplier

    def fan_in_ratios(self, params, shapes_of):
        """A pytree of floats like ``params``: ``fan_in / base_fan_in`` for hidden weights (two
        infinite dimensions; ``[..., fan_in, fan_out]``), 1.0 for every other parameter."""
        base = shapes_of(self.base_config())

        def ratio(path, leaf):
            name = path_name(path)
            shape, base_shape = tuple(leaf.shape), base[name]
            if len(shape) != len(base_shape):
                raise ValueError(f"{name}: shape {shape} has no base shape like {base_shape}")
            infinite = sum(a != b for a, b in zip(shape, base_shape))
            if infinite > 2:
                raise ValueError(f"{name}: more than two dimensions grow with width")
            return shape[-2] / base_shape[-2] if infinite == 2 else 1.0

        return jax.tree_util.tree_map_with_path(ratio, params)

    def init_scales(self, params, shapes_of):
        """``1 / sqrt(m)`` for hidden weights (init variance ``~ 1/fan_in``), 1 elsewhere."""
        return jax.tree.map(lambda r: 1.0 / math.sqrt(r), self.fan_in_ratios(params, shapes_of))

    def lr_multipliers(self, params, shapes_of):
        """``1 / m`` for hidden weights (Adam LR ``~ 1/fan_in``), 1 elsewhere."""
        return jax.tree.map(lambda r: 1.0 / r, self.fan_in_ratios(params, shapes_of))

    def lr_multipliers_fn(self, shapes_of):
        return functools.partial(self.lr_multipliers, shapes_of=shapes_of)
