"""A synthetic byte source with a known entropy rate: a seeded, sparse, order-k Markov chain.

Each context (the last k bytes) can be followed by ``branching`` distinct bytes from 1..255 (0 is
the end-of-document byte and never occurs), with probabilities drawn from a flat Dirichlet. The
process is sampled from its stationary distribution, so its entropy rate

    H = sum_s pi(s) sum_x -p(x | s) log p(x | s)        (Cover & Thomas, Thm. 4.2.4)

is the loss (nats per byte) of the best possible predictor with unbounded context: the
irreducible loss E that a scaling-law fit should recover. A model that sees only t < k bytes of
context cannot reach H; its floor at that position is the conditional block entropy
H(X_{t+1} | X_1..X_t) = H_{t+1} - H_t, see :func:`window_loss_floor`.
"""

from __future__ import annotations

import bisect
import dataclasses
import math

import numpy as np
from scipy import sparse
from scipy.sparse import csgraph

from attnlab.errors import ConfigError

ALPHABET = 256
MAX_TRANSITIONS = 2**22  # contexts * branching kept in memory; order 2 allows branching <= 64


@dataclasses.dataclass(frozen=True)
class MarkovChain:
    """An order-k chain over bytes. A state is the last k bytes, most recent byte lowest:
    s = sum_i x_{t-i} 256^i, so the next state is (s * 256 + x) mod 256^k."""

    order: int
    successors: np.ndarray  # [256**order, branching] uint8: the bytes that may follow each state
    probs: np.ndarray  # [256**order, branching] float64: their probabilities (rows sum to 1)
    stationary: np.ndarray  # [256**order] float64: pi, zero outside the recurrent class

    @property
    def num_states(self) -> int:
        return ALPHABET**self.order

    def next_states(self) -> np.ndarray:
        """[num_states, branching] int64: the state reached by each transition."""
        states = np.arange(self.num_states, dtype=np.int64)[:, None]
        return (states * ALPHABET + self.successors) % self.num_states


def check_size(order: int, branching: int) -> None:
    if not 1 <= branching <= ALPHABET - 1:
        raise ConfigError("data.markov_branching", f"must be in 1..255, got {branching}")
    if order < 1 or ALPHABET**order * branching > MAX_TRANSITIONS:
        raise ConfigError(
            "data.markov_order",
            f"order {order} with branching {branching} needs 256^{order} x {branching} "
            f"transitions; at most {MAX_TRANSITIONS} fit (order 1, or order 2 with branching "
            "<= 64)",
        )


def build_chain(order: int, branching: int, seed: int) -> MarkovChain:
    """The chain for (order, branching, seed): a pure function of its arguments."""
    check_size(order, branching)
    rng = np.random.default_rng([seed, 0])
    num_states = ALPHABET**order
    successors = np.empty((num_states, branching), np.uint8)
    rows_per_chunk = 4096  # bounds the [rows, 255] key matrix to 8 MB
    for start in range(0, num_states, rows_per_chunk):
        keys = rng.random((min(rows_per_chunk, num_states - start), ALPHABET - 1))
        # The `branching` smallest of 255 iid keys: a uniform subset of bytes 1..255.
        chosen = np.argpartition(keys, branching - 1, axis=1)[:, :branching]
        successors[start : start + len(keys)] = chosen + 1
    probs = rng.dirichlet(np.ones(branching), size=num_states)
    chain = MarkovChain(order, successors, probs, np.zeros(num_states))
    return dataclasses.replace(chain, stationary=stationary_distribution(chain))


def stationary_distribution(chain: MarkovChain, tol: float = 1e-13) -> np.ndarray:
    """pi of the largest closed communicating class (the chain started anywhere ends in a closed
    class; the sampler starts in this one), by power iteration of the lazy chain (I + P) / 2,
    which has the same pi and is aperiodic.

    Returns:
      [num_states] float64 summing to 1, zero outside the class.
    """
    n, b = chain.successors.shape
    src = np.repeat(np.arange(n), b)
    dst = chain.next_states().reshape(-1)
    transition = sparse.csr_matrix((chain.probs.reshape(-1), (src, dst)), shape=(n, n))
    _, labels = csgraph.connected_components(transition, directed=True, connection="strong")
    leaves = np.zeros(labels.max() + 1, bool)
    leaves[labels[src][labels[src] != labels[dst]]] = True
    sizes = np.bincount(labels)
    closed = np.flatnonzero(~leaves)
    # Largest closed class; ties go to the class holding the smallest state.
    first_state = np.array([np.argmax(labels == c) for c in closed])
    best = closed[np.lexsort((first_state, -sizes[closed]))[0]]
    members = labels == best
    pi = members / members.sum()
    if b == 1:
        return pi  # a deterministic cycle: uniform on it
    transition_t = transition.T.tocsr()
    for _ in range(200_000):
        stepped = transition_t @ pi
        residual = np.abs(stepped - pi).sum()
        pi = 0.5 * (pi + stepped)
        if residual < tol:
            return pi / pi.sum()
    raise RuntimeError(f"stationary distribution did not converge (residual {residual:.2e})")


def entropy_rate(chain: MarkovChain) -> float:
    """H in nats per byte (float64)."""
    plogp = np.where(chain.probs > 0, chain.probs * np.log(chain.probs), 0.0)
    return float(-(chain.stationary * plogp.sum(axis=1)).sum())


def block_entropies(chain: MarkovChain) -> np.ndarray:
    """[order + 1] float64: H_m = entropy (nats) of m consecutive bytes, m = 0..order."""
    out = [0.0]
    for m in range(1, chain.order + 1):
        # The oldest m bytes of the state; stationarity makes any m-block distributed alike.
        prefix = np.arange(chain.num_states) // ALPHABET ** (chain.order - m)
        q = np.bincount(prefix, weights=chain.stationary, minlength=ALPHABET**m)
        q = q[q > 0]
        out.append(float(-(q * np.log(q)).sum()))
    return np.array(out)


def conditional_entropies(block: np.ndarray, rate: float, seq_len: int) -> np.ndarray:
    """[seq_len] h_t for t = 1..seq_len: the least expected loss of predicting a window's token
    t from the t tokens before it, H_{t+1} - H_t while t < order, then the entropy rate."""
    order = len(block) - 1
    out = np.full(seq_len, rate)
    for t in range(1, min(order, seq_len + 1)):
        out[t - 1] = block[t + 1] - block[t]
    return out


def window_loss_floor(block: np.ndarray, rate: float, seq_len: int) -> float:
    """The least achievable mean loss (nats/token) over a window of ``seq_len`` predictions.

    It exceeds the entropy rate by sum_{t<k} (h_t - H) / seq_len: the first tokens of every
    window lack context. Compare a fitted E with this, not with H, when order > 1.
    """
    return float(conditional_entropies(block, rate, seq_len).mean())


def summary(chain: MarkovChain, branching: int, seed: int) -> dict:
    rate = entropy_rate(chain)
    block = block_entropies(chain)
    return {
        "markov_order": chain.order,
        "markov_branching": branching,
        "markov_seed": seed,
        "recurrent_states": int((chain.stationary > 0).sum()),
        "entropy_rate_nats": rate,
        "entropy_rate_bits": rate / math.log(2),
        "block_entropies_nats": block.tolist(),
    }


def sample(chain: MarkovChain, num_bytes: int, seed: int | list[int]) -> np.ndarray:
    """[num_bytes] uint8 from the stationary chain: the first state is drawn from pi."""
    rng = np.random.default_rng(seed)
    state = int(rng.choice(chain.num_states, p=chain.stationary))
    first = [(state >> (8 * i)) & 0xFF for i in reversed(range(chain.order))]
    successors = chain.successors.tolist()
    cumulative = np.cumsum(chain.probs, axis=1)
    cumulative[:, -1] = 1.0  # uniforms are < 1, so bisect never runs past the last successor
    cumulative = cumulative.tolist()
    mask = chain.num_states - 1
    out = bytearray(first[:num_bytes])
    for u in rng.random(max(num_bytes - chain.order, 0)).tolist():
        x = successors[state][bisect.bisect_right(cumulative[state], u)]
        out.append(x)
        state = ((state << 8) | x) & mask
    return np.frombuffer(bytes(out), np.uint8)
