"""What the laws of whole learning curves share (``multipower.py``, ``annealing.py``): they
read a curves table with each step's rate (``scaling/curves.py``), are fitted by
``scaling/curvefit.py``, predict any schedule's curve (``--predict-schedule``) and are held out
by run (``--holdout=run:NAME``, ``scaling/tables/schedule_fits.py``)."""

from __future__ import annotations

import numpy as np

from attnlab.cli_vocab import Flag
from attnlab.scaling import curvefit
from attnlab.scaling.curves import Curve, curves_from_table, schedule_curve
from attnlab.scaling.law import Law
from attnlab.scaling.result import ScalingFit

PREDICT_SCHEDULE = Flag(
    "predict-schedule", "string", None, "--law=multipower or annealing: the curve the fitted "
    "law predicts for a schedule, in the fields of attnlab's schedule classes, e.g. "
    "wsd:peak=3e-4,warmup_steps=100,total_steps=3000,decay_fraction=0.2,cooldown=linear "
    "(cosine, constant, wsd, noam; several separated by ';').")


class CurveLaw(Law):
    """A law of whole curves under their schedules: a ``curvefit.CurveModel`` (``model``) fitted
    to a curves table's runs."""

    capabilities = frozenset({"curves", "schedule"})
    flags = (PREDICT_SCHEDULE,)
    refused = ("by", "cluster", "floor", "pair", "budget", "train-longer", "multiplier-against")
    scope = "one fit of whole learning curves, each run's curve resampled whole"
    column_names = ("lr",)

    def model(self, settings) -> curvefit.CurveModel:
        raise NotImplementedError

    def options(self, given):
        specs = [s for s in (given.get("predict-schedule") or "").split(";") if s.strip()]
        return {"predict": tuple(schedule_curve(s) for s in specs)}

    def curves(self, table, source: str, columns=None) -> tuple[list[Curve], list[str]]:
        """(curves, notes) of a curves table, or the curves as they are."""
        if isinstance(table, (list, tuple)):
            return list(table), []
        return curves_from_table(table, source=source, columns=columns)

    def fit(self, table, *, n_bootstrap, ci_level, seed, source="curves", columns=None,
            **settings) -> ScalingFit:
        """The fit to a curves table (or a list of ``Curve``) with intervals over runs."""
        curves, notes = self.curves(table, source, columns)
        return curvefit.fit_curves(self.model(settings), self, curves, n_bootstrap=n_bootstrap,
                                   ci_level=ci_level, seed=seed, source=source, notes=notes)

    def predict(self, params, curve: Curve, settings=None) -> np.ndarray:
        """The loss the law predicts at the curve's steps."""
        return self.model(settings or {}).loss(params, curve)
