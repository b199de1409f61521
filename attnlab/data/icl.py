"""In-context learning tasks with known answers: synthetic sources whose batch ``i`` is a pure
function of ``(task settings, seed, split, i)`` (no corpus, no iterator state: a resumed run sees
the batches it would have seen), each with its exact optimal loss or Bayes-optimal baselines.

Token tasks (``data.source``), windows of ``seq_len + 1`` ids as the corpora give them:

* ``induction`` (Olsson et al. 2022): a random sequence of ``P`` distinct tokens from
  ``0 .. data.task_vocab - 1`` (distinct, so that an earlier occurrence names its successor
  uniquely), repeated to the end of the window; the period ``P`` varies between windows. Every
  token after the repeat's first costs 0 to the optimal predictor.
* ``mqar`` (multi-query associative recall, Arora et al. 2023 "Zoology"): ``n = data.mqar_pairs``
  key-value pairs ``k_1 v_1 .. k_n v_n`` (distinct keys from ``K`` key ids, values uniform over
  ``K`` value ids), then every key once in a random order, each followed by its value, then
  padding (id 0). Ids: 0 pad, keys ``1 .. K``, values ``K + 1 .. 2K``, ``K = (V - 1) // 2``.

The continuous task, in-context regression (``data.source=regression``), is
``attnlab/data/icl_regression.py``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from attnlab.errors import ConfigError

SPLIT_STREAMS = {"train": 0, "validation": 1, "test": 2}
PAD = 0  # mqar's padding id


def batch_rng(seed: int, split: str, i: int) -> np.random.Generator:
    """The generator of batch ``i`` of ``split``: independent across (seed, split, i)."""
    if i < 0:
        raise IndexError(f"batch index must be >= 0, got {i}")
    return np.random.default_rng([seed, SPLIT_STREAMS[split], i])


def _distinct(rng: np.random.Generator, rows: int, n: int, vocab: int) -> np.ndarray:
    """[rows, n] int64: each row ``n`` distinct ids drawn uniformly from ``0 .. vocab - 1``
    (the first n of a random permutation: the ``n`` smallest of ``vocab`` iid keys)."""
    keys = rng.random((rows, vocab))
    return np.argsort(keys, axis=1)[:, :n]


# --------------------------------------------------------------------------------------------
# Token tasks
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TokenTask:
    """A token task over windows of ``seq_len + 1`` ids from ``0 .. vocab - 1``."""

    seq_len: int
    vocab: int

    name = ""

    def validate(self) -> None:
        """Raises ConfigError naming the field when the settings cannot make a window."""

    def sample(self, rng: np.random.Generator, rows: int) -> np.ndarray:
        """[rows, seq_len + 1] int32."""
        raise NotImplementedError

    def optimal_losses(self) -> np.ndarray:
        """[seq_len] float64: the least expected loss (nats) of predicting window token
        ``t + 1`` from tokens ``0 .. t``, for the Bayes-optimal predictor."""
        raise NotImplementedError

    def summary(self) -> dict:
        """The manifest: the task's settings and its optimal mean loss."""
        losses = self.optimal_losses()
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {"source": self.name, **fields, "ln_vocab": math.log(self.vocab),
                "optimal_loss_nats": float(losses.mean())}


@dataclasses.dataclass(frozen=True)
class InductionTask(TokenTask):
    """A random prefix of ``P`` distinct tokens repeated to the window's end (Olsson et al.
    2022), ``P`` uniform on ``[P_max // 2, P_max]`` per window, ``P_max = ceil((seq_len + 1) /
    2)``. A varying period keeps a fixed-offset positional head from solving the repeat: the
    continuation must be found by content, the token after the current token's previous
    occurrence (an induction head)."""

    name = "induction"

    @property
    def max_prefix(self) -> int:
        return -(-(self.seq_len + 1) // 2)

    @property
    def min_prefix(self) -> int:
        return max(2, self.max_prefix // 2)

    def validate(self) -> None:
        if self.seq_len < 3:
            raise ConfigError("data.seq_len", f"induction needs >= 3 (a prefix and its repeat), "
                              f"got {self.seq_len}")
        if self.max_prefix > self.vocab:
            raise ConfigError("data.task_vocab", f"{self.vocab} ids cannot fill an induction "
                              f"prefix of up to {self.max_prefix} distinct tokens (data.seq_len="
                              f"{self.seq_len}); raise it to >= {self.max_prefix}")

    def sample(self, rng, rows):
        window = self.seq_len + 1
        tokens = _distinct(rng, rows, self.max_prefix, self.vocab)
        period = rng.integers(self.min_prefix, self.max_prefix + 1, rows)
        index = np.arange(window)[None] % period[:, None]  # x_t = x_{t mod P}
        return np.take_along_axis(tokens, index, axis=1).astype(np.int32)

    @staticmethod
    def prefixes(windows: np.ndarray) -> np.ndarray:
        """[rows] int: each window's period ``P``, where its first token recurs (prefix
        tokens are distinct)."""
        recur = windows[:, 1:] == windows[:, :1]
        return 1 + np.argmax(recur, axis=1)

    def repeat_targets(self, windows: np.ndarray) -> np.ndarray:
        """[rows, seq_len] bool: the targets an induction head can predict, the repeated tokens
        after the first (which alone needs to know where the repeat starts)."""
        t = np.arange(1, self.seq_len + 1)[None]  # window index of each target
        return t > self.prefixes(windows)[:, None]

    def optimal_losses(self):
        """With ``t`` distinct tokens seen, the next is the repeat's start ``x_0`` with the
        hazard ``h_t = Pr(P = t | P >= t)`` and otherwise uniform over the ``V - t`` unused ids;
        after the repeat's start every token is known. Averaged over ``P``."""
        lo, hi, vocab = self.min_prefix, self.max_prefix, self.vocab
        out = np.zeros(self.seq_len)
        for period in range(lo, hi + 1):
            for t in range(1, min(period, self.seq_len) + 1):
                hazard = 1.0 / (hi - t + 1) if t >= lo else 0.0
                if t < period:
                    out[t - 1] += -math.log((1 - hazard) / (vocab - t))
                else:
                    out[t - 1] += -math.log(hazard)
        return out / (hi - lo + 1)


@dataclasses.dataclass(frozen=True)
class MQARTask(TokenTask):
    """Multi-query associative recall (Arora et al. 2023, section 3): pairs, then queries."""

    pairs: int = 8

    name = "mqar"

    @property
    def keys(self) -> int:
        """K: key ids 1..K, value ids K+1..2K."""
        return (self.vocab - 1) // 2

    def validate(self) -> None:
        if self.pairs < 1:
            raise ConfigError("data.mqar_pairs", f"must be positive, got {self.pairs}")
        if 4 * self.pairs > self.seq_len + 1:
            raise ConfigError("data.mqar_pairs", f"{self.pairs} pairs and their {self.pairs} "
                              f"queries need {4 * self.pairs} tokens; a window of data.seq_len="
                              f"{self.seq_len} holds {self.seq_len + 1}")
        if self.pairs > self.keys:
            raise ConfigError("data.task_vocab", f"{self.vocab} ids give {self.keys} distinct "
                              f"keys, fewer than data.mqar_pairs={self.pairs}; raise it to >= "
                              f"{2 * self.pairs + 1}")

    def sample(self, rng, rows):
        n, window = self.pairs, self.seq_len + 1
        keys = 1 + _distinct(rng, rows, n, self.keys)
        values = 1 + self.keys + rng.integers(0, self.keys, (rows, n))
        order = np.argsort(rng.random((rows, n)), axis=1)  # the order queries come in
        out = np.full((rows, window), PAD, np.int64)
        out[:, 0 : 2 * n : 2], out[:, 1 : 2 * n : 2] = keys, values
        out[:, 2 * n : 4 * n : 2] = np.take_along_axis(keys, order, axis=1)
        out[:, 2 * n + 1 : 4 * n : 2] = np.take_along_axis(values, order, axis=1)
        return out.astype(np.int32)

    def answer_targets(self) -> np.ndarray:
        """[seq_len] bool: the targets that are a queried key's value (the recall)."""
        t = np.arange(1, self.seq_len + 1)
        return (t >= 2 * self.pairs) & (t < 4 * self.pairs) & (t % 2 == 1)

    def optimal_losses(self):
        n, k = self.pairs, self.keys
        out = np.zeros(self.seq_len)
        for t in range(1, self.seq_len + 1):
            if t < 2 * n:  # context: key j is one of the K - j unused keys; values uniform
                out[t - 1] = math.log(k - t // 2) if t % 2 == 0 else math.log(k)
            elif t < 4 * n and t % 2 == 0:  # query i: one of the n - i keys not asked yet
                out[t - 1] = math.log(n - (t - 2 * n) // 2)
        return out  # answers and padding: determined


def token_task(cls: type[TokenTask], cfg) -> TokenTask:
    """The token task ``cls`` sized by a data config, checked."""
    extra = {"pairs": cfg.mqar_pairs} if cls is MQARTask else {}
    task = cls(seq_len=cfg.seq_len, vocab=cfg.task_vocab, **extra)
    task.validate()
    return task


class TaskBatches:
    """``batches[i]`` -> [batch_size // process_count, seq_len + 1] int32, this process's rows
    of global batch i; the interface of :class:`attnlab.data.Batches` (an endless stream:
    never an epoch)."""

    def __init__(self, task: TokenTask, split: str, batch_size: int, seed: int,
                 process_index: int = 0, process_count: int = 1):
        if batch_size < 1 or batch_size % process_count:
            raise ConfigError("data.batch_size", f"{batch_size} must be positive and divisible "
                              f"by the number of processes ({process_count})")
        self.task, self.split, self.seed = task, split, seed
        self.seq_len, self.batch_size = task.seq_len, batch_size
        self.process_index, self.process_count = process_index, process_count
        self.local_batch_size = batch_size // process_count
        self.tokens_per_batch = batch_size * task.seq_len

    def __getitem__(self, i: int) -> np.ndarray:
        rows = self.task.sample(batch_rng(self.seed, self.split, int(i)), self.batch_size)
        start = self.process_index * self.local_batch_size
        return rows[start : start + self.local_batch_size]

    def epoch(self, i: int) -> float:
        return 0.0  # fresh samples every batch: no data is repeated

    def tokens_after(self, i: int) -> int:
        return (i + 1) * self.tokens_per_batch

    def unique(self) -> dict:
        return {}  # an endless stream: no finite set of unique tokens, nothing repeated

    def consumed(self, steps: int) -> dict:
        return {}


class TaskCorpus:
    """A token task in the place of a prepared corpus: its name, manifest and vocabulary, its
    training stream and fixed validation set (the same methods as
    :class:`attnlab.data.Corpus`)."""

    def __init__(self, task: TokenTask, weights: np.ndarray | None = None):
        self.task = task
        self.name = task.name
        self.vocab_size = task.vocab
        self.manifest = task.summary()
        if weights is not None:  # the optimum of the loss the run reports: over scored targets
            optimal = task.optimal_losses()
            self.manifest.update(loss_on="answers", optimal_loss_nats=float(
                (optimal * weights).sum() / weights.sum()))
        self.tokenizer = None  # ids are the task's symbols, not text

    def train_batches(self, seq_len: int, batch_size: int, seed: int, process_index: int = 0,
                      process_count: int = 1) -> TaskBatches:
        return TaskBatches(self.task, "train", batch_size, seed, process_index, process_count)

    def validation_set(self, seq_len: int, batch_size: int, n_batches: int) -> np.ndarray:
        """[n_batches, batch_size, seq_len + 1] int32, the same for every run of this task
        (seed 0 of the validation stream)."""
        batches = TaskBatches(self.task, "validation", batch_size, seed=0)
        return np.stack([batches[i] for i in range(n_batches)])

    def budget_warnings(self, tokens: int, seq_len: int) -> list[str]:
        return []  # an endless stream never repeats

    def __repr__(self) -> str:
        return f"TaskCorpus({self.task})"
