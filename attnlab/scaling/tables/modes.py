"""The modes a law is fitted in, each one class and a line of :data:`MODES`: one fit of the
whole table, one fit per group (``--by``), a hold-out (``--holdout``), and the own fit of a law
that reads the results table itself (Clark et al.'s, the hyperparameter law).

A mode is handed a fit request (``scaling.request.FitRequest``: the law, its settings, the
columns, the bootstrap plan) and the tables it read (``read.Inputs``); ``run`` fits, ``report``
says what the fit found: the text ``attnlab fit`` prints and its JSON.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

from attnlab.scaling.errors import FitInputError, GridEdgeWarning
from attnlab.scaling.points import ScalingTable
from attnlab.scaling.result import ScalingFit, jsonable
from attnlab.scaling.tables.coverage import format_coverage, simulated_coverage
from attnlab.scaling.tables.fitting import fit_table, points_for
from attnlab.scaling.tables.forecasters import with_baselines
from attnlab.scaling.tables.grouped import fit_by, format_grouped
from attnlab.scaling.tables.holdout import (LEAVE_FUTURE_OUT, format_holdout, format_rolling,
                                            holdout_prediction, leave_future_out)
from attnlab.scaling.tables.multiplier import format_multipliers, grouped_multipliers
from attnlab.scaling.tables.picks import best_points, format_picks
from attnlab.scaling.tables.read import Inputs, read_curves, read_table
from attnlab.scaling.tables.repick import redraw_picks
from attnlab.scaling.tables.report import below_floor, format_report, format_trained_longer
from attnlab.scaling.tables.schedule_fits import Schedules


@dataclasses.dataclass(frozen=True)
class Report:
    """What a report adds to the fit: the FLOP ``budgets`` of its compute-optimal predictions,
    the token multipliers of ``longer`` (--train-longer), the group the others' compute
    multipliers are measured ``against``."""

    budgets: tuple[float, ...] = ()
    longer: tuple[float, ...] = ()
    against: str | None = None
    coverage: int = 0  # tables simulated to check the intervals' coverage (tables/coverage.py)


SWEEP_REQUIRED = "--sweep=DIR is required (a sweep directory or its results .parquet/.csv)"


def read_inputs(request) -> Inputs:
    """The tables a request fits, read once: the results (with --best-over, each point's best
    runs and the picks) or approach 1's curves (with the results they join N from)."""
    if request.law.can("curves"):
        source = request.curves or request.sweep
        if not source:
            raise FitInputError("approach 1 needs --curves=FILE (or --sweep=DIR)")
        joined = request.sweep and (request.by or (request.curves
                                                   and Path(request.sweep).exists()))
        runs = read_table(request.sweep) if joined else None
        return Inputs(runs=runs, kept=runs, curves=read_curves(source))
    if not request.sweep:
        raise FitInputError(SWEEP_REQUIRED)
    runs = read_table(request.sweep)
    if not request.best_over:
        return Inputs(runs=runs, kept=runs)
    kept, picks = best_points(runs, over=request.best_over, law=request.law, by=request.by,
                              columns=request.columns, source=request.sweep, pair=request.pair)
    return Inputs(runs=runs, kept=kept, picks=picks)


def table_of(request, inputs: Inputs) -> ScalingTable:
    """The checked table of a fit: the runs' final points, or approach 1's curves."""
    law = request.law
    source = (request.curves or request.sweep) if law.can("curves") else request.sweep
    return points_for(law, inputs.kept, curves=inputs.curves, source=str(source),
                      columns=request.columns, cluster=request.cluster)


def fit_options(request) -> dict:
    """The keyword arguments of ``fit_table`` a request sets."""
    return dict(n_bootstrap=request.n_bootstrap, ci_level=request.ci_level, seed=request.seed,
                fixed=dict(request.fixed) or None, **request.settings)


class Mode:
    name = ""

    def run(self, request, inputs: Inputs):
        raise NotImplementedError

    def report(self, request, inputs: Inputs, outcome, report: Report) -> tuple[str, dict]:
        raise NotImplementedError


class OneFit(Mode):
    """One fit of the whole table: (the checked table, the fit)."""

    name = "one"

    def run(self, request, inputs):
        table = table_of(request, inputs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", GridEdgeWarning)  # reported from fit.warnings
            fit = fit_table(table, law=request.law, **fit_options(request))
        if request.redraws:
            fit = redrawn(request, fit, inputs.runs)
        return table, fit

    def report(self, request, inputs, outcome, report):
        """The fit, its --train-longer losses and the law's own lines."""
        table, fit = outcome
        extra, entries = request.law.extra_report(fit, list(report.budgets), request.settings)
        text = (format_report(fit, table.source, list(report.budgets), request.floor, table)
                + format_trained_longer(fit, list(report.budgets), list(report.longer)) + extra)
        payload = with_baselines(fit.to_dict(report.budgets, report.longer),
                                 table.frame) | entries
        if request.floor is not None:
            low = below_floor(fit, list(report.budgets), request.floor)
            payload["floor"] = request.floor
            for prediction in payload.get("predictions", []):
                prediction["below_floor"] = prediction["C"] in low
        if report.coverage:
            checked = simulated_coverage(table, fit, sims=report.coverage,
                                         **fit_options(request))
            text += "\n" + format_coverage(checked)
            payload["coverage"] = checked.to_dict()
        return text, payload


def redrawn(request, fit: ScalingFit, runs) -> ScalingFit:
    """``fit`` with intervals that redraw its --best-over picks among ``runs``."""
    def fit_kept(kept, n, seed):
        one = dataclasses.replace(request, seed=seed, n_bootstrap=n, pair=None)
        return OneFit().run(one, Inputs(runs=kept, kept=kept))[1]

    return redraw_picks(fit, runs, law=request.law, over=request.best_over, pair=request.pair,
                        columns=request.columns, n_bootstrap=request.n_bootstrap,
                        seed=request.seed, fit_kept=fit_kept)


class Groups(Mode):
    """One fit per value of the ``by`` column, side by side, with compute multipliers against
    one group."""

    name = "by"

    def run(self, request, inputs):
        grouped = fit_by(inputs.kept, request.by, law=request.law, source=request.sweep,
                         columns=request.columns, curves=inputs.curves,
                         cluster=request.cluster, **fit_options(request))
        if request.redraws:
            one = dataclasses.replace(request, by=None)
            for label, fit in grouped.fits.items():
                rows = inputs.runs[inputs.runs[request.by].astype(str) == label]
                grouped.fits[label] = redrawn(one, fit, rows)
        return grouped

    def report(self, request, inputs, grouped, report):
        budgets = list(report.budgets)
        text = format_grouped(grouped, budgets)
        payload = grouped.to_dict(budgets)
        for group, fit_payload in payload.get("groups", {}).items():
            if group in grouped.tables:
                with_baselines(fit_payload, grouped.tables[group].frame)
        if report.against:
            frame = grouped_multipliers(grouped, report.against, budgets)
            text += "\n" + format_multipliers(frame)
            payload["multipliers"] = jsonable(frame.to_dict(orient="records"))
        return text, payload


class HoldOut(Mode):
    """The fit without the runs ``holdout`` holds out, and its predictions for them."""

    name = "holdout"

    def run(self, request, inputs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", GridEdgeWarning)
            return holdout_prediction(table_of(request, inputs), law=request.law,
                                      holdout=request.holdout, floor=request.floor,
                                      **fit_options(request))

    def report(self, request, inputs, held, report):
        budgets = list(report.budgets)
        text = (format_report(held.fit, request.sweep or "", budgets, table=held.kept) + "\n"
                + format_holdout(held))
        predictions = held.fit.to_dict(budgets).get("predictions") or []
        return text, held.to_dict() | (with_baselines({"predictions": predictions},
                                                      held.kept.frame) if budgets else {})


class LeaveFutureOut(Mode):
    """Each budget predicted from the budgets below it, rolled forward."""

    name = LEAVE_FUTURE_OUT

    def run(self, request, inputs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", GridEdgeWarning)
            return leave_future_out(table_of(request, inputs), law=request.law,
                                    **fit_options(request))

    def report(self, request, inputs, rolled, report):
        return format_rolling(rolled), rolled.to_dict()


class OwnFit(Mode):
    """A law that fits the results table itself, with its own report."""

    name = "own"

    def run(self, request, inputs):
        pair = {"pair": request.pair} if request.law.can("pair") else {}
        return request.law.fit(inputs.runs, n_bootstrap=request.n_bootstrap,
                               source=request.sweep, ci_level=request.ci_level,
                               seed=request.seed, columns=request.columns, **pair,
                               **request.settings)

    def report(self, request, inputs, fit, report):
        return request.law.report(fit, request.sweep), jsonable(fit.to_dict())


MODES = {mode.name: mode for mode in (OneFit, Groups, HoldOut, LeaveFutureOut, OwnFit,
                                      Schedules)}


def mode_of(request) -> Mode:
    """The mode a request is fitted in: a law's own fit, the groups, the hold-out, or one."""
    if request.law.can("schedule"):
        return MODES["schedule"]()
    if not request.law.can("table"):
        return OwnFit()
    if request.holdout == LEAVE_FUTURE_OUT:
        return LeaveFutureOut()
    return MODES["by" if request.by else "holdout" if request.holdout else "one"]()


def picks_report(request, inputs: Inputs) -> tuple[str, dict]:
    """The --best-over picks as text and JSON (nothing without them)."""
    if inputs.picks is None:
        return "", {}
    text = format_picks(inputs.picks, over=request.best_over, metric="loss",
                        what="each (N, D) point", fixed=not request.redraws)
    payload = {"best_over": request.best_over,
               "picks": jsonable(inputs.picks.to_dict(orient="records"))}
    return text, payload | ({"pair": request.pair} if request.pair else {})
