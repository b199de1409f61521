"""Ensembles: k runs of one model shape trained by one compiled program.

    summaries = run_ensemble([cfg_seed0, cfg_seed1, ...], [dir0, dir1, ...])

Small models leave the machine idle between ops: a 50k-parameter step is per-op overhead, not
FLOPs. ``jax.vmap`` of the loss and gradient over a stack of runs gives k-fold larger matmuls at
the same op count. The members may differ only in what :data:`attnlab.ensembles.MAY_DIFFER`
lists (seeds, the learning rate and its schedule, the run's length, weight decay, Adam's betas,
the logging and checkpoint cadence); everything that shapes the program must match.

Each member stays a run of its own: its directory, config, metrics, summary, checkpoints (in a
lone run's format, so ``attnlab generate``, ``extrapolate`` and a lone resume read them) and its
results row. Per member, the optimizer update is the lone run's own optax transformation
(members with equal optimizer settings share one vmapped update), batches and dropout/masking
keys are the lone run's, so a member follows the run trained alone up to the rounding of the
batched matmuls. Members step in lockstep on their own step counters: a member that is ahead
(resumed from a later checkpoint), finished or diverged is frozen (its update masked out) and
its bookkeeping stops, while the others go on; the stack keeps its composition, so an
interrupted ensemble resumes bitwise.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import PartitionSpec as P

from attnlab import rundir
from attnlab.config import Config
from attnlab.data import prepare
from attnlab.ensembles import check_members, optimizer_key
from attnlab.checks import check
from attnlab.train.loop import _Training
from attnlab.train.memory import check_training_fits
from attnlab.train.optimizer import optimizer_for
from attnlab.train.preflight import check_corpus, newest_intact_checkpoint, resume_point
from attnlab.train.programs import ProgramCache, Programs, compile_programs
from attnlab.train.sharding import (ENSEMBLE_AXIS, REPLICATED, TRAIN_BATCH_SPEC,
                                    check_batch_divides, ensemble_mesh, member_mesh)
from attnlab.train.state import TrainState
from attnlab.train.step import Targets, accumulated_grads, loss_grad_fn
from attnlab.train.workdir import check_workdir

def stack(trees: list):
    """The members' pytrees stacked along a new leading axis ``[k, ...]``."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def member(tree, i: int):
    """Member ``i`` of a stacked pytree."""
    return jax.tree.map(lambda a: a[i], tree)


def _zeros(like: jax.ShapeDtypeStruct, axes: tuple[str, ...]) -> jax.Array:
    """Zeros of ``like``'s shape and dtype, varying over the device ``axes`` of a ``shard_map``
    as the member's own results do (``cond``'s branches must agree on that too)."""
    zeros = jnp.zeros(like.shape, like.dtype)
    return jax.lax.pcast(zeros, axes, to="varying") if axes else zeros


def make_ensemble_step(cfgs: list[Config], graphdef: nnx.GraphDef, *,
                       members: str = "vmap", mesh: jax.sharding.Mesh | None = None) -> Callable:
    """``step(states [k, ...], batches int32 [k, accum, rows, seq + 1], active bool [k]) ->
    (states, metrics [k])`` (not yet jitted): each active member's lone train step; inactive
    members keep their state. ``members``: how the loss and gradient run over the members,
    ``vmap`` (k-fold larger ops) or ``map`` (one member after another inside the program:
    a lone run's working set, one dispatch for all). ``mesh``: an :func:`ensemble_mesh`; with
    more than one member group each group of devices runs its own members' gradients."""
    # One data section for all members (they share a corpus).
    targets = Targets.of(cfgs[0].data)
    grad_fn = loss_grad_fn(graphdef, targets.packing, targets.weights)
    use_dropout = cfgs[0].model.dropout > 0
    optimizers = [optimizer_for(cfg) for cfg in cfgs]
    shared = len({optimizer_key(cfg) for cfg in cfgs}) == 1
    seeds = np.asarray([cfg.train.seed for cfg in cfgs], np.int32)
    data_seeds = np.asarray([cfg.data.seed for cfg in cfgs], np.int32)

    def grads_of(params, batch, step, seed, data_seed):
        return accumulated_grads(grad_fn, params, batch, step, seed=seed, data_seed=data_seed,
                                 use_dropout=use_dropout)

    def update(tx, grads, state: TrainState) -> TrainState:
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        return TrainState(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                          opt_state=opt_state)

    def members_grads(*inputs):
        """``inputs``: params, batches, steps, seeds, data seeds and ``active``, each [k, ...]."""
        *inputs, active = inputs
        if members == "vmap":  # every member computed; a frozen one's result is discarded
            return jax.vmap(grads_of)(*inputs)

        def one(args):
            # A frozen member (finished, diverged, or ahead of the round) costs nothing: members
            # of different lengths then share a program without the short ones' idle rounds.
            *member_inputs, on = args
            blank = jax.eval_shape(grads_of, *member_inputs)
            axes = tuple(sorted(jax.typeof(on).manual_axis_type.varying))  # inside shard_map
            return jax.lax.cond(on, lambda: grads_of(*member_inputs),
                                lambda: jax.tree.map(lambda a: _zeros(a, axes), blank))

        return jax.lax.map(one, (*inputs, active))

    if mesh is not None and mesh.shape[ENSEMBLE_AXIS] > 1:  # each group maps its own members
        members_grads = jax.shard_map(members_grads, mesh=mesh, in_specs=P(ENSEMBLE_AXIS),
                                      out_specs=P(ENSEMBLE_AXIS), axis_names={ENSEMBLE_AXIS})

    def step(states: TrainState, batches: jax.Array, active: jax.Array):
        out, grads = members_grads(states.params, batches, states.step, seeds, data_seeds,
                                   active)
        if shared:  # one optimizer: its update vmapped too
            new = jax.vmap(lambda g, s: update(optimizers[0][0], g, s))(grads, states)
        else:  # each member's own transformation (elementwise work: cheap to unroll)
            new = stack([update(tx, member(grads, i), member(states, i))
                         for i, (tx, _) in enumerate(optimizers)])
        keep = lambda n, o: jnp.where(active.reshape((-1,) + (1,) * (n.ndim - 1)), n, o)  # noqa: E731
        lrs = jnp.stack([jnp.asarray(schedule(states.step[i]), jnp.float32)
                         for i, (_, schedule) in enumerate(optimizers)])
        metrics = {**out, "grad_norm": jax.vmap(optax.global_norm)(grads), "lr": lrs}
        return jax.tree.map(keep, new, states), metrics

    return step


@dataclasses.dataclass
class _Member:
    """One run of the ensemble: its bookkeeping (None: it was finished before the ensemble
    started), its step, and whether it is frozen (finished or diverged)."""

    training: _Training | None
    step: int
    total: int
    frozen: bool = False

    @property
    def running(self) -> bool:
        return not self.frozen and self.training is not None and self.step < self.total


def run_ensemble(cfgs: list[Config], workdirs: list[str | Path], *, progress: bool = False,
                 allow_large: bool = False, programs: ProgramCache | None = None) -> list[dict]:
    """Trains (or resumes) ``cfgs[i]`` in ``workdirs[i]`` together; returns their summaries.

    A member whose directory holds a finished run is not retrained: it stays in the stack,
    frozen at its last checkpoint, so the ensemble's program (and so every member's numbers) is
    the same whether or not it was interrupted. Raises what :func:`attnlab.train.run` raises
    for bad input, before anything is written.
    """
    for cfg in cfgs:
        check(cfg)
    check_members(cfgs)
    workdirs = [Path(w).absolute() for w in workdirs]
    previous = [check_workdir(w, cfg) for cfg, w in zip(cfgs, workdirs)]
    for cfg in cfgs:
        check_training_fits(cfg, allow_large=allow_large)
    mesh = ensemble_mesh(cfgs[0], len(cfgs))
    check_batch_divides(cfgs[0], member_mesh(mesh).size, jax.process_count())
    shared = (programs or ProgramCache()).get(cfgs[0], member_mesh(mesh))
    members, states = [], []
    for i, (cfg, workdir, before) in enumerate(zip(cfgs, workdirs, previous)):
        done = before and before.get("status") in (rundir.COMPLETED, rundir.DIVERGED)
        member_, state = _prepare_member(cfg, workdir, shared, done, progress and i == 0)
        members.append(member_)
        states.append(state)
    _train(cfgs, members, stack(states), shared, mesh)
    return [before if m.training is None else m.training.summary
            for before, m in zip(previous, members)]


def _prepare_member(cfg: Config, workdir: Path, shared: Programs, done: bool, progress: bool):
    """``(member, its initial state)``; a finished run is frozen at its newest checkpoint."""
    if done:
        step, state = 0, None
        if (workdir / rundir.CHECKPOINT_DIR).exists():
            step, _, state, _ = newest_intact_checkpoint(
                cfg, workdir / rundir.CHECKPOINT_DIR, shared)
        if state is None:  # diverged before its first checkpoint: any state of the shape
            compile_programs(cfg, shared, with_init=True)
            state = shared.init(jax.random.key(cfg.train.seed))
        return _Member(None, step or 0, cfg.total_steps, frozen=True), state
    corpus = prepare(cfg.data)
    found = resume_point(cfg, workdir, corpus, check_corpus(cfg, corpus), shared)
    training = _Training(cfg, workdir, found, progress)
    if found.state is None:
        compile_programs(cfg, shared, with_init=True)
        state = shared.init(jax.random.key(cfg.train.seed))
    else:
        state = found.state
    return _Member(training, found.latest or 0, cfg.total_steps), state


def _train(cfgs: list[Config], members: list[_Member], states: TrainState,
           shared: Programs, mesh: jax.sharding.Mesh) -> None:
    """The ensemble's loop: one vmapped update per round for the members at the round's step;
    each member's bookkeeping as its lone run's (:class:`_Training`)."""
    layout = _jit_step(cfgs, shared, mesh)
    states = jax.device_put(states, layout.states)

    def alone(i: int) -> Callable[[], TrainState]:  # member i, laid out as its lone run's
        return lambda: jax.device_put(member(states, i), shared.shardings)

    opened = [m.training for m in members if m.training is not None]
    try:
        for training in opened:
            training.open()
        for i, m in enumerate(members):  # resumed at its last step: only its summary is left
            if m.training is not None and not m.frozen and m.step == m.total:
                m.training.complete(alone(i)())
        while any(m.running for m in members):
            now = min(m.step for m in members if m.running)
            active = [m.running and m.step == now for m in members]
            batches = {i: m.training.host_batch(m.step)
                       for i, (m, on) in enumerate(zip(members, active)) if on}
            blank = np.zeros_like(next(iter(batches.values())))  # a frozen member's slot
            batches = np.stack([batches.get(i, blank) for i in range(len(members))])
            states, out = layout.step(states, batches, np.asarray(active))
            out = jax.device_get(out)
            for i, (m, on) in enumerate(zip(members, active)):
                if not on:
                    continue
                m.step += 1
                status = m.training.after_step(m.step, {k: v[i] for k, v in out.items()},
                                               alone(i))
                if status is not None:  # diverged: frozen from here on
                    m.frozen = True
                elif m.step == m.total:
                    m.training.complete(alone(i)())
    except BaseException as e:
        for training in opened:
            training.fail(e)
        raise
    finally:
        for training in opened:
            training.close()


def member_loop(mesh: jax.sharding.Mesh) -> str:
    """How the ensemble runs its members' gradients on ``mesh``'s platform. On XLA:CPU the
    k-fold larger ops of ``vmap`` leave the caches (k = 8 at the quickstart's largest shape:
    0.66x a lone run's tokens/s) while ``map`` keeps a lone run's working set and saves the
    per-step dispatch (1.09-1.16x; benchmarks/ensemble.py, docs/benchmarks.md); an
    accelerator wants the larger ops."""
    return "map" if mesh.devices.flat[0].platform == "cpu" else "vmap"


@dataclasses.dataclass(frozen=True)
class _Layout:
    """The ensemble step jitted on an :func:`ensemble_mesh` (members split over its leading axis,
    the rest of each array laid out as a lone run's; the state donated), and the shardings of
    its stacked state."""

    step: Callable
    states: TrainState


def _jit_step(cfgs: list[Config], shared: Programs, mesh: jax.sharding.Mesh) -> _Layout:
    on_mesh = lambda spec: jax.sharding.NamedSharding(mesh, spec)  # noqa: E731
    states = jax.tree.map(lambda s: on_mesh(P(ENSEMBLE_AXIS, *s.spec)), shared.shardings)
    batches = on_mesh(P(ENSEMBLE_AXIS, *TRAIN_BATCH_SPEC))
    step = make_ensemble_step(cfgs, shared.graphdef, members=member_loop(mesh), mesh=mesh)
    return _Layout(jax.jit(step, donate_argnums=0,
                           in_shardings=(states, batches, on_mesh(REPLICATED)),
                           out_shardings=(states, on_mesh(REPLICATED))), states)
