"""AdamW with global-norm clipping, a weight-decay mask, and the learning-rate schedules.

Every schedule maps the number of updates already applied, ``t = 0, 1, ...`` (optax's ``count``),
to the learning rate of update ``t``. Warmups count the update being made, ``(t + 1) / warmup``,
so the first update is not wasted at lr = 0, and decays reach their floor one update after the
last, ``t = total_steps``: with a floor of zero the last update is not wasted either.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from attnlab.config import Config, TrainConfig, check_warmup, wsd_decay_start
from attnlab.errors import ConfigError
from attnlab.model import Architecture, param_shapes, resolve


def _warmup(t: jax.Array, peak: float, warmup_steps: int) -> jax.Array:
    """Linear ramp ``peak * (t + 1) / warmup_steps`` for ``t < warmup_steps``, ``peak`` after."""
    if warmup_steps == 0:
        return jnp.full_like(t, peak, dtype=jnp.float32)
    return peak * jnp.minimum(1.0, (t + 1.0) / warmup_steps)


def _decay_progress(t: jax.Array, start: int, total_steps: int) -> jax.Array:
    """Fraction of a decay phase done after update ``t``: 0 before ``start``, ``L / (L + 1)`` at
    the last update ``total_steps - 1`` of a decay of ``L`` updates (1 one update later)."""
    length = max(1, total_steps - start)
    return jnp.clip((t - start + 1.0) / (length + 1.0), 0.0, 1.0)


def cosine_schedule(peak: float, warmup_steps: int, total_steps: int,
                    min_lr_ratio: float) -> optax.Schedule:
    """Linear warmup, then cosine decay from ``peak`` to ``min_lr_ratio * peak`` over the rest.

    One cosine cycle matched to the run's length (Hoffmann et al. 2022, sec. 3.1: a cycle longer
    than the run overestimates the loss of short runs).
    """
    floor = peak * min_lr_ratio

    def schedule(count):
        t = jnp.asarray(count, jnp.float32)
        p = _decay_progress(t, warmup_steps, total_steps)
        decayed = floor + (peak - floor) * 0.5 * (1.0 + jnp.cos(jnp.pi * p))
        return jnp.where(t < warmup_steps, _warmup(t, peak, warmup_steps), decayed)

    return schedule


def noam_schedule(learning_rate: float, d_model: int, warmup_steps: int) -> optax.Schedule:
    """The original Transformer schedule (Vaswani et al. 2017, eq. 3), scaled by ``learning_rate``.

    ``lr(s) = learning_rate * d_model^-0.5 * min(s^-0.5, s * warmup^-1.5)`` with ``s = t + 1``.
    ``learning_rate`` is a dimensionless multiplier: 1.0 reproduces the paper exactly, and the peak,
    reached at ``s = warmup``, is ``learning_rate / sqrt(d_model * warmup)`` (e.g. 1.0 with
    d_model=512, warmup=4000 peaks at 7.0e-4). ``min_lr_ratio`` is not used: the decay is s^-0.5.
    """
    if warmup_steps <= 0:
        raise ConfigError("train.warmup_steps", "the noam schedule needs warmup_steps > 0")
    scale = learning_rate * d_model**-0.5

    def schedule(count):
        s = jnp.asarray(count, jnp.float32) + 1.0
        return scale * jnp.minimum(s**-0.5, s * warmup_steps**-1.5)

    return schedule


# The cooldown's shape g(p): the fraction of the way from the floor to the peak left after a
# fraction p of the decay (Hägele et al. 2024, sec. 3 and eq. 1: 1 - sqrt(p) is their best).
COOLDOWN_SHAPES: dict[str, Callable[[jax.Array], jax.Array]] = {
    "linear": lambda p: 1.0 - p,
    "1-sqrt": lambda p: 1.0 - jnp.sqrt(p),
    "cosine": lambda p: 0.5 * (1.0 + jnp.cos(jnp.pi * p)),
}


def wsd_schedule(peak: float, warmup_steps: int, total_steps: int, decay_fraction: float,
                 min_lr_ratio: float, cooldown: str = "linear") -> optax.Schedule:
    """Warmup-stable-decay (Hu et al. 2024, MiniCPM; Hägele et al. 2024): linear warmup, constant
    ``peak``, then a cooldown to ``min_lr_ratio * peak`` over the last ``decay_fraction`` of the
    steps, ``lr = floor + (peak - floor) * g(p)`` with ``g`` the ``cooldown`` shape
    (:data:`COOLDOWN_SHAPES`) and ``p`` the fraction of the cooldown done. A run's stable-phase
    checkpoints can be cooled down separately to get several budgets (cooldown branches).
    """
    floor = peak * min_lr_ratio
    decay_start = wsd_decay_start(total_steps, warmup_steps, decay_fraction)
    shape = COOLDOWN_SHAPES[cooldown]

    def schedule(count):
        t = jnp.asarray(count, jnp.float32)
        p = _decay_progress(t, decay_start, total_steps)
        decayed = jnp.where(p > 0, floor + (peak - floor) * shape(p), peak)
        return jnp.where(t < warmup_steps, _warmup(t, peak, warmup_steps), decayed)

    return schedule


def constant_schedule(peak: float, warmup_steps: int) -> optax.Schedule:
    """Linear warmup (if any), then ``peak`` for ever."""

    def schedule(count):
        return _warmup(jnp.asarray(count, jnp.float32), peak, warmup_steps)

    return schedule


def make_schedule(train: TrainConfig, total_steps: int, d_model: int) -> optax.Schedule:
    """The schedule named by ``train.schedule``; raises ConfigError for impossible settings."""
    check_warmup(train, total_steps)
    train = train.decay()
    if train.schedule == "cosine":
        return cosine_schedule(train.learning_rate, train.warmup_steps, total_steps,
                               train.min_lr_ratio)
    if train.schedule == "noam":
        return noam_schedule(train.learning_rate, d_model, train.warmup_steps)
    if train.schedule == "wsd":
        return wsd_schedule(train.learning_rate, train.warmup_steps, total_steps,
                            train.decay_fraction, train.min_lr_ratio, train.cooldown)
    if train.schedule == "constant":
        return constant_schedule(train.learning_rate, train.warmup_steps)
    raise ConfigError("train.schedule", f"unknown schedule {train.schedule!r}")


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
