"""AdamW with global-norm clipping and a weight-decay mask, driven by the learning-rate schedule
of ``train.schedule`` (attnlab/schedules.py)."""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from attnlab.config import Config, TrainConfig, check_warmup
from attnlab.model import Architecture, param_shapes, resolve


def make_schedule(train: TrainConfig, total_steps: int, d_model: int) -> optax.Schedule:
    """The schedule named by ``train.schedule`` as an optax schedule; raises ConfigError for
    impossible settings."""
    check_warmup(train, total_steps)
    return functools.partial(train.lr_schedule(total_steps, d_model).lr, xp=jnp)


def _path_names(path) -> list[str]:
    names = []
    for key in path:
        name = getattr(key, "key", getattr(key, "name", getattr(key, "idx", None)))
        names.append(str(name))
    return names


def is_decayed(path, leaf, arch: Architecture | None = None) -> bool:
    """Weight decay applies to matrices only: not to norm scales or biases (1-D per layer), nor
    to the token or position tables (a path component naming an embedding), as in
    GPT-2/nanoGPT, nor to the parameters a layer's mixer holds out (``arch.undecayed``:
    Mamba's ``A_log`` and ``D``). With tied embeddings the output layer is the token table, so
    it is not decayed; an untied ``lm_head`` is a projection like the others and is. A scanned
    stack's leading layer axis does not count as a dimension (``arch.stacked_axes``).
    """
    names = tuple(_path_names(path))
    if any("embed" in name.lower() for name in names):
        return False
    if arch is not None and arch.undecayed(names):
        return False
    stacked = arch.stacked_axes(names) if arch is not None else 0
    return jnp.ndim(leaf) - stacked >= 2


def decay_mask(params, arch: Architecture | None = None):
    """A pytree of bools shaped like ``params``: True where AdamW's weight decay applies
    (``arch``: the model's resolved parts, which say what its mixers hold out and whether its
    layers are stacked; None: every matrix of an unscanned model)."""
    return jax.tree_util.tree_map_with_path(lambda p, leaf: is_decayed(p, leaf, arch), params)


def constrained(constraint: Callable) -> optax.GradientTransformation:
    """A last link of the chain that puts the parameters back where the model keeps them
    (``constraint``, the block kind's ``param_constraint``; nGPT, Loshchilov et al. 2024,
    sec. 2.3: every matrix's rows on the unit sphere): it turns ``updates`` into
    ``constraint(params + updates) - params``, so ``apply_updates`` lands there."""

    def init_fn(params):
        return optax.EmptyState()

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("a constrained update needs the parameters")
        target = constraint(optax.apply_updates(params, updates))
        return jax.tree.map(lambda new, old: new - old, target, params), state

    return optax.GradientTransformation(init_fn, update_fn)


def scaled_per_parameter(multipliers: Callable) -> optax.GradientTransformation:
    """Multiplies each parameter's update by its factor, ``multipliers(updates)``: a pytree of
    floats shaped like the parameters, a static function of their shapes (muP's Adam learning
    rates, ``Parameterization.lr_multipliers``). Stateless."""

    def init_fn(params):
        return optax.EmptyState()

    def update_fn(updates, state, params=None):
        factors = multipliers(updates)
        return jax.tree.map(lambda u, m: u if m == 1.0 else u * m, updates, factors), state

    return optax.GradientTransformation(init_fn, update_fn)


def adamw(train: TrainConfig, schedule: optax.Schedule, multipliers: Callable | None = None,
          arch: Architecture | None = None) -> optax.GradientTransformation:
    """optax's AdamW (decoupled decay, scaled by the lr as in PyTorch/optax), decaying what
    :func:`decay_mask` says for ``arch``; with ``multipliers``, each parameter's Adam direction
    is scaled by its factor before the decay is added, so a factor scales that parameter's
    learning rate and leaves its decay per step ``lr * wd * W`` as it is (muP's ``MuAdamW``:
    ``lr / m``, ``wd * m``)."""
    mask = functools.partial(decay_mask, arch=arch)
    if multipliers is None:
        return optax.adamw(learning_rate=schedule, b1=train.b1, b2=train.b2, eps=train.eps,
                           weight_decay=train.weight_decay, mask=mask)
    return optax.chain(
        optax.scale_by_adam(b1=train.b1, b2=train.b2, eps=train.eps),
        scaled_per_parameter(multipliers),
        optax.add_decayed_weights(train.weight_decay, mask),
        optax.scale_by_learning_rate(schedule),
    )


def make_optimizer(train: TrainConfig, total_steps: int, d_model: int, *,
                   constraint: Callable | None = None, multipliers: Callable | None = None,
                   arch: Architecture | None = None
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Global-norm clipping then AdamW (:func:`adamw`, per-parameter learning-rate factors
    ``multipliers`` if given); then, for a model whose block kind constrains its parameters
    (``constraint``: nGPT's renormalisation), :func:`constrained` (nGPT's rules have refused
    weight decay and warmup). ``arch``: the model's parts, for the decay mask
    (:func:`decay_mask`).

    Returns the transformation and its schedule (the schedule is also logged as ``lr``).
    """
    schedule = make_schedule(train, total_steps, d_model)
    adamw_ = adamw(train, schedule, multipliers, arch)
    chain = [adamw_]
    if train.grad_clip > 0:
        chain.insert(0, optax.clip_by_global_norm(train.grad_clip))
    if constraint is not None:
        chain.append(constrained(constraint))
    return (chain[0] if len(chain) == 1 else optax.chain(*chain)), schedule


def optimizer_for(cfg: Config) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """:func:`make_optimizer` for a whole config: its schedule over ``cfg.total_steps``,
    constrained as the model's block kind says, with the parameterisation's per-parameter
    learning rates (muP)."""
    arch = resolve(cfg.model)
    return make_optimizer(cfg.train, cfg.total_steps, cfg.model.d_model,
                          constraint=arch.block.param_constraint(),
                          multipliers=arch.parameterization.lr_multipliers_fn(param_shapes),
                          arch=arch)
