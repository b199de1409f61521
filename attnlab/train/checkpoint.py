"""Checkpoints with orbax: parameters, optimizer state (with the step) and a JSON record.

Layout of ``<workdir>/checkpoints/<step>/``: ``params/`` and ``opt_state/`` (array trees), and
``meta/`` (JSON: step, data position, the model config, every parameter's shape, and the running
totals the summary needs). Orbax writes each step into a temporary directory and renames it
when complete, so a process killed mid-save leaves no half-written step that looks finished;
leftover temporaries are deleted when the next manager opens the directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Iterator

import jax
import orbax.checkpoint as ocp

from attnlab.config import ModelConfig
from attnlab.errors import AttnlabError
from attnlab.interrupts import deferred as interrupts_deferred
from attnlab.rundir import write_failure
from attnlab.train.state import TrainState

FORMAT_VERSION = 1


class CheckpointError(AttnlabError):
    """A checkpoint does not fit the configured model, or cannot be read."""


def path_name(path) -> str:
    """``('blocks', 0, 'attn', 'query', 'kernel', 'value')`` -> ``'blocks/0/attn/query/kernel'``."""
    names = []
    for key in path:
        name = getattr(key, "key", getattr(key, "name", getattr(key, "idx", key)))
        names.append(str(name))
    if names and names[-1] == "value":  # nnx.Variable's leaf attribute
        names.pop()
    return "/".join(names)


def param_shapes(params) -> dict[str, list[int]]:
    """``{'blocks/0/ffn/w_in/kernel': [d_model, d_ff], ...}`` of a params tree (or its shapes)."""
    return {path_name(p): list(x.shape) for p, x in jax.tree_util.tree_leaves_with_path(params)}


def check_compatible(meta: dict, model: ModelConfig, expected_shapes: dict[str, list[int]],
                     where: str) -> None:
    """Raises CheckpointError naming the first difference between a checkpoint and the model."""
    if meta.get("format") != FORMAT_VERSION or "param_shapes" not in meta:
        raise CheckpointError(f"{where} was not written by attnlab's trainer (no parameter "
                              "record); move it away or use a fresh --run")
    # A field the record lacks was added to ModelConfig after the checkpoint was written; its
    # default reproduces the old model (every new field's rule), so it compares as the default.
    saved_model = {**dataclasses.asdict(type(model)()), **meta.get("model", {})}
    current = dataclasses.asdict(model)
    diffs = [f"model.{k}: checkpoint {saved_model.get(k)!r}, config {current[k]!r}"
             for k in current if saved_model.get(k) != current[k]]
    saved = meta["param_shapes"]
    for name in sorted(set(saved) | set(expected_shapes)):
        if saved.get(name) != expected_shapes.get(name):
            diffs.append(f"parameter {name}: checkpoint shape {saved.get(name)}, "
                         f"model shape {expected_shapes.get(name)}")
            break
    if diffs:
        raise CheckpointError(
            f"{where} is from an incompatible model: " + "; ".join(diffs[:4])
            + ("; ..." if len(diffs) > 4 else "")
            + ". Use a fresh --run for this model, or the config the checkpoint was made with")


def with_shardings(abstract_tree, shardings):
    """ShapeDtypeStructs carrying the target shardings, so orbax restores straight into them."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract_tree, shardings)


class _KnownHarmless(logging.Filter):
    """Drops absl warnings that orbax and TFDS print on every load although nothing is wrong
    (a read-only manager adjusting its own options; TFDS naming a local corpus's config)."""

    LINES = ("CheckpointManagerOptions.read_only=True", "Given directory is read only",
             "Using custom data configuration")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(line in message for line in self.LINES)


logging.getLogger("absl").addFilter(_KnownHarmless())


class _UnretrievedDamagedReads(logging.Filter):
    """Drops asyncio's "exception was never retrieved" reports of failed array reads. When one
    array of a damaged checkpoint fails to read, orbax's sibling reads fail too and nobody awaits
    them: asyncio reports each when it is garbage-collected, at any later moment, after attnlab
    has said in one line which step is damaged."""

    READ_ERRORS = ("OCDBT", "zarr", "tensorstore")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("exception was never retrieved" in message
                    and any(marker in message for marker in self.READ_ERRORS))


logging.getLogger("asyncio").addFilter(_UnretrievedDamagedReads())


class _FailedWrites(logging.Filter):
    """Drops orbax's reports of a save that failed for want of space (or a read-only disk):
    several ERROR records with tracebacks, logged from its background threads when the commit
    fails. The main thread sees the same error at the next save or wait and says it in one line
    (:func:`attnlab.rundir.write_failure`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return write_failure(error) is None and write_failure(
            Exception(record.getMessage())) is None


logging.getLogger("absl").addFilter(_FailedWrites())


class _LateStorageCallbacks:
    """An unraisable-exception hook that drops tensorstore's reports of a callback that came
    after the asyncio loop awaiting it had closed, and passes everything else to the hook it
    wraps. When one write of a save fails (a full disk), orbax's commit ends and closes its loop
    while the step's other writes are still failing; each of them then prints an "Event loop is
    closed" traceback from tensorstore's threads, after or before the one line that says what
    happened. Nothing is lost: the failure they belong to is already being raised."""

    def __init__(self, wrapped):
        self.wrapped = wrapped

    def __call__(self, unraisable) -> None:
        if not _late_callback(unraisable):
            self.wrapped(unraisable)


def _late_callback(unraisable) -> bool:
    error, tb = unraisable.exc_value, unraisable.exc_traceback
    frames = [frame.name for frame in traceback.extract_tb(tb)] if tb is not None else []
    return (type(error) is RuntimeError and str(error) == "Event loop is closed"
            and "call_soon_threadsafe" in frames)


if not isinstance(sys.unraisablehook, _LateStorageCallbacks):
    sys.unraisablehook = _LateStorageCallbacks(sys.unraisablehook)


@contextlib.contextmanager
def _stderr_captured() -> Iterator[None]:
    """Sends file descriptor 2 to a scratch file meanwhile, and drops it: tensorstore prints
    "Event loop is closed" tracebacks from its callback threads when a damaged checkpoint
    fails to read, which would bury the one line that says what happened."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as scratch:
        os.dup2(scratch.fileno(), 2)
        try:
            yield
        except Exception:
            # Reads still in flight finish (and print) shortly after the first one failed.
            time.sleep(_DRAIN_SECONDS)
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


_DRAIN_SECONDS = 2.0


CORRUPT_PREFIX = "corrupt-"  # checkpoints/corrupt-<step>/: a damaged step, moved aside


# What TensorStore and orbax add to a read error that says nothing to a user: the JSON specs of
# every driver involved, the chain of drivers opened, the files (the step is named already) and,
# in some orbax versions, the repr of a bound method ("See full TensorStore details: <bound
# method pybind11_detail_function_...>").
_ERROR_NOISE = (re.compile(r"[.\s]*See full TensorStore details:.*", re.S),
                re.compile(r"\s*\[tensorstore_spec(\[\d+\])?='[^']*'\]"),
                re.compile(r"\s*<bound method [^>]*>"),
                re.compile(r'Error opening "\w+" driver: '),
                re.compile(r' (in OCDBT database at|of) local file "[^"]*"'))


def describe_error(error: BaseException, limit: int = 160) -> str:
    """``'ValueError: first line of the message'``, short enough for a one-line report
    (TensorStore's driver specs and reprs left out)."""
    message = str(error)
    for noise in _ERROR_NOISE:
        message = noise.sub("", message)
    text = message.strip().splitlines()
    first = text[0] if text else ""
    if len(first) > limit:
        first = first[:limit - 3] + "..."
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


class DamagedCheckpointError(CheckpointError):
    """A checkpoint step exists but cannot be read back (truncated or corrupted files)."""


def move_aside(directory: Path, step: int) -> Path:
    """Renames ``checkpoints/<step>`` to ``checkpoints/corrupt-<step>`` (``-2``, ``-3``... if
    taken), where orbax no longer sees it as a step and nothing deletes it. Returns the path."""
    target = directory / f"{CORRUPT_PREFIX}{step}"
    n = 1
    while target.exists():
        n += 1
        target = directory / f"{CORRUPT_PREFIX}{step}-{n}"
    (directory / str(step)).rename(target)
    return target


class Checkpoints:
    """``CheckpointManager`` for one run's ``checkpoints/`` directory. The loop decides when to
    save (every ``checkpoint_every`` steps, at ``keep_steps`` and at the end); this keeps the
    newest ``keep`` and every step of ``keep_steps``."""

    def __init__(self, directory: str | Path, *, keep: int, read_only: bool = False,
                 keep_steps: tuple[int, ...] = ()):
        self.directory = Path(directory).absolute()
        # keep_steps (a trunk's branch points) are kept besides the newest ``keep``.
        policy = ({"preservation_policy": ocp.checkpoint_managers.AnyPreservationPolicy([
            ocp.checkpoint_managers.LatestN(keep),
            ocp.checkpoint_managers.CustomSteps(list(keep_steps))])}
            if keep_steps else {"max_to_keep": keep})
        options = ocp.CheckpointManagerOptions(
            **policy,
            enable_async_checkpointing=True,  # training continues while arrays are written
            cleanup_tmp_directories=not read_only,
            create=not read_only,
            read_only=read_only,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def read_meta(self, step: int) -> dict:
        try:
            with _stderr_captured():
                restored = self.manager.restore(step, args=ocp.args.Composite(
                    meta=ocp.args.JsonRestore()))
            meta = restored.meta
        except Exception as e:  # orbax raises a variety of errors for unreadable directories
            raise DamagedCheckpointError(f"cannot read {self.directory / str(step)}: "
                                         f"{describe_error(e)}") from None
        if not isinstance(meta, dict):
            raise DamagedCheckpointError(f"cannot read {self.directory / str(step)}: its meta "
                                         f"record is missing or not a JSON object")
        return dict(meta)

    def save(self, state: TrainState, meta: dict[str, Any]) -> None:
        """Starts an asynchronous save of ``state`` at ``meta['step']`` (returns before it ends)."""
        step = int(meta["step"])
        with interrupts_deferred():  # orbax first waits for the previous save to commit
            self.manager.save(step, args=ocp.args.Composite(
                params=ocp.args.StandardSave(state.params),
                opt_state=ocp.args.StandardSave({"step": state.step,
                                                 "opt_state": state.opt_state}),
                meta=ocp.args.JsonSave({"format": FORMAT_VERSION, **meta}),
            ), force=True)

    def restore(self, step: int, abstract_state: TrainState, shardings: TrainState
                ) -> TrainState:
        """The full training state at ``step``, laid out by ``shardings``."""
        target = with_shardings(abstract_state, shardings)
        try:
            with _stderr_captured():
                restored = self.manager.restore(step, args=ocp.args.Composite(
                    params=ocp.args.StandardRestore(target.params),
                    opt_state=ocp.args.StandardRestore(
                        {"step": target.step, "opt_state": target.opt_state}),
                ))
        except Exception as e:  # noqa: BLE001 - truncated/corrupt files raise many kinds
            raise DamagedCheckpointError(f"cannot restore {self.directory / str(step)}: "
                                         f"{describe_error(e)}") from None
        return TrainState(step=restored.opt_state["step"], params=restored.params,
                          opt_state=restored.opt_state["opt_state"])

    def restore_params(self, step: int, abstract_params, shardings=None):
        """Only the parameters (for evaluation and generation)."""
        target = abstract_params if shardings is None else with_shardings(abstract_params,
                                                                          shardings)
        try:
            with _stderr_captured():
                restored = self.manager.restore(step, args=ocp.args.Composite(
                    params=ocp.args.StandardRestore(target)))
        except Exception as e:  # noqa: BLE001 - truncated/corrupt files raise many kinds
            raise DamagedCheckpointError(f"cannot restore {self.directory / str(step)}: "
                                         f"{describe_error(e)}") from None
        return restored.params

    def wait(self) -> None:
        with interrupts_deferred():  # an interrupted commit would log a traceback
            self.manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases the manager (safe to call twice)."""
        if self.manager is not None:
            manager, self.manager = self.manager, None  # closed once, even if closing raises
            with interrupts_deferred(), _stderr_captured():  # noise after a failed read
                manager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
