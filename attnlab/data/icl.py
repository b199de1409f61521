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

Continuous task (:class:`RegressionTask`, ``data.source=regression``), Garg et al. 2022: ``w ~
N(0, I_d)``, ``x_i ~ N(0, I_d)``, ``y_i = w . x_i + sigma eps_i``, as float prompts of vectors
(:class:`RegressionCorpus`), or another function class of ``attnlab/data/icl_functions.py``
(sparse linear, 2-layer ReLU networks); the baselines of :func:`regression_baselines` predict
each ``y_k`` from the first ``k`` examples in float64.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from attnlab.data.icl_functions import FunctionClass, Linear, function_of
from attnlab.errors import ConfigError

SPLIT_STREAMS = {"train": 0, "validation": 1, "test": 2}
PAD = 0  # mqar's padding id


def _rng(seed: int, split: str, i: int) -> np.random.Generator:
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
        rows = self.task.sample(_rng(self.seed, self.split, int(i)), self.batch_size)
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


# --------------------------------------------------------------------------------------------
# In-context linear regression (Garg et al. 2022) and its baselines
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RegressionTask:
    """Prompts ``x_1, y_1, .., x_k, y_k`` of a random linear function (Garg et al. 2022, 3).

    With a curriculum (``curriculum_every > 0``, Garg et al.'s: their reference code starts at
    5 dimensions and 11 points and adds 1 and 2 every 2000 steps), training batch ``i`` is at
    stage ``s = i // curriculum_every``: ``min(dim, dim_start + s)`` dimensions (the others of
    every x zero) and ``min(examples, examples_start + 2 s)`` scored examples. The prompts keep
    their full length: a causal model's prediction at ``x_j`` sees only the prompt before it,
    so scoring the first ``k_s`` examples of a full prompt trains what a prompt cut to ``k_s``
    examples would (at the cost of the positions after it)."""

    dim: int = 8
    examples: int = 16
    noise: float = 0.0  # sigma: standard deviation of the label noise
    curriculum_every: int = 0  # steps per curriculum stage; 0: none
    dim_start: int = 0  # 0: the full dim from the start
    examples_start: int = 0  # 0: every example scored from the start
    function: FunctionClass = Linear()  # what y = f(x) each prompt draws (icl_functions.py)

    name = "regression"

    @property
    def seq_len(self) -> int:
        """Vectors per prompt: ``x_i`` and ``(y_i, 0..)`` for each example."""
        return 2 * self.examples

    def validate(self) -> None:
        if self.dim < 1:
            raise ConfigError("data.icl_dim", f"must be positive, got {self.dim}")
        if self.examples < 1:
            raise ConfigError("data.icl_examples", f"must be positive, got {self.examples}")
        if self.noise < 0:
            raise ConfigError("data.icl_noise", f"must be >= 0, got {self.noise}")
        self.function.validate(self.dim)

    def sample_functions(self, rng: np.random.Generator, rows: int, dims: int | None = None):
        """``(xs [rows, k, d], ys [rows, k], functions)``, float64: each prompt's function (its
        class's parameters, e.g. ``w [rows, d]``), inputs and labels; ``dims``: only the first
        ``dims`` coordinates of every x are drawn, the rest are 0 (the same draws either way)."""
        functions = self.function.draw(rng, rows, self.dim)
        xs = rng.standard_normal((rows, self.examples, self.dim))
        eps = rng.standard_normal((rows, self.examples))
        if dims is not None:
            xs[..., dims:] = 0.0
        return xs, self.function.apply(functions, xs) + self.noise * eps, functions

    def sample(self, rng: np.random.Generator, rows: int, dims: int | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """``(xs [rows, k, d], ys [rows, k])`` of :meth:`sample_functions`."""
        return self.sample_functions(rng, rows, dims)[:2]

    def batch(self, seed: int, split: str, i: int, rows: int, dims: int | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        return self.sample(_rng(seed, split, i), rows, dims)

    def batch_functions(self, seed: int, split: str, i: int, rows: int):
        """:meth:`batch` with each prompt's function: ``(xs, ys, functions)``."""
        return self.sample_functions(_rng(seed, split, i), rows)

    def stage(self, i: int) -> tuple[int, int]:
        """``(dimensions, scored examples)`` of training batch ``i`` under the curriculum."""
        if not self.curriculum_every:
            return self.dim, self.examples
        s = i // self.curriculum_every
        dim = min(self.dim, self.dim_start + s) if self.dim_start else self.dim
        examples = (min(self.examples, self.examples_start + 2 * s) if self.examples_start
                    else self.examples)
        return dim, examples

    def window(self, seed: int, split: str, i: int, rows: int) -> np.ndarray:
        """float32 ``[rows, 2k, d + 1]``: batch ``i`` as the model's windows, the prompt
        (:func:`interleave`) in channels ``:d`` and each position's weight in the loss in
        channel ``d`` (1 at a scored ``x_j``; 0 at the ``y`` positions and past the stage's
        examples). The curriculum applies to the training split only: validation and test
        prompts are the full task."""
        dims, examples = self.stage(i) if split == "train" else (self.dim, self.examples)
        xs, ys = self.batch(seed, split, i, rows, dims)
        weights = np.zeros((rows, 2 * self.examples, 1))
        weights[:, 0 : 2 * examples : 2] = 1.0
        return np.concatenate([interleave(xs, ys), weights], axis=-1).astype(np.float32)

    def summary(self) -> dict:
        """The manifest's task settings; the function class only when not linear (so that the
        runs made before the classes existed keep their manifests)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name != "function"}
        if self.function != Linear():
            fields.update(self.function.summary())
        return {"source": self.name, **fields}


def interleave(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """The prompt as vectors (Garg et al. 2022): ``[.., k, d], [.., k] -> [.., 2k, d]`` with
    ``x_i`` at position ``2i`` and ``(y_i, 0, .., 0)`` at ``2i + 1``; the read-out at position
    ``2i`` predicts ``y_i``."""
    ys_as_vectors = np.zeros_like(xs)
    ys_as_vectors[..., 0] = ys
    out = np.stack([xs, ys_as_vectors], axis=-2)  # [.., k, 2, d]
    return out.reshape(*xs.shape[:-2], 2 * xs.shape[-2], xs.shape[-1])


def gd_step_size(k: int, dim: int, noise: float) -> float:
    """The step size of one gradient-descent step from ``w = 0`` on ``1/2 sum_i (w.x_i -
    y_i)^2`` that minimises the expected query error: ``w_1 = eta X^T y`` gives
    ``E err(eta) = eta^2 k d (k + d + 1 + s^2) - 2 eta k d + d + s^2`` (``E tr(X^T X) = k d``,
    ``E tr((X^T X)^2) = k d (k + d + 1)`` for a Wishart matrix), so
    ``eta* = 1 / (k + d + 1 + s^2)`` (von Oswald et al. 2023's one-step construction)."""
    return 1.0 / (k + dim + 1 + noise**2)


def expected_errors(k: np.ndarray, dim: int, noise: float) -> dict[str, np.ndarray]:
    """Closed forms of the expected squared query error (against the noisy label), normalised
    by ``d``, after ``k`` examples (``s = sigma``):

    * least squares, min-norm: ``d - k + s^2 + s^2 k / (d - k - 1)`` for ``k < d - 1`` (the
      unseen directions of ``w``, plus the noise through ``E (X X^T)^-1 = I / (d - k - 1)``);
      ``s^2 (1 + d / (k - d - 1))`` for ``k > d + 1`` (inverse-Wishart mean); noiseless: 0 from
      ``k = d``; infinite (NaN here) around the interpolation threshold;
    * one GD step at ``eta*``: ``d + s^2 - k d / (k + d + 1 + s^2)``;
    * averaging (``eta = 1 / k``): ``d (d + 1 + s^2) / k + s^2``.
    """
    k = np.asarray(k, np.float64)
    s2 = noise**2
    with np.errstate(divide="ignore", invalid="ignore"):
        gd = (dim + s2 - k * dim / (k + dim + 1 + s2)) / dim
        averaging = np.where(k > 0, dim * (dim + 1 + s2) / np.maximum(k, 1) + s2, dim + s2) / dim
        below = (dim - k + s2 + s2 * k / (dim - k - 1)) / dim
        above = s2 * (1 + dim / (k - dim - 1)) / dim
    if noise == 0:
        ls = np.where(k < dim, 1.0 - k / dim, 0.0)
    else:
        ls = np.where(k < dim - 1, below, np.where(k > dim + 1, above, np.nan))
    return {"least_squares": ls, "one_step_gd": gd, "averaging": averaging}


def _predict_all(xs, ys, fit) -> np.ndarray:
    """[rows, k]: ``fit(X [n, d], y [n], x_q [d])`` predicting ``y_n`` from examples ``< n``,
    for every prompt and every ``n``."""
    rows, k, _ = xs.shape
    out = np.zeros((rows, k))
    for b in range(rows):
        for n in range(k):
            out[b, n] = fit(xs[b, :n], ys[b, :n], xs[b, n])
    return out


def _ridge(lam: float):
    def fit(x, y, query):
        if len(y) == 0:
            return 0.0
        if lam == 0:  # least squares, min-norm when underdetermined
            w = np.linalg.lstsq(x, y, rcond=None)[0]
        else:
            w = np.linalg.solve(x.T @ x + lam * np.eye(x.shape[1]), x.T @ y)
        return float(query @ w)
    return fit


def _nearest(neighbours: int):
    def fit(x, y, query):
        if len(y) == 0:
            return 0.0
        distance = ((x - query) ** 2).sum(axis=1)
        return float(y[np.argsort(distance, kind="stable")[:neighbours]].mean())
    return fit


def _gd_step(dim: int, noise: float):
    def fit(x, y, query):
        return float(query @ (gd_step_size(len(y), dim, noise) * x.T @ y)) if len(y) else 0.0
    return fit


def _averaging(x, y, query):
    return float(query @ (x.T @ y) / len(y)) if len(y) else 0.0


def regression_baselines(xs: np.ndarray, ys: np.ndarray, noise: float,
                         neighbours: int = 3, function: FunctionClass = Linear(),
                         functions=None) -> dict[str, np.ndarray]:
    """Each baseline's normalised squared error at every ``k`` (float64, no training):
    ``mean_b (yhat_bk - y_bk)^2 / d``, predicting ``y_k`` from the ``k`` examples before it.

    * ``least_squares``: min-norm least squares (= ridge as lambda -> 0);
    * ``ridge``: lambda = sigma^2, the posterior mean under ``w ~ N(0, I)``: Bayes-optimal for
      the linear class;
    * ``nearest_neighbours``: mean label of the ``neighbours`` nearest x (Garg et al. use 3);
    * ``averaging``: ``w = (1/k) sum_i y_i x_i`` (Garg et al. 2022);
    * ``one_step_gd``: ``w = eta* X^T y`` (:func:`gd_step_size`, optimal for ``E[w w^T] = I``);
    * the function class's own (``function.extra_baselines``, given each prompt's function
      ``functions``), e.g. sparse regression's least squares on the true support.

    Args:
      xs: ``[rows, k, d]``; ys: ``[rows, k]``.

    Returns:
      name -> float64 ``[k]``.
    """
    xs, ys = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
    dim = xs.shape[-1]
    fits = {"least_squares": _ridge(0.0), "ridge": _ridge(noise**2),
            "nearest_neighbours": _nearest(neighbours), "averaging": _averaging,
            "one_step_gd": _gd_step(dim, noise)}
    predictions = {name: _predict_all(xs, ys, fit) for name, fit in fits.items()}
    if functions is not None:
        predictions.update(function.extra_baselines(xs, ys, functions, noise))
    return {name: ((p - ys) ** 2).mean(axis=0) / dim for name, p in predictions.items()}


# --------------------------------------------------------------------------------------------
# In-context regression as a data source (data.source=regression)
# --------------------------------------------------------------------------------------------


def regression_task(cfg) -> RegressionTask:
    """The regression task of a data config (``data.source=regression``), checked."""
    task = RegressionTask(dim=cfg.icl_dim, examples=cfg.icl_examples, noise=cfg.icl_noise,
                          curriculum_every=cfg.icl_curriculum_every,
                          dim_start=cfg.icl_dim_start, examples_start=cfg.icl_examples_start,
                          function=function_of(cfg))
    task.validate()
    return task


class RegressionBatches(TaskBatches):
    """``batches[i]`` -> float32 ``[batch_size // process_count, 2k, d + 1]``, this process's
    rows of global batch ``i`` (:meth:`RegressionTask.window`; the curriculum's stage of step
    ``i``)."""

    def __getitem__(self, i: int) -> np.ndarray:
        if i < 0:
            raise IndexError(f"batch index must be >= 0, got {i}")
        rows = self.task.window(self.seed, self.split, int(i), self.batch_size)
        start = self.process_index * self.local_batch_size
        return rows[start : start + self.local_batch_size]


class RegressionCorpus(TaskCorpus):
    """In-context regression in the place of a corpus (:class:`TaskCorpus`'s methods), with
    float prompts for batches and no vocabulary."""

    def __init__(self, task: RegressionTask):
        self.task = task
        self.name = task.name
        self.vocab_size = 0  # reads vectors: no ids
        self.manifest = task.summary()
        self.tokenizer = None

    def train_batches(self, seq_len: int, batch_size: int, seed: int, process_index: int = 0,
                      process_count: int = 1) -> RegressionBatches:
        return RegressionBatches(self.task, "train", batch_size, seed, process_index,
                                 process_count)

    def validation_set(self, seq_len: int, batch_size: int, n_batches: int) -> np.ndarray:
        """float32 ``[n_batches, batch_size, 2k, d + 1]``: full-task prompts, the same for every
        run of this task (seed 0 of the validation stream)."""
        batches = RegressionBatches(self.task, "validation", batch_size, seed=0)
        return np.stack([batches[i] for i in range(n_batches)])
