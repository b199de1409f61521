"""The figures ``attnlab plot --kind`` draws: each one class, registered in :data:`FIGURES` by its
name, that says what it shows, what it needs of the flags, and fits and draws it. With ``--by``,
a figure of one fit is drawn once per group, one row each (``plot_by_group``), each group fitted
as ``attnlab fit --by`` fits it."""

from __future__ import annotations

import dataclasses
import sys
from typing import ClassVar

from attnlab.plots import scaling as scaling_plots
from attnlab.plots.hparams import plot_hparams
from attnlab.scaling import hparams, registry
from attnlab.scaling.cli import (FitInputs, law_options, load_table, read_results, run_fit,
                                 run_grouped, run_holdout)
from attnlab.scaling.errors import FitError, FitInputError
from attnlab.scaling.grouped import group_values
from attnlab.scaling.table import read_table
from attnlab.scaling.laws import Law


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

    def check(self, inputs: FitInputs, holdout: str | None) -> None:
        """Refuses flags the figure cannot be drawn from (FitInputError naming the flag): a
        --holdout, and a --law, --approach or --form naming a law other than the one it draws."""
        if holdout:
            raise FitInputError(f"--holdout draws --kind=holdout; --kind={self.name} would "
                                f"ignore it")
        if inputs.law or inputs.approach or inputs.form:  # what is not given is the figure's
            drawn = self.law(inputs)
            asked = registry.law_named(inputs.law or drawn.name, inputs.approach or drawn.approach,
                                       inputs.form or drawn.form)
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

    def law(self, inputs: FitInputs) -> Law:
        return inputs.part("chinchilla")

    def panel(self, fit, frame, into=None):
        raise NotImplementedError

    def draw(self, inputs: FitInputs, n_bootstrap: int, holdout: str | None, values=None):
        law = self.law(inputs)
        if not inputs.by:
            table, fit = run_fit(inputs, law, n_bootstrap)
            return self.panel(fit, table.frame)
        grouped = run_grouped(inputs, law, n_bootstrap)
        panels = {group: (lambda into, fit=fit, table=grouped.tables[group]:
                          self.panel(fit, table.frame, into))
                  for group, fit in grouped.fits.items()}
        notes = [f"not fitted: {group} ({why})" for group, why in grouped.skipped.items()]
        return scaling_plots.plot_by_group(inputs.by, panels, self.size, notes)


class LossVsParams(Figure):
    name = "loss-vs-params"
    help = "loss against N per D with Kaplan lines"
    size = (7.4, 4.6)

    def law(self, inputs):
        return inputs.part("kaplan")

    def panel(self, fit, frame, into=None):
        return scaling_plots.plot_loss_vs_params(frame, fit, into)

    def draw(self, inputs, n_bootstrap, holdout, values=None):
        if inputs.by:
            return super().draw(inputs, n_bootstrap, holdout)
        law = self.law(inputs)
        try:
            table, fit = run_fit(inputs, law, n_bootstrap)
        except FitError as error:  # the runs are worth seeing without their law's lines
            why = f"no fitted lines: {error}"
            sys.stderr.write(f"warning: {why}\n")
            return scaling_plots.plot_loss_vs_params(load_table(inputs, law).frame, missing=why)
        return self.panel(fit, table.frame)


class LossVsCompute(Figure):
    name = "loss-vs-compute"
    help = "loss against FLOPs with the frontier"
    size = (6.4, 4.6)

    def law(self, inputs):
        return registry.law_named(inputs.law or "chinchilla", 1 if inputs.curves else None,
                                  inputs.form)

    def panel(self, fit, frame, into=None):
        return scaling_plots.plot_loss_vs_compute(frame, fit, into)

    def check(self, inputs, holdout):
        if inputs.approach and not inputs.curves:
            raise FitInputError(f"--approach={inputs.approach}: --kind={self.name} fits "
                                f"nothing without --curves (approach 1's envelope); leave it out")
        super().check(inputs, holdout)

    def check_flags(self, values):
        super().check_flags(values)
        for name in FIT_ONLY if not values["curves"].present else ():
            if values[name].present:
                raise FitInputError(f"--{name}: --kind={self.name} without --curves draws the "
                                    f"runs and fits nothing; leave it out")

    def draw(self, inputs, n_bootstrap, holdout, values=None):
        if inputs.curves:  # approach 1's envelope is the frontier
            return super().draw(inputs, n_bootstrap, holdout)
        law = self.law(inputs)  # the runs themselves: nothing to fit
        if not inputs.by:
            return self.panel(None, load_table(inputs, law).frame)
        raw, _ = read_results(inputs, law)
        one = dataclasses.replace(inputs, by=None)
        panels = {str(group): (lambda into, rows=raw[raw[inputs.by] == group]:
                               self.panel(None, load_table(one, law, rows).frame, into))
                  for group in group_values(raw, inputs.by, str(inputs.results))}
        return scaling_plots.plot_by_group(inputs.by, panels, self.size)


class IsoFLOPProfiles(Figure):
    name = "isoflop"
    help = "IsoFLOP parabolas (Chinchilla Fig. 3)"

    def law(self, inputs):
        return registry.law_named("chinchilla", 2)

    def panel(self, fit, frame, into=None):
        return scaling_plots.plot_isoflops(fit, into)


class Contours(Figure):
    name = "contours"
    help = "fitted L(N, D) with the efficient frontier (Chinchilla Fig. 4)"
    size = (6.8, 5.0)

    def law(self, inputs):
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

    def check(self, inputs, holdout):
        if not holdout:
            raise FitInputError("--kind=holdout needs --holdout=... (e.g. largest-budget)")
        if inputs.by:
            raise FitInputError("--by and --holdout: draw one group's table at a time; "
                                "together they are not supported (as in attnlab fit)")

    def draw(self, inputs, n_bootstrap, holdout, values=None):
        law = inputs.part("chinchilla")
        return scaling_plots.plot_holdout(run_holdout(inputs, law, n_bootstrap, holdout))


class Frontiers(Figure):
    name = "frontiers"
    help = "every --by group's compute-optimal frontier in one figure"
    bootstrap = 200

    def check(self, inputs, holdout):
        super().check(inputs, holdout)
        if not inputs.by:
            raise FitInputError("--kind=frontiers needs --by=COLUMN (e.g. model.pos_encoding)")

    def draw(self, inputs, n_bootstrap, holdout, values=None):
        law = inputs.part("chinchilla")
        return scaling_plots.plot_group_frontiers(run_grouped(inputs, law, n_bootstrap))


class HParams(Figure):
    name = "hparams"
    help = ("loss against the learning rate per (N, D) group, a line per batch size, with the "
            "group's optimum and the law's")
    own_fit = True

    def law(self, inputs):
        return registry.law_named("hparams")

    def check(self, inputs, holdout):
        super().check(inputs, holdout)
        if inputs.by:
            raise FitInputError("--by does not apply to --kind=hparams: its panels are the "
                                "(N, D) groups already")

    def draw(self, inputs, n_bootstrap, holdout, values=None):
        law = self.law(inputs)
        options, table = law_options(values, inputs, law), read_table(inputs.results)
        try:
            fit = law.fit(table, n_bootstrap=n_bootstrap, **options)
        except FitInputError as error:  # the runs and their optima are worth seeing alone
            runs, _ = hparams.read_runs(table, options["source"], options["columns"],
                                        options.get("pair"))  # raises bad input again
            sys.stderr.write(f"warning: no law drawn: {error}\n")
            return plot_hparams(runs, hparams.group_optima(runs, options["method"],
                                                           options["near"]),
                                missing=f"no law: {error}")
        return plot_hparams(fit.frame, fit.optima, fit.laws)


FIGURES: dict[str, type[Figure]] = {c.name: c for c in (
    LossVsParams, LossVsCompute, IsoFLOPProfiles, Contours, Allocation, Holdout, Frontiers,
    HParams)}
