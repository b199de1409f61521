"""The training state: a pytree of arrays that the jitted step maps to its successor."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from attnlab.config import Config
from attnlab.model import build_model, init_model
from attnlab.model.transformer import ParamKeys


@flax.struct.dataclass
class TrainState:
    """Everything that changes during training. The model's ``GraphDef`` is static and lives
    outside (closed over by the step), as in the Flax NNX functional-API examples.

    ``step`` is the number of updates applied so far, which is also the index of the next batch
    (batch ``i`` is a pure function of ``i``), so it is the data position too.
    """

    step: jax.Array  # int32 scalar
    params: nnx.State  # float32 nnx.Param leaves
    opt_state: Any  # optax state shaped like params


def abstract_model(cfg: Config) -> tuple[nnx.GraphDef, nnx.State]:
    """``(graphdef, params as ShapeDtypeStructs)`` without allocating or computing anything."""
    model = nnx.eval_shape(lambda: build_model(cfg.model, ParamKeys(cfg.train.seed)))
    return nnx.split(model)


def init_train_state(cfg: Config, optimizer: optax.GradientTransformation,
                     key: jax.Array | None = None) -> TrainState:
    """Fresh parameters and a zero optimizer state (call under jit to get them created directly
    in their sharded layout). ``key``: the parameters' PRNG key, default
    ``jax.random.key(train.seed)`` (the same numbers). Passing it as an argument of the jitted
    function, rather than closing over the seed, lets every seed share one compiled program."""
    _, params = init_model(cfg.model, cfg.train.seed if key is None else key)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params))


def abstract_train_state(cfg: Config, optimizer: optax.GradientTransformation) -> TrainState:
    """Shapes and dtypes of :func:`init_train_state`, for shardings and checkpoint restores."""
    return jax.eval_shape(lambda: init_train_state(cfg, optimizer))
