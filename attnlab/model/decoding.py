"""Autoregressive decoding: the decode state (a pytree), a pure decode step, ``generate``.

Each layer's mixer keeps its own state: softmax attention a KV cache, whose slot ``i`` holds the
keys/values of the token at position ``i`` (a step writes ``t`` new tokens at slots ``start ..
start + t - 1`` and attends over the whole cache under the mask, which hides slots not yet
written; a sliding window keeps a rolling buffer); linear attention its ``(S, z)``; Mamba its
conv window and ``h`` (see :mod:`attnlab.model.mixers`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab.config import ModelConfig
from attnlab.errors import AttnlabError
from attnlab.model.architecture import resolve
from attnlab.model.masks import Packing, left_pad, prompt_segments
from attnlab.model.objectives import MASK_TEXT, mask_id


class DecodeState(NamedTuple):
    """Every layer's decode state, in order: each what its mixer's ``init_state`` gives (softmax
    attention: keys and values, each ``[batch, cache_len, kv_heads, head_dim]`` in the compute
    dtype). ``segment`` and ``document_start``, int32 ``[batch]``: the segment id and the
    document's first index of the last token fed (document masks; zeros before the first
    step). A pytree: pass it through ``jit`` and ``scan`` freely."""

    layers: tuple
    segment: jax.Array | None = None
    document_start: jax.Array | None = None


def init_state(cfg: ModelConfig, batch: int, max_len: int) -> DecodeState:
    """An empty decode state of the causal stack for ``batch`` sequences of up to ``max_len``
    tokens (prompt + generated)."""
    arch = resolve(cfg)
    stack = arch.decoder or arch.stack
    zeros = jnp.zeros((batch,), jnp.int32)
    return DecodeState(tuple(mixer.init_state(batch, max_len) for mixer in stack.mixers),
                       zeros, zeros)


def decode_step(graphdef: nnx.GraphDef, state: nnx.State, cache: DecodeState, tokens, start):
    """Feeds ``tokens [batch, t]`` at positions ``start .. start + t - 1``.

    Pure; jit it with ``graphdef`` static. ``start`` may be a Python int (range errors raise at
    once) or a traced int (range errors raise when the step runs).

    Returns:
      ``(logits float32 [batch, t, vocab], updated decode state)``.
    """
    return nnx.merge(graphdef, state).decode(tokens, start, cache)


def _next_token(logits, key, temperature: float):
    """``logits [batch, vocab] -> int32 [batch]``: argmax, or a sample at ``temperature``."""
    if temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, logits / temperature, axis=-1).astype(jnp.int32)


def _sample(logits, keys, temperature: float):
    """``logits [batch, vocab]`` -> int32 ``[batch]`` with one key for the batch, or each row
    with its own key (``keys [batch]``: a row's draw does not depend on the other rows)."""
    if temperature == 0.0 or keys.ndim == 0:
        return _next_token(logits, keys, temperature)
    return jax.vmap(lambda row, key: _next_token(row[None], key, temperature)[0])(logits, keys)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "temperature",
                                             "separator", "reset_positions", "padded"))
def _generate(graphdef, state, prompt, pads, rng, *, max_new_tokens: int, temperature: float,
              separator: int | None, reset_positions: bool, padded: bool):
    model = nnx.merge(graphdef, state)
    batch, prompt_len = prompt.shape
    cache = init_state(model.cfg, batch, prompt_len + max_new_tokens)
    documents = separator is not None or padded
    segments = prompt_segments(prompt, pads, separator) if documents else None
    options = dict(reset_positions=reset_positions, offsets=pads if padded else None,
                   check_range=False)
    logits, cache = model.decode(prompt, 0, cache, segments=segments, **options)
    # keys [max_new_tokens] (one per step) or [max_new_tokens, batch] (per row, then per step)
    keys = (jax.random.split(rng, max_new_tokens) if rng.ndim == 0
            else jax.vmap(lambda key: jax.random.split(key, max_new_tokens), out_axes=1)(rng))
    first = _sample(logits[:, -1], keys[0], temperature)

    def step(carry, inputs):
        cache, token = carry
        index, key = inputs
        segment = None
        if documents:  # a token after a separator starts the next document
            ended = (token == separator) if separator is not None else False
            segment = (cache.segment + ended)[:, None]
        logits, cache = model.decode(token[:, None], prompt_len + index, cache, segments=segment,
                                     **options)
        token = _sample(logits[:, -1], key, temperature)
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
    packing: Packing | None = None,
):
    """Extends ``prompt`` by ``max_new_tokens`` tokens.

    ``prompt``: int ``[batch, t0]``, or a list of prompts of different lengths, generated as
    one left-padded batch (:func:`left_pad`): the pads are a document of their own that no real
    token sees, each row's positions start at its first real token, and its recurrent states
    start there (so each row equals its prompt generated alone). ``packing``: the run's
    document mask (:func:`attnlab.train.step.packing_for`): a prompt holding the separator
    keeps its documents apart, as in training.

    ``temperature == 0`` is greedy (argmax); otherwise tokens are sampled from
    ``softmax(logits / temperature)`` with ``rng`` (required): one key for the whole batch, or
    ``[batch]`` keys, one per row (then a row's tokens do not depend on the other rows).

    Returns:
      int32 ``[batch, t0 + max_new_tokens]`` (the prompt followed by the new tokens); for a list
      of prompts, a list of int32 ``[len_i + max_new_tokens]``.
    """
    as_list = isinstance(prompt, (list, tuple))
    if as_list:
        prompt, pads = left_pad(prompt)
    prompt = jnp.asarray(prompt, jnp.int32)
    if prompt.ndim != 2 or prompt.shape[1] == 0:
        raise ValueError(f"prompt must be [batch, t0] with t0 >= 1, got shape {prompt.shape}")
    pads = np.asarray(pads) if as_list else np.zeros(prompt.shape[0], np.int32)
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature > 0 and rng is None:
        raise ValueError("sampling (temperature > 0) needs rng")
    if rng is not None and not jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        rng = jax.random.wrap_key_data(rng)  # raw uint32 key data: [2] or [batch, 2]
    if rng is not None and rng.shape not in ((), (prompt.shape[0],)):
        raise ValueError(f"rng must be one key or one key per row ({prompt.shape[0]}), got "
                         f"shape {rng.shape}")
    padded = bool(pads.any())
    if padded and resolve(cfg).mask.global_keys:
        raise ValueError("model.attention_global_tokens: the global keys are the first indices, "
                         "which left padding fills with pads; generate these prompts one by one")
    if max_new_tokens == 0:
        out = prompt
    else:
        total = prompt.shape[1] + max_new_tokens
        # Checked here once, statically (learned table); the jitted loop then runs without
        # callbacks.
        resolve(cfg).encoding.check_range(np.array([0, total - 1 - pads.min()]))
        rng = jax.random.key(0) if rng is None else rng
        out = _generate(graphdef, state, prompt, jnp.asarray(pads), rng,
                        max_new_tokens=max_new_tokens, temperature=float(temperature),
                        separator=None if packing is None else packing.separator,
                        reset_positions=packing is not None and packing.reset_positions,
                        padded=padded)
    if as_list:
        return [out[row, pad:] for row, pad in enumerate(pads)]
    return out


# --------------------------------------------------------------------------------------------
# The masked objectives: an encoder fills masks, an encoder-decoder writes spans.
# --------------------------------------------------------------------------------------------


class NoMaskError(AttnlabError):
    """A masked-objective model was asked to generate from a prompt without [MASK]."""


def _check_masks(cfg: ModelConfig, prompt) -> None:
    if not np.any(np.asarray(prompt) == mask_id(cfg.vocab_size)):
        raise NoMaskError(
            f"model.objective={cfg.objective} fills masks: the prompt holds no {MASK_TEXT} "
            "(write it where tokens should be predicted)")


def fill_masks(graphdef: nnx.GraphDef, state: nnx.State, cfg: ModelConfig, prompt) -> jax.Array:
    """A bidirectional encoder's (``mlm``) guess at every [MASK] of ``prompt int32 [batch,
    seq]``, in one forward pass: each [MASK] becomes the argmax over the real tokens.

    Returns:
      int32 ``[batch, seq]``: the prompt with its [MASK] ids replaced.

    Raises:
      NoMaskError: the prompt holds no [MASK].
    """
    _check_masks(cfg, prompt)
    prompt = jnp.asarray(prompt, jnp.int32)
    mask = mask_id(cfg.vocab_size)
    logits = nnx.merge(graphdef, state)(prompt)[..., :mask]  # never predict [MASK] itself
    return jnp.where(prompt == mask, jnp.argmax(logits, axis=-1).astype(jnp.int32), prompt)


def init_encdec_state(model, source: jax.Array, max_len: int):
    """The encoder-decoder's decode state for ``source int32 [batch, s]``: the encoder runs
    once, its output's cross-attention keys/values are kept for every step, and an empty
    decoder self-attention state of ``max_len`` slots."""
    from_encoder = model.cross_keys_values(model.encode(source))
    decoder = init_state(model.cfg, source.shape[0], max_len)
    return type(model).state_type(decoder, from_encoder)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens"))
def _decode_spans(graphdef, state, source, *, max_new_tokens: int):
    model = nnx.merge(graphdef, state)
    batch = source.shape[0]
    start = jnp.full((batch, 1), mask_id(model.cfg.vocab_size), jnp.int32)
    cache = init_encdec_state(model, source, max_new_tokens)

    def step(carry, index):
        cache, token = carry
        logits, cache = model.decode(token, index, cache)
        token = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)[:, None]
        return (cache, token), token[:, 0]

    _, out = jax.lax.scan(step, (cache, start), jnp.arange(max_new_tokens))
    return out.T  # [batch, max_new_tokens]


def decode_spans(graphdef: nnx.GraphDef, state: nnx.State, cfg: ModelConfig, source,
                 max_new_tokens: int) -> jax.Array:
    """Greedy decoding of an encoder-decoder (``span``): the decoder starts from [MASK] and
    writes ``[MASK] span [MASK] span ...`` for the [MASK]s of ``source int32 [batch, s]``,
    with its KV cache and the cached encoder output.

    Returns:
      int32 ``[batch, max_new_tokens]`` (the decoder's output, start token excluded).

    Raises:
      NoMaskError: the source holds no [MASK].
    """
    _check_masks(cfg, source)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    resolve(cfg).encoding.check_range(np.array([0, max_new_tokens - 1]))
    return _decode_spans(graphdef, state, jnp.asarray(source, jnp.int32),
                         max_new_tokens=max_new_tokens)
