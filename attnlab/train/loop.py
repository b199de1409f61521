"""``run(cfg, workdir)``: train one model, resuming from the latest checkpoint in ``workdir``.

Order of work, so that bad input fails fast and leaves the directory untouched:

1. checks that need nothing built (:mod:`attnlab.train.preflight`): the workdir's config, the
   mesh, batch divisibility, the schedule; then the corpus (prepared/cached by attnlab.data) and
   the model's shapes (abstract, no FLOPs), and the latest checkpoint's record against them;
2. only then are files written (``config.json``, ``summary.json`` with status ``running``),
   the init, train and eval programs compiled (unless a :class:`ProgramCache` holds them
   already) and the state initialised or restored;
3. the loop: one jitted, state-donating ``train_step`` per batch; metrics every ``log_every``
   steps, validation every ``eval_every``, checkpoints every ``checkpoint_every`` and at the end.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import sys
import time
from pathlib import Path

import jax
import numpy as np

from attnlab import rundir
from attnlab.config import Config, check_warmup
from attnlab.data.sources import window_layout
from attnlab.errors import ConfigError
from attnlab.checks import check
from attnlab.model import flops_per_token, param_counts, recorded_counts, resolve
from attnlab.train.branch import branch_record
from attnlab.train import environment
from attnlab.train.checkpoint import Checkpoints
from attnlab.train.memory import check_training_fits
from attnlab.train.metrics import MetricsWriter, Throughput, scalar_metrics
from attnlab.train.mfu import mfu, peak_flops_per_device
from attnlab.train.preflight import Preflight, preflight
from attnlab.train.programs import ProgramCache, compile_programs
from attnlab.train.sharding import EVAL_BATCH_SPEC, TRAIN_BATCH_SPEC, global_batch
from attnlab.train.workdir import check_workdir

EXIT_COMPLETED, EXIT_BAD_INPUT, EXIT_DIVERGED = 0, 2, 3


STEP_METRICS = ("loss", "grad_norm", "lr")  # every step's; the rest (an MoE's) are logged as is


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
    """``[rows, seq + 1] -> [accum, rows / accum, seq + 1]`` (any row shape): row ``r`` goes to
    micro-batch ``r % accum``, so each micro-batch keeps a contiguous slice of every device's
    rows (no resharding) and the assignment does not depend on how many devices there are."""
    rows, *row = local.shape
    return local.reshape(rows // accum, accum, *row).swapaxes(0, 1)


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


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
        self.tasks = meta.get("eval_tasks", {})  # train.eval_tasks' scores, last evaluation
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
                "last_val_loss": self.last_val, "eval_tasks": self.tasks,
                "timed_tokens": self.throughput.tokens,
                "timed_seconds": self.throughput.seconds,
                "paused_seconds": dict(self.throughput.paused_seconds),
                "wall_seconds": self.wall_seconds()}


class _Training:
    """One run from its first write to its final summary: the summary it keeps current, the
    running record, the batches, and the loop's steps (logging, validation, checkpoints)."""

    def __init__(self, cfg: Config, workdir: Path, found: Preflight, progress: bool):
        self.cfg, self.workdir, self.found, self.progress = cfg, workdir, found, progress
        self.metrics = self.checkpoints = self.record = None  # opened by open()
        self.writer = jax.process_index() == 0  # the process that writes the run's files
        self.start = found.latest or 0
        self.tokens_per_step = cfg.data.batch_size * cfg.data.seq_len
        self.flops = training_flops_per_token(cfg)
        self.objective = resolve(cfg.model).objective
        device = jax.devices()[0]
        self.peak, self.peak_source = peak_flops_per_device(device, cfg.model.dtype)
        counts = param_counts(cfg.model)
        mesh = found.mesh
        self.summary = {
            "status": rundir.RUNNING, "name": cfg.name, "workdir": str(workdir),
            "total_steps": cfg.total_steps, "step": self.start,
            "tokens_per_step": self.tokens_per_step,
            "params": recorded_counts(counts),
            "flops_per_token": self.flops,
            "device": {"kind": device.device_kind, "platform": device.platform,
                       "count": mesh.size, "processes": jax.process_count(),
                       "mesh": dict(mesh.shape), "peak_flops_per_device": self.peak,
                       "peak_source": self.peak_source},
            "versions": environment.versions(),
            "dataset": found.corpus.manifest,
            "warnings": list(found.budget_warnings) + found.notes,
        }
        if cfg.train.branch_from:
            self.summary["branch"] = branch_record(cfg, workdir, self.flops)
        self.batches = found.corpus.train_batches(
            cfg.data.seq_len, cfg.data.batch_size, cfg.data.seed,
            process_index=jax.process_index(), process_count=jax.process_count())
        self.summary.update(self.batches.unique())  # U_D of a data-constrained law
        self.row_shape, self.dtype = window_layout(cfg.data)  # tokens, or regression prompts
        self.val_batches = found.val_windows  # drawn by the preflight's check

    def write_summary(self) -> None:
        if self.writer:
            rundir.write_json_atomic(self.workdir / rundir.SUMMARY_FILE, self.summary)

    def mfu(self, tokens_per_s: float) -> float:
        return mfu(tokens_per_s, self.flops["mfu"], self.peak, self.found.mesh.size)

    def open(self) -> None:
        """Writes the run's files and opens its checkpoints, record and metrics (the record's
        wall time counts compiling)."""
        if self.writer:
            self.workdir.mkdir(parents=True, exist_ok=True)
            if not (self.workdir / rundir.CONFIG_FILE).exists():
                rundir.write_json_atomic(self.workdir / rundir.CONFIG_FILE, self.cfg.to_dict())
            # Lines logged after the checkpoint are about to be logged again.
            rundir.rewind_metrics(self.workdir / rundir.METRICS_FILE, self.start)
        self.write_summary()
        self.checkpoints = Checkpoints(self.workdir / rundir.CHECKPOINT_DIR,
                                       keep=self.cfg.train.keep_checkpoints,
                                       keep_steps=self.cfg.train.keep_steps)
        self.record = _Record(self.found.meta, self.cfg.total_steps, self.tokens_per_step)
        total = self.cfg.total_steps
        self.metrics = MetricsWriter(self.workdir, total_steps=total, start_step=self.start,
                                     progress=self.progress, write_files=self.writer)
        if self.writer:  # what ran it, first in every run's log
            sys.stderr.write("".join(f"{line}\n" for line in environment.run_lines(
                self.summary["versions"], self.peak, self.peak_source, self.cfg.model.dtype)))
            sys.stderr.flush()
        for text in self.found.budget_warnings:
            self.metrics.message(f"warning: {text}")
        for text in self.found.notes:  # said even without a progress display
            sys.stderr.write(f"warning: {text}\n")
            sys.stderr.flush()
        if self.found.branched:
            self.metrics.message(f"branching {self.workdir} from its trunk "
                                 f"{self.summary['branch']['trunk']} at step {self.start}/{total}")
        elif self.start:
            self.metrics.message(f"resuming {self.workdir} from step {self.start}/{total}")

    def fail(self, error: BaseException) -> None:
        """Records a crash or an interrupt as status ``failed`` (a finished run stays)."""
        if self.summary["status"] == rundir.RUNNING:
            self.summary.update(status=rundir.FAILED, error=rundir.failure_text(error))
            try:
                self.write_summary()
            except OSError as e:  # a full disk: the error being raised is what matters
                if rundir.write_failure(e) is None:
                    raise

    def close(self) -> None:
        metrics, checkpoints, self.metrics, self.checkpoints = (self.metrics, self.checkpoints,
                                                                None, None)
        try:
            if metrics is not None:
                metrics.close()
        finally:
            if checkpoints is not None:
                checkpoints.close()

    def train(self) -> dict:
        """Trains to the end (or to divergence); a crash or an interrupt is recorded as status
        ``failed`` and raised. A write the storage refused (a full disk) raises
        :class:`~attnlab.errors.WriteError` and leaves the run partial: its summary is not
        touched (it could not be written anyway), and the next invocation resumes it from its
        latest complete checkpoint."""
        try:
            self.open()
            found = self.found
            compile_programs(self.cfg, found.programs, with_init=found.latest is None)
            if found.latest is None:
                state = found.programs.init(jax.random.key(self.cfg.train.seed))
            else:
                state = found.state  # restored (and so verified) by the preflight
            summary = self._loop(state)
            self.close()  # the last save's commit can fail too
            return summary
        except BaseException as e:
            failure = rundir.write_failure(e, self.workdir)
            if failure is None:
                self.fail(e)
            try:
                self.close()
            except Exception as late:  # noqa: BLE001 - a save it waits for failing again
                if rundir.write_failure(late) is None:
                    raise
            if failure is not None:
                raise failure from None
            raise

    def host_batch(self, i: int) -> np.ndarray:
        """Batch ``i`` of this process, as micro-batches ``[accum, rows / accum, seq + 1]``."""
        return _as_micro_batches(np.asarray(self.batches[i], self.dtype),
                                 self.cfg.train.grad_accum)

    def _device_batch(self, i: int) -> jax.Array:
        accum = self.cfg.train.grad_accum
        shape = (accum, self.cfg.data.batch_size // accum, *self.row_shape)
        return global_batch(self.found.mesh, TRAIN_BATCH_SPEC, self.host_batch(i), shape)

    def _loop(self, state) -> dict:
        total = self.cfg.total_steps
        train_step = self.found.programs.train_step
        batch = self._device_batch(self.start) if self.start < total else None
        for step in range(self.start + 1, total + 1):  # step = updates done after it
            state, out = train_step(state, batch)
            if step < total:
                batch = self._device_batch(step)  # host work overlaps the device's step
            if self.after_step(step, jax.device_get(out), lambda: state) is not None:
                return self.summary
        return self.complete(state)

    def after_step(self, step: int, out: dict, state_fn) -> str | None:
        """Records update ``step`` (``out``: its loss, grad_norm and lr) and logs, validates and
        checkpoints as the config says (``state_fn()``: the state after it). Returns
        ``diverged`` (and finishes the run) when the loss or gradient is not finite."""
        train = self.cfg.train
        loss, grad_norm = float(out["loss"]), float(out["grad_norm"])
        self.summary["step"] = step
        line = {"step": step, "tokens": step * self.tokens_per_step, "loss": loss,
                "lr": float(out["lr"]), "grad_norm": grad_norm}
        if not _finite(loss, grad_norm):
            self.metrics.log(line)
            self.metrics.message(f"diverged at step {step}: loss {loss}, grad_norm {grad_norm}")
            self.finish(rundir.DIVERGED, diverged_at_step=step)
            return rundir.DIVERGED
        self.record.recent_losses.append(loss)
        self.record.throughput.step_done()
        self.metrics.step(step)
        total = self.cfg.total_steps
        if step % train.log_every == 0 or step in (1, total):
            rate = self.record.throughput.rate()
            extra = scalar_metrics({k: v for k, v in out.items() if k not in STEP_METRICS})
            self.metrics.log({**line, **self.batches.consumed(step), **extra,
                              **({"tokens_per_s": rate, "mfu": self.mfu(rate)} if rate else {})})
        if step % train.eval_every == 0 or step == total:
            self._validate(step, state_fn())
        if step % train.checkpoint_every == 0 or step == total or step in train.keep_steps:
            self._checkpoint(step, state_fn())
        return None

    def complete(self, state) -> dict:
        """Finishes a run that reached its last step (validating a run resumed from its final
        checkpoint, which has no validation loss yet)."""
        if self.record.last_val is None:
            with self.record.throughput.paused("evaluation"):
                self.record.validation(self.evaluate(state.params))
        return self.finish(rundir.COMPLETED)

    def _validate(self, step: int, state) -> None:
        record = self.record
        with record.throughput.paused("evaluation"):  # not training throughput
            record.validation(self.evaluate(state.params))
        line = {"step": step, "tokens": step * self.tokens_per_step, "val_loss": record.last_val}
        if self.objective.uses_mask:
            line["val_accuracy"] = record.val_accuracy
        if self.cfg.train.eval_masked_spans:
            line["val_span_bits"] = record.val_span_bits
        if self.found.tasks is not None:
            with record.throughput.paused("evaluation"):
                record.tasks = self.found.tasks.metrics(self.found.programs.graphdef,
                                                        state.params)
            line.update(record.tasks)
        self.metrics.log(line)

    def _checkpoint(self, step: int, state) -> None:
        with self.record.throughput.paused("checkpoints"):
            self.checkpoints.save(state, {**self.record.checkpoint_meta(step),
                                          "model": dataclasses.asdict(self.cfg.model),
                                          "param_shapes": self.found.programs.param_shapes})

    def evaluate(self, params) -> float:
        """Mean validation loss (every batch holds the same number of tokens); the mean
        accuracy of the masked objectives goes to ``record.val_accuracy``."""
        eval_step, mesh = self.found.programs.eval_step, self.found.mesh
        out = jax.device_get([eval_step(params, global_batch(mesh, EVAL_BATCH_SPEC,
                                                             _process_rows(b), b.shape),
                                        np.int32(j))
                              for j, b in enumerate(self.val_batches)])
        if self.objective.uses_mask:
            self.record.val_accuracy = float(np.mean([o["accuracy"] for o in out]))
        if self.cfg.train.eval_masked_spans:  # bits per token of the masked spans, all batches
            self.record.val_span_bits = (sum(float(o["span_nats"]) for o in out)
                                         / sum(float(o["span_count"]) for o in out) / math.log(2))
        return float(np.mean([o["loss"] for o in out]))

    def finish(self, status: str, **extra) -> dict:
        record, flops = self.record, self.flops
        with record.throughput.paused("checkpoints"):  # the last save's commit
            self.checkpoints.wait()
        tokens = self.summary["step"] * self.tokens_per_step
        tokens_per_s = record.throughput.mean_rate()
        losses, paused = record.recent_losses, record.throughput.paused_seconds
        self.summary.update(
            status=status, tokens=tokens, **self.batches.consumed(self.summary["step"]),
            flops={"6nd": flops["6n"] * tokens, "chinchilla": flops["chinchilla"] * tokens,
                   "mfu_count": flops["mfu"] * tokens},
            final_val_loss=record.last_val, best_val_loss=record.best_val,
            **({"final_val_accuracy": record.val_accuracy} if self.objective.uses_mask else {}),
            **({"final_val_span_bits": record.val_span_bits}
               if self.cfg.train.eval_masked_spans else {}),
            **record.tasks,
            final_train_loss_smoothed=float(np.mean(losses)) if losses else None,
            train_loss_smoothing_steps=record.window,
            wall_seconds=record.wall_seconds(), tokens_per_s=tokens_per_s,
            evaluation_seconds=paused.get("evaluation", 0.0),
            checkpoint_seconds=paused.get("checkpoints", 0.0),
            mfu=self.mfu(tokens_per_s) if tokens_per_s else None,
            **extra)
        self.write_summary()
        return self.summary


def run(cfg: Config, workdir: str | Path, *, progress: bool = True, allow_large: bool = False,
        allow_nonempty: bool = False, programs: ProgramCache | None = None) -> dict:
    """Trains ``cfg`` in ``workdir`` (resuming if it holds this run) and returns the summary.

    ``allow_nonempty``: train in an existing directory that holds other files and no run.
    ``programs``: a cache of compiled programs to take them from and leave them in (a sweep
    worker passes one to every run); without one the run compiles its own.

    Returns:
      the ``summary.json`` dict; ``status`` is ``'completed'`` or ``'diverged'`` (a NaN/inf loss
      or gradient stops the run: a result, not an exception).

    Raises:
      attnlab.errors.AttnlabError (ConfigError, WorkdirError, CheckpointError, data errors,
      TooLargeError unless ``allow_large``): bad input, raised before anything is compiled or
      written.
    """
    workdir = Path(workdir).absolute()
    check(cfg)  # the rules between parts; a config built in code has not met them yet
    check_warmup(cfg.train, cfg.total_steps)
    initialize_distributed(cfg)
    previous = check_workdir(workdir, cfg, allow_nonempty=allow_nonempty)
    if previous and previous.get("status") in (rundir.COMPLETED, rundir.DIVERGED):
        return previous  # a finished result: rerunning is a no-op
    check_training_fits(cfg, allow_large=allow_large)  # before anything is allocated
    found = preflight(cfg, workdir, programs if programs is not None else ProgramCache())
    return _Training(cfg, workdir, found, progress).train()
