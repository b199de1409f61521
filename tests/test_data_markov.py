"""The Markov source's entropy rate against independent float64 computations and samples."""

import numpy as np
import pytest

from attnlab.data import markov
from attnlab.errors import ConfigError


def _dense_transition(chain):
    """[S, S] float64 transition matrix, built entry by entry."""
    n = chain.num_states
    matrix = np.zeros((n, n))
    for s in range(n):
        for x, p in zip(chain.successors[s], chain.probs[s], strict=True):
            matrix[s, (s * 256 + int(x)) % n] += p
    return matrix


def test_order_one_matches_a_dense_eigenvector_reference():
    chain = markov.build_chain(order=1, branching=3, seed=3)
    matrix = _dense_transition(chain)
    np.testing.assert_allclose(matrix.sum(axis=1), 1.0)
    values, vectors = np.linalg.eig(matrix.T)
    ones = np.flatnonzero(np.abs(values - 1) < 1e-9)
    assert len(ones) == 1  # one closed class: pi is unique
    pi = np.real(vectors[:, ones[0]])
    pi = pi / pi.sum()
    np.testing.assert_allclose(chain.stationary, pi, atol=1e-12)
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(matrix > 0, matrix * np.log(matrix), 0.0)
    reference = -(pi[:, None] * plogp).sum()
    assert markov.entropy_rate(chain) == pytest.approx(reference, abs=1e-10)


@pytest.mark.parametrize("order,branching", [(1, 3), (2, 4)])
def test_stationary_distribution_is_invariant(order, branching):
    chain = markov.build_chain(order, branching, seed=0)
    pi = chain.stationary
    assert pi.min() >= 0 and pi.sum() == pytest.approx(1.0, abs=1e-12)
    stepped = np.zeros_like(pi)
    np.add.at(stepped, chain.next_states().reshape(-1), (pi[:, None] * chain.probs).reshape(-1))
    np.testing.assert_allclose(stepped, pi, atol=1e-12)


def test_entropy_rate_matches_empirical_conditional_entropy():
    """Plug-in estimate H(X_t | X_{t-1}) from counts in a long sample (bias ~ 1e-3 nats)."""
    chain = markov.build_chain(order=1, branching=3, seed=1)
    x = markov.sample(chain, 300_000, seed=[1, 1]).astype(np.int64)
    counts = np.zeros((256, 256))
    np.add.at(counts, (x[:-1], x[1:]), 1)
    joint = counts / counts.sum()
    conditional = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        empirical = -np.nansum(joint * np.log(conditional))
    assert empirical == pytest.approx(markov.entropy_rate(chain), abs=0.01)
    assert 0 not in x  # the separator byte never occurs


def test_entropy_rate_order_two_matches_sampled_log_loss():
    """The ergodic average of -log p(x_t | x_{t-2} x_{t-1}) along a sample converges to H."""
    chain = markov.build_chain(order=2, branching=4, seed=2)
    x = markov.sample(chain, 300_000, seed=[2, 1]).astype(np.int64)
    states = x[:-2] * 256 + x[1:-1]
    successors, probs = chain.successors[states], chain.probs[states]
    p = (probs * (successors == x[2:, None])).sum(axis=1)
    assert (p > 0).all()  # the sampler only takes allowed transitions
    assert -np.log(p).mean() == pytest.approx(markov.entropy_rate(chain), abs=0.01)


def test_block_entropies_and_window_floor():
    chain = markov.build_chain(order=2, branching=4, seed=2)
    rate = markov.entropy_rate(chain)
    block = markov.block_entropies(chain)
    x = markov.sample(chain, 300_000, seed=[2, 2])
    unigram = np.bincount(x, minlength=256) / len(x)
    unigram = unigram[unigram > 0]
    assert block[1] == pytest.approx(-(unigram * np.log(unigram)).sum(), abs=0.01)

    # h_1 = H(X_2 | X_1) computed directly from the stationary 3-block distribution.
    pi = chain.stationary.reshape(256, 256)  # [older byte, newer byte]
    pair = np.zeros((256, 256))  # [x_1, x_2] over consecutive bytes
    for older in range(256):
        for newer in np.flatnonzero(pi[older]):
            state = older * 256 + newer
            np.add.at(
                pair[newer],
                chain.successors[state].astype(int),
                pi[older, newer] * chain.probs[state],
            )
    marginal = pair.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        h1 = -np.nansum(pair * np.log(pair / marginal))
    assert block[2] - block[1] == pytest.approx(h1, abs=1e-9)
    seq_len = 64
    floor = markov.window_loss_floor(block, rate, seq_len)
    assert floor == pytest.approx((h1 + (seq_len - 1) * rate) / seq_len, abs=1e-9)
    assert floor > rate


def test_order_one_floor_is_the_entropy_rate():
    chain = markov.build_chain(order=1, branching=3, seed=0)
    rate = markov.entropy_rate(chain)
    assert markov.window_loss_floor(markov.block_entropies(chain), rate, 16) == pytest.approx(rate)


def test_chain_is_a_pure_function_of_its_seed():
    a, b = markov.build_chain(1, 4, seed=5), markov.build_chain(1, 4, seed=5)
    np.testing.assert_array_equal(a.successors, b.successors)
    np.testing.assert_array_equal(a.probs, b.probs)
    assert not np.array_equal(a.probs, markov.build_chain(1, 4, seed=6).probs)


def test_deterministic_chain_has_zero_entropy():
    chain = markov.build_chain(order=1, branching=1, seed=0)
    assert markov.entropy_rate(chain) == pytest.approx(0.0, abs=1e-15)


def test_too_many_states_is_a_config_error():
    with pytest.raises(ConfigError, match="data.markov_order"):
        markov.check_size(order=3, branching=4)
    with pytest.raises(ConfigError, match="data.markov_branching"):
        markov.check_size(order=1, branching=256)
