"""The LR-annealing law (Tissue et al. 2024, arXiv 2408.11029): a loss curve from two areas of
its schedule,

    L(s) = L0 + A S1^-alpha - C S2,
    S1 = sum_{i<=s} eta_i,   S2 = sum_{i<=s} m_i,   m_i = lambda m_{i-1} + (eta_{i-1} - eta_i),

S1 the forward area (the summed rate, warmup included), S2 the annealing area: the drops of the
rate after its peak, each carried on with momentum lambda (0.999 in the paper,
``--annealing-decay``), so that a drop's benefit builds up over the following steps. Four
parameters, all > 0; fitted like the multi-power law (Huber(1e-3) on log L).
"""

from __future__ import annotations

import numpy as np
from scipy.signal import lfilter

from attnlab.cli_vocab import Flag
from attnlab.scaling import curvefit
from attnlab.scaling.curves import Curve
from attnlab.scaling.errors import FitInputError

NAMES = ("L0", "A", "alpha", "C")
DECAY = 0.999  # lambda (Tissue et al. 2024)
C_SHARES = (0.01, 0.1)  # starts: C max S2 as a share of the lowest loss


def annealing_area(curve: Curve, decay: float) -> np.ndarray:
    """[T] S2 after each update: the momentum sum of the drops after the peak."""
    drops = np.zeros(len(curve.lr))
    drops[curve.peak:] = -np.diff(curve.lr)[curve.peak - 1:]
    return np.cumsum(lfilter([1.0], [1.0, -decay], drops))


def annealing_loss(params: dict, curve: Curve, decay: float = DECAY) -> np.ndarray:
    """L = L0 + A S1^-alpha - C S2 at the curve's steps."""
    s2 = annealing_area(curve, decay)[curve.steps - 1]
    return curvefit.s1_loss(params, curve) - params["C"] * s2


def _model(decay: float) -> curvefit.CurveModel:
    def loss(params, curve):
        return annealing_loss(params, curve, decay)

    def jacobian(params, curve):
        s2 = annealing_area(curve, decay)[curve.steps - 1]
        return np.column_stack([curvefit.s1_jacobian(params, curve), -params["C"] * s2])

    def grid(curves):
        floor = min(c.loss.min() for c in curves)
        most = max(annealing_area(c, decay).max() for c in curves) or 1.0
        return np.array([np.append(s, np.log(share * floor / most))
                         for s in curvefit.power_grid(curves) for share in C_SHARES])

    return curvefit.CurveModel(NAMES, loss, jacobian, grid, decay=("C",))


class Annealing(curvefit.CurveLaw):
    """Tissue et al. 2024's law of forward and annealing areas (module docstring)."""

    name = "annealing"
    title = "LR-annealing law (Tissue et al. 2024): L = L0 + A S1^-alpha - C S2"
    n_parameters = len(NAMES)
    exponents = ("alpha",)
    flags = curvefit.CurveLaw.flags + (Flag(
        "annealing-decay", "float", DECAY, "--law=annealing: lambda, the momentum with which "
        "the annealing area S2 carries each drop of the rate (0 < lambda < 1; the paper's "
        "0.999)."),)

    def options(self, given):
        decay = given.get("annealing-decay")
        decay = DECAY if decay is None else float(decay)
        if not 0.0 < decay < 1.0:
            raise FitInputError(f"--annealing-decay must lie in (0, 1), not {decay}")
        return super().options(given) | {"decay": decay}

    def model(self, settings) -> curvefit.CurveModel:
        return _model(settings.get("decay", DECAY))
