"""The figures ``attnlab plot --kind`` draws: each one class, registered in :data:`FIGURES` by its
name, that says what it shows, what it needs of the flags, and fits and draws it. With ``--by``,
a figure of one fit is drawn once per group, one row each (``plot_by_group``), each group fitted
as ``attnlab fit --by`` fits it. A figure names its law from the flags (``law``) and draws from
the fit request they make (``draw``)."""

from __future__ import annotations

import dataclasses
import sys
from typing import ClassVar

from attnlab.plots import scaling as scaling_plots
from attnlab.plots.curves import plot_schedule_fits
from attnlab.plots.forecasts import plot_leave_future_out
from attnlab.plots.hparams import plot_hparams
from attnlab.scaling.errors import FitError, FitInputError
from attnlab.scaling.law import Law
from attnlab.scaling.laws import hparams, registry
from attnlab.scaling.request import FitRequest, Inputs, law_from_flags
from attnlab.scaling.tables.grouped import group_values
from attnlab.scaling.tables.holdout import LEAVE_FUTURE_OUT

BAND_FLAGS = ("bootstrap", "ci-level", "bootstrap-seed")
FIT_ONLY = ("fix", "grid", "cluster", "profile", "window", "best-over", "pair")


class Figure:
    """A figure kind of one fit: ``law`` says which, ``panel`` draws it (into one row of a
    figure per group with --by)."""

    name: ClassVar[str]
    help: ClassVar[str]
    bootstrap: ClassVar[int] = 0  # refits for the bands when --bootstrap is not given
    own_fit: ClassVar[bool] = False  # draws a law with its own fit (not an (N, D, L) table's)
    size: ClassVar[tuple[float, float]] = (11, 4.4)  # one group's row, with --by

    def check(self, values, holdout: str | None) -> None:
        """Refuses flags the figure cannot be drawn from (FitInputError naming the flag): a
        --holdout, and a --law, --approach or --form naming a law other than the one it draws."""
        if holdout:
            raise FitInputError(f"--holdout draws --kind=holdout; --kind={self.name} would "
                                f"ignore it")
        name, approach, form = (values[f].value for f in ("law", "approach", "form"))
        if name or approach or form:  # what is not given is the figure's
            drawn = self.law(values)
            asked = registry.law_named(name or drawn.name,
                                       int(approach) if approach else drawn.approach,
                                       form or drawn.form)
            if type(asked) is not type(drawn):
                raise FitInputError(f"--kind={self.name} draws {drawn.short_title}, not "
                                    f"{asked.short_title}: leave out --law, --approach and "
                                    f"--form")

    def check_flags(self, values) -> None:
        """Refuses the flags of the intervals (--bootstrap, --ci-level, --bootstrap-seed) where
        the figure draws no interval bands (``bootstrap`` 0)."""
        for name in BAND_FLAGS if not self.bootstrap else ():
            if values[name].present:
                raise FitInputError(f"--{name}: --kind={self.name} draws no interval bands; "
                                    f"leave it out")

    def law(self, values) -> Law:
        return law_from_flags(values, "chinchilla")

    def panel(self, fit, frame, into=None):
        raise NotImplementedError

    def draw(self, request: FitRequest):
        if not request.by:
            table, fit = request.fit()
            return self.panel(fit, table.frame)
        grouped = request.grouped()
        panels = {group: (lambda into, fit=fit, table=grouped.tables[group]:
                          self.panel(fit, table.frame, into))
                  for group, fit in grouped.fits.items()}
        notes = [f"not fitted: {group} ({why})" for group, why in grouped.skipped.items()]
        return scaling_plots.plot_by_group(request.by, panels, self.size, notes)


class LossVsParams(Figure):
    name = "loss-vs-params"
    help = "loss against N per D with Kaplan lines"
    size = (7.4, 4.6)

    def law(self, values):
        return law_from_flags(values, "kaplan")

    def panel(self, fit, frame, into=None):
        return scaling_plots.plot_loss_vs_params(frame, fit, into)

    def draw(self, request):
        if request.by:
            return super().draw(request)
        inputs = request.read()
        try:
            table, fit = request.fit(inputs)
        except FitError as error:  # the runs are worth seeing without their law's lines
            why = f"no fitted lines: {error}"
            sys.stderr.write(f"warning: {why}\n")
            return scaling_plots.plot_loss_vs_params(request.table(inputs).frame, missing=why)
        return self.panel(fit, table.frame)


class LossVsCompute(Figure):
    name = "loss-vs-compute"
    help = "loss against FLOPs with the frontier"
    size = (6.4, 4.6)

    def law(self, values):
        return registry.law_named(values["law"].value or "chinchilla",
                                  1 if values["curves"].value else None, values["form"].value)

    def panel(self, fit, frame, into=None):
        return scaling_plots.plot_loss_vs_compute(frame, fit, into)

    def check(self, values, holdout):
        approach = values["approach"].value
        if approach and not values["curves"].value:
            raise FitInputError(f"--approach={approach}: --kind={self.name} fits "
                                f"nothing without --curves (approach 1's envelope); leave it out")
        super().check(values, holdout)

    def check_flags(self, values):
        super().check_flags(values)
        for name in FIT_ONLY if not values["curves"].present else ():
            if values[name].present:
                raise FitInputError(f"--{name}: --kind={self.name} without --curves draws the "
                                    f"runs and fits nothing; leave it out")

    def draw(self, request):
        if request.curves:  # approach 1's envelope is the frontier
            return super().draw(request)
        inputs = request.read()  # the runs themselves: nothing to fit
        if not request.by:
            return self.panel(None, request.table(inputs).frame)
        raw = inputs.kept
        panels = {str(group): (lambda into, rows=raw[raw[request.by] == group]:
                               self.panel(None, request.table(Inputs(rows, rows)).frame, into))
                  for group in group_values(raw, request.by, str(request.sweep))}
        return scaling_plots.plot_by_group(request.by, panels, self.size)


class IsoFLOPProfiles(Figure):
    name = "isoflop"
    help = "IsoFLOP parabolas (Chinchilla Fig. 3)"

    def law(self, values):
        return registry.law_named("chinchilla", 2)

    def panel(self, fit, frame, into=None):
        return scaling_plots.plot_isoflops(fit, into)


class Contours(Figure):
    name = "contours"
    help = "fitted L(N, D) with the efficient frontier (Chinchilla Fig. 4)"
    size = (6.8, 5.0)

    def law(self, values):
        return registry.law_named("chinchilla", 3)

    def panel(self, fit, frame, into=None):
        return scaling_plots.plot_loss_contours(fit, frame, into)


class Allocation(Figure):
    name = "allocation"
    help = "N_opt(C) and D_opt(C) with interval bands"
    bootstrap = 200

    def panel(self, fit, frame, into=None):
        return scaling_plots.plot_optimal_allocation(fit, frame, into=into)


class Holdout(Figure):
    name = "holdout"
    help = "predicted against observed loss of the runs --holdout leaves out"
    bootstrap = 200

    def check(self, values, holdout):
        if not holdout:
            raise FitInputError("--kind=holdout needs --holdout=... (e.g. largest-budget)")
        if values["by"].value:
            raise FitInputError("--by and --holdout: draw one group's table at a time; "
                                "together they are not supported (as in attnlab fit)")

    def draw(self, request):
        return scaling_plots.plot_holdout(request.held_out())


class LeaveFutureOut(Figure):
    name = "leave-future-out"
    help = ("each budget's error predicted from the budgets below it, the law against the "
            "forecasters")

    def check(self, values, holdout):
        super().check(values, holdout)
        if values["by"].value:
            raise FitInputError("--by does not apply to --kind=leave-future-out: draw one "
                                "group's table at a time")

    def draw(self, request):
        rolled = dataclasses.replace(request, holdout=LEAVE_FUTURE_OUT).run()
        return plot_leave_future_out(rolled)


class Frontiers(Figure):
    name = "frontiers"
    help = "every --by group's compute-optimal frontier in one figure"
    bootstrap = 200

    def check(self, values, holdout):
        super().check(values, holdout)
        if not values["by"].value:
            raise FitInputError("--kind=frontiers needs --by=COLUMN (e.g. model.pos_encoding)")

    def draw(self, request):
        return scaling_plots.plot_group_frontiers(request.grouped())


class HParams(Figure):
    name = "hparams"
    help = ("loss against the learning rate per (N, D) group, a line per batch size, with the "
            "group's optimum and the law's")
    own_fit = True

    def law(self, values):
        return registry.law_named("hparams")

    def check(self, values, holdout):
        super().check(values, holdout)
        if values["by"].value:
            raise FitInputError("--by does not apply to --kind=hparams: its panels are the "
                                "(N, D) groups already")

    def draw(self, request):
        inputs = request.read()
        try:
            fit = request.own_fit(inputs)
        except FitInputError as error:  # the runs and their optima are worth seeing alone
            settings = request.settings
            runs, _ = hparams.read_runs(inputs.runs, request.sweep, request.columns,
                                        request.pair, settings["size"])  # bad input again
            sys.stderr.write(f"warning: no law drawn: {error}\n")
            return plot_hparams(runs, hparams.group_optima(runs, settings["method"],
                                                           settings["near"]),
                                missing=f"no law: {error}")
        return plot_hparams(fit.frame, fit.optima, fit.laws)


class Curves(Figure):
    name = "curves"
    help = ("a law of whole curves (--law=multipower, annealing) against each run's observed "
            "curve, the runs --holdout=run:NAME leaves out marked")
    own_fit = True  # its own mode (tables/schedule_fits.py), not an (N, D, L) table's fit

    def law(self, values):
        law = law_from_flags(values, "multipower")
        if not law.can("schedule"):
            raise FitInputError(f"--kind=curves draws a law of whole curves (multipower, "
                                f"annealing), not --law={law.name}")
        return law

    def check(self, values, holdout):
        if values["by"].value:
            raise FitInputError("--by does not apply to --kind=curves: its lines are the runs")

    def draw(self, request):
        return plot_schedule_fits(request.run())


FIGURES: dict[str, type[Figure]] = {c.name: c for c in (
    LossVsParams, LossVsCompute, IsoFLOPProfiles, Contours, Allocation, Holdout, LeaveFutureOut,
    Frontiers, HParams, Curves)}
