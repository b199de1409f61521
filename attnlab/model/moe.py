"""Mixture of experts (``model.moe``): the FFN of every layer replaced by ``E`` experts, each the
configured FFN (``model.ffn``, width ``model.d_ff``), of which a router picks ``k`` per token.

    z = x W_r                                      router logits [tokens, E], float32
    p = softmax(z)                                 router probabilities
    S = top_k(z)                                   the k experts of each token
    g = softmax(z_S)   (k > 1, Mixtral)            combine weights over the chosen experts
    g = p_S            (k = 1, Switch)             (a renormalised top-1 weight would be 1: the
                                                    router would get no gradient from the loss)
    y = sum_{e in S} g_e FFN_e(x) (+ shared experts' FFN(x), DeepSeekMoE)

Auxiliary losses, added to the training loss (their coefficients are config fields):

    balance = alpha E sum_i f_i P_i     (Switch, Fedus et al. 2021 eq. 4; f_i the fraction of the
                                         tokens' k assignments routed to expert i, P_i the mean
                                         router probability of i; 1 at a uniform router)
    z_loss  = beta mean_t (logsumexp_j z_tj)^2          (ST-MoE, Zoph et al. 2022 eq. 5)

Dispatch (``model.moe_dispatch``):

* ``dropless``: the token-expert assignments sorted by expert, each expert's run as one group of
  a grouped matmul (``jax.lax.ragged_dot``); every assignment is computed. XLA:CPU lowers the
  grouped matmul to one dense matmul whose rows are masked per group: E times the FLOPs.
* ``capacity`` (the default: 2-10x faster on CPU, docs/moe.md): each expert takes at most
  ``C = ceil(capacity_factor T k / E)`` of the ``T`` tokens of the batch (GShard / Switch); assignments are served by (choice rank, token order),
  all first choices before any second choice; the rest are dropped (their weight is lost, the
  residual stream carries the token on). Buffers ``[E, C, d]`` run as one batched matmul.
  With dropping, a token's output depends on the other tokens of the batch (also later ones):
  decoding equals the full forward only while nothing is dropped.

Expert parallelism (``train.mesh_expert > 1``): the experts' stacked tensors split over the
mesh's ``expert`` axis. Capacity dispatch (:func:`expert_parallel`): buffers filled per device
and exchanged by all-to-all (GShard); the capacity then covers each device's tokens. Dropless
(:func:`dropless_expert_parallel`): each device's assignments sent to their experts' devices by
an all-to-all padded to fixed shapes; the result is the single-device one.

``E`` experts are ``E`` stacked parameter sets, ``[E, d_model, width]`` and ``[E, width,
d_model]``. Routing statistics leave the module as an ``nnx.Intermediate`` (``routing``) when the
model records them (:func:`record_routing`), which the training step pops and turns into the
auxiliary loss and metrics (:meth:`TokenChoice.losses`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError
from attnlab.model.ffn import FFN

EXPERT_AXIS = "expert"  # the mesh axis that splits the experts (attnlab.train.sharding)
# The experts' stacked [E, ...] parameters, split over EXPERT_AXIS by their leading axis.
EXPERT_PARAMS = ("w_in", "w_gate", "w_out", "bias_in", "bias_gate", "bias_out")
RECORD = "record_routing"  # the MoE modules' static switch (see record_routing)
STATS = "routing"  # the nnx.Intermediate attribute holding one call's routing statistics


# --------------------------------------------------------------------------------------------
# Routing (pure functions of the router logits)
# --------------------------------------------------------------------------------------------


def route(logits: jax.Array, k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Token-choice top-k routing.

    Args:
      logits: float32 ``[tokens, E]``.
      k: experts per token.

    Returns:
      ``(probs [tokens, E], experts int32 [tokens, k], weights [tokens, k])``: the router's
      softmax, each token's chosen experts (largest logit first) and their combine weights
      (Mixtral's softmax over the chosen logits; Switch's router probability when k = 1).
    """
    probs = jax.nn.softmax(logits, axis=-1)
    top, experts = jax.lax.top_k(logits, k)
    weights = jnp.take_along_axis(probs, experts, axis=-1) if k == 1 else jax.nn.softmax(top, -1)
    return probs, experts.astype(jnp.int32), weights


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


def balance_loss(probs: jax.Array, experts: jax.Array) -> jax.Array:
    """``E sum_i f_i P_i`` (Switch eq. 4, without alpha): ``f_i`` the fraction of the
    ``tokens * k`` assignments to expert ``i`` (before any dropping), ``P_i = mean_t p_ti``."""
    n_experts = probs.shape[-1]
    load = expert_load(experts, n_experts)
    return n_experts * jnp.sum(load * jnp.mean(probs, axis=0))


def z_loss(logits: jax.Array) -> jax.Array:
    """``mean_t (logsumexp_j z_tj)^2`` (ST-MoE eq. 5, without its coefficient)."""
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)


def expert_load(experts: jax.Array, n_experts: int) -> jax.Array:
    """``f [E]``: the fraction of the assignments ``experts [tokens, k]`` routed to each."""
    counts = jnp.zeros((n_experts,), jnp.float32).at[experts.reshape(-1)].add(1.0)
    return counts / experts.size


def router_entropy(probs: jax.Array) -> jax.Array:
    """Mean over tokens of ``-sum_i p_i log p_i`` (nats; log E for a uniform router)."""
    return -jnp.mean(jnp.sum(probs * jnp.log(jnp.maximum(probs, 1e-30)), axis=-1))


# --------------------------------------------------------------------------------------------
# The module
# --------------------------------------------------------------------------------------------


def _stacked(cfg: ModelConfig, n: int, d_in: int, d_out: int, std: float, rngs: nnx.Rngs):
    """``n`` matrices ``[d_in, d_out]`` drawn from N(0, std), stacked: ``[n, d_in, d_out]``."""
    return nnx.Param(nnx.initializers.normal(std)(rngs.params(), (n, d_in, d_out)))


class MoEFFN(nnx.Module):
    """``[batch, seq, d_model] -> [batch, seq, d_model]``: ``E`` experts of width ``width``
    (``act(x W_in) W_out``, or SwiGLU's ``(silu(x W_gate) * x W_in) W_out``), routed top-k.

    Parameters: ``router [d, E]``; ``w_in, (w_gate) [E, d, width]``, ``w_out [E, width, d]``
    (biases ``bias_in, (bias_gate) [E, width]``, ``bias_out [E, d]`` with
    ``model.linear_bias``); and the shared experts as one dense FFN ``shared`` of width ``shared_experts * width``.
    """

    def __init__(self, part: "TokenChoice", *, rngs: nnx.Rngs):
        cfg, expert = part.cfg, part.expert
        d, n, width = cfg.d_model, cfg.moe_experts, part.width
        residual_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
        dispatch = DISPATCHES[cfg.moe_dispatch]
        self.k, self.dispatch, self.split_dispatch = cfg.moe_top_k, dispatch.run, dispatch.split
        self.capacity_factor = cfg.moe_capacity_factor
        self.gated = expert.inputs == 2
        self.activation = expert.activation
        self.dtype = jnp.dtype(cfg.dtype)
        self.router = nnx.Param(nnx.initializers.normal(cfg.init_std)(rngs.params(), (d, n)))
        self.w_in = _stacked(cfg, n, d, width, cfg.init_std, rngs)
        self.w_gate = _stacked(cfg, n, d, width, cfg.init_std, rngs) if self.gated else None
        self.w_out = _stacked(cfg, n, width, d, residual_std, rngs)
        zeros = nnx.initializers.zeros
        bias = cfg.linear_bias
        # biases: kept out of weight decay (TokenChoice.undecayed), though they are 2-D
        self.bias_in = nnx.Param(zeros(rngs.params(), (n, width))) if bias else None
        self.bias_gate = (nnx.Param(zeros(rngs.params(), (n, width))) if bias and self.gated
                          else None)
        self.bias_out = nnx.Param(zeros(rngs.params(), (n, d))) if bias else None
        self.shared = part.shared.build(rngs) if part.shared is not None else None
        setattr(self, RECORD, False)

    def experts_params(self) -> dict[str, jax.Array]:
        """The experts' parameters in the compute dtype (absent ones left out)."""
        return {n: getattr(self, n)[...].astype(self.dtype) for n in EXPERT_PARAMS
                if getattr(self, n) is not None}

    def __call__(self, x: jax.Array) -> jax.Array:
        batch, seq, d = x.shape
        tokens = x.reshape(batch * seq, d)
        logits = jnp.einsum("td,de->te", tokens.astype(jnp.float32), self.router[...])
        probs, experts, weights = route(logits, self.k)
        dispatch, mesh = self.dispatch, expert_mesh()
        if mesh is not None:  # the experts split over the mesh
            dispatch = functools.partial(self.split_dispatch, mesh)
        y, kept = dispatch(tokens, experts, weights.astype(x.dtype), self.experts_params(),
                           self.activation, self.gated, self.capacity_factor)
        y = y.reshape(batch, seq, d)
        if self.shared is not None:
            y = y + self.shared(x)
        if getattr(self, RECORD):
            n = probs.shape[-1]
            setattr(self, STATS, nnx.Intermediate({
                "balance": balance_loss(probs, experts), "z": z_loss(logits),
                "load": expert_load(experts, n), "dropped": 1.0 - jnp.mean(kept),
                "entropy": router_entropy(probs)}))
        return y


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


def record_routing(model: nnx.Module) -> None:
    """Makes every MoE module of ``model`` keep its routing statistics (``nnx.Intermediate``)
    when called; off by default, so that decoding (a module called inside a scan it was not
    made in) never writes to a module."""
    model.set_attributes(**{RECORD: True}, raise_if_not_found=False)


# --------------------------------------------------------------------------------------------
# The parts (architecture.ROUTINGS, selected by model.moe)
# --------------------------------------------------------------------------------------------


class Dense:
    """No routing: the layer's FFN is the configured FFN (``model.moe=none``)."""

    name = "none"
    title = "the dense FFN"
    fields = ()

    @staticmethod
    def around(ffn: FFN) -> FFN:
        return ffn


@dataclasses.dataclass(frozen=True)
class TokenChoice(FFN):
    """Token-choice top-k MoE (``model.moe=token_choice``) whose experts are ``expert``, the
    configured FFN kind; it stands wherever an FFN part does (counts, build)."""

    expert: FFN = None

    name = "token_choice"
    title = "token-choice MoE (model.moe=token_choice)"
    mup_rule = False  # stacked [E, ...] experts: muP's fan-in rule is not written for them
    undecayed = ("bias_in", "bias_gate", "bias_out")  # biases, though [E, width] is 2-D
    fields = ("moe_experts", "moe_top_k", "moe_dispatch", "moe_capacity_factor",
              "moe_shared_experts", "moe_balance_coef", "moe_z_coef")

    @classmethod
    def around(cls, ffn: FFN) -> "TokenChoice":
        return cls(ffn.cfg, ffn)

    @property
    def inputs(self) -> int:
        return self.expert.inputs

    def default_width(self) -> int:
        return self.expert.default_width()

    @property
    def shared(self) -> FFN | None:
        """The shared experts as one FFN of ``moe_shared_experts`` times the expert width."""
        n = self.cfg.moe_shared_experts
        if not n:
            return None
        return type(self.expert)(dataclasses.replace(self.cfg, d_ff=n * self.width))

    def validate(self) -> None:
        """Rules across fields (raises ConfigError naming the field)."""
        m = self.cfg
        if m.moe_top_k > m.moe_experts:
            raise ConfigError("model.moe_top_k", f"k={m.moe_top_k} exceeds the "
                              f"model.moe_experts={m.moe_experts} experts")
        if (not DISPATCHES[m.moe_dispatch].reads_capacity
                and m.moe_capacity_factor != ModelConfig.moe_capacity_factor):
            raise ConfigError("model.moe_capacity_factor", "is read only by "
                              "model.moe_dispatch=capacity; dropless dispatch drops no token")
        if m.ngpt:
            raise ConfigError("model.moe", "token_choice is not implemented for nGPT blocks "
                              "(model.ngpt=true, whose MLP keeps unit-norm rows)")

    def check_train(self, train) -> None:
        """The expert axis must split the experts evenly."""
        m, split = self.cfg, train.mesh_expert
        if m.moe_experts % split:
            raise ConfigError("train.mesh_expert", f"{split} does not divide the "
                              f"model.moe_experts={m.moe_experts} experts")

    def build(self, rngs: nnx.Rngs) -> nnx.Module:
        return MoEFFN(self, rngs=rngs)

    def param_count(self) -> int:
        """Every expert, the router ``d E`` and the shared experts."""
        shared = 0 if self.shared is None else self.shared.param_count()
        return (self.cfg.moe_experts * self.expert_params() + self.cfg.d_model
                * self.cfg.moe_experts + shared)

    def active_param_count(self) -> int:
        """What one token uses: ``k`` experts, the router and the shared experts."""
        shared = 0 if self.shared is None else self.shared.param_count()
        return (self.cfg.moe_top_k * self.expert_params() + self.cfg.d_model
                * self.cfg.moe_experts + shared)

    def expert_params(self) -> int:
        return self.expert.param_count()

    def flops_per_token(self) -> float:
        """Forward FLOPs of one token: the router ``2 d E``, ``k`` experts, the shared experts
        and the weighted combine ``2 k d`` (gathers and scatters move data, no FLOPs). With
        ``capacity`` dispatch the buffers' empty slots are computed too: see
        :meth:`computed_flops_per_token`."""
        return self.router_flops() + self.cfg.moe_top_k * self.expert_flops() + self.extra()

    def computed_flops_per_token(self) -> float:
        """The FLOPs the dispatch runs per token: capacity buffers hold ``capacity_factor k``
        slots per token, filled or not; dropless runs exactly ``k`` experts."""
        slots = DISPATCHES[self.cfg.moe_dispatch].slots_per_token(self.cfg)
        return self.router_flops() + slots * self.expert_flops() + self.extra()

    def router_flops(self) -> float:
        return 2.0 * self.cfg.d_model * self.cfg.moe_experts

    def expert_flops(self) -> float:
        return self.expert.flops_per_token()

    def extra(self) -> float:
        shared = 0.0 if self.shared is None else self.shared.flops_per_token()
        return shared + 2.0 * self.cfg.moe_top_k * self.cfg.d_model

    def losses(self, sown) -> tuple[jax.Array, dict[str, jax.Array]]:
        """``(auxiliary loss, metrics)`` from the popped ``nnx.Intermediate`` state of one
        forward: the balance and z-losses summed over layers (each weighted by its
        coefficient), and per layer the expert load ``moe_load [layers, E]``, the dropped
        fraction and the router entropy (``[layers]``)."""
        stats = [leaf for path, leaf in nnx.to_flat_state(sown) if path[-1] == STATS]
        stats = [getattr(s, "value", s) for s in stats]
        if not stats:
            return jnp.zeros((), jnp.float32), {}
        # A layer's statistics are scalars and load [E]; a stacked (scanned) model's carry a
        # leading layer axis already.
        n = self.cfg.moe_experts
        per_layer = {key: jnp.concatenate([jnp.reshape(s[key], (-1, n) if key == "load"
                                                       else (-1,)) for s in stats])
                     for key in stats[0]}
        balance, z = jnp.sum(per_layer["balance"]), jnp.sum(per_layer["z"])
        aux = self.cfg.moe_balance_coef * balance + self.cfg.moe_z_coef * z
        return aux, {"moe_aux_loss": aux, "moe_balance_loss": balance, "moe_z_loss": z,
                     "moe_load": per_layer["load"], "moe_dropped": per_layer["dropped"],
                     "moe_router_entropy": per_layer["entropy"]}
