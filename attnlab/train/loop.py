"""``run(cfg, workdir)``: train one model, resuming from the latest checkpoint in ``workdir``.

Order of work, so that bad input fails fast and leaves the directory untouched:

1. checks that need nothing built: the workdir's config, the mesh, batch divisibility, the
   schedule; then the corpus (prepared/cached by attnlab.data) and the model's shapes (abstract,
   no FLOPs), and the latest checkpoint's record against those shapes;
2. only then are files written (``config.json``, ``summary.json`` with status ``running``),
   the init, train and eval programs compiled (unless :func:`precompile` did it already) and the
   state initialised or restored;
3. the loop: one jitted, state-donating ``train_step`` per batch; metrics every ``log_every``
   steps, validation every ``eval_every``, checkpoints every ``checkpoint_every`` and at the end.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import math
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Callable

import jax
import numpy as np
import optax
from flax import nnx

from attnlab import rundir
from attnlab.config import Config
from attnlab.data import Batches, Corpus, check_budget, prepare, validation_batches
from attnlab.errors import ConfigError
from attnlab.model import flops_per_token, param_counts
from attnlab.model.objectives import objective_for
from attnlab.train.checkpoint import (Checkpoints, CheckpointError, DamagedCheckpointError,
                                     check_compatible, move_aside, param_shapes, with_shardings)
from attnlab.train.memory import check_training_fits
from attnlab.train.metrics import MetricsWriter, Throughput
from attnlab.train.mfu import mfu, peak_flops_per_device
from attnlab.train.optimizer import make_optimizer
from attnlab.train.sharding import (
    EVAL_BATCH_SPEC,
    REPLICATED,
    TRAIN_BATCH_SPEC,
    check_batch_divides,
    global_batch,
    make_mesh,
    state_shardings,
)
from attnlab.train.state import (
    TrainState,
    abstract_model,
    abstract_train_state,
    init_train_state,
)
from attnlab.train.step import make_eval_step, make_train_step
from attnlab.train.workdir import check_workdir

EXIT_COMPLETED, EXIT_BAD_INPUT, EXIT_DIVERGED = 0, 2, 3


def initialize_distributed(cfg: Config) -> None:
    """``jax.distributed.initialize`` for multi-host runs (once per process, before any JAX
    computation). On CPUs the cross-process collectives are gloo, JAX's default."""
    t = cfg.train
    if not t.distributed or jax.distributed.is_initialized():
        return
    if t.num_processes > 1 and not t.coordinator_address:
        raise ConfigError("train.coordinator_address",
                          "multi-process runs need the coordinator's host:port")
    if not 0 <= t.process_id < t.num_processes:
        raise ConfigError("train.process_id",
                          f"{t.process_id} is not in [0, num_processes={t.num_processes})")
    jax.distributed.initialize(coordinator_address=t.coordinator_address or None,
                               num_processes=t.num_processes, process_id=t.process_id)


def training_flops_per_token(cfg: Config) -> dict[str, float]:
    """FLOPs per trained token. ``mfu`` counts the matmuls a causal LM needs: Kaplan's
    ``6N + 6 n_layers seq d_attn`` (attention causal-averaged) plus the output layer ``6 d V``
    (Porian et al. 2024); ``6n`` and ``chinchilla`` are the two published conventions."""
    f = flops_per_token(cfg.model, cfg.data.seq_len)
    return {"mfu": f["kaplan"] + f["head"], "6n": f["kaplan_6n"], "chinchilla": f["chinchilla"]}


def _process_rows(array: np.ndarray) -> np.ndarray:
    """This process's contiguous block of rows (the whole array with one process)."""
    size = array.shape[0] // jax.process_count()
    return array[jax.process_index() * size:(jax.process_index() + 1) * size]


def _as_micro_batches(local: np.ndarray, accum: int) -> np.ndarray:
    """``[rows, seq + 1] -> [accum, rows / accum, seq + 1]``: row ``r`` goes to micro-batch
    ``r % accum``, so each micro-batch keeps a contiguous slice of every device's rows (no
    resharding) and the assignment does not depend on how many devices there are."""
    rows, width = local.shape
    return local.reshape(rows // accum, accum, width).transpose(1, 0, 2)


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


@dataclasses.dataclass
class _Programs:
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


# Runs of the same shape in one process (a sweep worker training seed after seed) share their
# jitted functions: jit then reuses its traced and lowered programs, which the persistent
# compilation cache cannot (it skips XLA's compilation, not tracing). Few entries: each holds
# compiled executables.
_PROGRAMS: collections.OrderedDict[tuple, _Programs] = collections.OrderedDict()
_PROGRAMS_KEPT = 4
_PROGRAMS_LOCK = threading.Lock()  # precompile() may build programs beside a training run


def _programs_key(cfg: Config) -> str:
    """``cfg`` as JSON without what the programs do not depend on: the name, and the seed unless
    dropout draws masks from it (``train.seed`` reaches the train step only as the dropout key;
    the parameters' key is an argument of ``init``)."""
    raw = cfg.to_dict()
    raw["name"] = ""
    if cfg.model.dropout == 0:
        raw["train"]["seed"] = 0
    return json.dumps(raw, sort_keys=True, default=str)


def _programs(cfg: Config, mesh: jax.sharding.Mesh, optimizer: optax.GradientTransformation,
              schedule: optax.Schedule) -> _Programs:
    """This process's :class:`_Programs` for ``cfg`` (built on first use)."""
    key = (_programs_key(cfg), tuple(d.id for d in mesh.devices.flat))
    with _PROGRAMS_LOCK:
        if key in _PROGRAMS:
            _PROGRAMS.move_to_end(key)
            return _PROGRAMS[key]
        graphdef, abstract_params = abstract_model(cfg)
        abstract_state = abstract_train_state(cfg, optimizer)
        shardings = state_shardings(abstract_state, mesh)
        init = jax.jit(lambda rng: init_train_state(cfg, optimizer, rng), out_shardings=shardings)
        train_step, eval_step = _compile(cfg, mesh, shardings, graphdef, optimizer, schedule)
        programs = _Programs(mesh, graphdef, param_shapes(abstract_params), abstract_state,
                             shardings, init, train_step, eval_step)
        _PROGRAMS[key] = programs
        while len(_PROGRAMS) > _PROGRAMS_KEPT:
            _PROGRAMS.popitem(last=False)
    return programs


def precompile(cfg: Config) -> None:
    """Builds and XLA-compiles ``cfg``'s init, train and eval programs in this process, so that
    a later :func:`run` of ``cfg`` (or of another seed, without dropout) starts training at once.

    A sweep worker calls it in a background thread for its next run while the current run
    trains: a new shape's compilation then overlaps training instead of adding to the sweep's
    wall time. Writes nothing. Raises what the model's and mesh's checks raise.
    """
    mesh = make_mesh(cfg)
    optimizer, schedule = make_optimizer(cfg.train, cfg.total_steps, cfg.model.d_model,
                                         ngpt=cfg.model.ngpt)
    _compile_programs(cfg, _programs(cfg, mesh, optimizer, schedule), with_init=True)


def _compile_programs(cfg: Config, programs: _Programs, *, with_init: bool) -> None:
    """XLA-compiles ``programs`` (init only ``with_init``: a resumed run restores its state)
    ahead of their first call, once per process.

    Each program is traced and lowered here (Python, holding the GIL) and compiled, or read
    from the persistent compilation cache, in a thread of its own while the next one is traced:
    XLA works without the GIL, so the three overlap (0.3-0.5 s less per new shape on 2 CPU
    cores, cold or cached; docs/benchmarks.md).
    """
    with programs.compiling, concurrent.futures.ThreadPoolExecutor(3) as pool:
        mesh, accum = programs.mesh, cfg.train.grad_accum
        rows, width = cfg.data.batch_size // accum, cfg.data.seq_len + 1

        def batch(spec, shape):  # shaped and laid out as run() passes its batches
            return jax.ShapeDtypeStruct(shape, np.int32,
                                        sharding=jax.sharding.NamedSharding(mesh, spec))

        # Lowered from the types run() passes (a typed key, the state laid out on the mesh as
        # init and restore give it, an int32 scalar), so that its calls find these executables.
        compiling = []
        if with_init and "init" not in programs.compiled:
            compiling.append(pool.submit(programs.init.lower(jax.random.key(0)).compile))
        if "steps" not in programs.compiled:
            state = with_shardings(programs.abstract_state, programs.shardings)
            compiling.append(pool.submit(programs.train_step.lower(
                state, batch(TRAIN_BATCH_SPEC, (accum, rows, width))).compile))
            compiling.append(pool.submit(programs.eval_step.lower(
                state.params, batch(EVAL_BATCH_SPEC, (rows, width)), np.int32(0)).compile))
        for future in compiling:
            future.result()  # raises what the compilation raised
        if with_init:
            programs.compiled.add("init")
        programs.compiled.add("steps")


@dataclasses.dataclass
class _Preflight:
    """What the checks found; nothing has been written yet."""

    mesh: jax.sharding.Mesh
    corpus: Corpus
    budget_warnings: list[str]
    programs: _Programs
    param_shapes: dict[str, list[int]]
    shardings: TrainState
    latest: int | None  # newest intact checkpoint step; None for a fresh run
    meta: dict  # its record ({} for a fresh run)
    state: TrainState | None = None  # restored from it (already verified readable)
    notes: list[str] = dataclasses.field(default_factory=list)  # e.g. damaged steps moved aside


def check_corpus(cfg: Config, corpus) -> list[str]:
    """Checks the model and the token budget of ``cfg`` against its prepared ``corpus``.

    Returns the budget warnings (data repeated past one epoch); raises ConfigError /
    CorpusTooSmallError naming the field (a vocabulary larger than the model's, windows longer
    than the training split).
    """
    if corpus.vocab_size > cfg.model.vocab_size:
        raise ConfigError("model.vocab_size", f"{cfg.model.vocab_size} is smaller than the "
                          f"tokenizer's vocabulary ({corpus.vocab_size})")
    if objective_for(cfg.model).uses_mask and corpus.vocab_size >= cfg.model.vocab_size:
        raise ConfigError("model.vocab_size", f"model.objective={cfg.model.objective} needs a "
                          f"[MASK] id after the tokenizer's {corpus.vocab_size} ids: set "
                          f"model.vocab_size >= {corpus.vocab_size + 1}")
    tokens = cfg.total_steps * cfg.data.batch_size * cfg.data.seq_len
    with warnings.catch_warnings():  # the caller reports them (metrics writer, sweep notes)
        warnings.simplefilter("ignore")
        return check_budget(corpus, tokens, cfg.data.seq_len)


def _preflight(cfg: Config, workdir: Path) -> _Preflight:
    """Every check that can fail on bad input, cheapest first; raises AttnlabError."""
    mesh = make_mesh(cfg)
    check_batch_divides(cfg, mesh.size, jax.process_count())
    optimizer, schedule = make_optimizer(cfg.train, cfg.total_steps, cfg.model.d_model,
                                         ngpt=cfg.model.ngpt)
    corpus = prepare(cfg.data)
    budget_warnings = check_corpus(cfg, corpus)
    programs = _programs(cfg, mesh, optimizer, schedule)
    shapes, shardings = programs.param_shapes, programs.shardings
    latest, meta, state, notes = None, {}, None, []
    directory = workdir / rundir.CHECKPOINT_DIR
    if directory.exists():
        latest, meta, state, notes = _newest_intact_checkpoint(
            cfg, directory, shapes, programs.abstract_state, shardings)
    return _Preflight(mesh, corpus, budget_warnings, programs, shapes, shardings, latest, meta,
                      state, notes)


def _newest_intact_checkpoint(cfg: Config, directory: Path, shapes: dict, abstract_state,
                              shardings) -> tuple[int | None, dict, TrainState | None, list[str]]:
    """The newest checkpoint that reads back whole: ``(step, meta, state, notes)``.

    A step whose files are truncated or corrupted (a disk filled up, a copy cut short) is moved
    aside to ``checkpoints/corrupt-<step>`` (kept for inspection, never deleted) and the next
    older one is tried; each move is one line in ``notes``. With none intact the run starts
    from step 0. A checkpoint that reads fine but belongs to another model is an error
    (CheckpointError), not damage.
    """
    notes: list[str] = []
    while True:
        with Checkpoints(directory, keep=cfg.train.keep_checkpoints, read_only=True) as ckpts:
            steps = sorted(ckpts.all_steps(), reverse=True)
            if not steps:
                return None, {}, None, notes
            step = steps[0]
            try:
                meta = ckpts.read_meta(step)
                damaged = None
            except DamagedCheckpointError as e:
                damaged = e
            if damaged is None:
                check_compatible(meta, cfg.model, shapes, f"checkpoint {directory / str(step)}")
                if step > cfg.total_steps:
                    raise CheckpointError(f"the latest checkpoint (step {step}) is past this "
                                          f"run's {cfg.total_steps} steps")
                try:
                    state = ckpts.restore(step, abstract_state, shardings)
                    return step, meta, state, notes
                except DamagedCheckpointError as e:
                    damaged = e
        moved = move_aside(directory, step)
        older = [s for s in steps[1:]]
        notes.append(f"checkpoint step {step} is damaged ({damaged}); moved it to {moved} and "
                     + (f"resuming from step {older[0]}" if older else "starting from step 0"))


def _compile(cfg: Config, mesh: jax.sharding.Mesh, shardings: TrainState,
             graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation,
             schedule: optax.Schedule) -> tuple[Callable, Callable]:
    """``(train_step, eval_step)`` jitted with the mesh's layouts; the train state is donated
    (updated in place: no second copy of parameters and optimizer state)."""
    on_mesh = lambda spec: jax.sharding.NamedSharding(mesh, spec)  # noqa: E731
    train_step = jax.jit(
        make_train_step(cfg, graphdef, optimizer, schedule),
        in_shardings=(shardings, on_mesh(TRAIN_BATCH_SPEC)),
        out_shardings=(shardings, on_mesh(REPLICATED)),
        donate_argnums=0,
    )
    eval_step = jax.jit(make_eval_step(graphdef, masked_spans=cfg.train.eval_masked_spans),
                        in_shardings=(shardings.params, on_mesh(EVAL_BATCH_SPEC),
                                      on_mesh(REPLICATED)),
                        out_shardings=on_mesh(REPLICATED))
    return train_step, eval_step


class _Record:
    """The running numbers of a run that outlive a restart (kept in each checkpoint's record):
    recent train losses, validation losses, timed throughput, wall time."""

    def __init__(self, meta: dict, total_steps: int, tokens_per_step: int):
        self.tokens_per_step = tokens_per_step
        # final_train_loss_smoothed: mean over the last 10% of steps (at most 100)
        self.window = max(1, min(100, total_steps // 10))
        self.recent_losses = collections.deque(meta.get("recent_losses", []), maxlen=self.window)
        self.val_accuracy = None  # masked objectives: accuracy on the predicted positions
        self.val_span_bits = None  # train.eval_masked_spans: the objectives' common measure
        self.best_val = meta.get("best_val_loss")
        self.last_val = meta.get("last_val_loss")
        self.throughput = Throughput(tokens_per_step, meta.get("timed_tokens", 0),
                                     meta.get("timed_seconds", 0.0),
                                     meta.get("paused_seconds", {}))
        self._wall_before = meta.get("wall_seconds", 0.0)
        self._started = time.perf_counter()

    def validation(self, loss: float) -> None:
        self.last_val = loss
        self.best_val = loss if self.best_val is None else min(self.best_val, loss)

    def wall_seconds(self) -> float:
        return self._wall_before + time.perf_counter() - self._started

    def checkpoint_meta(self, step: int) -> dict:
        return {"step": step, "data_position": step, "tokens": step * self.tokens_per_step,
                "recent_losses": list(self.recent_losses), "best_val_loss": self.best_val,
                "last_val_loss": self.last_val, "timed_tokens": self.throughput.tokens,
                "timed_seconds": self.throughput.seconds,
                "paused_seconds": dict(self.throughput.paused_seconds),
                "wall_seconds": self.wall_seconds()}


def run(cfg: Config, workdir: str | Path, *, progress: bool = True,
        allow_large: bool = False) -> dict:
    """Trains ``cfg`` in ``workdir`` (resuming if it holds this run) and returns the summary.

    Returns:
      the ``summary.json`` dict; ``status`` is ``'completed'`` or ``'diverged'`` (a NaN/inf loss
      or gradient stops the run: a result, not an exception).

    Raises:
      attnlab.errors.AttnlabError (ConfigError, WorkdirError, CheckpointError, data errors,
      TooLargeError unless ``allow_large``): bad input, raised before anything is compiled or
      written.
    """
    workdir = Path(workdir).absolute()
    initialize_distributed(cfg)
    writer = jax.process_index() == 0  # the process that writes the run's files

    # -- 1. checks; nothing is written ----------------------------------------------------------
    previous = check_workdir(workdir, cfg)
    if previous and previous.get("status") in (rundir.COMPLETED, rundir.DIVERGED):
        return previous  # a finished result: rerunning is a no-op
    check_training_fits(cfg, allow_large=allow_large)  # before anything is allocated
    plan = _preflight(cfg, workdir)

    # -- 2. write, then initialise or restore and compile --------------------------------------
    total_steps, accum = cfg.total_steps, cfg.train.grad_accum
    tokens_per_step = cfg.data.batch_size * cfg.data.seq_len
    start_step = plan.latest or 0
    if writer:
        workdir.mkdir(parents=True, exist_ok=True)
        if not (workdir / rundir.CONFIG_FILE).exists():
            rundir.write_json_atomic(workdir / rundir.CONFIG_FILE, cfg.to_dict())
    counts = param_counts(cfg.model)
    flops = training_flops_per_token(cfg)
    device = jax.devices()[0]
    peak, peak_source = peak_flops_per_device(device, cfg.model.dtype)
    summary = {
        "status": rundir.RUNNING, "name": cfg.name, "workdir": str(workdir),
        "total_steps": total_steps, "step": start_step, "tokens_per_step": tokens_per_step,
        "params": {k: counts[k] for k in ("total", "non_embedding", "embedding")},
        "flops_per_token": flops,
        "device": {"kind": device.device_kind, "platform": device.platform,
                   "count": plan.mesh.size, "processes": jax.process_count(),
                   "mesh": dict(plan.mesh.shape), "peak_flops_per_device": peak,
                   "peak_source": peak_source},
        "dataset": plan.corpus.manifest, "warnings": list(plan.budget_warnings) + plan.notes,
    }

    def write_summary():
        if writer:
            rundir.write_json_atomic(workdir / rundir.SUMMARY_FILE, summary)

    write_summary()
    checkpoints = Checkpoints(workdir / rundir.CHECKPOINT_DIR, keep=cfg.train.keep_checkpoints)
    metrics = None
    try:  # from here on, a crash is recorded as status "failed"
        record = _Record(plan.meta, total_steps, tokens_per_step)  # wall time counts compiling
        _compile_programs(cfg, plan.programs, with_init=plan.latest is None)
        if plan.latest is None:
            state = plan.programs.init(jax.random.key(cfg.train.seed))
        else:
            state = plan.state  # restored (and so verified) by the preflight
        if writer:  # lines logged after the checkpoint are about to be logged again
            rundir.rewind_metrics(workdir / rundir.METRICS_FILE, start_step)
        train_step, eval_step = plan.programs.train_step, plan.programs.eval_step
        objective = objective_for(cfg.model)

        batches = Batches(plan.corpus, "train", cfg.data.seq_len, cfg.data.batch_size,
                          cfg.data.seed, process_index=jax.process_index(),
                          process_count=jax.process_count())
        train_shape = (accum, cfg.data.batch_size // accum, cfg.data.seq_len + 1)

        def device_batch(i: int) -> jax.Array:
            local = _as_micro_batches(np.asarray(batches[i], np.int32), accum)
            return global_batch(plan.mesh, TRAIN_BATCH_SPEC, local, train_shape)

        # Evaluated in micro-batches (memory as in training); these are the windows that
        # eval_batches full batches would hold, so the validation set ignores grad_accum.
        val_batches = np.asarray(validation_batches(
            plan.corpus, cfg.data.seq_len, cfg.data.batch_size // accum,
            cfg.train.eval_batches * accum), np.int32)

        def evaluate(params) -> float:
            """Mean validation loss (every batch holds the same number of tokens); the mean
            accuracy of the masked objectives goes to ``val_accuracy``."""
            out = jax.device_get([eval_step(params, global_batch(plan.mesh, EVAL_BATCH_SPEC,
                                                                 _process_rows(b), b.shape),
                                            np.int32(j))
                                  for j, b in enumerate(val_batches)])
            if objective.uses_mask:
                record.val_accuracy = float(np.mean([o["accuracy"] for o in out]))
            if cfg.train.eval_masked_spans:  # bits per token of the masked spans, all batches
                record.val_span_bits = (sum(float(o["span_nats"]) for o in out)
                                        / sum(float(o["span_count"]) for o in out) / math.log(2))
            return float(np.mean([o["loss"] for o in out]))

        def finish(status: str, **extra) -> dict:
            with record.throughput.paused("checkpoints"):  # the last save's commit
                checkpoints.wait()
            tokens = summary["step"] * tokens_per_step
            tokens_per_s = record.throughput.mean_rate()
            losses = record.recent_losses
            summary.update(
                status=status, tokens=tokens,
                flops={"6nd": flops["6n"] * tokens, "chinchilla": flops["chinchilla"] * tokens,
                       "mfu_count": flops["mfu"] * tokens},
                final_val_loss=record.last_val, best_val_loss=record.best_val,
                **({"final_val_accuracy": record.val_accuracy} if objective.uses_mask else {}),
                **({"final_val_span_bits": record.val_span_bits}
                   if cfg.train.eval_masked_spans else {}),
                final_train_loss_smoothed=float(np.mean(losses)) if losses else None,
                train_loss_smoothing_steps=record.window,
                wall_seconds=record.wall_seconds(), tokens_per_s=tokens_per_s,
                evaluation_seconds=record.throughput.paused_seconds.get("evaluation", 0.0),
                checkpoint_seconds=record.throughput.paused_seconds.get("checkpoints", 0.0),
                mfu=mfu(tokens_per_s, flops["mfu"], peak, plan.mesh.size) if tokens_per_s else None,
                **extra)
            write_summary()
            return summary

        # -- 3. the loop -------------------------------------------------------------------
        metrics = MetricsWriter(workdir, total_steps=total_steps, start_step=start_step,
                                progress=progress, write_files=writer)
        for text in plan.budget_warnings:
            metrics.message(f"warning: {text}")
        for text in plan.notes:  # said even without a progress display
            sys.stderr.write(f"warning: {text}\n")
            sys.stderr.flush()
        if start_step:
            metrics.message(f"resuming {workdir} from step {start_step}/{total_steps}")
        batch = device_batch(start_step) if start_step < total_steps else None
        for step in range(start_step + 1, total_steps + 1):  # step = updates done after it
            state, out = train_step(state, batch)
            if step < total_steps:
                batch = device_batch(step)  # host work overlaps the device's step
            out = jax.device_get(out)
            loss, grad_norm = float(out["loss"]), float(out["grad_norm"])
            summary["step"] = step
            line = {"step": step, "tokens": step * tokens_per_step, "loss": loss,
                    "lr": float(out["lr"]), "grad_norm": grad_norm}
            if not _finite(loss, grad_norm):
                metrics.log(line)
                metrics.message(f"diverged at step {step}: loss {loss}, grad_norm {grad_norm}")
                return finish(rundir.DIVERGED, diverged_at_step=step)
            record.recent_losses.append(loss)
            record.throughput.step_done()
            metrics.step(step)

            if step % cfg.train.log_every == 0 or step in (1, total_steps):
                rate = record.throughput.rate()
                if rate:
                    line.update(tokens_per_s=rate,
                                mfu=mfu(rate, flops["mfu"], peak, plan.mesh.size))
                metrics.log(line)
            if step % cfg.train.eval_every == 0 or step == total_steps:
                with record.throughput.paused("evaluation"):  # not training throughput
                    record.validation(evaluate(state.params))
                line = {"step": step, "tokens": step * tokens_per_step,
                        "val_loss": record.last_val}
                if objective.uses_mask:
                    line["val_accuracy"] = record.val_accuracy
                if cfg.train.eval_masked_spans:
                    line["val_span_bits"] = record.val_span_bits
                metrics.log(line)
            if step % cfg.train.checkpoint_every == 0 or step == total_steps:
                with record.throughput.paused("checkpoints"):
                    checkpoints.save(state, {**record.checkpoint_meta(step),
                                             "model": dataclasses.asdict(cfg.model),
                                             "param_shapes": plan.param_shapes})
        if record.last_val is None:  # resumed from the final checkpoint
            with record.throughput.paused("evaluation"):
                record.validation(evaluate(state.params))
        return finish(rundir.COMPLETED)
    except BaseException as e:
        if summary["status"] == rundir.RUNNING:
            summary.update(status=rundir.FAILED, error=f"{type(e).__name__}: {e}")
            write_summary()
        raise
    finally:
        if metrics is not None:
            metrics.close()
        checkpoints.close()
