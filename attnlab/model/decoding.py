"""Autoregressive decoding with a KV cache: a cache pytree, a pure decode step, ``generate``.

Cache slot ``i`` holds the keys/values of the token at position ``i``; a step writes ``t`` new
tokens at slots ``start .. start + t - 1`` and attends over the whole cache under the causal mask
(slots not yet written are masked out). Layers whose mixer is recurrent (linear attention, Mamba;
see :mod:`attnlab.model.mixers`) keep their own two-array state in the same slots instead.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab.model.config import ModelConfig
from attnlab.model.mixers import layer_mixers
from attnlab.model.positions import encoding_for


class KVCache(NamedTuple):
    """Per-layer decode state as two arrays: for softmax attention the keys and values, each
    ``[batch, max_len, kv_heads, head_dim]`` in the compute dtype; for other mixers whatever their
    ``init_state`` gives (linear attention ``S, z``; Mamba the conv window and ``h``). A pytree:
    pass it through ``jit`` and ``scan`` freely."""

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]


def init_cache(cfg: ModelConfig, batch: int, max_len: int) -> KVCache:
    """An empty cache for ``batch`` sequences of up to ``max_len`` tokens (prompt + generated)."""
    states = [mixer.init_state(batch, max_len) for mixer in layer_mixers(cfg)]
    return KVCache(keys=tuple(s[0] for s in states), values=tuple(s[1] for s in states))


def decode_step(graphdef: nnx.GraphDef, state: nnx.State, cache: KVCache, tokens, start):
    """Feeds ``tokens [batch, t]`` at positions ``start .. start + t - 1``.

    Pure; jit it with ``graphdef`` static. ``start`` may be a Python int (range errors raise at
    once) or a traced int (range errors raise when the step runs).

    Returns:
      ``(logits float32 [batch, t, vocab], updated cache)``.
    """
    return nnx.merge(graphdef, state).decode(tokens, start, cache)


def _next_token(logits, key, temperature: float):
    """``logits [batch, vocab] -> int32 [batch]``: argmax, or a sample at ``temperature``."""
    if temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, logits / temperature, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "temperature"))
def _generate(graphdef, state, prompt, rng, *, max_new_tokens: int, temperature: float):
    model = nnx.merge(graphdef, state)
    batch, prompt_len = prompt.shape
    cache = init_cache(model.cfg, batch, prompt_len + max_new_tokens)
    logits, cache = model.decode(prompt, 0, cache, check_range=False)
    keys = jax.random.split(rng, max_new_tokens)
    first = _next_token(logits[:, -1], keys[0], temperature)

    def step(carry, inputs):
        cache, token = carry
        index, key = inputs
        logits, cache = model.decode(token[:, None], prompt_len + index, cache, check_range=False)
        token = _next_token(logits[:, -1], key, temperature)
        return (cache, token), token

    steps = (jnp.arange(max_new_tokens - 1), keys[1:])
    _, rest = jax.lax.scan(step, (cache, first), steps)  # [max_new_tokens - 1, batch]
    return jnp.concatenate([prompt, first[:, None], rest.T], axis=1)


def generate(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    cfg: ModelConfig,
    prompt,
    max_new_tokens: int,
    *,
    rng: jax.Array | None = None,
    temperature: float = 0.0,
) -> jax.Array:
    """Extends ``prompt [batch, t0]`` by ``max_new_tokens`` tokens.

    ``temperature == 0`` is greedy (argmax); otherwise tokens are sampled from
    ``softmax(logits / temperature)`` with ``rng`` (required).

    Returns:
      int32 ``[batch, t0 + max_new_tokens]`` (the prompt followed by the new tokens).
    """
    prompt = jnp.asarray(prompt, jnp.int32)
    if prompt.ndim != 2 or prompt.shape[1] == 0:
        raise ValueError(f"prompt must be [batch, t0] with t0 >= 1, got shape {prompt.shape}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature > 0 and rng is None:
        raise ValueError("sampling (temperature > 0) needs rng")
    if max_new_tokens == 0:
        return prompt
    total = prompt.shape[1] + max_new_tokens
    # Checked here once, statically (learned table); the jitted loop then runs without callbacks.
    encoding_for(cfg).check_range(np.array([0, total - 1]))
    rng = jax.random.key(0) if rng is None else rng
    return _generate(
        graphdef, state, prompt, rng, max_new_tokens=max_new_tokens, temperature=float(temperature)
    )
