"""Which tokens each evaluation window feeds the model and which of its predictions are scored.

Pure NumPy, no model: a *plan* is a list of windows over one token stream. Window ``w`` feeds
``stream[start_w : start_w + L]`` and predicts ``stream[start_w + 1 : start_w + L + 1]``; of those L
predictions only positions ``first_scored_w .. L-1`` count. Across the windows of a plan every
target ``stream[1 .. n_targets]`` is scored exactly once, so plans for different lengths and
protocols score the very same tokens (Press et al. 2022, sec. 4 / appendix B).

Protocols:
  nonoverlapping  consecutive chunks of length L, every prediction scored.
  sliding         windows of length L advancing by S; each window scores only its last S
                  predictions (the first window scores all of its L, so no token goes unscored).
                  With S = L this is exactly ``nonoverlapping``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from attnlab.errors import AttnlabError

class EvaluationError(AttnlabError):
    """Bad evaluation request: lengths, stride, protocol, or a run that cannot be evaluated."""


@dataclasses.dataclass(frozen=True)
class WindowPlan:
    """Windows of one length over a stream of ``n_targets + 1`` tokens.

    Attributes:
      length: L, tokens fed to the model per window.
      starts: [n_windows] int64, index of each window's first input token.
      first_scored: [n_windows] int64, first scored position within each window (0..L-1).
      n_targets: number of scored targets, = sum over windows of (L - first_scored).
    """

    length: int
    starts: np.ndarray
    first_scored: np.ndarray
    n_targets: int

    @property
    def n_windows(self) -> int:
        return int(self.starts.shape[0])

    def score_mask(self) -> np.ndarray:
        """[n_windows, L] bool, True where a prediction is scored."""
        positions = np.arange(self.length)[None, :]
        return positions >= self.first_scored[:, None]


def validate_lengths(lengths, *, field: str = "lengths") -> tuple[int, ...]:
    """Sorted unique positive ints; raises EvaluationError naming ``field`` otherwise."""
    lengths = list(lengths)
    if not lengths:
        raise EvaluationError(f"{field}: no evaluation lengths given")
    for length in lengths:
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)):
            raise EvaluationError(f"{field}: {length!r} is not an integer")
        if length < 1:
            raise EvaluationError(f"{field}: every length must be >= 1, got {length}")
    return tuple(sorted({int(length) for length in lengths}))


def scored_target_count(n_tokens: int, lengths) -> int:
    """Targets scored for every length: the stream's ``n_tokens - 1`` predictions truncated to a
    multiple of every length (of the longest one when, as usual, the others divide it), so that
    every length scores the same tokens.

    Raises EvaluationError if the stream is shorter than that common multiple.
    """
    lengths = validate_lengths(lengths)
    multiple = math.lcm(*lengths)
    n_targets = (n_tokens - 1) // multiple * multiple
    if n_targets == 0:
        needed = "one window" if multiple == max(lengths) else f"{multiple} (their least common multiple)"
        raise EvaluationError(
            f"lengths: the validation split has {n_tokens} tokens, but lengths {list(lengths)} need "
            f"at least {multiple + 1}: {needed} plus its last target; use shorter lengths, lengths "
            "that divide the longest, or a larger corpus"
        )
    return n_targets


def nonoverlapping_plan(n_targets: int, length: int) -> WindowPlan:
    """Consecutive windows of ``length``; ``n_targets`` must be a multiple of ``length``."""
    (length,) = validate_lengths([length], field="length")
    if n_targets % length:
        raise EvaluationError(f"length: {n_targets} scored targets are not a multiple of {length}")
    starts = np.arange(0, n_targets, length, dtype=np.int64)
    return WindowPlan(length, starts, np.zeros_like(starts), n_targets)


def sliding_plan(n_targets: int, length: int, stride: int) -> WindowPlan:
    """Windows of ``length`` whose ends advance by ``stride``; each scores the predictions not yet
    scored by an earlier window (the last ``stride`` of them, all ``length`` for the first window,
    and fewer for a final window placed flush with the end of the stream).

    Raises EvaluationError if the stride is below 1 or larger than the window.
    """
    (length,) = validate_lengths([length], field="length")
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or stride < 1:
        raise EvaluationError(f"stride: must be an integer >= 1, got {stride!r}")
    if stride > length:
        raise EvaluationError(
            f"stride: {stride} is larger than the window length {length}; tokens between windows "
            "would never be scored"
        )
    if n_targets < length:
        raise EvaluationError(f"length: {length} is longer than the {n_targets} scored targets")
    # Window ends (exclusive, in prediction indices): L, L + S, L + 2S, ... and finally n_targets.
    ends = np.arange(length, n_targets + 1, stride, dtype=np.int64)
    if ends[-1] != n_targets:
        ends = np.append(ends, n_targets)
    previous_ends = np.concatenate([[0], ends[:-1]])
    starts = ends - length
    first_scored = length - (ends - previous_ends)
    return WindowPlan(length, starts, first_scored, n_targets)


class Protocol:
    """An evaluation protocol: the windows that feed the model and the predictions scored."""

    name = ""
    suffix = ""  # of its figures' file names
    strided = False  # its windows advance by a stride (--stride)

    def plan(self, n_targets: int, length: int, stride: int | None = None) -> WindowPlan:
        raise NotImplementedError


class Nonoverlapping(Protocol):
    """Consecutive chunks of the length, every prediction scored."""

    name = "nonoverlapping"

    def plan(self, n_targets, length, stride=None):
        return nonoverlapping_plan(n_targets, length)


class Sliding(Protocol):
    """Windows of the length advancing by the stride, each scoring its last ``stride``."""

    name = "sliding"
    suffix = "_sliding"
    strided = True

    def plan(self, n_targets, length, stride=None):
        if stride is None:
            raise EvaluationError("stride: the sliding protocol needs a stride")
        return sliding_plan(n_targets, length, stride)


PROTOCOLS = {cls.name: cls for cls in (Nonoverlapping, Sliding)}


def protocol_named(name: str) -> Protocol:
    """The protocol ``name``; raises EvaluationError naming the valid ones."""
    if name not in PROTOCOLS:
        raise EvaluationError(f"protocol: unknown {name!r}; valid protocols are "
                              f"{', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]()


def make_plan(protocol: str, n_targets: int, length: int, stride: int | None = None) -> WindowPlan:
    """The plan of ``protocol`` (see module docstring); ``stride`` is used by ``sliding`` only."""
    return protocol_named(protocol).plan(n_targets, length, stride)


def window_tokens(stream: np.ndarray, plan: WindowPlan, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets of the windows ``rows`` of ``plan``.

    Args:
      stream: [n] int token ids (n >= plan.n_targets + 1).
      rows: [b] window indices.
    Returns:
      (inputs [b, L], targets [b, L]) int32, targets shifted by one token.
    """
    offsets = plan.starts[rows][:, None] + np.arange(plan.length + 1)[None, :]
    windows = np.asarray(stream)[offsets].astype(np.int32)
    return windows[:, :-1], windows[:, 1:]
