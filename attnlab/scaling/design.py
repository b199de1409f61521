"""Will a planned sweep pin approach 3's law? A check of the plan's (N, D) points before training.

Approach 3 fits theta = (a, b, e, alpha, beta) of log L = LSE(a - alpha log N, b - beta log D, e)
(Hoffmann et al. 2022 Sec. 3.3; ``approach3``). Near a prior law, a least-squares fit of log L
with independent noise sigma (the seed-to-seed spread of a final loss) has, to first order, the
covariance sigma^2 (J^T J)^-1, J[i, k] = d log L_i / d theta_k (the Gauss-Newton / Fisher
approximation). Points that vary N and D together (ladders centred on each budget's optimum) make
the columns of alpha and beta nearly collinear with each other and with a, b: J^T J is
ill-conditioned and the expected intervals are wide, whatever the training. So a plan is checked
by the expected 95% interval widths of the allocation exponent a = beta / (alpha + beta) and of
the floor E (delta method), and by the condition number of J with unit-norm columns.

A ladder's branches share their trunk's initialisation, data order and constant phase, so most
of a seed's noise moves a trunk's branches together: with ``groups`` (a trunk per point) the
noise covariance is sigma^2 ((1 - s) I + s C), C[i, j] = 1 within a trunk, and the covariance
of the least-squares fit the sandwich (J^T J)^-1 J^T Sigma J (J^T J)^-1; independent points
(``groups`` None, or each its own) give sigma^2 (J^T J)^-1 again.

The prior is the approach-3 law of the byte-level IsoFLOP study (experiments/chinchilla_isoflop.py,
pystdlib, CPU scale, docs/results.md); at another scale or on other data pass your own
(``check_design(..., prior=...)``). The widths are first-order: a fit whose law is far from the
prior, or noise beyond the linear regime, gives wider intervals, so a warning is a reliable "this
plan cannot conclude", and its absence is no promise.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import stats

# experiments/chinchilla_isoflop.py's approach-3 fit (docs/results.md: 1,000 bootstrap refits).
DESIGN_PRIOR = {"E": 1.031, "A": 741.9, "B": 2438.0, "alpha": 0.752, "beta": 0.595}
# Seed-to-seed spread of a final loss at small scale: 0.5-2% (docs/scaling.md); 1% in log L.
SEED_NOISE = 0.01
# Share of that noise a trunk's branches share: the simulated ladders' (docs/scaling_studies.md,
# "Bootstrap coverage on simulated ladders": a 1% trunk effect, 0.2% of each branch's own).
TRUNK_SHARE = 1.0 / (1.0 + 0.2 ** 2)
# The widths a study should reach to conclude (95% intervals).
TARGET_WIDTHS = {"a": 0.25, "E": 0.3}
# Beyond this the columns of J are numerically dependent: some parameter is not determined.
SINGULAR_CONDITION = 1e10


@dataclasses.dataclass(frozen=True)
class DesignCheck:
    """points: planned (N, D) points; sizes: distinct N; condition: of J with unit-norm columns;
    widths: name -> expected interval width at ``level`` (inf: not determined by the plan);
    trunks: how many trunks share the points' noise (0: independent points), ``shared`` of it."""

    points: int
    sizes: int
    condition: float
    widths: dict[str, float]
    level: float
    noise: float
    trunks: int = 0
    shared: float = 0.0

    def _noise_words(self) -> str:
        words = f"{100 * self.noise:g}% seed noise"
        return words + (f" ({100 * self.shared:.0f}% of it shared by a trunk's branches, "
                        f"{self.trunks} trunks)" if self.trunks else "")

    def warnings(self, targets: dict[str, float] = TARGET_WIDTHS) -> list[str]:
        """One line per way the plan falls short, empty when it pins the law."""
        level = f"{100 * self.level:g}%"
        if self.sizes < 2 or not math.isfinite(self.widths["a"]):
            return [f"the plan's {self.points} points ({self.sizes} size(s)) cannot separate "
                    f"the law's terms E, A/N^alpha, B/D^beta (J^T J singular, condition "
                    f"{self.condition:.3g}): approach 3's law will not be pinned; plan >= 3 "
                    f"sizes, each at >= 3 token counts"]
        short = [f"{name} {self.widths[name]:.2g} (target <= {target:g})"
                 for name, target in targets.items() if self.widths[name] > target]
        if not short:
            return []
        return [f"the plan may not pin approach 3's law: expected {level} interval widths "
                f"{', '.join(short)} at {self._noise_words()} (condition "
                f"{self.condition:.3g}); add tokens per parameter per size, sizes or seeds"]

    def describe(self) -> str:
        level = f"{100 * self.level:g}%"
        widths = ", ".join(f"{name} {w:.2g}" for name, w in self.widths.items())
        return (f"design: {self.points} points, {self.sizes} sizes; expected {level} widths at "
                f"{self._noise_words()}: {widths}; condition {self.condition:.3g}")


def log_loss_jacobian(params: dict, n, d) -> np.ndarray:
    """[points, 5]: d log L / d (a, b, e, alpha, beta) at ``params`` (E, A, B, alpha, beta).

    With terms t = (A/N^alpha, B/D^beta, E) and weights w = t / L (L = sum t):
    d/da = w_N, d/db = w_D, d/de = w_E, d/dalpha = -w_N log N, d/dbeta = -w_D log D."""
    n, d = np.asarray(n, np.float64), np.asarray(d, np.float64)
    terms = np.stack([params["A"] * n ** -params["alpha"], params["B"] * d ** -params["beta"],
                      np.full_like(n, params["E"])], axis=-1)
    w = terms / terms.sum(axis=-1, keepdims=True)
    return np.stack([w[:, 0], w[:, 1], w[:, 2], -w[:, 0] * np.log(n), -w[:, 1] * np.log(d)],
                    axis=-1)


def parameter_covariance(jacobian: np.ndarray, noise: float, groups=None,
                         shared: float = 0.0) -> tuple[np.ndarray, float]:
    """(the least-squares fit's covariance, the condition number of J with unit-norm columns):
    sigma^2 (J^T J)^-1 for independent points, the sandwich when ``groups`` (a label per point)
    share ``shared`` of the noise; inf where J's columns are dependent."""
    scale = np.linalg.norm(jacobian, axis=0)
    scaled = jacobian / np.where(scale > 0, scale, 1.0)
    # Fewer points than parameters: np.linalg.cond sees only the nonzero singular values.
    rows, columns = jacobian.shape
    condition = float(np.linalg.cond(scaled)) if rows >= columns else math.inf
    if not (scale > 0).all() or not condition < SINGULAR_CONDITION:
        return np.full((jacobian.shape[1],) * 2, np.inf), condition
    inverse = np.linalg.inv(scaled.T @ scaled)
    if groups is not None and shared > 0:
        labels = np.asarray(groups)
        sigma = (1 - shared) * np.eye(len(labels)) + shared * (labels[:, None] == labels[None, :])
        inverse = inverse @ (scaled.T @ sigma @ scaled) @ inverse
    return noise ** 2 * inverse / np.outer(scale, scale), condition


def check_design(n, d, *, prior: dict = DESIGN_PRIOR, noise: float = SEED_NOISE,
                 level: float = 0.95, trunks=None, shared: float = TRUNK_SHARE) -> DesignCheck:
    """The expected interval widths of approach 3's a (= beta / (alpha + beta)), E, alpha and
    beta if runs at (n, d) (parameters, tokens: [points]) follow ``prior`` with log-noise
    ``noise``; ``trunks`` (a trunk per point, or None) share ``shared`` of it."""
    n, d = np.asarray(n, np.float64), np.asarray(d, np.float64)
    grouped = trunks is not None and len(set(trunks)) < len(n)
    cov, condition = parameter_covariance(log_loss_jacobian(prior, n, d), noise,
                                          trunks if grouped else None, shared)
    alpha, beta = prior["alpha"], prior["beta"]
    # Delta method: gradients in theta = (a, b, e, alpha, beta).
    gradients = {"a": np.array([0, 0, 0, -beta, alpha]) / (alpha + beta) ** 2,
                 "E": np.array([0, 0, prior["E"], 0, 0]),
                 "alpha": np.eye(5)[3], "beta": np.eye(5)[4]}
    z = stats.norm.ppf(0.5 + level / 2)
    widths = {}
    for name, g in gradients.items():
        with np.errstate(invalid="ignore"):
            variance = float(g @ cov @ g) if np.isfinite(cov).all() else math.inf
        widths[name] = 2 * z * math.sqrt(variance) if variance >= 0 else math.inf
    return DesignCheck(points=len(n), sizes=len(np.unique(n)), condition=condition,
                       widths=widths, level=level, noise=noise,
                       trunks=len(set(trunks)) if grouped else 0,
                       shared=shared if grouped else 0.0)
