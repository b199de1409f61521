"""Many independent L-BFGS minimisations at once, in float64.

Each problem is one start of a multi-start fit (or one start of a bootstrap replicate): it
minimises ``objective(theta, data, weights)`` from its own ``theta0`` with its own per-point
``weights``. The problems run on optimistix's L-BFGS, vectorised with ``vmap`` over a fixed number
of *slots*: every loop iteration takes one L-BFGS step in every slot, and a slot whose problem
has finished (converged, failed or out of steps) records the outcome and takes the next waiting
problem. Optimistix's step holds exactly one function evaluation (its Armijo backtracking is
part of the step, not an inner loop), so the cost is about the sum of the problems' own step
counts, not ``problems × the slowest problem's steps``.

float64 comes from the ``jax.enable_x64`` context (no global flag is flipped): Besiroglu et al.
2024 trace the early stop of the original Chinchilla fit to loose numerics.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

# Problems solved side by side: enough to amortise the per-step overhead, few enough that the
# [slots, points] arrays stay in cache (measured on a 2-core CPU: 256-512 problems per batch
# evaluate ~2x faster per point than 4,500 at once).
SLOTS = 256
# Points are padded with weight-0 copies to a multiple of this, and the problem count to a power
# of two, so fits of similar size share one compiled program.
POINT_PAD = 64

Objective = Callable[[jax.Array, tuple[jax.Array, ...], jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class MultiStartResult:
    """Outcome of every problem, in input order.

    params: [problems, n_params] last accepted iterate; objective: [problems] its value;
    converged: [problems] True where optimistix's Cauchy criterion (the changes in theta and in
    the objective both below ``atol + rtol·|value|``) held before ``max_steps``;
    steps: [problems] L-BFGS steps taken.
    """

    params: np.ndarray
    objective: np.ndarray
    converged: np.ndarray
    steps: np.ndarray


@functools.partial(jax.jit, static_argnames=("objective", "max_steps", "rtol", "atol"))
def _solve(objective: Objective, starts: jax.Array, data: tuple[jax.Array, ...],
           weights: jax.Array, n_problems: jax.Array, *, max_steps: int, rtol: float,
           atol: float):
    """starts [capacity, n_params], weights [capacity, points]; the first n_problems are real."""
    capacity = starts.shape[0]
    solver = optx.LBFGS(rtol=rtol, atol=atol)
    fn = lambda theta, w: (objective(theta, data, w), None)  # optimistix's (value, aux)
    f_struct = jax.ShapeDtypeStruct((), starts.dtype)
    init = eqx.filter_vmap(lambda y0, w: solver.init(fn, y0, w, {}, f_struct, None, frozenset()))
    step = eqx.filter_vmap(lambda y, w, state: solver.step(fn, y, w, {}, state, frozenset())[:2])
    clamp = lambda index: jnp.minimum(index, capacity - 1)

    # Slot s begins with problem s; a slot holding index >= n_problems is idle.
    problem = jnp.arange(SLOTS)
    problem = jnp.where(problem < n_problems, problem, capacity)
    y, w = starts[clamp(problem)], weights[clamp(problem)]
    dynamic, static = eqx.partition(init(y, w), eqx.is_array)
    outputs = (jnp.zeros_like(starts), jnp.full(capacity, jnp.inf, starts.dtype),
               jnp.zeros(capacity, bool), jnp.zeros(capacity, jnp.int32))
    carry = (y, w, dynamic, problem, jnp.zeros(SLOTS, jnp.int32), jnp.asarray(SLOTS), outputs)

    def cond(carry):
        return jnp.any(carry[3] < n_problems)

    def body(carry):
        y, w, dynamic, problem, steps, next_problem, outputs = carry
        y, state = step(y, w, eqx.combine(static, dynamic))
        steps = steps + 1
        ok = state.result == optx.RESULTS.successful
        finite = jnp.all(jnp.isfinite(y), axis=1) & jnp.isfinite(state.f_info.f)
        active = problem < n_problems
        finished = active & (state.terminate | ~ok | ~finite | (steps >= max_steps))
        converged = state.terminate & ok & finite
        # Record finished problems (an out-of-range index drops the write for the others).
        where_to = jnp.where(finished, problem, capacity)
        params, value, conv, used = outputs
        outputs = (params.at[where_to].set(y, mode="drop"),
                   value.at[where_to].set(state.f_info.f, mode="drop"),
                   conv.at[where_to].set(converged, mode="drop"),
                   used.at[where_to].set(steps, mode="drop"))
        # Hand each finished slot the next waiting problem.
        incoming = next_problem + jnp.cumsum(finished) - 1
        problem = jnp.where(finished, jnp.where(incoming < n_problems, incoming, capacity),
                            problem)
        next_problem = next_problem + jnp.sum(finished)
        new_y, new_w = starts[clamp(problem)], weights[clamp(problem)]
        fresh, _ = eqx.partition(init(new_y, new_w), eqx.is_array)
        dynamic, _ = eqx.partition(state, eqx.is_array)
        dynamic = jax.tree.map(
            lambda new, old: jnp.where(finished.reshape((-1,) + (1,) * (old.ndim - 1)), new, old),
            fresh, dynamic)
        y = jnp.where(finished[:, None], new_y, y)
        w = jnp.where(finished[:, None], new_w, w)
        steps = jnp.where(finished, 0, steps)
        return y, w, dynamic, problem, steps, next_problem, outputs

    return jax.lax.while_loop(cond, body, carry)[-1]


def minimise_many(objective: Objective, starts: np.ndarray, data: tuple[np.ndarray, ...],
                  weights: np.ndarray, *, max_steps: int = 500, rtol: float = 1e-10,
                  atol: float = 1e-10) -> MultiStartResult:
    """Minimises ``objective`` from every start, each problem with its own weights.

    objective: pure jax function ``(theta [n_params], data, weights [points]) -> scalar``, defined
      at module level (it is a static argument of the compiled program).
    starts: [problems, n_params]; data: tuple of [points] arrays shared by all problems;
    weights: [problems, points] (a bootstrap replicate's multiplicities; ones for a plain fit).
    """
    starts = np.asarray(starts, np.float64)
    weights = np.asarray(weights, np.float64)
    n_problems, n_points = len(starts), weights.shape[1]
    padded_points = -(-n_points // POINT_PAD) * POINT_PAD
    # Padding points repeat the first point with weight 0: finite, so 0 · term stays 0.
    point_index = np.concatenate([np.arange(n_points), np.zeros(padded_points - n_points, int)])
    data = tuple(np.asarray(column, np.float64)[point_index] for column in data)
    weights = np.pad(weights, ((0, 0), (0, padded_points - n_points)))
    capacity = max(SLOTS, 1 << (n_problems - 1).bit_length())
    starts = np.pad(starts, ((0, capacity - n_problems), (0, 0)))
    weights = np.pad(weights, ((0, capacity - n_problems), (0, 0)))
    with jax.enable_x64(True):
        outputs = _solve(objective, jnp.asarray(starts), tuple(jnp.asarray(c) for c in data),
                         jnp.asarray(weights), jnp.asarray(n_problems), max_steps=max_steps,
                         rtol=rtol, atol=atol)
        params, value, converged, steps = (np.asarray(o)[:n_problems] for o in outputs)
    return MultiStartResult(params=params, objective=value, converged=converged, steps=steps)
