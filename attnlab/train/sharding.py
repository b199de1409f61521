"""Device mesh and named partition specs for data parallelism, FSDP and expert parallelism.

One mesh with three axes, ``('data', 'fsdp', 'expert')``. Batches are split over every axis
(every device sees different examples); parameters and optimizer state are split over ``fsdp``
(ZeRO-3 / FSDP style: each device stores 1/fsdp of every large tensor, XLA all-gathers for the
matmuls and reduce-scatters the gradients), and a mixture of experts' stacked ``[E, ...]``
tensors also over ``expert`` by their expert axis (attnlab.model.moe_dispatch.expert_parallel: the
tokens reach their experts' devices by an all-to-all). Pure data parallelism is simply
``mesh_fsdp = mesh_expert = 1``: the same specs then name axes of size one, so there is a single
code path, and the layout is declared by :func:`param_spec` / :data:`TRAIN_BATCH_SPEC`, not by
branches in the step.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from attnlab.config import Config
from attnlab.errors import ConfigError
from attnlab.model.moe_dispatch import EXPERT_AXIS, EXPERT_PARAMS

MESH_AXES = ("data", "fsdp", EXPERT_AXIS)
# An ensemble's members (attnlab.train.ensemble) are split over a third, leading axis.
ENSEMBLE_AXIS = "ensemble"
BATCH_AXES = MESH_AXES  # the batch dimension is split over every device
# [grad_accum, micro_batch, seq_len + 1]: micro-batches are sharded, the accumulation axis is not.
TRAIN_BATCH_SPEC = P(None, BATCH_AXES)
# [batch, seq_len + 1]
EVAL_BATCH_SPEC = P(BATCH_AXES)
REPLICATED = P()


def mesh_shape(cfg: Config, n_devices: int) -> tuple[int, int, int]:
    """(data, fsdp, expert) sizes for ``n_devices``; raises ConfigError if they do not multiply
    out."""
    fsdp, expert = cfg.train.mesh_fsdp, cfg.train.mesh_expert
    if n_devices % fsdp:
        raise ConfigError("train.mesh_fsdp",
                          f"{fsdp} does not divide the {n_devices} available devices")
    if n_devices % (fsdp * expert):
        raise ConfigError("train.mesh_expert", f"mesh_fsdp * mesh_expert = {fsdp} * {expert} "
                          f"does not divide the {n_devices} available devices")
    rest = n_devices // (fsdp * expert)
    data = rest if cfg.train.mesh_data == -1 else cfg.train.mesh_data
    if data != rest:
        raise ConfigError(
            "train.mesh_data",
            f"mesh_data * mesh_fsdp * mesh_expert = {data} * {fsdp} * {expert} = "
            f"{data * fsdp * expert}, but there are {n_devices} devices (set mesh_data=-1 to "
            f"use the rest)",
        )
    return data, fsdp, expert


def check_batch_divides(cfg: Config, n_devices: int, process_count: int) -> None:
    """Each micro-batch must split evenly over the devices and the batch over the processes."""
    batch, accum = cfg.data.batch_size, cfg.train.grad_accum
    micro = batch // accum
    if batch % process_count:
        raise ConfigError("data.batch_size",
                          f"{batch} does not divide over {process_count} processes")
    if micro % n_devices:
        raise ConfigError(
            "data.batch_size",
            f"the micro-batch batch_size / grad_accum = {batch} / {accum} = {micro} does not "
            f"divide over {n_devices} devices; use a multiple of {n_devices * accum}",
        )


def make_mesh(cfg: Config, devices=None) -> Mesh:
    """A ``('data', 'fsdp', 'expert')`` mesh over ``devices`` (default: all, in process order,
    so that each process's rows of the batch land on its own devices)."""
    devices = list(devices if devices is not None else jax.devices())
    devices.sort(key=lambda d: (d.process_index, d.id))
    return Mesh(np.array(devices).reshape(mesh_shape(cfg, len(devices))), MESH_AXES)


def ensemble_mesh(cfg: Config, k: int, devices=None) -> Mesh:
    """An ``('ensemble', 'data', 'fsdp', 'expert')`` mesh for ``k`` members of ``cfg``'s shape:
    the members are split over as many device groups as divide both ``k`` and the devices (after
    each member's own ``mesh_fsdp``, ``mesh_expert`` and, when set, ``mesh_data``), each group a
    lone run's mesh whose micro-batch still divides over it. One group is a lone run's mesh
    with a member axis of size one."""
    devices = list(devices if devices is not None else jax.devices())
    devices.sort(key=lambda d: (d.process_index, d.id))
    n = len(devices)
    split, data = cfg.train.mesh_fsdp * cfg.train.mesh_expert, cfg.train.mesh_data
    micro = cfg.data.batch_size // cfg.train.grad_accum

    def fits(e: int) -> bool:  # e groups of n / e devices, each a lone run's mesh
        size = n // e
        return (k % e == 0 and n % e == 0 and size % split == 0 and micro % size == 0
                and (data == -1 or size == data * split))

    groups = max((e for e in range(1, k + 1) if fits(e)), default=1)
    return Mesh(np.array(devices).reshape(groups, *mesh_shape(cfg, n // groups)),
                (ENSEMBLE_AXIS, *MESH_AXES))


def member_mesh(mesh: Mesh) -> Mesh:
    """The first device group of an :func:`ensemble_mesh`: where a member's lone programs
    (init, evaluation, checkpoints) run."""
    return Mesh(mesh.devices[0], MESH_AXES)


def param_spec(shape: tuple[int, ...], fsdp_size: int, *, stacked: bool = False,
               experts: bool = False) -> P:
    """FSDP rule: split a tensor's largest dimension that ``fsdp_size`` divides over ``'fsdp'``.

    Scalars, vectors shorter than the axis and tensors with no divisible dimension stay
    replicated (they are small: norms, biases, Adam's step count). Ties go to the last dimension.
    With ``fsdp_size == 1`` the spec names an axis of size one, which is the same as replicated.
    ``stacked``: the leading axis is the layer axis of a stacked layer (``model.scan_layers``),
    never split (the scan takes one layer per step; each step would gather across devices).
    ``experts``: a mixture of experts' ``[E, ...]`` tensor (after the layer axis when stacked),
    whose expert axis is split over ``'expert'`` and the FSDP rule applied to the rest.
    """
    first = 1 if stacked else 0
    if experts:
        inner = shape[first + 1:]
        rest = tuple(param_spec(inner, fsdp_size)) or (None,) * len(inner)
        return P(*[None] * first, EXPERT_AXIS, *rest)
    candidates = [i for i, n in enumerate(shape)
                  if i >= first and n % fsdp_size == 0 and n >= fsdp_size]
    if not candidates:
        return REPLICATED
    dim = max(candidates, key=lambda i: (shape[i], i))
    spec = [None] * len(shape)
    spec[dim] = "fsdp"
    return P(*spec)


def state_shardings(abstract_state, mesh: Mesh):
    """NamedShardings for every leaf of a (train) state, by :func:`param_spec` on its shape.

    The rule depends on the shape alone, so an Adam moment gets the same layout as its parameter.
    """
    fsdp_size = mesh.shape["fsdp"]

    def sharding(path, x):
        spec = param_spec(tuple(x.shape), fsdp_size, stacked=is_stacked_layer(path),
                          experts=is_expert_tensor(path))
        return NamedSharding(mesh, spec)

    return jax.tree_util.tree_map_with_path(sharding, abstract_state)


def is_stacked_layer(path) -> bool:
    """Whether a state path (a parameter's, or an optimizer moment's, which repeats it) is in a
    stacked layer: ``blocks`` followed by a name, where an unrolled model has a layer index."""
    names = [getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))) for k in path]
    return any(name == "blocks" and i + 1 < len(names) and isinstance(names[i + 1], str)
               for i, name in enumerate(names))


def is_expert_tensor(path) -> bool:
    """Whether a state path is a mixture of experts' stacked ``[E, ...]`` tensor: one of
    :data:`~attnlab.model.moe_dispatch.EXPERT_PARAMS` held by the layer's ``ffn`` itself (a dense FFN's
    ``w_in`` is a Linear layer: ``ffn/w_in/kernel``)."""
    names = [getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))) for k in path]
    while names and names[-1] == "value":  # a Param's value, where the path spells it
        names.pop()
    return len(names) >= 2 and names[-2] == "ffn" and names[-1] in EXPERT_PARAMS


def global_batch(mesh: Mesh, spec: P, local_batch: np.ndarray, global_shape: tuple[int, ...]):
    """Assembles each process's rows into one global array laid out by ``spec``.

    With one process this is a plain sharded ``device_put``; with several, process ``p`` passes
    the rows it loaded (its contiguous block of the batch dimension).
    """
    sharding = NamedSharding(mesh, spec)
    return jax.make_array_from_process_local_data(sharding, local_batch, global_shape)
