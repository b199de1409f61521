"""Training and validation batches: random access, deterministic, exactly counted.

A split of ``n`` tokens is cut into ``W = (n - 1) // seq_len`` windows of ``seq_len + 1`` tokens
that overlap by one token (window w covers tokens [w * seq_len, (w + 1) * seq_len]), so every
token after the first is a prediction target exactly once per epoch. Global row r of the
training stream is window ``perm_e[r mod W]`` of epoch ``e = r // W``, where
``perm_e = np.random.default_rng([seed, e]).permutation(W)``; batch i holds rows
[i * batch_size, (i + 1) * batch_size). So batch i is a pure function of (corpus, split, seq_len,
batch_size, seed, i): a resumed run sees the batches it would have seen, with no iterator state.
Batches may straddle an epoch boundary; every window is used once per epoch.
"""

from __future__ import annotations

import operator
import warnings

import numpy as np

from attnlab.data.errors import CorpusTooSmallError
from attnlab.errors import ConfigError

# Functions here take an attnlab.data.corpus.Corpus (not imported: corpus.py builds Batches).


def _num_windows(corpus: "Corpus", split: str, seq_len: int) -> int:
    if seq_len < 1:
        raise ConfigError("data.seq_len", f"must be positive, got {seq_len}")
    n = corpus.num_tokens(split)
    if n < seq_len + 1:
        raise CorpusTooSmallError(
            f"data.seq_len={seq_len} needs windows of {seq_len + 1} tokens, but the {split} split "
            f"of {corpus.name} holds only {n} tokens"
        )
    return (n - 1) // seq_len


class BatchRows:
    """``rows(i)`` -> [batch_size // process_count] int64: the global rows of the stream in
    this process's part of batch i (rows ``[i B, (i + 1) B)``, cut into contiguous blocks)."""

    def __init__(self, batch_size: int, process_index: int = 0, process_count: int = 1):
        if batch_size < 1:
            raise ConfigError("data.batch_size", f"must be positive, got {batch_size}")
        if process_count < 1 or batch_size % process_count:
            raise ConfigError(
                "data.batch_size",
                f"{batch_size} must be divisible by the number of processes ({process_count})",
            )
        if not 0 <= process_index < process_count:
            raise ConfigError(
                "train.process_id", f"{process_index} is not in 0..{process_count - 1}"
            )
        self.batch_size, self.process_index = batch_size, process_index
        self.local_batch_size = batch_size // process_count

    def __call__(self, i: int) -> np.ndarray:
        i = operator.index(i)
        if i < 0:
            raise IndexError(f"batch index must be >= 0, got {i}")
        first = i * self.batch_size + self.process_index * self.local_batch_size
        return first + np.arange(self.local_batch_size)


class Batches:
    """``batches[i]`` -> [batch_size // process_count, seq_len + 1] int32: this process's rows of
    global batch i (inputs are ``[:, :-1]``, targets ``[:, 1:]``)."""

    def __init__(
        self,
        corpus: "Corpus",
        split: str,
        seq_len: int,
        batch_size: int,
        seed: int,
        process_index: int = 0,
        process_count: int = 1,
    ):
        self.rows = BatchRows(batch_size, process_index, process_count)
        self.windows_per_epoch = _num_windows(corpus, split, seq_len)
        if self.windows_per_epoch < batch_size:
            raise CorpusTooSmallError(
                f"the {split} split of {corpus.name} ({corpus.num_tokens(split)} tokens) holds "
                f"{self.windows_per_epoch} windows of seq_len={seq_len}, fewer than one batch of "
                f"data.batch_size={batch_size}; use a larger corpus (data.max_bytes) or smaller "
                "batches"
            )
        self.corpus_name = corpus.name
        self.split = split
        self.seq_len = seq_len
        self.batch_size = batch_size  # global
        self.seed = seed
        self.process_index = process_index
        self.process_count = process_count
        self.local_batch_size = batch_size // process_count
        self.tokens_per_batch = batch_size * seq_len  # predicted tokens of one global batch
        self.unique_tokens = corpus.num_tokens(split)
        self._stream = np.asarray(corpus.stream(split))  # plain ndarray view of the memory map
        self._offsets = np.arange(seq_len + 1)
        self._orders: dict[int, np.ndarray] = {}  # memo of window_order; never changes results

    def window_order(self, epoch: int) -> np.ndarray:
        """[windows_per_epoch] int64: the order windows are visited in during ``epoch``."""
        order = self._orders.get(epoch)
        if order is None:
            order = np.random.default_rng([self.seed, epoch]).permutation(self.windows_per_epoch)
            if len(self._orders) >= 4:
                self._orders.pop(next(iter(self._orders)))
            self._orders[epoch] = order
        return order

    def window_indices(self, i: int) -> np.ndarray:
        """[local_batch_size] int64: the windows in this process's rows of batch i."""
        return self.windows_of_rows(self.rows(i))

    def windows_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The window of each global row of the stream (row r: epoch r // W, its place in that
        epoch's order r mod W); a mixture reads its sources' rows through this."""
        epochs, positions = np.divmod(rows, self.windows_per_epoch)
        if not len(rows):
            return rows
        if epochs[0] == epochs[-1]:
            return self.window_order(int(epochs[0]))[positions]
        out = np.empty_like(rows)
        for epoch in np.unique(epochs):
            here = epochs == epoch
            out[here] = self.window_order(int(epoch))[positions[here]]
        return out

    def __getitem__(self, i: int) -> np.ndarray:
        return self.windows(self.window_indices(i))

    def windows(self, indices: np.ndarray) -> np.ndarray:
        """[len(indices), seq_len + 1] int32: the token windows of ``indices``."""
        starts = indices * self.seq_len
        return self._stream[starts[:, None] + self._offsets].astype(np.int32)

    def epoch(self, i: int) -> float:
        """Epochs of the split consumed once batches 0..i are done (global, all processes)."""
        return (i + 1) * self.batch_size / self.windows_per_epoch

    def tokens_after(self, i: int) -> int:
        """Predicted tokens consumed once batches 0..i are done (global): the D of L(N, D)."""
        return (i + 1) * self.tokens_per_batch

    def unique(self) -> dict[str, int]:
        """``unique_tokens``: the tokens of the split, the U_D of a data-constrained law."""
        return {"unique_tokens": self.unique_tokens}

    def consumed(self, steps: int) -> dict[str, float]:
        """``epochs`` once ``steps`` batches are done: predicted tokens / unique tokens."""
        return {"epochs": steps * self.tokens_per_batch / self.unique_tokens}


def validation_batches(corpus: "Corpus", seq_len: int, batch_size: int, n_batches: int) -> np.ndarray:
    """[n_batches, batch_size, seq_len + 1] int32: a fixed set of distinct windows spread evenly
    over the validation split (the same for every run with these arguments).

    Raises:
      CorpusTooSmallError: the validation split holds fewer than n_batches * batch_size windows.
    """
    needed = n_batches * batch_size
    windows = _num_windows(corpus, "validation", seq_len)
    if windows < needed:
        raise CorpusTooSmallError(
            f"the validation split of {corpus.name} ({corpus.num_tokens('validation')} tokens) "
            f"holds {windows} windows of seq_len={seq_len}, fewer than the {n_batches} x "
            f"{batch_size} requested; lower train.eval_batches or raise data.max_bytes"
        )
    chosen = np.arange(needed) * windows // needed
    stream = np.asarray(corpus.stream("validation"))
    rows = stream[(chosen * seq_len)[:, None] + np.arange(seq_len + 1)].astype(np.int32)
    return rows.reshape(n_batches, batch_size, seq_len + 1)


def epochs_read(corpus: "Corpus", tokens: int, seq_len: int) -> float:
    """How many times ``tokens`` predicted tokens read the training split of ``corpus``."""
    return tokens / (_num_windows(corpus, "train", seq_len) * seq_len)


def check_budget(corpus: "Corpus", tokens: int, seq_len: int) -> list[str]:
    """Warnings about a training budget of ``tokens`` predicted tokens (also warnings.warn-ed).

    Training past one epoch repeats data, which lowers the value of each token and bends
    L(D) away from a single-epoch scaling law (Muennighoff et al. 2023, arXiv 2305.16264).
    """
    per_epoch = _num_windows(corpus, "train", seq_len) * seq_len
    epochs = tokens / per_epoch
    messages = []
    if epochs > 1:
        messages.append(
            f"token budget {tokens:,} is {epochs:.2f} epochs of the {corpus.name} training split "
            f"({per_epoch:,} predicted tokens per epoch at seq_len={seq_len}); repeated data "
            "changes the scaling law"
        )
    for message in messages:
        warnings.warn(message, stacklevel=2)
    return messages
