"""``attnlab plot``: the standard scaling-law figures, fitted and drawn from a sweep's results.

It reads and fits the table as ``attnlab fit`` does (the same input flags) and draws with
:mod:`attnlab.plots.scaling`. Bad input prints one ``error: ...`` line and returns 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from attnlab import cli_flags
from attnlab.cli_flags import Flag
from attnlab.errors import AttnlabError
from attnlab.plots import scaling as scaling_plots
from attnlab.scaling.cli import (INPUT_FLAGS, FitInputs, load_table, run_fit, run_grouped,
                                 run_holdout)
from attnlab.scaling import registry
from attnlab.scaling.errors import FitInputError

PLOT_HELP = """\
Draw the standard scaling-law figures (PNG or PDF, by the --out extension).

    attnlab plot --results=sweeps/isoflop --kind=isoflop --out=isoflop.png"""

PLOT_KINDS = ("loss-vs-params", "loss-vs-compute", "isoflop", "contours", "allocation",
              "holdout", "frontiers")

PLOT_FLAGS = INPUT_FLAGS + [
    Flag("kind", "enum", None, "loss-vs-params: loss against N per D with Kaplan lines; "
         "loss-vs-compute: loss against FLOPs with the frontier; isoflop: IsoFLOP parabolas "
         "(Chinchilla Fig. 3); contours: fitted L(N, D) with the efficient frontier (Chinchilla "
         "Fig. 4); allocation: N_opt(C) and D_opt(C) with interval bands; holdout: predicted "
         "against observed loss of the runs --holdout leaves out; frontiers: every --by group's "
         "compute-optimal frontier in one figure.",
         enum_values=PLOT_KINDS, required=True),
    Flag("out", "string", None, "Output file, .png or .pdf.", required=True),
    Flag("bootstrap", "integer", None, "Bootstrap refits for the bands (default 200 for "
                                       "allocation, holdout and frontiers, else 0)."),
    Flag("holdout", "string", None, "--kind=holdout: the runs to leave out (as attnlab fit "
                                    "--holdout)."),
]


def plot_main(argv: list[str]) -> int:
    try:
        values = cli_flags.parse(argv, PLOT_FLAGS, prog="attnlab plot", takes_config=False,
                                 description=PLOT_HELP)
        inputs = FitInputs.from_flags(values)
        kind, out = values["kind"].value, values["out"].value
        if Path(out).suffix.lower() not in (".png", ".pdf"):
            raise FitInputError(f"--out must end in .png or .pdf, not {out!r}")
        n_bootstrap = values["bootstrap"].value
        if n_bootstrap is None:
            n_bootstrap = 200 if kind in ("allocation", "holdout", "frontiers") else 0
        law = inputs.part("chinchilla")
        if not law.fits_table:
            raise FitInputError(f"--law={law.name}: attnlab plot draws fits of (N, D, L) "
                                f"tables; fit {law.title} with attnlab fit --law={law.name}")
        if kind == "holdout" and not values["holdout"].value:
            raise FitInputError("--kind=holdout needs --holdout=... (e.g. largest-budget)")
        if kind == "frontiers" and not inputs.by:
            raise FitInputError("--kind=frontiers needs --by=COLUMN (e.g. model.pos_encoding)")
        figure = _draw(kind, inputs, n_bootstrap, values["holdout"].value)
        sys.stdout.write(f"wrote {scaling_plots.save_figure(figure, out)}\n")
    except AttnlabError as error:  # also when called directly, not through attnlab.cli
        sys.stderr.write(f"error: {error}\n")
        return 2
    return 0


def _draw(kind: str, inputs: FitInputs, n_bootstrap: int, holdout: str | None = None):
    """The figure of ``kind``, with the fit it needs (each kind has its default law)."""
    if kind in ("holdout", "frontiers"):
        law = inputs.part("chinchilla")
        if kind == "holdout":
            return scaling_plots.plot_holdout(run_holdout(inputs, law, n_bootstrap, holdout))
        return scaling_plots.plot_group_frontiers(run_grouped(inputs, law, n_bootstrap))
    if kind == "loss-vs-params":
        table, fit = run_fit(inputs, inputs.part("kaplan"), n_bootstrap)
        return scaling_plots.plot_loss_vs_params(table.frame, fit)
    if kind == "loss-vs-compute":
        name = inputs.law or "chinchilla"
        if inputs.curves:
            table, fit = run_fit(inputs, registry.resolve(name, 1, inputs.form), n_bootstrap)
            return scaling_plots.plot_loss_vs_compute(table.frame, fit)
        return scaling_plots.plot_loss_vs_compute(
            load_table(inputs, registry.resolve(name, None, inputs.form)).frame)
    if kind == "isoflop":
        _, fit = run_fit(inputs, registry.resolve("chinchilla", 2), n_bootstrap)
        return scaling_plots.plot_isoflops(fit)
    if kind == "contours":
        table, fit = run_fit(inputs, registry.resolve("chinchilla", 3), n_bootstrap)
        return scaling_plots.plot_loss_contours(fit, table.frame)
    table, fit = run_fit(inputs, inputs.part("chinchilla"), n_bootstrap)  # allocation
    return scaling_plots.plot_optimal_allocation(fit, table.frame)
