"""Checkpoints with orbax: parameters, optimizer state (with the step) and a JSON record.

Layout of ``<workdir>/checkpoints/<step>/``: ``params/`` and ``opt_state/`` (array trees), and
``meta/`` (JSON: step, data position, the model config, every parameter's shape, and the running
totals the summary needs). Orbax writes each step into a temporary directory and renames it
when complete, so a process killed mid-save leaves no half-written step that looks finished;
leftover temporaries are deleted when the next manager opens the directory.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from attnlab.config import ModelConfig
from attnlab.errors import AttnlabError
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
                              "record); move it away or use a fresh --workdir")
    saved_model = meta.get("model", {})
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
            + ". Use a fresh --workdir for this model, or the config the checkpoint was made with")


def with_shardings(abstract_tree, shardings):
    """ShapeDtypeStructs carrying the target shardings, so orbax restores straight into them."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract_tree, shardings)


class Checkpoints:
    """``CheckpointManager`` for one run's ``checkpoints/`` directory. The loop decides when to
    save (every ``checkpoint_every`` steps and at the end); this keeps the newest ``keep``."""

    def __init__(self, directory: str | Path, *, keep: int, read_only: bool = False):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
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
            restored = self.manager.restore(step, args=ocp.args.Composite(
                meta=ocp.args.JsonRestore()))
        except Exception as e:  # orbax raises a variety of errors for unreadable directories
            raise CheckpointError(f"cannot read {self.directory / str(step)}: {e}") from None
        return dict(restored.meta or {})

    def save(self, state: TrainState, meta: dict[str, Any]) -> None:
        """Starts an asynchronous save of ``state`` at ``meta['step']`` (returns before it ends)."""
        step = int(meta["step"])
        self.manager.save(step, args=ocp.args.Composite(
            params=ocp.args.StandardSave(state.params),
            opt_state=ocp.args.StandardSave({"step": state.step, "opt_state": state.opt_state}),
            meta=ocp.args.JsonSave({"format": FORMAT_VERSION, **meta}),
        ), force=True)

    def restore(self, step: int, abstract_state: TrainState, shardings: TrainState
                ) -> TrainState:
        """The full training state at ``step``, laid out by ``shardings``."""
        target = with_shardings(abstract_state, shardings)
        restored = self.manager.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(target.params),
            opt_state=ocp.args.StandardRestore(
                {"step": target.step, "opt_state": target.opt_state}),
        ))
        return TrainState(step=restored.opt_state["step"], params=restored.params,
                          opt_state=restored.opt_state["opt_state"])

    def restore_params(self, step: int, abstract_params, shardings=None):
        """Only the parameters (for evaluation and generation)."""
        target = abstract_params if shardings is None else with_shardings(abstract_params,
                                                                          shardings)
        restored = self.manager.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(target)))
        return restored.params

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases the manager (safe to call twice)."""
        if self.manager is not None:
            self.manager.close()
            self.manager = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
