"""The interface every scaling law implements, and the one place its declarations are read.

A law is one class in ``scaling/laws/`` and one line of ``laws/registry.LAWS``. It declares
what its fit can answer (``capabilities``, named in :data:`CAPABILITIES`), its flags (``flags``,
each with its type, help and default; ``options`` turns their values into its settings), the
flag that picks a variant of its family (``selector``: ``--approach``, ``--form``), and the
shared flags beyond what one fit of it is (``refused``, ``scope`` saying what one fit is).
:func:`check_flags` reads those declarations, and nothing else decides which flag applies to
which law; ``attnlab fit --help`` lists the flags from them (``registry.law_flags``).

One rule for a law's flags: a flag of a law without variants is its own (``--saturation applies
to --law=clark only``); a flag of a variant (approach 2's ``--profile``) is read by the variants
that declare it. A flag of the report alone (``report_flags``: over-training's
``--tokens-per-param``) reports on one fit, and ``attnlab plot`` does not take it. The values
of a law's flags are parsed by the helpers at the end of this module, each error naming the
flag.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from attnlab.cli_vocab import Flag
from attnlab.scaling.errors import FitError, FitInputError

CAPABILITIES = {
    "table": "fitted to a checked table of points or curves (else: its own fit and report)",
    "curves": "fitted to learning curves rather than final points",
    "isoflop": "fitted per FLOP budget (a ladder's branches become budgets)",
    "run-loss": "a loss for any run (L(N, D), L(N) or L(D)): --holdout",
    "loss-model": "a loss at any (N, D): --train-longer",
    "allocation": "N_opt(C), D_opt(C): --budget",
    "closed-frontier": "L*(C) = E + K (C/k)^-gamma inverts in closed form: --multiplier-against",
    "table-k": "prices a budget as C = k·N·D with k read off the table's FLOPs",
    "pair": "reads --pair without --best-over (its own fit resamples those units)",
    "schedule": "fitted to whole curves under their learning-rate schedules: --holdout=run:NAME",
}

class Law:
    """One scaling law as the commands see it: which table columns it reads, what its fit can
    answer, its flags, and its maths. Each law is a subclass beside the code that fits it
    (``laws/kaplan.py``, ``laws/approach1.py``, ...) and one line of ``registry.LAWS``; commands
    ask the law, never compare its name.

    name: the ``--law`` value; variant: the ``--approach`` (Chinchilla) or ``--form`` (Kaplan)
    that selects it within its family; title: the equation reports print."""

    name: str = ""
    variant: int | str | None = None
    selector: Flag | None = None  # the flag that picks the variant (--approach, --form)
    default_variant: int | str | None = None  # the variant taken without that flag
    title: str = ""
    n_parameters: int = 0
    capabilities: frozenset[str] = frozenset({"table"})
    flags: tuple[Flag, ...] = ()  # the flags this law reads (its family's selector aside)
    report_flags: tuple[Flag, ...] = ()  # flags of its report alone (``extra_report``)
    refused: tuple[str, ...] = ()  # shared fit flags beyond what one fit of it is
    scope: str = ""  # what one fit of this law is, for those refusals
    # N is the non-embedding count for Kaplan (their convention), all parameters otherwise.
    params_columns: tuple[str, ...] = ("params",)
    flops_columns: tuple[str, ...] = ("flops",)
    run_columns: tuple[str, ...] = ()  # table columns beyond N and D a run's loss reads
    column_names: tuple[str, ...] = ()  # --columns names beyond the (N, D, L) table's
    # The quantity fitted, the table's ``loss``: its --columns name, the columns tried for it
    # without one (none: --columns must name it) and what it is, for errors.
    loss_name: str = "loss"
    loss_columns: tuple[str, ...] = ("loss", "final_val_loss")
    loss_what: str = "final loss L"
    # The forecasters a hold-out sets beside the law: the standard ones it names
    # (``tables/forecasters.FORECASTERS``), then its own baselines (classes with name, needs,
    # column, rule_column and predict(kept, test), as ``tables/forecasters.Forecaster``).
    forecasters: tuple[str, ...] = ("persistence", "trend", "frontier")
    own_forecasters: tuple[type, ...] = ()
    fixable: tuple[str, ...] = ()  # the parameters --fix can hold
    # Axis of the table (one of AXES) -> the parameters that only runs spread along it
    # determine: a table with one value there is refused (check_axes).
    varies: Mapping[str, tuple[str, ...]] = {}
    # The floor every axis's term must be told apart from (Chinchilla's E): along such an axis
    # a table needs one value more than the term has free parameters (``distinct_needed``).
    floor: str | None = None
    # Parameters whose interval is read as an exponent's (``ScalingFit.too_wide``).
    exponents: tuple[str, ...] = ("alpha", "beta", "a", "b", "alpha_N", "alpha_D")
    # Positive constants read on a log scale (a decay constant): pinned within a factor of
    # MAX_SCALE_RATIO (``ScalingFit.too_wide``).
    scales: tuple[str, ...] = ()

    def can(self, capability: str) -> bool:
        """Whether the law declares ``capability`` (one of :data:`CAPABILITIES`)."""
        if capability not in CAPABILITIES:
            raise KeyError(f"no capability {capability!r}; they are {', '.join(CAPABILITIES)}")
        return capability in self.capabilities

    @property
    def flag_names(self) -> tuple[str, ...]:
        """The flags this law reads, its family's selector first, its report's last."""
        selector = (self.selector,) if self.selector else ()
        return tuple(f.name for f in selector + self.flags + self.report_flags)

    @property
    def short_title(self) -> str:
        """The law's name without its equation: "Chinchilla approach 2", "Kaplan L(N, D)"."""
        return (self.title or self.name).split(":")[0].split(" = ")[0]

    @property
    def variant_flag(self) -> str:
        """How the command line names the variant: " --approach=3", " --form=nd" or ""."""
        return f" --{self.selector.name}={self.variant}" if self.selector else ""

    @property
    def approach(self) -> int | None:
        """Chinchilla's approach number (None for other laws), as JSON reports name it."""
        return None

    @property
    def form(self) -> str:
        """Kaplan's form ("" for other laws), as JSON reports name it."""
        return ""

    def distinct_needed(self, fixed: Mapping[str, float] | None = None) -> dict[str, int]:
        """axis (of :data:`AXES`) -> how many distinct values along it a table, or a bootstrap
        draw of it, needs for the law's free parameters to be determined: one per free
        parameter of the axis's term, one more to tell the term from a free floor. With two
        model sizes, E + A/N^alpha takes any E from a range and fits as well
        (``bootstrap.identified`` counts such a draw as failed)."""
        fixed = fixed or {}
        needed = {}
        for axis, names in self.varies.items():
            free = [name for name in names if name not in fixed]
            if free:
                floor = bool(self.floor) and self.floor not in fixed
                needed[axis] = len(free) + floor
        return needed

    def fit(self, table, *, n_bootstrap: int, ci_level: float, seed: int, **options):
        """The fit of this law to a checked ``points.ScalingTable`` (a results frame for a law
        without the ``table`` capability). ``options``: its settings (:meth:`options`),
        ``fixed`` (--fix), ``flops_per_param_token`` and ``clusters``; a law takes those it
        reads and ignores the rest."""
        raise NotImplementedError

    def options(self, given: Mapping) -> dict:
        """The law's settings from the values of its ``flags`` (flag name -> value, None where
        not given), FitInputError naming a bad one; its defaults where not given."""
        return {}

    def report(self, fit, source: str) -> str:
        """A law with its own fit: the report ``attnlab fit`` prints."""
        raise NotImplementedError

    def table_columns(self, df, mapping: Mapping, source: str) -> dict[str, str]:
        """The columns beyond N, D, L and C this law reads from a results table (canonical
        name -> column), for ``table.prepare_points``."""
        return {}

    def check_table(self, table):
        """The checked table with this law's own columns derived and checked (e.g. the
        repeats of a data-constrained run); the table as it is by default."""
        return table

    def extra_report(self, fit, budgets, settings: Mapping) -> tuple[str, dict]:
        """A table law's report beyond the parameters, from its settings (:meth:`options`):
        (text, JSON entries); nothing by default."""
        return "", {}

    def loss(self, params: Mapping, n, d):
        raise FitError(f"{self.title} has no L(N, D); fit --law=kaplan (form nd) or "
                          f"--law=chinchilla --approach=3 to predict losses")

    def size_curve(self, params: Mapping, n):
        """L(N) alone, for a law fitted on the best loss of each size (Kaplan's L(N)); None for
        the others."""
        return None

    def run_loss(self, params: Mapping, n, d, **columns):
        """The loss predicted for a run of N parameters trained on D tokens (``columns``: the
        run's values of ``run_columns``)."""
        return self.loss(params, n, d)

    def optimal(self, params: Mapping, c, flops_per_param_token: float):
        raise FitError(f"{self.title} has no compute-optimal allocation")


# The axes a law's parameters are identified along: (what the runs differ in, the values of a
# checked table's frame). Values within SAME_AXIS of each other are one value.
AXES = {
    "N": ("model sizes", lambda frame: frame["params"]),
    "D": ("token counts", lambda frame: frame["tokens"]),
    "D/N": ("tokens-per-parameter ratios", lambda frame: frame["tokens"] / frame["params"]),
}
SAME_AXIS = 0.01


def axis_levels(values) -> np.ndarray:
    """[points] the index of each value's level along an axis: sorted values within SAME_AXIS
    of the previous one share a level."""
    values = np.asarray(values, np.float64)
    order = np.argsort(values)
    steps = np.diff(np.log(values[order])) > np.log1p(SAME_AXIS)
    levels = np.empty(len(values), np.int64)
    levels[order] = np.concatenate([[0], np.cumsum(steps)])
    return levels


def identifying_design(law: Law, frame, fixed: Mapping[str, float] | None = None) -> dict:
    """axis -> ([points] level along it, distinct levels a draw needs), for the axes
    ``law.distinct_needed`` names (``bootstrap.identified`` reads it)."""
    return {axis: (axis_levels(AXES[axis][1](frame)), needed)
            for axis, needed in law.distinct_needed(fixed).items()}


def check_axes(law: Law, table, fixed: Mapping[str, float] | None = None) -> None:
    """Refuses, in one line, a table with one value along an axis ``law.varies`` names: the
    parameters that axis determines are not identified (those all held by ``fixed`` aside). A
    table with fewer distinct (N, D) points than the law has parameters is left to the law's
    own count of them."""
    frame = table.frame
    if len(frame.groupby(["params", "tokens"])) < law.n_parameters:
        return
    for axis, names in law.varies.items():
        values = np.asarray(AXES[axis][1](frame), np.float64)
        if set(names) <= set(fixed or {}) or values.max() > values.min() * (1 + SAME_AXIS):
            continue
        *first, last = names
        neither = f"neither {', '.join(first)} nor {last}" if first else last
        raise FitInputError(f"--law={law.name}{law.variant_flag}: every run has {axis} = "
                            f"{values.min():.4g}, which determines {neither}; add runs at other "
                            f"{AXES[axis][0]}")


# The shared flags of a fit that a law must be able to answer: the capability each needs, and
# what to say when the law lacks it.
NEEDS = {
    "curves": ("curves", "--curves: {short} fits each run's final loss, not learning curves "
                         "(approach 1 reads them): leave it out"),
    "budget": ("allocation", "--budget does not apply to {short}: it models one of N and D, so "
                             "no compute-optimal allocation (fit --form=nd for one)"),
    "train-longer": ("loss-model", "--train-longer does not apply to {short}: it predicts no "
                                   "loss at an allocation (use --law=chinchilla --approach=3 or "
                                   "--law=kaplan --form=nd)"),
    "multiplier-against": ("closed-frontier", "--multiplier-against needs approach 3's law: "
                                              "--law=chinchilla --approach=3"),
}


def check_flags(law: Law, given: Mapping, laws: tuple[Law, ...]) -> None:
    """Refuses, naming it, each flag in ``given`` (name -> value, the flags given on the command
    line) that ``law`` would ignore: the shared flags it refuses (``refused``) or cannot answer
    (:data:`NEEDS`), the flags of the other ``laws`` (every registered one), and --fix where it
    holds none of the parameters."""
    for name in given:
        if name in law.refused:
            raise FitInputError(f"--{name} does not apply to --law={law.name} ({law.scope})")
        need = NEEDS.get(name)
        if need and given[name] and not law.can(need[0]):
            raise FitInputError(need[1].format(short=law.short_title))
        owners = [other for other in laws if name in other.flag_names]
        if owners and name not in law.flag_names:
            raise FitInputError(_foreign_flag(law, name, owners))
    if "best-over" in given and (law.can("curves") or not law.can("table")):
        raise FitInputError(f"--best-over does not apply to --law={law.name}: it picks runs "
                            f"for a fit of each run's final loss")
    check_fixable(law, given.get("fix") or {})


def _foreign_flag(law: Law, name: str, owners) -> str:
    """The refusal of another law's flag: its owner's alone, or a variant's that this one is
    not."""
    families = {owner.name for owner in owners}
    if len(families) == 1 and not owners[0].selector:
        return f"--{name} applies to --law={owners[0].name} only"
    if law.scope:
        return f"--{name} does not apply to --law={law.name} ({law.scope})"
    return (f"--{name} does not apply to --law={law.name}{law.variant_flag} "
            f"({law.title or law.name} does not read it)")


def check_fixable(law: Law, fixed: Mapping[str, float]) -> None:
    """FitInputError naming the first parameter of ``fixed`` when ``law`` holds none."""
    if fixed and not law.fixable:
        raise FitInputError(f"--fix: {next(iter(fixed))} cannot be held: {law.title} fits "
                            f"every parameter freely (--fix applies to approach 3 and the "
                            f"data-constrained and overtrain laws)")


def parse_fix(text: str | None) -> dict[str, float]:
    """``"E=1.87,A=520.8"`` -> {"E": 1.87, "A": 520.8}; FitInputError naming --fix."""
    held: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in (text or "").split(","))):
        name, sep, value = (s.strip() for s in item.partition("="))
        try:
            held[name] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name or not np.isfinite(held.get(name, np.nan)):
            raise FitInputError(f"--fix: {item!r} is not NAME=VALUE with a finite number")
    return held


def positive_list(text: str | None, flag: str, what: str, example: str) -> list[float]:
    """``"10,100"`` -> [10.0, 100.0]; FitInputError naming ``flag`` for a value that is not a
    finite number > 0."""
    try:
        values = [float(v) for v in (text or "").split(",") if v.strip()]
    except ValueError:
        raise FitInputError(f"{flag}: {text!r} is not a comma-separated list of {what} (e.g. "
                            f"{example})") from None
    if not all(0 < v < math.inf for v in values):
        raise FitInputError(f"{flag}: {what} must be finite and > 0, got {text!r}")
    return values
