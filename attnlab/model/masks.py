"""Attention masks, one class per mask: which keys each query may see, and how a KV cache of that
mask is kept.

A mask is called on indices, not positions: ``mask(q_index [q_len], k_index [k_len]) -> bool
[q_len, k_len]`` (True = may attend). Query ``i`` of a call sits at key index ``q_offset + i``
(0 for a forward pass, ``start`` for a KV-cache step), so offset positions change nothing here.

| mask | who sees what | KV cache | reference |
|---|---|---|---|
| ``causal`` | key ``j <= i`` | ``[batch, max_len, kv_heads, head_dim]``, slot = position | Vaswani et al. 2017 |
| ``sliding_window`` | ``i - w < j <= i``, plus the first ``n_global`` keys | a rolling buffer of ``n_global + w`` slots | Beltagy et al. 2020; Mistral |
| bidirectional | every key (an encoder; not a ``model.attention_mask`` value) | none | Devlin et al. 2019 |

``model.attention_mask`` names the decoder's mask (``architecture.MASKS``); a positive
``model.attention_window`` selects ``sliding_window`` (its field predates the registry). Adding a
mask is one subclass of :class:`Mask` and one registry line.

Document masks (``data.document_mask``) are not a mask kind: they compose with every mask above.
A packed window's segment ids (:func:`segment_ids`, the document index of each token) become
each token's document span ``[start, end)`` in key indices (:func:`documents_from_segments`,
:class:`Documents`); query ``i`` then sees key ``j`` iff the mask allows it AND ``start_i <= j <
end_i``. Spans, not segment ids, reach the layers because a KV cache (and the rolling buffer)
knows each key's index but not its segment: a decode step needs only its queries' spans.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError

NOT_WRITTEN = 2**30  # position of an empty rolling-cache slot: after every query, so masked
OPEN_END = 2**31 - 1  # a decoding query's document end: every later key is hidden by causality


def segment_ids(tokens: jax.Array, separator: int) -> jax.Array:
    """The document index of each token of packed windows ``tokens int [batch, t]`` whose
    documents end with ``separator`` (the separator belongs to the document it ends): int32
    ``[batch, t]``, non-decreasing along each row, 0 for the row's first document."""
    is_separator = (tokens == separator).astype(jnp.int32)
    return jnp.cumsum(is_separator, axis=1) - is_separator


class Documents(NamedTuple):
    """Each query's document as a span of key indices: query ``i`` (of a call, in order) may
    see key ``j`` only if ``start[b, i] <= j < end[b, i]``; int32 ``[batch, q_len]`` each. A
    recurrent mixer resets its state at a token whose index equals its ``start``."""

    start: jax.Array
    end: jax.Array

    def allows(self, key_index: jax.Array) -> jax.Array:
        """bool ``[batch, q_len, k_len]`` for keys at indices ``key_index int [k_len]``."""
        key_index = key_index[None, None, :]
        return (key_index >= self.start[..., None]) & (key_index < self.end[..., None])

    def first(self, index: jax.Array) -> jax.Array:
        """bool ``[batch, t]``: the tokens at ``index int [t]`` that start their document."""
        return self.start == index[None, :]


def documents_from_segments(segments: jax.Array) -> Documents:
    """The spans of the runs of equal ``segments int [batch, t]`` (each document one run of
    consecutive tokens, as :func:`segment_ids` and left padding make them)."""
    t = segments.shape[1]
    index = jnp.arange(t, dtype=jnp.int32)[None, :]
    begins = jnp.concatenate([jnp.ones_like(segments[:, :1], bool),
                              segments[:, 1:] != segments[:, :-1]], axis=1)
    ends = jnp.concatenate([segments[:, 1:] != segments[:, :-1],
                            jnp.ones_like(segments[:, :1], bool)], axis=1)
    start = jax.lax.cummax(jnp.where(begins, index, 0), axis=1)
    end = jax.lax.cummin(jnp.where(ends, index + 1, t), axis=1, reverse=True)
    return Documents(start.astype(jnp.int32), end.astype(jnp.int32))


@dataclasses.dataclass(frozen=True)
class Packing:
    """How the documents of packed windows are kept apart (``data.document_mask``): they end
    with ``separator``; ``reset_positions`` (``data.reset_positions``) restarts positions at
    each document's first token."""

    separator: int
    reset_positions: bool = False

    def inputs(self, tokens: jax.Array) -> tuple[jax.Array, jax.Array | None]:
        """``(segments int32 [batch, t], positions int32 [batch, t] or None)`` of model inputs
        ``tokens [batch, t]`` (None: the default ``arange``)."""
        segments = segment_ids(tokens, self.separator)
        if not self.reset_positions:
            return segments, None
        index = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None, :]
        return segments, index - documents_from_segments(segments).start


def prompt_segments(prompt: jax.Array, pads: jax.Array, separator: int | None) -> jax.Array:
    """int32 ``[batch, t]``: 0 for the left padding (``pads [batch]`` ids per row), the
    document index + 1 for the real tokens (:func:`~attnlab.model.masks.segment_ids`; one
    document without a ``separator``)."""
    real = jnp.arange(prompt.shape[1])[None, :] >= pads[:, None]
    ends = real & (prompt == separator) if separator is not None else jnp.zeros_like(real)
    ends = ends.astype(jnp.int32)
    return jnp.where(real, 1 + jnp.cumsum(ends, axis=1) - ends, 0).astype(jnp.int32)


def left_pad(prompts, pad_id: int = 0, length: int | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """Sequences of different lengths (1-D int sequences) -> ``(int32 [batch, longest], pads
    int32 [batch])``, each row right-aligned after ``pads[i]`` copies of ``pad_id`` (never
    attended to: the pads form a document of their own). ``length``: the rows' length instead
    of the longest's (one shape for every batch)."""
    prompts = [np.asarray(p, np.int32).reshape(-1) for p in prompts]
    if not prompts or min(len(p) for p in prompts) == 0:
        raise ValueError("every prompt needs at least one token")
    longest = max(len(p) for p in prompts) if length is None else length
    pads = np.asarray([longest - len(p) for p in prompts], np.int32)
    out = np.full((len(prompts), longest), pad_id, np.int32)
    for row, (p, pad) in enumerate(zip(prompts, pads)):
        out[row, pad:] = p
    return out, pads


def continued_documents(segments: jax.Array, start, last_segment: jax.Array,
                        last_start: jax.Array) -> Documents:
    """The spans of a decode step's ``t`` tokens at indices ``start .. start + t - 1`` with
    segment ids ``segments int [batch, t]``, after tokens whose last one had segment
    ``last_segment [batch]`` and document start ``last_start [batch]``; ends are open (causal
    decoding never sees a later key)."""
    index = jnp.asarray(start, jnp.int32) + jnp.arange(segments.shape[1], dtype=jnp.int32)
    previous = jnp.concatenate([last_segment[:, None], segments[:, :-1]], axis=1)
    begins = jnp.where(segments != previous, index[None, :], last_start[:, None])
    first = jax.lax.cummax(begins, axis=1).astype(jnp.int32)
    return Documents(first, jnp.full_like(first, OPEN_END))


@dataclasses.dataclass(frozen=True)
class Mask:
    """One attention mask of a model built from ``cfg`` (immutable, hashable).

    Class attributes: ``name`` (the ``model.attention_mask`` value); ``is_causal``: exactly the
    lower triangle, which fused kernels apply without reading a mask array; ``causal``: no query
    sees a later key (an encoder needs a mask that is not); ``fields``: the ``model.*`` fields
    only this mask reads. ``cfg`` may be None for the masks that read no field (causal,
    bidirectional).
    """

    cfg: ModelConfig | None = dataclasses.field(default=None, repr=False)

    name = ""
    title = "mask"
    is_causal = False
    causal = True
    fields = ()

    def setting(self) -> str:
        """The config setting that chose this mask, for messages."""
        return f"model.attention_mask={self.name}"

    def __call__(self, q_index: jax.Array, k_index: jax.Array) -> jax.Array | None:
        """bool ``[q_len, k_len]`` (True = may attend); None: every query sees every key."""
        raise NotImplementedError

    def validate(self) -> None:
        """Rules across fields (raises ConfigError naming the field)."""

    def key_index(self, k_index: jax.Array) -> jax.Array:
        """The sequence index of the keys at ``k_index`` (a rolling cache's slots hold others)."""
        return k_index

    @property
    def band(self) -> int:
        """``w > 0``: the mask hides every key more than ``w - 1`` indices before its query
        (but the first :attr:`global_keys`), so query blocks read only the keys in reach."""
        return 0

    @property
    def global_keys(self) -> int:
        return 0

    def cache_length(self, max_len: int) -> int:
        """Slots of a KV cache for sequences of up to ``max_len`` tokens."""
        return max_len

    def cache_limit(self, cache_len: int) -> int | None:
        """How many positions a cache of ``cache_len`` slots can hold; None = any (rolling)."""
        return cache_len

    def keys_per_query(self, seq_len: int) -> int:
        """Keys a query attends to in a context of ``seq_len``, for the FLOP counts: all of them
        (no causal halving, as Kaplan and Hoffmann et al. count)."""
        return seq_len

    def cache_step(self, cache, k: jax.Array, v: jax.Array, start):
        """One KV-cache step: writes this step's keys and values ``[batch, t, kv_heads,
        head_dim]`` at cache index ``start`` of ``cache = (keys, values)``, each ``[batch,
        cache_len, kv_heads, head_dim]``.

        Returns ``(keys, values, cache, mask, q_offset, k_positions [1, k_len])``: what the
        queries attend over, the updated cache, the mask to apply by index, the key index of
        query 0, and the keys' positions (for the score bias). Here the queries attend to the
        whole cache; the causal mask hides the slots after ``start + t`` that still hold zeros.
        """
        keys, values = cache
        keys = jax.lax.dynamic_update_slice_in_dim(keys, k.astype(keys.dtype), start, axis=1)
        values = jax.lax.dynamic_update_slice_in_dim(values, v.astype(values.dtype), start, axis=1)
        return keys, values, (keys, values), self, start, jnp.arange(keys.shape[1])[None]


class Causal(Mask):
    """Query ``i`` sees key ``j`` iff ``j <= i`` (the default)."""

    name = "causal"
    is_causal = True

    def __call__(self, q_index, k_index):
        return k_index[None, :] <= q_index[:, None]


class Bidirectional(Mask):
    """No mask: every query sees every key (an encoder's self-attention; cross-attention). It
    has no KV cache."""

    name = "bidirectional"
    causal = False

    def __call__(self, q_index, k_index):
        return None

    def cache_step(self, cache, k, v, start):
        raise ValueError("a bidirectional encoder has no KV-cache decoding")


class SlidingWindow(Mask):
    """Local causal attention (Beltagy et al. 2020; Mistral, Jiang et al. 2023): query ``i``
    sees keys ``i - w + 1 .. i`` (``w = model.attention_window``), plus the first ``n_global =
    model.attention_global_tokens`` keys. After ``L`` layers the output at ``i`` depends on no
    token before ``i - L (w - 1)`` (global tokens aside). Its KV cache is a rolling buffer of
    ``n_global + w`` slots, exact past the window."""

    name = "sliding_window"
    title = "sliding window"
    fields = ("attention_window", "attention_global_tokens")

    def setting(self):
        return f"model.attention_window={self.cfg.attention_window}"

    def validate(self):
        if self.cfg.attention_window < 1:
            raise ConfigError("model.attention_window",
                              "model.attention_mask=sliding_window needs a window >= 1")

    @property
    def band(self):
        return self.cfg.attention_window

    @property
    def global_keys(self):
        return self.cfg.attention_global_tokens

    def __call__(self, q_index, k_index):
        window, n_global = self.cfg.attention_window, self.cfg.attention_global_tokens
        distance = q_index[:, None] - k_index[None, :]
        return (distance >= 0) & ((distance < window) | (k_index[None, :] < n_global))

    def cache_length(self, max_len):
        return self.cfg.attention_global_tokens + self.cfg.attention_window

    def cache_limit(self, cache_len):
        return None

    def keys_per_query(self, seq_len):
        return min(seq_len, self.cfg.attention_window + self.cfg.attention_global_tokens)

    def cache_step(self, cache, k, v, start):
        """This call's ``t`` keys/values attend with the cached ones, whose slot positions come
        from :func:`rolling_slot_positions`; the last ``min(t, window)`` are then written at
        slots ``n_global + p % window`` (and positions ``p < n_global`` also at slot ``p``).
        Keys are ``[batch, n_global + window + t, ...]``; the mask reads slots by position."""
        window, n_global = self.cfg.attention_window, self.cfg.attention_global_tokens
        keys, values = cache
        t = k.shape[1]
        k, v = k.astype(keys.dtype), v.astype(values.dtype)
        new_positions = jnp.asarray(start, jnp.int32) + jnp.arange(t, dtype=jnp.int32)
        k_positions = jnp.concatenate(
            [rolling_slot_positions(start, window, n_global), new_positions])
        attend_k = jnp.concatenate([keys, k], axis=1)
        attend_v = jnp.concatenate([values, v], axis=1)
        keep = min(t, window)  # distinct slots: later tokens overwrite earlier ones
        slots = n_global + jnp.mod(new_positions[t - keep:], window)
        keys = keys.at[:, slots].set(k[:, t - keep:])
        values = values.at[:, slots].set(v[:, t - keep:])
        if n_global:
            global_slots = jnp.where(new_positions < n_global, new_positions, n_global + window)
            keys = keys.at[:, global_slots].set(k, mode="drop")
            values = values.at[:, global_slots].set(v, mode="drop")
        by_slot = BySlot(mask=self, positions=k_positions)
        return attend_k, attend_v, (keys, values), by_slot, start, k_positions[None]


@dataclasses.dataclass(frozen=True, eq=False)
class BySlot(Mask):
    """``mask`` applied to keys held in cache slots: key index ``j`` is the slot whose position
    is ``positions[j]`` (a rolling cache's step)."""

    mask: Mask | None = None
    positions: jax.Array | None = None

    def __call__(self, q_index, k_index):
        return self.mask(q_index, self.positions[k_index])

    def key_index(self, k_index):
        return self.positions[k_index]


def rolling_slot_positions(start: jax.Array | int, window: int, n_global: int) -> jax.Array:
    """Positions held by a rolling KV cache before a step at ``start``; int32 ``[n_global +
    window]``. Slots ``0 .. n_global-1`` hold positions ``0 .. n_global-1``; slot ``n_global + r``
    the latest position ``p < start`` with ``p % window == r``. Slots not written yet, and rolling
    slots whose position is a global one (counted once, in its global slot), read
    :data:`NOT_WRITTEN`."""
    start = jnp.asarray(start, jnp.int32)
    global_positions = jnp.arange(n_global, dtype=jnp.int32)
    r = jnp.arange(window, dtype=jnp.int32)
    rolling = start - 1 - jnp.mod(start - 1 - r, window)
    positions = jnp.concatenate([
        jnp.where(global_positions < start, global_positions, NOT_WRITTEN),
        jnp.where(rolling >= n_global, rolling, NOT_WRITTEN),  # also < 0: not written
    ])
    return positions
