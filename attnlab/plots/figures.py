"""The figures ``attnlab plot --kind`` draws: each one class, registered in :data:`FIGURES` by its
name, that says what it shows, what it needs of the flags, and fits and draws it."""

from __future__ import annotations

from typing import ClassVar

from attnlab.plots import scaling as scaling_plots
from attnlab.scaling import registry
from attnlab.scaling.cli import FitInputs, load_table, run_fit, run_grouped, run_holdout
from attnlab.scaling.errors import FitInputError


class Figure:
    """A figure kind: ``draw`` fits what it needs from ``inputs`` and returns the figure."""

    name: ClassVar[str]
    help: ClassVar[str]
    bootstrap: ClassVar[int] = 0  # refits for the bands when --bootstrap is not given

    def check(self, inputs: FitInputs, holdout: str | None) -> None:
        """Refuses flags the figure cannot be drawn from (FitInputError naming the flag)."""

    def draw(self, inputs: FitInputs, n_bootstrap: int, holdout: str | None):
        raise NotImplementedError


class LossVsParams(Figure):
    name = "loss-vs-params"
    help = "loss against N per D with Kaplan lines"

    def draw(self, inputs, n_bootstrap, holdout):
        table, fit = run_fit(inputs, inputs.part("kaplan"), n_bootstrap)
        return scaling_plots.plot_loss_vs_params(table.frame, fit)


class LossVsCompute(Figure):
    name = "loss-vs-compute"
    help = "loss against FLOPs with the frontier"

    def draw(self, inputs, n_bootstrap, holdout):
        name = inputs.law or "chinchilla"
        if inputs.curves:
            table, fit = run_fit(inputs, registry.law_named(name, 1, inputs.form), n_bootstrap)
            return scaling_plots.plot_loss_vs_compute(table.frame, fit)
        return scaling_plots.plot_loss_vs_compute(
            load_table(inputs, registry.law_named(name, None, inputs.form)).frame)


class IsoFLOPProfiles(Figure):
    name = "isoflop"
    help = "IsoFLOP parabolas (Chinchilla Fig. 3)"

    def draw(self, inputs, n_bootstrap, holdout):
        _, fit = run_fit(inputs, registry.law_named("chinchilla", 2), n_bootstrap)
        return scaling_plots.plot_isoflops(fit)


class Contours(Figure):
    name = "contours"
    help = "fitted L(N, D) with the efficient frontier (Chinchilla Fig. 4)"

    def draw(self, inputs, n_bootstrap, holdout):
        table, fit = run_fit(inputs, registry.law_named("chinchilla", 3), n_bootstrap)
        return scaling_plots.plot_loss_contours(fit, table.frame)


class Allocation(Figure):
    name = "allocation"
    help = "N_opt(C) and D_opt(C) with interval bands"
    bootstrap = 200

    def draw(self, inputs, n_bootstrap, holdout):
        table, fit = run_fit(inputs, inputs.part("chinchilla"), n_bootstrap)
        return scaling_plots.plot_optimal_allocation(fit, table.frame)


class Holdout(Figure):
    name = "holdout"
    help = "predicted against observed loss of the runs --holdout leaves out"
    bootstrap = 200

    def check(self, inputs, holdout):
        if not holdout:
            raise FitInputError("--kind=holdout needs --holdout=... (e.g. largest-budget)")

    def draw(self, inputs, n_bootstrap, holdout):
        law = inputs.part("chinchilla")
        return scaling_plots.plot_holdout(run_holdout(inputs, law, n_bootstrap, holdout))


class Frontiers(Figure):
    name = "frontiers"
    help = "every --by group's compute-optimal frontier in one figure"
    bootstrap = 200

    def check(self, inputs, holdout):
        if not inputs.by:
            raise FitInputError("--kind=frontiers needs --by=COLUMN (e.g. model.pos_encoding)")

    def draw(self, inputs, n_bootstrap, holdout):
        law = inputs.part("chinchilla")
        return scaling_plots.plot_group_frontiers(run_grouped(inputs, law, n_bootstrap))


FIGURES: dict[str, type[Figure]] = {c.name: c for c in (
    LossVsParams, LossVsCompute, IsoFLOPProfiles, Contours, Allocation, Holdout, Frontiers)}
