"""In-context regression (Garg et al. 2022), ``data.source=regression``: ``w ~ N(0, I_d)``,
``x_i ~ N(0, I_d)``, ``y_i = w . x_i + sigma eps_i``, as float prompts of vectors
(:class:`RegressionCorpus`), or another function class of ``attnlab/data/icl_functions.py``
(sparse linear, 2-layer ReLU networks); the baselines of :func:`regression_baselines` predict
each ``y_k`` from the first ``k`` examples in float64. Batch ``i`` is a pure function of
``(task settings, seed, split, i)``, as for the token tasks of ``attnlab/data/icl.py``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from attnlab.data.icl import TaskBatches, TaskCorpus, batch_rng
from attnlab.data.icl_functions import FunctionClass, LinearFunction, function_of
from attnlab.errors import ConfigError


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
    function: FunctionClass = LinearFunction()  # what y = f(x) each prompt draws (icl_functions.py)

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
        return self.sample(batch_rng(seed, split, i), rows, dims)

    def batch_functions(self, seed: int, split: str, i: int, rows: int):
        """:meth:`batch` with each prompt's function: ``(xs, ys, functions)``."""
        return self.sample_functions(batch_rng(seed, split, i), rows)

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
        if self.function != LinearFunction():
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
                         neighbours: int = 3, function: FunctionClass = LinearFunction(),
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
