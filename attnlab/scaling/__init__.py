"""Scaling-law fits: Kaplan et al. 2020, Chinchilla (Hoffmann et al. 2022) approaches 1-3, and
Clark et al. 2022's law of routed models (``fit_clark``).

    from attnlab.scaling import fit_approach3
    fit = fit_approach3(n, d, loss, n_bootstrap=1000)
    fit.params["alpha"], fit.ci["alpha"], fit.predict_optimal(1e21)

    from attnlab.scaling import FitRequest     # a sweep's table, read once, in any mode
    table, fit = FitRequest.of("sweeps/isoflop", law="chinchilla", approach=3).fit()

The laws live in ``laws/`` (one file each and ``laws/registry.py``), the tables and the modes
they are fitted in (picks, hold-outs, groups, redraws) in ``tables/``; the two never import each
other, and ``request.py`` joins them.

Everything is fitted in float64; intervals are bootstrap percentile intervals (Clark et al.'s law:
Student t intervals, and a bootstrap as a check). See docs/scaling.md.
"""

from attnlab.scaling.columns import parse_columns
from attnlab.scaling.equations import (allocation_coefficient, allocation_exponents,
                                       chinchilla_loss, chinchilla_optimal, kaplan_loss,
                                       kaplan_optimal, training_flops)
from attnlab.scaling.errors import FitError, FitInputError, GridEdgeWarning
from attnlab.scaling.laws.approach1 import fit_approach1, lower_envelope
from attnlab.scaling.laws.approach2 import fit_approach2, isoflop_profiles, parabola_vertex
from attnlab.scaling.laws.approach3 import (CHINCHILLA_GRID, InitGrid, fit_approach3,
                                            huber_objective)
from attnlab.scaling.laws.clark import ClarkFit, fit_clark
from attnlab.scaling.laws.kaplan import fit_kaplan
from attnlab.scaling.laws.registry import law_named
from attnlab.scaling.points import ScalingTable, budget_labels
from attnlab.scaling.request import FitRequest
from attnlab.scaling.result import ScalingFit
from attnlab.scaling.tables.fitting import fit_table, flops_per_param_token
from attnlab.scaling.tables.prepare import prepare_curves, prepare_points
from attnlab.scaling.tables.read import Inputs, read_curves, read_table

__all__ = [
    "CHINCHILLA_GRID", "ClarkFit", "FitError", "FitInputError", "FitRequest", "GridEdgeWarning",
    "InitGrid", "Inputs",
    "ScalingFit", "ScalingTable", "allocation_coefficient", "allocation_exponents",
    "budget_labels", "chinchilla_loss", "chinchilla_optimal", "fit_approach1", "fit_approach2",
    "fit_approach3", "fit_clark", "fit_kaplan", "fit_table", "flops_per_param_token",
    "huber_objective", "isoflop_profiles", "kaplan_loss", "kaplan_optimal", "law_named",
    "lower_envelope",
    "parabola_vertex", "parse_columns", "prepare_curves", "prepare_points", "read_curves",
    "read_table", "training_flops",
]
