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

Dispatch and expert parallelism: :mod:`attnlab.model.moe_dispatch`.

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

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError
from attnlab.model.ffn import FFN
from attnlab.model.moe_dispatch import DISPATCHES, EXPERT_PARAMS, expert_mesh

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
