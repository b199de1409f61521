"""Positional encodings against float64 NumPy references and their defining invariants."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnlab.model import (
    PositionOutOfRangeError,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    check_positions,
    sinusoidal_table,
)


# ------------------------------------------------------------------------------- sinusoidal


def test_sinusoidal_values_at_position_one():
    table = np.asarray(sinusoidal_table(np.array([0, 1]), 8))
    expected = [0.841471, 0.540302, 0.099833, 0.995004, 0.01, 0.99995, 0.001, 1.0]
    np.testing.assert_allclose(table[1], expected, atol=1e-6)
    np.testing.assert_allclose(table[0], [0, 1] * 4, atol=0)


def test_sinusoidal_matches_float64_formula():
    positions = np.array([[0, 3, 17, 255, 1000, 4095]])
    d = 32
    table = np.asarray(sinusoidal_table(positions, d))
    assert table.shape == (1, 6, d) and table.dtype == np.float32
    i = np.arange(d // 2)
    angle = positions[..., None].astype(np.float64) / 10000.0 ** (2 * i / d)
    reference = np.empty((1, 6, d))
    reference[..., 0::2], reference[..., 1::2] = np.sin(angle), np.cos(angle)
    # fp32 angles at position 4095: absolute error ~ 4095 * 2^-24.
    np.testing.assert_allclose(table, reference, atol=5e-4)


# ------------------------------------------------------------------------------------ RoPE


def rope_reference(x, positions, theta=10000.0):
    """float64 rotation of pairs (i, i + d/2) by angle p * theta^(-2i/d)."""
    x = np.asarray(x, np.float64)
    half = x.shape[-1] // 2
    freq = theta ** (-np.arange(half) * 2.0 / x.shape[-1])
    angle = np.asarray(positions, np.float64)[:, :, None, None] * freq  # [b, s, 1, d/2]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate(
        [x1 * np.cos(angle) - x2 * np.sin(angle), x1 * np.sin(angle) + x2 * np.cos(angle)], -1
    )


def test_rope_matches_float64_reference():
    x = np.random.default_rng(0).normal(size=(2, 5, 3, 8)).astype(np.float32)
    positions = np.array([[0, 1, 2, 3, 100], [7, 9, 11, 300, 500]])
    out = np.asarray(apply_rope(jnp.asarray(x), positions, theta=500.0))
    np.testing.assert_allclose(out, rope_reference(x, positions, 500.0), atol=1e-4)


def test_rope_preserves_norms():
    x = np.random.default_rng(1).normal(size=(1, 64, 2, 16)).astype(np.float32)
    positions = np.arange(0, 64 * 37, 37)[None]
    out = np.asarray(apply_rope(jnp.asarray(x), positions))
    np.testing.assert_allclose(
        np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5
    )


def test_rope_score_depends_only_on_relative_position_up_to_16x_training_length():
    head_dim, train_len = 16, 64
    rng = np.random.default_rng(2)
    q = rng.normal(size=head_dim).astype(np.float32)
    k = rng.normal(size=head_dim).astype(np.float32)
    m = rng.integers(0, 16 * train_len, size=200)
    n = rng.integers(0, 16 * train_len, size=200)

    def rotate(vector, positions):
        x = jnp.broadcast_to(jnp.asarray(vector), (1, len(positions), 1, head_dim))
        return np.asarray(apply_rope(x, positions[None]), np.float64)[0, :, 0]

    scores = np.sum(rotate(q, m) * rotate(k, n), axis=-1)
    # float64: <R(m) q, R(n) k> = <q, R(n - m) k>.
    k_rotated = rope_reference(k[None, None, None], (n - m)[None, :])[0, :, 0]
    relative = np.sum(q.astype(np.float64) * k_rotated, axis=-1)
    scale = np.linalg.norm(q) * np.linalg.norm(k)
    np.testing.assert_allclose(scores, relative, atol=2e-3 * scale)
    # And shifting both positions by the same offset leaves the score unchanged.
    shifted = np.sum(rotate(q, m + 333) * rotate(k, n + 333), axis=-1)
    np.testing.assert_allclose(shifted, scores, atol=2e-3 * scale)


def test_rope_phases_are_float32_for_bf16_inputs():
    # bf16 phases would round position 257 to 256; the rotation must still tell them apart.
    x = jnp.ones((1, 2, 1, 8), jnp.bfloat16)
    out = apply_rope(x, np.array([[256, 257]]))
    assert out.dtype == jnp.bfloat16
    assert not np.array_equal(np.asarray(out[0, 0], np.float32), np.asarray(out[0, 1], np.float32))


# ----------------------------------------------------------------------------------- ALiBi


def test_alibi_slopes_power_of_two():
    np.testing.assert_allclose(alibi_slopes(8), [2.0 ** -(i + 1) for i in range(8)], rtol=1e-15)


def test_alibi_slopes_non_power_of_two_follow_the_official_rule():
    np.testing.assert_allclose(
        alibi_slopes(6), [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8], rtol=1e-15
    )
    # 12 heads: the 8-head slopes, then every other 16-head slope 2^-0.5, 2^-1.5, ...
    expected = [2.0 ** -(i + 1) for i in range(8)] + [2.0 ** -(i + 0.5) for i in range(4)]
    np.testing.assert_allclose(alibi_slopes(12), expected, rtol=1e-15)
    np.testing.assert_allclose(alibi_slopes(1), [2.0**-8], rtol=1e-15)


def test_alibi_bias_is_minus_slope_times_distance_below_the_diagonal():
    slopes = alibi_slopes(4)
    positions = np.arange(6)[None]
    bias = np.asarray(alibi_bias(slopes, positions, positions))
    assert bias.shape == (1, 4, 6, 6) and bias.dtype == np.float32
    i, j = np.tril_indices(6)
    for h, m in enumerate(slopes):
        np.testing.assert_allclose(bias[0, h][i, j], -m * (i - j), rtol=1e-7)


# ---------------------------------------------------------------------------- range checks


def test_check_positions_concrete():
    check_positions(np.arange(8), 8, "table")
    with pytest.raises(PositionOutOfRangeError, match=r"positions 0\.\.8 .*table.*size 8"):
        check_positions(np.arange(9), 8, "table")
    with pytest.raises(PositionOutOfRangeError, match="-1"):
        check_positions(np.array([-1, 2]), 8, "table")


def test_check_positions_traced_raises_when_run():
    @jax.jit
    def lookup(positions):
        check_positions(positions, 8, "learned table")
        return positions + 1

    np.testing.assert_array_equal(lookup(jnp.arange(8)), np.arange(1, 9))
    with pytest.raises(Exception, match="outside the learned table"):
        jax.block_until_ready(lookup(jnp.arange(3, 12)))
