"""The selective state-space mixer of Mamba (Gu & Dao 2023, arXiv 2312.00752, Algorithm 2, Fig. 3).

With ``E = expand * d_model`` channels and ``N = d_state`` states per channel:

    [u, g] = x W_in                                   in-projection, [b, t, 2E]
    u = SiLU(causal_depthwise_conv(u))                kernel K = 4, per channel, with bias
    Delta = softplus(u W_dt_low W_dt + b_dt)          [b, t, E], low rank R = ceil(d_model / 16)
    B = u W_B, C = u W_C                              [b, t, N] each: input-dependent (selective)
    A = -exp(A_log)                                   [E, N], diagonal, negative real;
                                                      S4D-real init A_n = -(n + 1)
    A_bar = exp(Delta A), B_bar = Delta B             zero-order hold for A, Euler for B (sec. 3.5)
    h_t = A_bar_t * h_{t-1} + B_bar_t u_t             [b, E, N]
    y_t = <C_t, h_t> + D * u_t                        [b, t, E]
    out = (y * SiLU(g)) W_out                         the SiLU gate, [b, t, d_model]

Training computes every ``h_t`` with ``jax.lax.associative_scan`` on the pairs ``(A_bar, B_bar u)``
under ``(a1, b1) . (a2, b2) = (a1 a2, a2 b1 + b2)`` (O(log T) depth), or with a loop over time
(``model.ssm_scan=sequential``: T steps, but 2-3x faster on a CPU for short windows, where the
associative scan's extra elementwise work dominates); decoding carries the last ``K - 1`` conv
inputs and ``h``: O(1) per token.
"""

from __future__ import annotations

import math
import jax
import jax.numpy as jnp
from flax import nnx

from attnlab.config import ModelConfig
from attnlab.model.layers import dense

DT_MIN, DT_MAX = 1e-3, 1e-1  # Delta's initial range (Gu & Dao 2023, sec. 3.6; log-uniform)


def dt_rank(cfg: ModelConfig) -> int:
    """Rank of Delta's projection, ``ceil(d_model / 16)`` (Mamba's default)."""
    return -(-cfg.d_model // 16)


def symmetric_uniform(bound: float):
    """An initialiser drawing ``U(-bound, bound)`` (``jax.nn.initializers.uniform`` is
    ``U(0, scale)``)."""

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def combine(left, right):
    """The associative operator of the linear recurrence ``h = a h_prev + b``:
    ``(a1, b1) . (a2, b2) = (a1 a2, a2 b1 + b2)`` (apply ``left`` first)."""
    a1, b1 = left
    a2, b2 = right
    return a1 * a2, a2 * b1 + b2


def selective_scan(a_bar, bu, h0=None):
    """All states of ``h_t = a_bar_t * h_{t-1} + bu_t`` by an associative scan over time.

    Args:
      a_bar, bu: ``[batch, t, E, N]``.
      h0: ``[batch, E, N]``, the state before the first step (None: zeros).

    Returns:
      ``h [batch, t, E, N]``.
    """
    decay, h = jax.lax.associative_scan(combine, (a_bar, bu), axis=1)
    if h0 is not None:
        h = h + decay * h0[:, None]  # decay_t = prod_{s<=t} a_bar_s
    return h


def sequential_scan(a_bar, bu, h0=None):
    """:func:`selective_scan` as a loop over time (``jax.lax.scan``), same arguments."""
    batch, _, e, n = a_bar.shape
    h0 = jnp.zeros((batch, e, n), bu.dtype) if h0 is None else h0.astype(bu.dtype)

    def step(h, inputs):
        a_t, bu_t = inputs
        h = a_t * h + bu_t
        return h, h

    _, h = jax.lax.scan(step, h0, (jnp.moveaxis(a_bar, 1, 0), jnp.moveaxis(bu, 1, 0)))
    return jnp.moveaxis(h, 0, 1)


SCANS = {"associative": selective_scan, "sequential": sequential_scan}


def causal_conv(u, kernel, bias, history, *, documents=None, start=0):
    """Causal depthwise convolution along time.

    Args:
      u: ``[batch, t, E]``.
      kernel: ``[K, E]`` (tap ``K - 1`` multiplies the current input).
      bias: ``[E]``.
      history: ``[batch, K - 1, E]``, the inputs before ``u`` (zeros at the start).
      documents: each token's document span (:class:`~attnlab.model.masks.Documents`,
        ``[batch, t]``), or None: a tap reading an input before its token's document start
        reads zero (as at the sequence start).
      start: the sequence index of ``u``'s first token, for ``documents``.

    Returns:
      ``(out [batch, t, E], the last K - 1 inputs [batch, K - 1, E])``.
    """
    taps, t = kernel.shape[0], u.shape[1]
    padded = jnp.concatenate([history.astype(u.dtype), u], axis=1)  # [b, K - 1 + t, E]
    index = jnp.asarray(start, jnp.int32) + jnp.arange(t, dtype=jnp.int32)

    def tap(i):  # tap i reads the input K - 1 - i steps back
        inputs = padded[:, i:i + t]
        if documents is not None:
            inside = index[None, :] - (taps - 1 - i) >= documents.start  # [b, t]
            inputs = inputs * inside[..., None].astype(inputs.dtype)
        return inputs * kernel[i]

    out = sum(tap(i) for i in range(taps)) + bias
    return out, padded[:, t:]


class SelectiveSSM(nnx.Module):
    """The Mamba mixer (equations in the module docstring); expansion ``cfg.ssm_expand``,
    ``N = cfg.ssm_state``, conv kernel ``cfg.ssm_conv``.

    A sequence mixer: ``(x [batch, t, d_model], positions, *, bias, state, start) -> (y,
    state)``. Positions are not used (order comes from the recurrence), nor ``bias`` (no scores:
    the rules refuse encodings that add one). The decode state is ``(conv [batch, K - 1, E],
    h [batch, E, N])``.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, e, n, r = cfg.d_model, cfg.ssm_expand * cfg.d_model, cfg.ssm_state, dt_rank(cfg)
        residual_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
        self.in_proj = dense(cfg, d, 2 * e, cfg.init_std, rngs)
        bound = 1.0 / math.sqrt(cfg.ssm_conv)  # PyTorch Conv1d default init, as Mamba uses
        self.conv_kernel = nnx.Param(jax.random.uniform(
            rngs.params(), (cfg.ssm_conv, e), jnp.float32, -bound, bound))
        self.conv_bias = nnx.Param(jnp.zeros((e,), jnp.float32))
        self.x_proj = dense(cfg, e, r + 2 * n, cfg.init_std, rngs)  # -> [Delta_low, B, C]
        # W_dt ~ U(-R^-1/2, R^-1/2) (Mamba's dt_init="random" with dt_scale 1): bounded, with
        # std R^-1/2 / sqrt(3).
        self.dt_proj = dense(cfg, r, e, r**-0.5, rngs, kernel_init=symmetric_uniform(r**-0.5))
        # b_dt = softplus^-1(dt), dt log-uniform in [DT_MIN, DT_MAX] (Mamba's dt init).
        dt = jnp.exp(jax.random.uniform(rngs.params(), (e,), jnp.float32,
                                        math.log(DT_MIN), math.log(DT_MAX)))
        self.dt_bias = nnx.Param(dt + jnp.log(-jnp.expm1(-dt)))
        # S4D-real: A_n = -(n + 1), stored as log(-A) so that A stays negative.
        self.a_log = nnx.Param(jnp.log(jnp.tile(jnp.arange(1, n + 1, dtype=jnp.float32), (e, 1))))
        self.d_skip = nnx.Param(jnp.ones((e,), jnp.float32))
        self.out_proj = dense(cfg, e, d, residual_std, rngs)

    def _selective_inputs(self, x, history, *, documents=None, start=0):
        """``(u, gate [b, t, E], Delta [b, t, E], B, C [b, t, N], conv history)`` of ``x``;
        with ``documents`` the conv reads no input before each token's document start."""
        cfg = self.cfg
        n, r = cfg.ssm_state, dt_rank(cfg)
        u, gate = jnp.split(self.in_proj(x), 2, axis=-1)  # [b, t, E] each
        u, history = causal_conv(u, self.conv_kernel[...].astype(u.dtype),
                                 self.conv_bias[...].astype(u.dtype), history,
                                 documents=documents, start=start)
        u = jax.nn.silu(u)
        dt_low, b, c = jnp.split(self.x_proj(u).astype(jnp.float32), [r, r + n], axis=-1)
        delta = jax.nn.softplus(
            jnp.einsum("btr,re->bte", dt_low, self.dt_proj.kernel[...]) + self.dt_bias[...])
        return u, gate, delta, b, c, history

    def weights(self, x, positions, *, bias=None, documents=None) -> jax.Array:
        """The implicit attention of the selective scan (Ali et al. 2024, "The Hidden Attention
        of Mamba": the scan unrolled), one ``t x t`` matrix per channel: ``alpha[e, i, j] = sum_n C_i[n]
        exp(sum_{s=j+1..i} Delta_s[e] A[e, n]) Delta_j[e] B_j[n]`` for ``j <= i`` (0 after),
        so that the scan's output is ``y_i[e] = sum_j alpha[e, i, j] u_j[e] + D[e] u_i[e]``.
        Signed, and rows need not sum to 1.

        ``x [batch, t, d_model]`` -> float32 ``[batch, E, t, t]``; with ``documents``, 0 for
        every ``j`` before query ``i``'s document (its first token's ``A_bar = 0`` cuts the
        product, and the conv reads no earlier input).
        """
        cfg = self.cfg
        batch, t, _ = x.shape
        history = jnp.zeros((batch, cfg.ssm_conv - 1, cfg.ssm_expand * cfg.d_model))
        _, _, delta, b, c, _ = self._selective_inputs(x, history, documents=documents)
        a = -jnp.exp(self.a_log[...])  # [E, N]
        log_decay = jnp.cumsum(jnp.einsum("bte,en->bten", delta, a), axis=1)  # L_i
        causal = jnp.tril(jnp.ones((t, t), bool))[None]
        if documents is not None:
            causal = causal & documents.allows(jnp.arange(t))
        causal = causal[..., None, None]  # [b, i, j, 1, 1]
        gap = log_decay[:, :, None] - log_decay[:, None, :]  # [b, i, j, E, N]: L_i - L_j
        decay = jnp.where(causal, jnp.exp(jnp.where(causal, gap, 0.0)), 0.0)
        return jnp.einsum("bin,bijen,bje,bjn->beij", c, decay, delta, b)

    def __call__(self, x, positions, *, bias=None, documents=None, state=None, start=0):
        """``x [batch, t, d_model]`` -> ``([batch, t, d_model], state)`` (None without one).
        ``documents``: each token's document span; at a document's first token ``A_bar = 0``
        (``h`` restarts from ``B_bar u``) and the conv reads no earlier input."""
        cfg = self.cfg
        batch, t, _ = x.shape
        e = cfg.ssm_expand * cfg.d_model
        history, h0 = state if state is not None else (jnp.zeros((batch, cfg.ssm_conv - 1, e)),
                                                        None)
        u, gate, delta, b, c, history = self._selective_inputs(x, history, documents=documents,
                                                               start=start)
        a = -jnp.exp(self.a_log[...])  # [E, N]
        a_bar = jnp.exp(jnp.einsum("bte,en->bten", delta, a))  # zero-order hold
        if documents is not None:  # a document's first token forgets everything before it
            index = jnp.asarray(start, jnp.int32) + jnp.arange(t, dtype=jnp.int32)
            a_bar = jnp.where(documents.first(index)[..., None, None], 0.0, a_bar)
        bu = jnp.einsum("bte,btn,bte->bten", delta, b, u.astype(jnp.float32))  # Euler: Delta B u
        h = SCANS[cfg.ssm_scan](a_bar, bu, h0)  # [b, t, E, N]
        y = jnp.einsum("bten,btn->bte", h, c) + self.d_skip[...] * u.astype(jnp.float32)
        out = self.out_proj((y * jax.nn.silu(gate.astype(jnp.float32))).astype(x.dtype))
        return out, (None if state is None else (history, h[:, -1]))


def init_state(cfg: ModelConfig, batch: int) -> tuple[jax.Array, jax.Array]:
    """Zero decode state: ``(conv [batch, K - 1, E] compute dtype, h [batch, E, N] float32)``."""
    e = cfg.ssm_expand * cfg.d_model
    return (jnp.zeros((batch, cfg.ssm_conv - 1, e), jnp.dtype(cfg.dtype)),
            jnp.zeros((batch, e, cfg.ssm_state), jnp.float32))


def param_count(cfg: ModelConfig) -> int:
    """Parameters of one :class:`SelectiveSSM` mixer."""
    d, e, n, r, k = cfg.d_model, cfg.ssm_expand * cfg.d_model, cfg.ssm_state, dt_rank(cfg), \
        cfg.ssm_conv
    return d * 2 * e + k * e + e + e * (r + 2 * n) + r * e + e + e * n + e + e * d


def forward_flops(cfg: ModelConfig) -> dict[str, float]:
    """Forward FLOPs per token of one :class:`SelectiveSSM` mixer, from the operations above (a
    multiply-add counts 2; exp, log and sigmoid are transcendentals, not FLOPs, as in XLA's count):

    * ``matmuls``: the in-, x-, dt- and out-projections, ``2 (2 d E + E (R + 2N) + R E + E d)``;
    * ``conv``: ``2 K E`` taps and ``E`` bias;
    * ``selective``: Delta's bias and softplus ``3E``, ``Delta A`` ``EN``, ``Delta u`` ``E`` and
      ``(Delta u) B`` ``EN``, the readout ``<C, h>`` ``2EN``, the skip ``D u`` ``2E``, SiLU of
      ``u`` and of the gate and the gating product ``3E``;
    * ``scan``: the recurrence ``h = A_bar h + B_bar u``, ``3 EN`` per token (multiply, add, and
      the running product of ``A_bar`` the parallel scan carries), the algorithmic work of a
      sequential or fused scan. XLA's ``associative_scan`` executes more elementwise work than
      this (odd/even interleaving: about 20-33 FLOPs per state element for T = 64..1024, rising
      with log T); that is overhead of the parallel form, not counted as model FLOPs
      (tests/test_model_mixers.py measures it).
    """
    d, e, n, r, k = cfg.d_model, cfg.ssm_expand * cfg.d_model, cfg.ssm_state, dt_rank(cfg), \
        cfg.ssm_conv
    return {
        "matmuls": 2.0 * (d * 2 * e + e * (r + 2 * n) + r * e + e * d),
        "conv": 2.0 * k * e + e,
        "selective": 4.0 * e * n + 9.0 * e,
        "scan": 3.0 * e * n,
    }
