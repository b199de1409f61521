"""One fit request: the law, its settings, the table it reads and the mode it is fitted in.

    request = FitRequest.of("sweeps/isoflop", law="chinchilla", approach=3, n_bootstrap=200)
    table, fit = request.fit()                 # one fit of the whole table
    FitRequest.of("sweeps/pe", by="model.pos_encoding").grouped()    # one fit per group
    FitRequest.of("sweeps/isoflop", holdout="largest-budget").held_out()

``attnlab fit`` and ``attnlab plot`` build theirs from their flags (:meth:`FitRequest.from_flags`,
which refuses each flag the law would ignore, naming it, before anything is read); the studies
and notebooks from Python arguments (:meth:`FitRequest.of`). Every mode reads the table once
(:meth:`FitRequest.read`; ``--columns`` is parsed once, into ``columns``) and hands the law, not
its name, to the readers and fits of ``scaling/tables/``. With ``--best-over`` and ``--pair``
the bootstrap redraws the picks (``tables/repick.py``) among the runs read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from attnlab import cli_vocab as vocab
from attnlab.cli_vocab import Flag
from attnlab.scaling.columns import CANONICAL, parse_columns
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.law import Law, check_flags, parse_fix
from attnlab.scaling.laws import registry
from attnlab.scaling.points import ScalingTable
from attnlab.scaling.result import ScalingFit
from attnlab.scaling.tables import modes
from attnlab.scaling.tables.grouped import GroupedFits
from attnlab.scaling.tables.holdout import HoldoutResult
from attnlab.scaling.tables.read import Inputs

# Where the table comes from and how to read and resample it: the flags of both `fit` and
# `plot`, beside the flags the laws declare (``registry.law_flags``).
INPUT_FLAGS = [
    vocab.SWEEP.flag("Or its results table: a .parquet/.csv with columns params, tokens, loss "
                     "(optional flops, budget); several, comma-separated, are read as one "
                     "table.", old_names=("results",)),
    Flag("curves", "string", None, "Learning curves for approach 1: a .parquet/.csv with run_id, "
                                   "step, tokens, params, loss (optional flops), a directory "
                                   "holding curves.parquet, or a sweep directory; for "
                                   "--law=multipower and annealing: run_id, step, lr, loss."),
    Flag("law", "string", None, f"The law to fit: {', '.join(registry.names())} (clark: Clark "
                                f"et al. 2022's log L(N, E) over the number of experts; "
                                f"attnlab fit only; hparams: attnlab plot --kind=hparams)."),
    Flag("columns", "string", None, "Rename columns, e.g. 'params:Model Size,tokens:Tokens'."),
    vocab.CI_LEVEL.flag("They are percentile intervals.", default=0.95),
    vocab.BOOTSTRAP_SEED.flag(default=0, old_names=("seed",)),
    vocab.BY.flag("Each group is fitted on its own and the fits shown side by side (e.g. "
                  "model.pos_encoding); attnlab plot draws a figure of one fit once per "
                  "group, a row each."),
    Flag("cluster", "string", None, "The bootstrap's unit of independence: rows sharing this "
         "column's value are resampled together (default: a ladder's 'trunk' column when the "
         "table has one; 'none': every row on its own)."),
    Flag("fix", "string", None, "Hold parameters at given values through the fit and every "
         "bootstrap refit, e.g. E=1.869,A=520.8,B=1487.7,alpha=0.3527,beta=0.3527 (approach 3, "
         "--law=data_constrained, --law=overtrain)."),
    vocab.BEST_OVER.flag("Each (N, D) point is fitted at its own best value; the bootstrap "
                         "holds the picks fixed, unless --pair."),
    vocab.PAIR.flag("With --best-over: the picks' stability draws a seed's runs at every value "
                    "together, and so does the bootstrap (not --holdout's), which picks again "
                    "in each draw. With --law=hparams: the bootstrap draws each (N, D) "
                    "group's seeds, each with its runs at every lr and batch."),
]


def input_flags(report: bool = True) -> list[Flag]:
    """The flags of a fit request: where the table comes from, then every law's own (with
    ``report``, its report's too)."""
    return INPUT_FLAGS + registry.law_flags(report)


@dataclasses.dataclass(frozen=True)
class FitRequest:
    """A resolved fit: the law and its settings (``law.options`` of its flags), where its
    table comes from and how it is read (columns: canonical name -> column), the mode (one fit,
    ``by`` groups, a ``holdout``) and the bootstrap plan."""

    law: Law
    sweep: str | None = None
    curves: str | None = None
    columns: Mapping[str, str] = dataclasses.field(default_factory=dict)
    settings: Mapping = dataclasses.field(default_factory=dict)
    by: str | None = None
    holdout: str | None = None
    cluster: str | None = None
    best_over: str | None = None
    pair: str | None = None
    fixed: Mapping[str, float] = dataclasses.field(default_factory=dict)
    n_bootstrap: int = 0
    ci_level: float = 0.95
    seed: int = 0
    floor: float | None = None

    def __post_init__(self):
        if self.pair and not self.best_over and not self.law.can("pair"):
            raise FitInputError("--pair applies to the picks of --best-over: add it, or leave "
                                "out --pair")
        if self.floor is not None and not self.floor > 0:
            raise FitInputError(f"--floor must be a loss > 0, not {self.floor}")
        if self.floor is not None and self.by:
            raise FitInputError("--floor flags one fit's predictions: leave out --by")
        if self.by and not self.sweep:
            raise FitInputError("--by needs --sweep=DIR (a sweep directory or its results "
                                ".parquet/.csv)")
        if self.by and self.holdout:
            raise FitInputError("--by and --holdout: run one fit per group with --holdout "
                                "on each group's own table; together they are not supported")

    @classmethod
    def of(cls, sweep: str | Path | None, *, law: str | Law = "chinchilla",
           approach: int | None = None, form: str | None = None, columns: str | None = None,
           flags: Mapping | None = None, **fields) -> FitRequest:
        """A request from Python arguments: ``law`` a name (with ``approach`` / ``form``) or a
        law, ``columns`` as --columns spells it, ``flags`` the law's own flag values (e.g.
        {"profile": "akima"}), ``fields`` the other fields."""
        part = registry.law_named(law, approach, form)
        check_flags(part, dict(flags or {}), registry.every_law())
        return cls(law=part, sweep=None if sweep is None else str(sweep),
                   columns=parse_columns(columns, CANONICAL + part.column_names),
                   settings=part.options(dict(flags or {})), **fields)

    @classmethod
    def from_flags(cls, values, *, law: Law | None = None, n_bootstrap: int = 0,
                   holdout: str | None = None, floor: float | None = None) -> FitRequest:
        """The request ``attnlab fit`` or ``attnlab plot`` flags make (``law``: the one they
        name, by default), each given flag checked against the law's declarations first."""
        law = law or law_from_flags(values)
        given = {name: values[name].value for name in values if values[name].present}
        given = given | ({"fix": parse_fix(given["fix"])} if "fix" in given else {})
        check_flags(law, given, registry.every_law())
        by = values["by"].value
        for name in ("train-longer",) + tuple(f.name for f in law.report_flags):
            if name in values and values[name].value and (by or holdout):
                raise FitInputError(f"--{name} reports on one fit: leave out --by and --holdout")
        return cls(law=law, sweep=values["sweep"].value, curves=values["curves"].value,
                   columns=parse_columns(values["columns"].value, CANONICAL + law.column_names),
                   settings=law.options({name: values[name].value for name in law.flag_names
                                         if name in values}),
                   by=by, holdout=holdout, cluster=values["cluster"].value,
                   best_over=values["best-over"].value, pair=values["pair"].value,
                   fixed=given.get("fix", {}), n_bootstrap=n_bootstrap,
                   ci_level=values["ci-level"].value, seed=values["bootstrap-seed"].value,
                   floor=floor)

    @property
    def redraws(self) -> bool:
        """Whether the bootstrap redraws the --best-over picks (with --pair; a hold-out's never
        does)."""
        return bool(self.best_over and self.pair and self.n_bootstrap and not self.holdout)

    def read(self) -> Inputs:
        """The tables this request fits, read once (pass them on to fit them again)."""
        return modes.read_inputs(self)

    def table(self, inputs: Inputs | None = None) -> ScalingTable:
        """The checked table of the fit: the runs' final points, or approach 1's curves."""
        return modes.table_of(self, inputs or self.read())

    def run(self, inputs: Inputs | None = None):
        """The request in its mode (``tables/modes.py``): a law's own fit, the groups' fits
        (``GroupedFits``), the hold-out (``HoldoutResult``), or (table, fit)."""
        return modes.mode_of(self).run(self, inputs or self.read())

    def fit(self, inputs: Inputs | None = None) -> tuple[ScalingTable, ScalingFit]:
        """One fit of the whole table: (the checked table, the fit)."""
        return modes.OneFit().run(self, inputs or self.read())

    def grouped(self, inputs: Inputs | None = None) -> GroupedFits:
        """One fit per value of ``by`` (``attnlab fit --by``)."""
        return modes.Groups().run(self, inputs or self.read())

    def held_out(self, inputs: Inputs | None = None) -> HoldoutResult:
        """The fit without the runs ``holdout`` holds out, and its predictions for them."""
        return modes.HoldOut().run(self, inputs or self.read())

    def own_fit(self, inputs: Inputs | None = None):
        """A law's own fit of the results table (Clark et al.'s log L(N, E), the hyperparameter
        law)."""
        return modes.OwnFit().run(self, inputs or self.read())


def law_from_flags(values, default: str | None = None) -> Law:
    """The law --law (or ``default``) names, in the variant --approach / --form select."""
    name = values["law"].value or default
    if name is None:
        raise FitInputError(f"--law is required: {', '.join(registry.names())}")
    approach = values["approach"].value
    return registry.law_named(name, int(approach) if approach else None, values["form"].value)
