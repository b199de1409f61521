"""The forecasters a law's hold-out sets beside it, by the names laws declare
(``Law.forecasters``): the standard ones of ``forecasters.FORECASTERS``, and those that are
the baselines of one law:

  chinchilla       a direct approach-3 fit of the table's loss on (N, D) (loss-to-loss: the
                   target fitted on its own, not through the source)
  step2 alone      two-step: the sigmoid fitted on the kept runs applied to a held-out run's
                   observed task loss (what the prediction would be were step 1 exact)
  power in C       two-step: the error 1 - Acc = E + A C^-a over the kept runs, a direct fit
                   of accuracy in compute
"""

from __future__ import annotations

import numpy as np

from attnlab.scaling.errors import FitError, FitInputError
from attnlab.scaling.laws import approach3, two_step
from attnlab.scaling.tables.forecasters import (FORECASTERS, Forecaster, fit_frontier,
                                                frontier_loss)


class DirectChinchilla(Forecaster):
    name = column = "chinchilla"
    needs = "5 distinct kept (N, D) points and an approach-3 fit of them"
    grid = approach3.CHINCHILLA_GRID  # approach 3's own (tests coarsen it)

    def predict(self, kept, test):
        try:
            fit = approach3.fit_approach3(*(kept[c].to_numpy(np.float64)
                                            for c in ("params", "tokens", "loss")),
                                          grid=self.grid)
        except (FitError, FitInputError):
            return np.full(len(test), np.nan), [None] * len(test)
        values = fit.loss(test["params"].to_numpy(np.float64), test["tokens"].to_numpy(np.float64))
        return np.asarray(values, np.float64), ["approach 3 of the loss on (N, D)"] * len(test)


class StepTwoAlone(Forecaster):
    name = "step2 alone"
    column = "step2"
    needs = "4 kept runs with distinct task losses"

    def predict(self, kept, test):
        params = two_step.fit_sigmoid(kept["task_loss"], kept["loss"])
        if params is None:
            return np.full(len(test), np.nan), [None] * len(test)
        return two_step.accuracy(params, test["task_loss"]), ["sigmoid of the observed task "
                                                              "loss"] * len(test)


class ErrorPowerLaw(Forecaster):
    name = "power in C"
    column = "error_power"
    needs = "3 kept runs"

    def predict(self, kept, test):
        params = fit_frontier(kept["flops"].to_numpy(np.float64),
                              1.0 - kept["loss"].to_numpy(np.float64))
        if params is None:
            return np.full(len(test), np.nan), [None] * len(test)
        return 1.0 - frontier_loss(params, test["flops"]), ["1 - Acc = E + A C^-a"] * len(test)


BY_NAME = {cls.name: cls for cls in FORECASTERS + (DirectChinchilla, StepTwoAlone,
                                                   ErrorPowerLaw)}
NEEDS = {name: cls.needs for name, cls in BY_NAME.items()}


def forecasters_of(law) -> tuple[type[Forecaster], ...]:
    """The forecaster classes ``law`` declares, in its order."""
    return tuple(BY_NAME[name] for name in law.forecasters)
