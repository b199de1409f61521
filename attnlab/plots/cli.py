"""``attnlab plot``: the standard scaling-law figures, fitted and drawn from a sweep's results.

It reads and fits the table as ``attnlab fit`` does (the same input flags) and draws with
:mod:`attnlab.plots.scaling`. Bad input prints one ``error: ...`` line and returns 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from attnlab import cli_flags
from attnlab import cli_vocab as vocab
from attnlab.cli_flags import Flag
from attnlab.errors import AttnlabError
from attnlab.plots import scaling as scaling_plots
from attnlab.plots.figures import FIGURES
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.request import FitRequest, input_flags

PLOT_HELP = """\
Draw the standard scaling-law figures (PNG or PDF, by the --plot extension).

    attnlab plot --sweep=sweeps/isoflop --kind=isoflop --plot=isoflop.png"""

PLOT_FLAGS = [
    Flag("kind", "enum", None, "; ".join(f"{f.name}: {f.help}" for f in FIGURES.values())
         + ".", enum_values=tuple(FIGURES), required=True),
    vocab.PLOT.flag("A .png or .pdf.", required=True, old_names=("out",)),
    vocab.BOOTSTRAP.flag("For the bands (default: " + ", ".join(
        f"{f.bootstrap} for {f.name}" for f in FIGURES.values() if f.bootstrap) + ", else 0)."),
    vocab.HOLDOUT.flag("For --kind=holdout."),
]


def plot_flags() -> list[Flag]:
    """The request's flags (the laws' among them) and the figure's."""
    return input_flags(report=False) + PLOT_FLAGS


def plot_main(argv: list[str]) -> int:
    try:
        values = cli_flags.parse(argv, plot_flags(), prog="attnlab plot", takes_config=False,
                                 description=PLOT_HELP)
        kind, out = values["kind"].value, values["plot"].value
        if Path(out).suffix.lower() not in (".png", ".pdf"):
            raise FitInputError(f"--plot must end in .png or .pdf, not {out!r}")
        figure, holdout = FIGURES[kind](), values["holdout"].value
        n_bootstrap = values["bootstrap"].value
        if n_bootstrap is None:
            n_bootstrap = figure.bootstrap
        figure.check(values, holdout)
        law = figure.law(values)
        if not law.can("table") and not figure.own_fit:
            raise FitInputError(f"--law={law.name}: attnlab plot draws fits of (N, D, L) "
                                f"tables; fit {law.title} with attnlab fit --law={law.name}")
        request = FitRequest.from_flags(values, law=law, n_bootstrap=n_bootstrap,
                                        holdout=holdout)
        figure.check_flags(values)
        drawn = figure.draw(request)
        sys.stdout.write(f"wrote {scaling_plots.save_figure(drawn, out)}\n")
    except AttnlabError as error:  # also when called directly, not through attnlab.cli
        sys.stderr.write(f"error: {error}\n")
        return 2
    return 0

