"""How a mixture of experts' token-expert assignments reach their experts
(``model.moe_dispatch``), on one device or with the experts split over a mesh axis; the router
and the module are in :mod:`attnlab.model.moe`.

Dispatch (``model.moe_dispatch``):

* ``dropless``: the token-expert assignments sorted by expert, each expert's run as one group of
  a grouped matmul (``jax.lax.ragged_dot``); every assignment is computed. XLA:CPU lowers the
  grouped matmul to one dense matmul whose rows are masked per group: E times the FLOPs.
* ``capacity`` (the default: 2-10x faster on CPU, docs/moe.md): each expert takes at most
  ``C = ceil(capacity_factor T k / E)`` of the ``T`` tokens of the batch (GShard / Switch);
  assignments are served by (choice rank, token order), all first choices before any second; the rest are dropped (their weight is lost, the
  residual stream carries the token on). Buffers ``[E, C, d]`` run as one batched matmul.
  With dropping, a token's output depends on the other tokens of the batch (also later ones):
  decoding equals the full forward only while nothing is dropped.

Expert parallelism (``train.mesh_expert > 1``): the experts' stacked tensors split over the
mesh's ``expert`` axis. Capacity dispatch (:func:`expert_parallel`): buffers filled per device
and exchanged by all-to-all (GShard); the capacity then covers each device's tokens. Dropless
(:func:`dropless_expert_parallel`): each device's assignments sent to their experts' devices by
an all-to-all padded to fixed shapes; the result is the single-device one.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from attnlab.config import ModelConfig

EXPERT_AXIS = "expert"  # the mesh axis that splits the experts (attnlab.train.sharding)
# The experts' stacked [E, ...] parameters, split over EXPERT_AXIS by their leading axis.
EXPERT_PARAMS = ("w_in", "w_gate", "w_out", "bias_in", "bias_gate", "bias_out")


def capacity(tokens: int, k: int, n_experts: int, factor: float) -> int:
    """Slots per expert: ``ceil(factor tokens k / E)`` (GShard; Switch eq. 3)."""
    return max(1, math.ceil(factor * tokens * k / n_experts))


def slots(experts: jax.Array, n_experts: int, slots_per_expert: int) -> jax.Array:
    """Each assignment's slot in its expert's buffer, or ``slots_per_expert`` when dropped.

    Assignments are served by choice rank, then token order: ``experts [tokens, k] -> int32
    [tokens, k]``.
    """
    by_rank = experts.T.reshape(-1)  # [k * tokens]: every first choice, then every second
    onehot = jax.nn.one_hot(by_rank, n_experts, dtype=jnp.int32)  # [k * tokens, E]
    position = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=-1)
    position = jnp.where(position < slots_per_expert, position, slots_per_expert)
    return position.reshape(experts.shape[::-1]).T


def expert_ffn(h: jax.Array, params: dict, activation, gated: bool, matmul) -> jax.Array:
    """Every expert's FFN over its rows ``h``; ``matmul(h, w, b) -> h w + b`` applies each
    expert's matrix ``w [E, ...]`` and bias ``b [E, ...]`` (or None) to that expert's rows
    (grouped or batched)."""
    def linear(h, name):
        return matmul(h, params[name], params.get("bias" + name[1:]))

    if gated:
        return linear(jax.nn.silu(linear(h, "w_gate")) * linear(h, "w_in"), "w_out")
    return linear(activation(linear(h, "w_in")), "w_out")


def dropless(tokens, experts, weights, params, activation, gated, capacity_factor=None):
    """Every assignment computed: sorted by expert, one grouped matmul per matrix.

    ``tokens [T, d]``, ``experts, weights [T, k]`` -> ``(y [T, d], kept [T, k] all ones)``.
    """
    t, k = experts.shape
    n = params["w_in"].shape[0]
    flat = experts.reshape(-1)  # [T k]: assignment a = token a // k, its choice a % k
    order = jnp.argsort(flat, stable=True)
    rows = jnp.take(tokens, order // k, axis=0)  # [T k, d], grouped by expert
    sizes = jnp.zeros((n,), jnp.int32).at[flat].add(1)
    expert_of_row = jnp.take(flat, order)

    def matmul(h, w, b):  # "rd,edf->rf" with row r using expert_of_row[r]
        out = jax.lax.ragged_dot(h, w, sizes)
        return out if b is None else out + jnp.take(b, expert_of_row, axis=0)

    out = expert_ffn(rows, params, activation, gated, matmul)
    unsorted = jnp.zeros_like(out).at[order].set(out).reshape(t, k, -1)
    y = jnp.einsum("tkd,tk->td", unsorted, weights)
    return y, jnp.ones((t, k), jnp.float32)


def to_buffers(tokens, experts, n_experts, slots_per_expert):
    """``tokens [T, d]`` scattered into ``[E, C, d]`` expert buffers (:func:`slots`; overflow
    dropped): ``(buffers [E, C, d], slot int32 [T, k])``."""
    t, k = experts.shape
    slot = slots(experts, n_experts, slots_per_expert)  # C = dropped (scatter drops it)
    buffers = jnp.zeros((n_experts, slots_per_expert, tokens.shape[-1]), tokens.dtype)
    rows = jnp.broadcast_to(tokens[:, None], (t, k, tokens.shape[-1]))
    return buffers.at[experts, slot].set(rows, mode="drop"), slot


def from_buffers(out, experts, slot, weights):
    """``y [T, d] = sum_k g_tk out[e_tk, slot_tk]`` over the kept assignments, and ``kept
    [T, k]``; ``out [E, C, d]``."""
    kept = (slot < out.shape[1]).astype(jnp.float32)
    gathered = out.at[experts, slot].get(mode="fill", fill_value=0)  # [T, k, d]
    y = jnp.einsum("tkd,tk->td", gathered, weights * kept.astype(weights.dtype))
    return y, kept


def batched_matmul(h, w, b):
    """Each expert's rows times its matrix: ``h [E, C, d_in], w [E, d_in, d_out] -> [E, C,
    d_out]`` (plus ``b [E, d_out]``)."""
    out = jnp.einsum("ecd,edf->ecf", h, w)
    return out if b is None else out + b[:, None]


def with_capacity(tokens, experts, weights, params, activation, gated, capacity_factor):
    """At most ``C`` tokens per expert (:func:`capacity`, :func:`slots`), the rest dropped:
    buffers ``[E, C, d]``, one batched matmul per matrix.

    ``tokens [T, d]``, ``experts, weights [T, k]`` -> ``(y [T, d], kept [T, k])``.
    """
    t, k = experts.shape
    n = params["w_in"].shape[0]
    buffers, slot = to_buffers(tokens, experts, n, capacity(t, k, n, capacity_factor))
    out = expert_ffn(buffers, params, activation, gated, batched_matmul)  # [E, C, d]
    return from_buffers(out, experts, slot, weights)


def expert_parallel(mesh, tokens, experts, weights, params, activation, gated,
                    capacity_factor):
    """:func:`with_capacity` with the experts split over the mesh's ``expert`` axis (GShard's
    expert parallelism, Lepikhin et al. 2020 sec. 2.2).

    ``tokens [T, d]``, ``experts, weights [T, k]`` are split over every mesh axis (the batch);
    the experts' ``[E, ...]`` tensors over ``expert``. Each device fills ``[E, C, d]`` buffers
    from its own ``T / devices`` tokens (``C`` by :func:`capacity` of those tokens: the
    capacity applies per device, as in GShard's groups), then an all-to-all over ``expert``
    hands each device the buffers of its ``E / n_expert`` experts from its ``n_expert`` peers
    (``[E / n_expert, n_expert C, d]``), which it runs; a second all-to-all returns the outputs to the tokens'
    devices. Other mesh axes (data, fsdp) see the experts replicated: XLA gathers an
    FSDP-split expert tensor before the call and reduces its gradient after it.
    """
    batch = P(tuple(mesh.axis_names))
    n_experts = params["w_in"].shape[0]  # E: the global (unsplit) expert count

    def local(tokens, experts, weights, params):
        t, k = experts.shape
        c = capacity(t, k, n_experts, capacity_factor)
        buffers, slot = to_buffers(tokens, experts, n_experts, c)
        # [E, C, d] -> [E / n_expert, n_expert C, d]: this device's experts, every peer's slots
        buffers = jax.lax.all_to_all(buffers, EXPERT_AXIS, 0, 1, tiled=True)
        out = expert_ffn(buffers, params, activation, gated, batched_matmul)
        out = jax.lax.all_to_all(out, EXPERT_AXIS, 1, 0, tiled=True)  # back: [E, C, d]
        return from_buffers(out, experts, slot, weights)

    experts_spec = {name: P(EXPERT_AXIS) for name in params}
    return jax.shard_map(local, mesh=mesh, in_specs=(batch, batch, batch, experts_spec),
                         out_specs=(batch, batch))(tokens, experts, weights, params)


def dropless_expert_parallel(mesh, tokens, experts, weights, params, activation, gated,
                             capacity_factor=None):
    """:func:`dropless` with the experts split over the mesh's ``expert`` axis: nothing
    dropped, so the result is the single-device one whatever the number of devices.

    Each device sorts its ``A = T k / devices`` assignments by expert and sends each peer the
    rows for that peer's ``E / n_expert`` experts. An all-to-all has fixed shapes, so each
    device pads what it sends to each peer to ``A`` rows (every one of its assignments might go
    to one peer), which costs ``n_expert`` times the exchange and the grouped matmul of a ragged
    exchange (``jax.lax.ragged_all_to_all``, which XLA:CPU does not run). The receiver sorts the
    ``n_expert A`` rows by its local expert (padding last, in no group), runs them as one grouped
    matmul per matrix, and a second all-to-all returns the outputs to the tokens' devices.
    """
    batch = P(tuple(mesh.axis_names))
    n_experts, n_split = params["w_in"].shape[0], mesh.shape[EXPERT_AXIS]
    per_device = n_experts // n_split

    def local(tokens, experts, weights, params):
        t, k = experts.shape
        a = t * k
        flat = experts.reshape(-1)  # [A]: assignment i = token i // k, its choice i % k
        order = jnp.argsort(flat, stable=True)  # grouped by expert, so by peer too
        expert_sorted = jnp.take(flat, order)
        peer = expert_sorted // per_device  # the device holding each sorted assignment's expert
        per_peer = jnp.zeros((n_split,), jnp.int32).at[peer].add(1)
        row = jnp.arange(a) - (jnp.cumsum(per_peer) - per_peer)[peer]  # its row in peer's block
        send = jnp.zeros((n_split, a, tokens.shape[-1]), tokens.dtype)
        send = send.at[peer, row].set(jnp.take(tokens, order // k, axis=0))
        # Each row's expert on the receiver; padding gets per_device: after every group.
        send_expert = jnp.full((n_split, a), per_device, jnp.int32)
        send_expert = send_expert.at[peer, row].set(expert_sorted % per_device)
        # [n_split, A, ...]: block j to peer j; received block i came from peer i
        got = jax.lax.all_to_all(send, EXPERT_AXIS, 0, 0, tiled=True).reshape(n_split * a, -1)
        got_expert = jax.lax.all_to_all(send_expert, EXPERT_AXIS, 0, 0, tiled=True).reshape(-1)
        local_order = jnp.argsort(got_expert, stable=True)
        rows = jnp.take(got, local_order, axis=0)
        expert_of_row = jnp.take(got_expert, local_order)
        sizes = jnp.zeros((per_device,), jnp.int32).at[expert_of_row].add(1, mode="drop")

        def matmul(h, w, b):  # "rd,edf->rf" for the rows in groups; padding rows are discarded
            out = jax.lax.ragged_dot(h, w, sizes)
            if b is None:
                return out
            return out + jnp.take(b, jnp.minimum(expert_of_row, per_device - 1), axis=0)

        out = expert_ffn(rows, params, activation, gated, matmul)
        out = jnp.zeros_like(out).at[local_order].set(out).reshape(n_split, a, -1)
        back = jax.lax.all_to_all(out, EXPERT_AXIS, 0, 0, tiled=True)  # [n_split, A, d]
        mine = back[peer, row]  # [A, d], in sorted order
        unsorted = jnp.zeros_like(mine).at[order].set(mine).reshape(t, k, -1)
        y = jnp.einsum("tkd,tk->td", unsorted, weights)
        return y, jnp.ones((t, k), jnp.float32)

    experts_spec = {name: P(EXPERT_AXIS) for name in params}
    return jax.shard_map(local, mesh=mesh, in_specs=(batch, batch, batch, experts_spec),
                         out_specs=(batch, batch))(tokens, experts, weights, params)


def expert_mesh():
    """The mesh the program is traced on (``jax.sharding.use_abstract_mesh``) when it splits
    the experts (an ``expert`` axis longer than one), else None. None too inside a
    ``shard_map`` (an ensemble's members: Shardy refuses the nested one's layout), where XLA
    shards the unsplit dispatch."""
    mesh = jax.sharding.get_abstract_mesh()
    if (mesh.empty or EXPERT_AXIS not in mesh.axis_names or mesh.shape[EXPERT_AXIS] == 1
            or mesh.manual_axes):
        return None
    return mesh


class Capacity:
    """``model.moe_dispatch=capacity``: fixed buffers, overflow dropped."""

    name = "capacity"
    run = staticmethod(with_capacity)
    split = staticmethod(expert_parallel)  # the experts over the mesh's expert axis
    reads_capacity = True

    @staticmethod
    def slots_per_token(cfg: ModelConfig) -> float:
        """Expert slots computed per token, filled or not."""
        return cfg.moe_capacity_factor * cfg.moe_top_k


class Dropless:
    """``model.moe_dispatch=dropless``: grouped matmuls over the sorted assignments."""

    name = "dropless"
    run = staticmethod(dropless)
    split = staticmethod(dropless_expert_parallel)
    reads_capacity = False

    @staticmethod
    def slots_per_token(cfg: ModelConfig) -> float:
        return cfg.moe_top_k


DISPATCHES = {c.name: c for c in (Capacity, Dropless)}  # config.MOE_DISPATCHES
