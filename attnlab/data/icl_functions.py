"""Function classes of in-context regression (Garg et al. 2022, sections 3-4): what ``y = f(x)``
a prompt's examples come from (``data.icl_function``).

Every class is scaled so that ``E[f(x)^2] = d`` for ``x ~ N(0, I_d)``: the zero predictor's
error is ``d`` in each, and the reports' "squared error / d" is the fraction of it left.

* ``linear``: ``f(x) = w . x``, ``w ~ N(0, I_d)``.
* ``sparse_linear``: ``w`` with ``s = data.icl_sparsity`` non-zero coordinates (a uniform
  random support), each ``N(0, d / s)`` (Garg et al. draw them ``N(0, 1)``; the scale keeps
  ``E[w w^T] = I``, so one-step GD's step size and the linear closed forms still hold).
* ``relu_net``: ``f(x) = sum_i a_i ReLU(w_i . x)`` over ``h = data.icl_hidden`` units,
  ``w_i ~ N(0, I_d)``, ``a_i ~ N(0, 2 / h)`` (Garg et al.'s 2-layer networks; ``E[ReLU(w.x)^2]
  = d / 2``).

A class draws each prompt's function from ``rng`` (:meth:`draw`), evaluates it
(:meth:`apply`), and names the exact float64 baselines it adds to the generic ones of
:func:`attnlab.data.icl_regression.regression_baselines` (:meth:`extra_baselines`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from attnlab.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class FunctionClass:
    """What a class of functions provides; the methods here are the linear class's (the
    others are variations of it)."""

    name = "linear"
    linear = True  # f is w . x with E[w w^T] = I: the closed forms of expected_errors hold
    parameter: ClassVar[tuple[str, str] | None] = None  # (data config field, own field)

    def validate(self, dim: int) -> None:
        """Raises ConfigError naming the field of a setting the class cannot take."""

    def draw(self, rng: np.random.Generator, rows: int, dim: int):
        """One function per prompt: ``w [rows, d]``."""
        return rng.standard_normal((rows, dim))

    def apply(self, params, xs: np.ndarray) -> np.ndarray:
        """``[rows, k, d] -> [rows, k]`` float64: each prompt's function at its inputs."""
        return np.einsum("bkd,bd->bk", xs, params)

    def extra_baselines(self, xs, ys, params, noise: float) -> dict[str, np.ndarray]:
        """name -> ``[rows, k]`` predictions of ``y_k`` from the examples before it."""
        return {}

    def claims(self, error: np.ndarray, baselines: dict[str, np.ndarray], dim: int
               ) -> dict[str, bool]:
        """Garg et al.'s claims for this class on noiseless prompts (claim -> holds), from the
        model's and the baselines' errors at ``k = 0 .. K - 1``: within 0.05 of least squares
        at every ``k >= d + 2``, below one step of GD at every ``k >= d``."""
        k = np.arange(len(error))
        ls_k, gd_k = k >= dim + 2, k >= dim
        if not ls_k.any():
            return {}
        return {
            f"within_0.05_of_least_squares_from_k_{dim + 2}": bool(
                (error[ls_k] - baselines["least_squares"][ls_k] <= 0.05).all()),
            f"below_one_step_gd_from_k_{dim}": bool(
                (error[gd_k] < baselines["one_step_gd"][gd_k]).all())}

    def summary(self) -> dict:
        return {"function": self.name,
                **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}


@dataclasses.dataclass(frozen=True)
class LinearFunction(FunctionClass):
    """Linear functions ``f(x) = w . x``, ``w ~ N(0, I_d)`` (Garg et al. 2022, section 3)."""


@dataclasses.dataclass(frozen=True)
class SparseLinear(FunctionClass):
    """``w`` with ``sparsity`` non-zero coordinates, each ``N(0, d / sparsity)``."""

    sparsity: int = 3
    name = "sparse_linear"
    parameter = ("icl_sparsity", "sparsity")

    def validate(self, dim):
        if not 1 <= self.sparsity <= dim:
            raise ConfigError("data.icl_sparsity", f"must be in 1..data.icl_dim={dim} for "
                              f"data.icl_function=sparse_linear, got {self.sparsity}")

    def draw(self, rng, rows, dim):
        w = rng.standard_normal((rows, dim)) * np.sqrt(dim / self.sparsity)
        support = np.argsort(rng.random((rows, dim)), axis=1)[:, : self.sparsity]
        mask = np.zeros((rows, dim), bool)
        np.put_along_axis(mask, support, True, axis=1)
        return np.where(mask, w, 0.0)

    def extra_baselines(self, xs, ys, params, noise):
        """``support_oracle``: least squares on the true support (the error a learner that
        knew which ``s`` coordinates matter would make; 0 from ``k = s`` without noise)."""
        rows, k, _ = xs.shape
        out = np.zeros((rows, k))
        for b in range(rows):
            support = np.flatnonzero(params[b])
            for n in range(1, k):
                w = np.linalg.lstsq(xs[b, :n][:, support], ys[b, :n], rcond=None)[0]
                out[b, n] = xs[b, n, support] @ w
        return {"support_oracle": out}

    def claims(self, error, baselines, dim):
        """Below least squares at every ``k`` from ``s + 1`` to ``d - 1``: where least squares
        cannot use the sparsity yet (Garg et al. 2022, Fig. 4: the Transformer tracks Lasso)."""
        k = np.arange(len(error))
        between = (k > self.sparsity) & (k < dim)
        if not between.any():
            return {}
        return {f"below_least_squares_for_k_{self.sparsity + 1}_to_{dim - 1}": bool(
            (error[between] < baselines["least_squares"][between]).all())}


@dataclasses.dataclass(frozen=True)
class ReluNet(FunctionClass):
    """``f(x) = sum_i a_i ReLU(w_i . x)``, ``hidden`` units, ``a_i ~ N(0, 2 / hidden)``."""

    hidden: int = 100
    name = "relu_net"
    linear = False
    parameter = ("icl_hidden", "hidden")

    def validate(self, dim):
        if self.hidden < 1:
            raise ConfigError("data.icl_hidden", f"must be >= 1 for data.icl_function="
                              f"relu_net, got {self.hidden}")

    def draw(self, rng, rows, dim):
        w = rng.standard_normal((rows, self.hidden, dim))
        a = rng.standard_normal((rows, self.hidden)) * np.sqrt(2.0 / self.hidden)
        return w, a

    def apply(self, params, xs):
        w, a = params
        return np.einsum("bkh,bh->bk", np.maximum(np.einsum("bkd,bhd->bkh", xs, w), 0.0), a)

    def claims(self, error, baselines, dim):
        """Below least squares at the largest ``k`` (Garg et al. 2022, Fig. 5: the Transformer
        fits the non-linear function better than the best linear one)."""
        return {"below_least_squares_at_the_largest_k": bool(
            error[-1] < baselines["least_squares"][-1])}


FUNCTIONS = {c.name: c for c in (LinearFunction, SparseLinear, ReluNet)}


def function_of(cfg) -> FunctionClass:
    """The function class of a data config (``data.icl_function`` and its parameter field, 0
    for the class's default), checked against ``data.icl_dim``."""
    if cfg.icl_function not in FUNCTIONS:
        raise ConfigError("data.icl_function", f"unknown function class "
                          f"{cfg.icl_function!r}; one of {', '.join(FUNCTIONS)}")
    cls = FUNCTIONS[cfg.icl_function]
    for other in FUNCTIONS.values():
        if other.parameter and other is not cls and getattr(cfg, other.parameter[0]):
            raise ConfigError(f"data.{other.parameter[0]}", f"is read only by "
                              f"data.icl_function={other.name}; data.icl_function={cls.name} "
                              f"does not use it")
    field, name = cls.parameter or (None, None)
    function = cls(**{name: getattr(cfg, field)}) if field and getattr(cfg, field) else cls()
    function.validate(cfg.icl_dim)
    return function
