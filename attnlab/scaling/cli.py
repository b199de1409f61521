"""``attnlab fit``: scaling-law fits of a sweep's results (the laws of ``laws/registry.LAWS``),
with intervals.

    attnlab fit --sweep=sweeps/isoflop --law=chinchilla --approach=3 --bootstrap=1000 \
        --budget=1e18 --json=fit.json

The flags become one :class:`~attnlab.scaling.request.FitRequest` (which checks them against
the law's declarations); this module prints what it fits. Bad input (a bad flag, a missing
column, a non-positive value, too few points, one budget for approach 2) prints one
``error: ...`` line and returns 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from attnlab import cli_flags
from attnlab import cli_vocab as vocab
from attnlab import outputs
from attnlab.cli_flags import Flag
from attnlab.errors import AttnlabError
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.law import positive_list
from attnlab.scaling.request import FitRequest, input_flags
from attnlab.scaling.tables.coverage import check_coverage
from attnlab.scaling.tables.modes import Report, mode_of, picks_report

FIT_HELP = """\
Fit scaling laws (--law, below) to a sweep's results, with intervals.

    attnlab fit --sweep=sweeps/isoflop --law=chinchilla --approach=3 --bootstrap=1000 \\
        --budget=1e18 --json=fit.json
    attnlab fit --sweep=sweeps/isoflop --law=chinchilla --holdout=largest-budget
    attnlab fit --sweep=sweeps/pe --law=chinchilla --approach=2 --by=model.pos_encoding
    attnlab fit --sweep=runs/architectures --law=chinchilla --by=architecture \\
        --multiplier-against=gpt --budget=1e15
    attnlab fit --sweep=sweeps/moe --law=clark    # Clark et al. 2022: log L(N, E)
    attnlab fit --sweep=runs.csv --law=data_constrained \
        --fix=E=1.869,A=520.8,B=1487.7,alpha=0.3527,beta=0.3527   # Muennighoff et al. 2023
    attnlab fit --sweep=runs.csv --law=overtrain --budget=1e21 --tokens-per-param=20,200"""

# The flags of the report, beside the request's (request.input_flags).
FIT_FLAGS = [
    vocab.BOOTSTRAP.flag("For the intervals.", default=200),
    Flag("budget", "string", None, "FLOP budget(s), comma-separated: print the compute-optimal "
                                   "N, D and loss there, with intervals."),
    Flag("train-longer", "string", None, "Token multipliers, comma-separated (e.g. 10,100): "
         "with --budget, the loss of each budget's compute-optimal model trained that many "
         "times longer (M x its tokens, M x the budget's FLOPs), with intervals (approach 3, "
         "Kaplan nd). For the loss at a fixed tokens-per-parameter ratio and the compute "
         "penalty of a smaller model, fit --law=overtrain with --tokens-per-param."),
    Flag("multiplier-against", "string", None, "With --by (approach 3): each group's effective "
         "compute multiplier against this group at each --budget (default: the largest run's "
         "compute), and the loss difference at the largest budget both ran, with intervals."),
    vocab.JSON.flag("The fit."),
    vocab.HOLDOUT.flag("Reports how well the law predicts their loss."),
    Flag("floor", "float", None, "A known floor of the loss (e.g. a corpus's entropy rate): "
         "flag every predicted loss below it (--budget, --holdout)."),
    Flag("coverage", "integer", 0, "Simulate this many tables from the fitted law at the "
         "table's own points, with its residual structure (a cluster effect and a row effect, "
         "estimated from the residuals), refit each as the table was, and report how often "
         "each interval holds the truth (a law of each run's loss; flags coverage < 90%)."),
]


def fit_flags() -> list[Flag]:
    return input_flags() + FIT_FLAGS


def _write_json(path: str, payload: dict) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    outputs.write_json(out, payload)


def _request(values) -> FitRequest:
    """The request the flags make, with the report's own flag rules."""
    request = FitRequest.from_flags(values, n_bootstrap=values["bootstrap"].value,
                                    holdout=values["holdout"].value, floor=values["floor"].value)
    if values["multiplier-against"].value and not request.by:
        raise FitInputError("--multiplier-against compares groups: add --by=COLUMN")
    if values["coverage"].value:
        check_coverage(request, values["coverage"].value)
    return request


def _report(values) -> Report:
    return Report(budgets=tuple(positive_list(values["budget"].value, "--budget", "FLOP budgets",
                                              "1e18,1e19")),
                  longer=tuple(positive_list(values["train-longer"].value, "--train-longer",
                                             "token multipliers", "10,100")),
                  against=values["multiplier-against"].value,
                  coverage=values["coverage"].value)


def fit_main(argv: list[str]) -> int:
    try:
        values = cli_flags.parse(argv, fit_flags(), prog="attnlab fit", takes_config=False,
                                 description=FIT_HELP)
        request, report = _request(values), _report(values)
        inputs = request.read()
        picks, picked = picks_report(request, inputs)
        sys.stdout.write(picks)
        mode = mode_of(request)
        text, payload = mode.report(request, inputs, mode.run(request, inputs), report)
        sys.stdout.write(text)
        if values["json"].value:
            _write_json(values["json"].value, payload | picked)
    except AttnlabError as error:  # also when called directly, not through attnlab.cli
        sys.stderr.write(f"error: {error}\n")
        return 2
    return 0
