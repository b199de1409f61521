"""Windowing plans: every target scored exactly once, equal counts across lengths, bad input."""

import numpy as np
import pytest

from attnlab.extrapolation import protocol
from attnlab.extrapolation.protocol import EvaluationError


def scored_target_indices(plan):
    """Prediction indices (0-based: index i predicts stream[i + 1]) scored by a plan, in order."""
    mask = plan.score_mask()
    index = plan.starts[:, None] + np.arange(plan.length)[None, :]
    return index[mask]


@pytest.mark.parametrize("lengths", [(4, 8, 16), (3, 5), (1, 8, 64)])
def test_nonoverlapping_scores_same_tokens_for_every_length(lengths):
    n_targets = protocol.scored_target_count(1000, lengths)
    multiple = np.lcm.reduce(lengths)  # = the longest length when the others divide it
    assert n_targets % multiple == 0 and 0 <= 1000 - 1 - n_targets < multiple
    for length in lengths:
        plan = protocol.nonoverlapping_plan(n_targets, length)
        np.testing.assert_array_equal(scored_target_indices(plan), np.arange(n_targets))


@pytest.mark.parametrize("length,stride", [(8, 8), (8, 3), (8, 1), (16, 5), (5, 4)])
def test_sliding_scores_every_target_once_with_at_least_L_minus_S_context(length, stride):
    n_targets = 80
    plan = protocol.sliding_plan(n_targets, length, stride)
    np.testing.assert_array_equal(scored_target_indices(plan), np.arange(n_targets))
    assert np.all(plan.starts >= 0) and np.all(plan.starts + length <= n_targets)
    # Outside the first window each scored prediction sees at least L - S earlier tokens.
    context = np.where(plan.score_mask(), np.arange(length)[None, :], length)[1:]
    assert context.min() >= length - stride


def test_sliding_with_stride_equal_to_length_is_nonoverlapping():
    for length in (1, 4, 16):
        a = protocol.sliding_plan(64, length, length)
        b = protocol.nonoverlapping_plan(64, length)
        np.testing.assert_array_equal(a.starts, b.starts)
        np.testing.assert_array_equal(a.first_scored, b.first_scored)


def test_window_tokens_shift_targets_by_one():
    stream = np.arange(100, 133)
    plan = protocol.nonoverlapping_plan(32, 8)
    inputs, targets = protocol.window_tokens(stream, plan, np.array([0, 3]))
    np.testing.assert_array_equal(inputs[1], np.arange(124, 132))
    np.testing.assert_array_equal(targets[1], np.arange(125, 133))
    assert inputs.dtype == np.int32


def test_bad_lengths_and_strides_raise_one_clear_error():
    with pytest.raises(EvaluationError, match="lengths: every length must be >= 1, got 0"):
        protocol.validate_lengths([64, 0])
    with pytest.raises(EvaluationError, match="lengths: no evaluation lengths"):
        protocol.validate_lengths([])
    with pytest.raises(EvaluationError, match="stride: 9 is larger than the window length 8"):
        protocol.sliding_plan(64, 8, 9)
    with pytest.raises(EvaluationError, match="stride: must be an integer >= 1"):
        protocol.sliding_plan(64, 8, 0)
    with pytest.raises(EvaluationError, match="validation split has 10 tokens, but lengths \\[8, 64\\] need at least 65"):
        protocol.scored_target_count(10, [8, 64])
    with pytest.raises(EvaluationError, match="protocol: unknown 'strided'"):
        protocol.make_plan("strided", 64, 8)


def test_each_protocol_is_a_registered_part():
    """A protocol is one class in PROTOCOLS: its plan, its figures' suffix and whether it takes
    the stride; the sliding protocol at stride = length is the nonoverlapping one."""
    assert list(protocol.PROTOCOLS) == ["nonoverlapping", "sliding"]
    chunks = protocol.protocol_named("nonoverlapping").plan(64, 8)
    slid = protocol.protocol_named("sliding").plan(64, 8, 8)
    np.testing.assert_array_equal(chunks.starts, slid.starts)
    np.testing.assert_array_equal(chunks.first_scored, slid.first_scored)
    assert [protocol.protocol_named(n).strided for n in protocol.PROTOCOLS] == [False, True]
    assert protocol.protocol_named("nonoverlapping").suffix == ""
    with pytest.raises(EvaluationError, match="stride: the sliding protocol needs a stride"):
        protocol.make_plan("sliding", 64, 8)
