"""T5's relative position bias (Raffel et al. 2020, section 2.1): a learned scalar per head and
log-spaced distance bucket, added to the attention scores unscaled.

Shapes: positions int32 ``[pbatch, len]``; the bias float32 ``[pbatch, heads, q_len, k_len]``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab.errors import ConfigError
from attnlab.model.positions import PositionalEncoding

def t5_bucket_table(num_buckets: int, max_distance: int, *, bidirectional: bool) -> np.ndarray:
    """Bucket of every distance ``n = i - j`` in ``-max_distance .. max_distance`` (Raffel et al.
    2020; the mesh-tensorflow rule), int32 ``[2 max_distance + 1]`` indexed by
    ``n + max_distance``.

    Causal (``bidirectional=False``): ``n <= 0`` (the key at or after the query) -> ``n = 0``;
    the ``B = num_buckets`` buckets cover ``n >= 0``. Bidirectional: keys after the query
    (``n < 0``) use buckets ``B/2 .. B-1`` with ``|n|``, so each direction has ``B' = B/2``.
    Within a direction, ``n < B'/2`` is its own bucket (exact small offsets); larger ``n`` go to
    ``B'/2 + floor(log(n / (B'/2)) / log(max_distance / (B'/2)) * (B' - B'/2))``, capped at
    ``B' - 1`` (every distance ``>= max_distance`` shares the last bucket). Computed once in
    float64 on the host, so the model indexes an integer table and float32 rounding cannot move a
    distance across a bucket edge.
    """
    n = np.arange(-max_distance, max_distance + 1, dtype=np.int64)
    buckets = num_buckets
    offset = np.zeros_like(n)
    if bidirectional:
        buckets //= 2
        offset = np.where(n < 0, buckets, 0)
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    max_exact = buckets // 2
    with np.errstate(divide="ignore"):
        log_ratio = np.log(np.maximum(n, 1) / max_exact) / np.log(max_distance / max_exact)
    large = max_exact + np.floor(log_ratio * (buckets - max_exact)).astype(np.int64)
    large = np.minimum(large, buckets - 1)
    return (offset + np.where(n < max_exact, n, large)).astype(np.int32)


def t5_buckets(q_positions, k_positions, num_buckets: int, max_distance: int, *,
               bidirectional: bool) -> jax.Array:
    """Bucket of every (query, key) pair; int32 ``[pbatch, q_len, k_len]`` for
    ``q_positions [pbatch, q_len]`` and ``k_positions [pbatch, k_len]`` (see
    :func:`t5_bucket_table`; distances beyond ``max_distance`` share the outermost buckets)."""
    table = jnp.asarray(t5_bucket_table(num_buckets, max_distance, bidirectional=bidirectional))
    n = (jnp.asarray(q_positions, jnp.int32)[:, :, None]
         - jnp.asarray(k_positions, jnp.int32)[:, None, :])
    return jnp.take(table, jnp.clip(n, -max_distance, max_distance) + max_distance)


class T5Bias(PositionalEncoding):
    """Adds a learned scalar ``b[h, bucket(i - j)]`` to head ``h``'s scores, unscaled (Raffel et
    al. 2020): ``model.t5_num_buckets`` log-spaced buckets up to ``model.t5_max_distance``,
    causal bucketing (a decoder). One table ``[num_buckets, heads]`` shared by every layer, as in
    T5, or one per layer (``model.t5_per_layer``: ``[n_layers, num_buckets, heads]``), stored at
    ``position_embedding`` (an embedding parameter, not in Kaplan's N); init N(0, init_std^2).
    """

    name = "t5"
    title = "T5 bias"
    fields = ("t5_num_buckets", "t5_max_distance", "t5_per_layer")
    bidirectional = False  # the decoder's bucketing; an encoder subclass sets True

    def validate(self) -> None:
        cfg = self.cfg
        if cfg.t5_num_buckets < 4 or cfg.t5_num_buckets % 2:
            raise ConfigError("model.t5_num_buckets",
                              f"must be an even number >= 4, got {cfg.t5_num_buckets}")
        direction = cfg.t5_num_buckets // (2 if self.bidirectional else 1)
        if cfg.t5_max_distance <= direction // 2:
            raise ConfigError("model.t5_max_distance",
                              f"must exceed the {direction // 2} exact buckets of "
                              f"model.t5_num_buckets={cfg.t5_num_buckets}, got {cfg.t5_max_distance}")

    def _shape(self) -> tuple[int, ...]:
        cfg = self.cfg
        shape = (cfg.t5_num_buckets, cfg.n_heads)
        return (cfg.n_layers, *shape) if cfg.t5_per_layer else shape

    def param_count(self) -> int:
        return int(np.prod(self._shape()))

    def init_params(self, rngs):
        return nnx.Param(nnx.initializers.normal(self.cfg.init_std)(rngs.params(), self._shape()))

    def layer_bias(self, table, layer):
        params = table[layer] if self.cfg.t5_per_layer else table[...]
        # A pytree partial: the table is a leaf, so the bias passes through jax.checkpoint.
        return jax.tree_util.Partial(self.bias, params=params)

    def for_encoder(self):
        return T5BidirectionalBias(self.cfg)

    def bias(self, q_positions, k_positions, params=None):
        """float32 ``[pbatch, heads, q_len, k_len]`` from ``params [num_buckets, heads]``."""
        buckets = t5_buckets(q_positions, k_positions, self.cfg.t5_num_buckets,
                             self.cfg.t5_max_distance, bidirectional=self.bidirectional)
        values = jnp.take(jnp.asarray(params, jnp.float32), buckets, axis=0)  # [pb, q, k, heads]
        return jnp.einsum("bqkh->bhqk", values)


class T5BidirectionalBias(T5Bias):
    """The T5 bias of an encoder (Raffel et al. 2020): keys after the query get their own
    ``num_buckets / 2`` buckets (:func:`t5_bucket_table` with ``bidirectional=True``). Not a
    ``model.pos_encoding`` value: an encoder stack's encoding (``for_encoder``) for
    ``pos_encoding="t5"``."""

    bidirectional = True
