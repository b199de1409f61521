"""A run's compiled programs (init, train step, eval step) and the cache that lets runs of one
shape share them.

A sweep worker trains run after run of the same shape (seeds, token budgets of one width):
``jit`` reuses its traced and lowered programs only when it is handed the same function again,
which the persistent compilation cache cannot do (it skips XLA's compilation, not tracing). So a
worker keeps one :class:`ProgramCache` and passes it to every :func:`attnlab.train.run`; it also
compiles the next run's programs in a background thread while the current one trains
(:meth:`ProgramCache.precompile`). A run given no cache builds its own.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import json
import threading
from typing import Callable

import jax
import numpy as np
import optax
from flax import nnx

from attnlab.config import Config
from attnlab.data.sources import window_layout
from attnlab.train.checkpoint import param_shapes, with_shardings
from attnlab.train.optimizer import optimizer_for
from attnlab.train.sharding import (EVAL_BATCH_SPEC, REPLICATED, TRAIN_BATCH_SPEC, make_mesh,
                                    state_shardings)
from attnlab.train.state import TrainState, abstract_model, abstract_train_state, init_train_state
from attnlab.train.step import Targets, make_eval_step, make_train_step


@dataclasses.dataclass
class Programs:
    """What a run builds from its config but not from its seed: the model's abstract shapes, the
    state's shardings and the jitted init, train and eval functions."""

    mesh: jax.sharding.Mesh
    graphdef: nnx.GraphDef
    param_shapes: dict[str, list[int]]
    abstract_state: TrainState
    shardings: TrainState
    init: Callable  # key -> TrainState (the seed is an argument: one program for every seed)
    train_step: Callable
    eval_step: Callable
    # XLA-compiled so far ("init", "steps"); the lock makes a second caller (a run beside its
    # worker's precompile) wait for the first instead of compiling the same programs again.
    compiled: set[str] = dataclasses.field(default_factory=set)
    compiling: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def programs_key(cfg: Config) -> str:
    """``cfg`` as JSON without what the programs do not depend on: the name, and the seed unless
    dropout draws masks from it (``train.seed`` reaches the train step only as the dropout key;
    the parameters' key is an argument of ``init``)."""
    raw = cfg.to_dict()
    raw["name"] = ""
    if cfg.model.dropout == 0:
        raw["train"]["seed"] = 0
    return json.dumps(raw, sort_keys=True, default=str)


def traced_on(mesh: jax.sharding.Mesh, fn: Callable) -> Callable:
    """``fn`` traced with ``mesh`` as the abstract mesh in context: the model reads from it
    whether its experts are split (attnlab.model.moe_dispatch.expert_mesh)."""
    @functools.wraps(fn)
    def traced(*args):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args)

    return traced


def jit_steps(cfg: Config, mesh: jax.sharding.Mesh, shardings: TrainState,
              graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation,
              schedule: optax.Schedule) -> tuple[Callable, Callable]:
    """``(train_step, eval_step)`` jitted with the mesh's layouts; the train state is donated
    (updated in place: no second copy of parameters and optimizer state)."""
    on_mesh = lambda spec: jax.sharding.NamedSharding(mesh, spec)  # noqa: E731
    targets = Targets.of(cfg.data)
    train_step = jax.jit(
        traced_on(mesh, make_train_step(cfg, graphdef, optimizer, schedule, targets)),
        in_shardings=(shardings, on_mesh(TRAIN_BATCH_SPEC)),
        out_shardings=(shardings, on_mesh(REPLICATED)),
        donate_argnums=0,
    )
    eval_step = jax.jit(traced_on(mesh, make_eval_step(graphdef,
                                                       masked_spans=cfg.train.eval_masked_spans,
                                                       packing=targets.packing,
                                                       weights=targets.weights)),
                        in_shardings=(shardings.params, on_mesh(EVAL_BATCH_SPEC),
                                      on_mesh(REPLICATED)),
                        out_shardings=on_mesh(REPLICATED))
    return train_step, eval_step


def build_programs(cfg: Config, mesh: jax.sharding.Mesh) -> Programs:
    """``cfg``'s programs on ``mesh``, jitted (traced and compiled on first use or by
    :func:`compile_programs`)."""
    optimizer, schedule = optimizer_for(cfg)
    graphdef, abstract_params = abstract_model(cfg)
    abstract_state = abstract_train_state(cfg, optimizer)
    shardings = state_shardings(abstract_state, mesh)
    init = jax.jit(lambda rng: init_train_state(cfg, optimizer, rng), out_shardings=shardings)
    train_step, eval_step = jit_steps(cfg, mesh, shardings, graphdef, optimizer, schedule)
    return Programs(mesh, graphdef, param_shapes(abstract_params), abstract_state, shardings,
                    init, train_step, eval_step)


def compile_programs(cfg: Config, programs: Programs, *, with_init: bool) -> None:
    """XLA-compiles ``programs`` (init only ``with_init``: a resumed run restores its state)
    ahead of their first call, once.

    Each program is traced and lowered here (Python, holding the GIL) and compiled, or read
    from the persistent compilation cache, in a thread of its own while the next one is traced:
    XLA works without the GIL, so the three overlap (0.3-0.5 s less per new shape on 2 CPU
    cores, cold or cached; docs/benchmarks.md).
    """
    with programs.compiling, concurrent.futures.ThreadPoolExecutor(3) as pool:
        mesh, accum = programs.mesh, cfg.train.grad_accum
        rows = cfg.data.batch_size // accum
        row_shape, dtype = window_layout(cfg.data)

        def batch(spec, shape):  # shaped and laid out as run() passes its batches
            return jax.ShapeDtypeStruct(shape, dtype,
                                        sharding=jax.sharding.NamedSharding(mesh, spec))

        # Lowered from the types run() passes (a typed key, the state laid out on the mesh as
        # init and restore give it, an int32 scalar), so that its calls find these executables.
        compiling = []
        if with_init and "init" not in programs.compiled:
            compiling.append(pool.submit(programs.init.lower(jax.random.key(0)).compile))
        if "steps" not in programs.compiled:
            state = with_shardings(programs.abstract_state, programs.shardings)
            compiling.append(pool.submit(programs.train_step.lower(
                state, batch(TRAIN_BATCH_SPEC, (accum, rows, *row_shape))).compile))
            compiling.append(pool.submit(programs.eval_step.lower(
                state.params, batch(EVAL_BATCH_SPEC, (rows, *row_shape)), np.int32(0)).compile))
        for future in compiling:
            future.result()  # raises what the compilation raised
        if with_init:
            programs.compiled.add("init")
        programs.compiled.add("steps")


class ProgramCache:
    """The programs of the last ``kept`` shapes (each holds compiled executables, so few),
    keyed by :func:`programs_key` and the mesh's devices. Thread-safe: a precompile thread may
    build programs beside a training run."""

    def __init__(self, kept: int = 4, devices: list | None = None):
        self.kept = kept
        self.devices = devices  # a lone run's mesh spans these (None: all)
        self._entries: collections.OrderedDict[tuple, Programs] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def lone_mesh(self, cfg: Config) -> jax.sharding.Mesh:
        """The mesh a lone run of ``cfg`` trains on."""
        return make_mesh(cfg, self.devices)

    def get(self, cfg: Config, mesh: jax.sharding.Mesh) -> Programs:
        """``cfg``'s programs on ``mesh`` (built on first use)."""
        key = (programs_key(cfg), tuple(d.id for d in mesh.devices.flat))
        with self._lock:
            if key not in self._entries:
                self._entries[key] = build_programs(cfg, mesh)
                while len(self._entries) > self.kept:
                    self._entries.popitem(last=False)
            self._entries.move_to_end(key)
            return self._entries[key]

    def precompile(self, cfg: Config) -> None:
        """Builds and XLA-compiles ``cfg``'s init, train and eval programs, so that a later
        :func:`attnlab.train.run` of ``cfg`` given this cache (or of another seed, without
        dropout) starts training at once. Writes nothing; raises what the model's and mesh's
        checks raise."""
        compile_programs(cfg, self.get(cfg, self.lone_mesh(cfg)), with_init=True)
