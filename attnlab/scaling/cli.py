"""``attnlab fit``: scaling-law fits of a sweep's results (the laws of ``registry.LAWS``), with
intervals.

    attnlab fit --sweep=sweeps/isoflop --law=chinchilla --approach=3 --bootstrap=1000 \
        --budget=1e18 --json=fit.json

:data:`INPUT_FLAGS`, :class:`FitInputs` and :func:`run_fit` are shared with ``attnlab plot``
(``attnlab/plots/cli.py``, which draws the fits). Bad input (a bad flag, a missing column, a
non-positive value, too few points, one budget for approach 2) prints one ``error: ...`` line
and returns 2.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from pathlib import Path

from absl import flags

from attnlab import cli_flags, outputs
from attnlab import cli_vocab as vocab
from attnlab.cli_flags import Flag
from attnlab.errors import AttnlabError
from attnlab.scaling import hparams, parametric, registry
from attnlab.scaling.approach2 import DEFAULT_WINDOW, PROFILES
from attnlab.scaling.approach3 import CHINCHILLA_GRID, InitGrid
from attnlab.scaling.ladder import isoflop_slices
from attnlab.scaling.errors import FitInputError, GridEdgeWarning
from attnlab.scaling.fitting import fit_table
from attnlab.scaling.grouped import GroupedFits, fit_by, format_grouped
from attnlab.scaling.holdout import (HoldoutResult, format_holdout, holdout_prediction,
                                     with_baselines)
from attnlab.scaling.laws import VARIANT_FLAGS, Law
from attnlab.scaling.multiplier import format_multipliers, grouped_multipliers
from attnlab.scaling.parametric import parse_fix, positive_list
from attnlab.scaling.picks import format_picks, read_at_best
from attnlab.scaling.repick import redraw_picks
from attnlab.scaling.report import below_floor, format_report, format_trained_longer
from attnlab.scaling.result import ScalingFit, jsonable
from attnlab.scaling.table import (CANONICAL, ScalingTable, parse_columns, prepare_curves,
                                   prepare_points, read_curves, read_table)

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

# Where the table comes from and how to fit it: the flags of both `fit` and `plot`.
INPUT_FLAGS = [
    vocab.SWEEP.flag("Or its results table: a .parquet/.csv with columns params, tokens, loss "
                     "(optional flops, budget); several, comma-separated, are read as one "
                     "table.", old_names=("results",)),
    Flag("curves", "string", None, "Learning curves for approach 1: a .parquet/.csv with run_id, "
                                   "step, tokens, params, loss (optional flops), a directory "
                                   "holding curves.parquet, or a sweep directory."),
    Flag("law", "string", None, f"The law to fit: {', '.join(registry.names())} (clark: Clark "
                                f"et al. 2022's log L(N, E) over the number of experts; "
                                f"attnlab fit only; hparams: attnlab plot --kind=hparams)."),
    Flag("approach", "enum", None, "Chinchilla approach (default 3).",
         enum_values=tuple(str(v) for v in registry.variants("chinchilla"))),
    Flag("form", "enum", "nd", "Kaplan law: L(N, D), L(N) or L(D).",
         enum_values=registry.variants("kaplan")),
    Flag("columns", "string", None, "Rename columns, e.g. 'params:Model Size,tokens:Tokens'."),
    vocab.CI_LEVEL.flag("They are percentile intervals.", default=0.95),
    vocab.BOOTSTRAP_SEED.flag(default=0, old_names=("seed",)),
    Flag("grid", "string", None, "Approach 3 initialisation grid overrides, NAME:START:STOP:STEP "
                                 "for NAME in a, b, e, alpha, beta (default: Hoffmann et al.'s "
                                 "grid)."),
    Flag("profile", "enum", "window", "Approach 2: how each budget's minimum is found: a "
         "parabola over the sizes near the best run (window), an Akima spline (akima), or one "
         "parabola over the whole ladder (whole).", enum_values=PROFILES),
    Flag("window", "float", DEFAULT_WINDOW, "Approach 2, --profile=window: decades of N either "
                                            "side of each budget's best run."),
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
    Flag("optimum", "enum", None, "--law=hparams: how each (N, D) group's best learning rate "
         "and batch size are found: parabolas in log lr then log batch (smooth, Porian et al. "
         "2024; default) or the runs near the best loss (near).", enum_values=hparams.METHODS),
    Flag("near", "float", None, "--law=hparams --optimum=near: percent above the group's best "
         "loss a run may be and count as near it (default 0.25)."),
]
FIT_FLAGS = INPUT_FLAGS + [
    vocab.BOOTSTRAP.flag("For the intervals.", default=200),
    Flag("budget", "string", None, "FLOP budget(s), comma-separated: print the compute-optimal "
                                   "N, D and loss there, with intervals."),
    Flag("train-longer", "string", None, "Token multipliers, comma-separated (e.g. 10,100): "
         "with --budget, the loss of each budget's compute-optimal model trained that many "
         "times longer (M x its tokens, M x the budget's FLOPs), with intervals (approach 3, "
         "Kaplan nd). For the loss at a fixed tokens-per-parameter ratio and the compute "
         "penalty of a smaller model, fit --law=overtrain with --tokens-per-param."),
    Flag("tokens-per-param", "string", None, "--law=overtrain: ratios M = D/N, comma-separated "
         "(e.g. 20,200): with --budget, the loss of a run of C FLOPs at each M and the compute "
         "penalty C_M/C_M* of M against the law's optimal ratio at equal loss, with "
         "intervals."),
    Flag("multiplier-against", "string", None, "With --by (approach 3): each group's effective "
         "compute multiplier against this group at each --budget (default: the largest run's "
         "compute), and the loss difference at the largest budget both ran, with intervals."),
    vocab.JSON.flag("The fit."),
    vocab.HOLDOUT.flag("Reports how well the law predicts their loss."),
    Flag("floor", "float", None, "A known floor of the loss (e.g. a corpus's entropy rate): "
         "flag every predicted loss below it (--budget, --holdout)."),
    Flag("saturation", "string", None, "--law=clark: E_START,E_MAX of Clark et al.'s "
         "saturating transform of E (e.g. 1.847,314.478, their S-BASE fit; default: none)."),
]


@dataclasses.dataclass(frozen=True)
class FitInputs:
    """The values of :data:`INPUT_FLAGS`."""

    results: str | None
    curves: str | None
    law: str | None
    approach: int | None
    form: str
    columns: str | None
    ci_level: float
    seed: int
    grid: str | None
    profile: str = "window"
    window: float = DEFAULT_WINDOW
    by: str | None = None
    cluster: str | None = None
    fix: str | None = None
    best_over: str | None = None
    pair: str | None = None

    @classmethod
    def from_flags(cls, values: flags.FlagValues) -> FitInputs:
        approach = values["approach"].value
        return cls(results=values["sweep"].value, curves=values["curves"].value,
                   law=values["law"].value, approach=int(approach) if approach else None,
                   form=values["form"].value, columns=values["columns"].value,
                   ci_level=values["ci-level"].value, seed=values["bootstrap-seed"].value,
                   grid=values["grid"].value, profile=values["profile"].value,
                   window=values["window"].value, by=values["by"].value,
                   cluster=values["cluster"].value, fix=values["fix"].value,
                   best_over=values["best-over"].value, pair=values["pair"].value)

    def check_pair(self, law: Law) -> None:
        if self.pair and not self.best_over and not law.reads_pair:
            raise FitInputError("--pair applies to the picks of --best-over: add it, or leave "
                                "out --pair")

    def redraws(self, n_bootstrap: int) -> bool:
        """Whether run_fit's and run_grouped's bootstraps redraw the --best-over picks (with
        --pair; run_holdout's never does)."""
        return bool(self.best_over and self.pair and n_bootstrap)

    def part(self, default: str | None = None) -> Law:
        """The law --law (or ``default``) names, in the variant --approach / --form select."""
        name = self.law or default
        if name is None:
            raise FitInputError(f"--law is required: {', '.join(registry.names())}")
        return registry.law_named(name, self.approach, self.form)

    def fit_options(self, n_bootstrap: int) -> dict:
        """The keyword arguments of ``fit_table`` that these flags set."""
        grid = InitGrid.parse(self.grid) if self.grid else CHINCHILLA_GRID
        return dict(form=self.form, n_bootstrap=n_bootstrap, ci_level=self.ci_level,
                    seed=self.seed, grid=grid, profile=self.profile, window=self.window,
                    fixed=parse_fix(self.fix))


def _multipliers(text: str | None) -> list[float]:
    return positive_list(text, "--train-longer", "token multipliers", "10,100")


def _budgets(text: str | None) -> list[float]:
    return positive_list(text, "--budget", "FLOP budgets", "1e18,1e19")


def read_results(inputs: FitInputs, law: Law):
    """(the results table, None); with --best-over, (its runs at each point's best value, the
    picks)."""
    if inputs.best_over and (law.needs_curves or not law.fits_table):
        raise FitInputError(f"--best-over does not apply to --law={law.name}: it picks runs "
                            f"for a fit of each run's final loss")
    if not inputs.results:
        raise FitInputError("--sweep=DIR is required (a sweep directory or its results "
                            ".parquet/.csv)")
    return read_at_best(inputs.results, over=inputs.best_over, law=law, by=inputs.by,
                        columns=parse_columns(inputs.columns), pair=inputs.pair)


def load_table(inputs: FitInputs, law: Law, raw=None) -> ScalingTable:
    """The checked table the chosen fit needs: curves for approach 1, run results otherwise
    (``raw``: the results as :func:`read_results` returned them, when already read)."""
    columns = parse_columns(inputs.columns)
    if law.needs_curves:
        source = inputs.curves or inputs.results
        if not source:
            raise FitInputError("approach 1 needs --curves=FILE (or --sweep=DIR)")
        runs = None
        if inputs.results and Path(inputs.results).exists() and inputs.curves:
            runs = read_table(inputs.results)
        return prepare_curves(read_curves(source), law=law, source=str(source),
                              columns=columns, runs=runs)
    if raw is None:
        raw, _ = read_results(inputs, law)
    table = prepare_points(raw, law=law, source=str(inputs.results), columns=columns,
                           cluster=inputs.cluster)
    if law.isoflop_profiles and table.budget is None and "role" in raw.columns:
        table = isoflop_slices(table)  # a ladder's branches lie on lines of constant N
    return table


def run_fit(inputs: FitInputs, law: Law, n_bootstrap: int,
            raw=None) -> tuple[ScalingTable, ScalingFit]:
    table = load_table(inputs, law, raw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)  # reported from fit.warnings instead
        fit = fit_table(table, law=law, **inputs.fit_options(n_bootstrap))
    if inputs.redraws(n_bootstrap):
        fit = redrawn(inputs, law, fit, n_bootstrap, read_table(inputs.results))
    return table, fit


def redrawn(inputs: FitInputs, law: Law, fit: ScalingFit, n_bootstrap: int, full) -> ScalingFit:
    """``fit`` with intervals that redraw its --best-over picks among the runs of ``full``."""
    def fit_kept(kept, n, seed):
        return run_fit(dataclasses.replace(inputs, seed=seed, pair=None), law, n, kept)[1]

    return redraw_picks(fit, full, law=law, over=inputs.best_over, pair=inputs.pair,
                        columns=parse_columns(inputs.columns), n_bootstrap=n_bootstrap,
                        seed=inputs.seed, fit_kept=fit_kept)


def run_grouped(inputs: FitInputs, law: Law, n_bootstrap: int, raw=None) -> GroupedFits:
    """One fit per value of ``inputs.by`` (``attnlab fit --by``)."""
    if not inputs.results:
        raise FitInputError("--by needs --sweep=DIR (a sweep directory or its results "
                            ".parquet/.csv)")
    curves = None
    if law.needs_curves:
        curves = read_curves(inputs.curves or inputs.results)
    if raw is None:
        raw, _ = read_results(inputs, law)
    grouped = fit_by(raw, inputs.by, law=law,
                     source=str(inputs.results), columns=parse_columns(inputs.columns),
                     curves=curves, cluster=inputs.cluster, **inputs.fit_options(n_bootstrap))
    if inputs.redraws(n_bootstrap):
        full, one = read_table(inputs.results), dataclasses.replace(inputs, by=None)
        for label, fit in grouped.fits.items():
            rows = full[full[inputs.by].astype(str) == label]
            grouped.fits[label] = redrawn(one, law, fit, n_bootstrap, rows)
    return grouped


def run_holdout(inputs: FitInputs, law: Law, n_bootstrap: int, holdout: str,
                floor: float | None = None, raw=None) -> HoldoutResult:
    """The fit without the held-out runs, and its predictions for them (and a naive
    baseline's)."""
    table = load_table(inputs, law, raw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)
        return holdout_prediction(table, law=law, holdout=holdout, floor=floor,
                                  **inputs.fit_options(n_bootstrap))


def _write_json(path: str, payload: dict) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    outputs.write_json(out, payload)


def check_law_flags(values: flags.FlagValues, law: Law) -> None:
    """Refuses the flags this law would silently ignore and those only another law reads."""
    check_variant_flags(values, law)
    if values["curves"].present and not law.needs_curves:
        raise FitInputError(f"--curves: {law.short_title} fits each run's final loss, not "
                            f"learning curves (approach 1 reads them): leave it out")
    parametric.check_fixable(law, parse_fix(values["fix"].value))
    for owner in registry.LAWS.values():
        for name in owner.own_flags:
            if name in values and values[name].value is not None and name not in law.own_flags:
                raise FitInputError(f"--{name} applies to --law={owner.name} only")


def check_variant_flags(values: flags.FlagValues, law: Law) -> None:
    """Refuses each flag given on the command line that ``law`` would ignore: those it refuses
    outright (``refused_flags``, beyond what one fit of it is), and --profile, --window,
    --grid, --form and --approach where it does not read them (its ``reads`` and its family's
    ``selector``). Flags the command does not have (``attnlab plot``'s) are skipped."""
    given = [name for name in law.refused_flags + VARIANT_FLAGS
             if name in values and values[name].present]
    for name in given:
        if name in law.refused_flags:
            raise FitInputError(f"--{name} does not apply to --law={law.name} ({law.scope})")
        if name not in law.reads + (law.selector,):
            variant = (f" --approach={law.approach}" if law.approach else
                       f" --form={law.form}" if law.form else "")
            raise FitInputError(f"--{name} does not apply to --law={law.name}{variant} "
                                f"({law.title or law.name} does not read it)")


def _check_modes(values: flags.FlagValues, inputs: FitInputs, law: Law) -> None:
    """Refuses the flags one mode (one fit, --by's groups, --holdout) cannot honour."""
    holdout, floor = values["holdout"].value, values["floor"].value
    for name in ("train-longer",) + law.own_flags:
        if values[name].value and (inputs.by or holdout):
            raise FitInputError(f"--{name} reports on one fit: leave out --by and --holdout")
    if floor is not None and not floor > 0:
        raise FitInputError(f"--floor must be a loss > 0, not {floor}")
    if values["budget"].value and not law.has_allocation:
        raise FitInputError(f"--budget does not apply to {law.short_title}: it models one of N "
                            f"and D, so no compute-optimal allocation (fit --form=nd for one)")
    if values["train-longer"].value and not law.has_loss_model:
        raise FitInputError(f"--train-longer does not apply to {law.short_title}: it predicts "
                            f"no loss at an allocation (use --law=chinchilla --approach=3 or "
                            f"--law=kaplan --form=nd)")
    against = values["multiplier-against"].value
    if against and not inputs.by:
        raise FitInputError("--multiplier-against compares groups: add --by=COLUMN")
    if against and not law.closed_frontier:
        raise FitInputError("--multiplier-against needs approach 3's law: --law=chinchilla "
                            "--approach=3")
    if floor is not None and inputs.by:
        raise FitInputError("--floor flags one fit's predictions: leave out --by")
    if inputs.by and holdout:
        raise FitInputError("--by and --holdout: run one fit per group with --holdout "
                            "on each group's own table; together they are not supported")


def _grouped_fits(inputs: FitInputs, law: Law, n_bootstrap: int, raw, budgets: list[float],
                  against: str | None) -> dict:
    """``--by``: one fit per group, printed, with compute multipliers against one group."""
    grouped = run_grouped(inputs, law, n_bootstrap, raw)
    sys.stdout.write(format_grouped(grouped, budgets))
    payload = grouped.to_dict(budgets)
    for group, fit_payload in payload.get("groups", {}).items():
        if group in grouped.tables:
            with_baselines(fit_payload, grouped.tables[group].frame)
    if against:
        frame = grouped_multipliers(grouped, against, budgets)
        sys.stdout.write("\n" + format_multipliers(frame))
        payload["multipliers"] = jsonable(frame.to_dict(orient="records"))
    return payload


def _one_fit(values: flags.FlagValues, inputs: FitInputs, law: Law, raw,
             budgets: list[float]) -> dict:
    """One fit of the whole table, printed with --train-longer's and the law's own lines."""
    floor, longer = values["floor"].value, _multipliers(values["train-longer"].value)
    own = {name: values[name].value for name in law.own_flags}
    table, fit = run_fit(inputs, law, values["bootstrap"].value, raw)
    extra, entries = law.extra_report(fit, budgets, own)
    sys.stdout.write(format_report(fit, table.source, budgets, floor, table)
                     + format_trained_longer(fit, budgets, longer) + extra)
    payload = with_baselines(fit.to_dict(budgets, longer), table.frame) | entries
    if floor is not None:
        low = below_floor(fit, budgets, floor)
        payload["floor"] = floor
        for prediction in payload.get("predictions", []):
            prediction["below_floor"] = prediction["C"] in low
    return payload


def law_options(values: flags.FlagValues, inputs: FitInputs, law: Law) -> dict:
    """The keyword arguments of a law with its own fit (``fits_table`` False) beyond the
    table: its own flags' values, --pair where it reads it, the mapped columns."""
    if not inputs.results:
        raise FitInputError("--sweep=DIR is required (a sweep directory or its results "
                            ".parquet/.csv)")
    options = law.options({name: values[name].value for name in law.own_flags})
    options |= {"pair": inputs.pair} if law.reads_pair else {}
    return options | {"source": str(inputs.results), "ci_level": inputs.ci_level,
                      "seed": inputs.seed,
                      "columns": parse_columns(inputs.columns, CANONICAL + law.column_names)}


def _own_fit_main(values: flags.FlagValues, inputs: FitInputs, law: Law) -> int:
    """A law with its own fit and report (Clark et al.'s log L(N, E), the hyperparameter law)
    on a results table."""
    options = law_options(values, inputs, law)
    fit = law.fit(read_table(inputs.results), n_bootstrap=values["bootstrap"].value, **options)
    source = options["source"]
    sys.stdout.write(law.report(fit, source))
    if values["json"].value:
        _write_json(values["json"].value, jsonable(fit.to_dict()))
    return 0


def fit_main(argv: list[str]) -> int:
    try:
        values = cli_flags.parse(argv, FIT_FLAGS, prog="attnlab fit", takes_config=False,
                                 description=FIT_HELP)
        inputs = FitInputs.from_flags(values)
        law = inputs.part()
        inputs.check_pair(law)
        check_law_flags(values, law)
        raw, picks = read_results(inputs, law) if inputs.best_over else (None, None)
        fixed = not inputs.redraws(values["bootstrap"].value) or values["holdout"].value
        if picks is not None:
            sys.stdout.write(format_picks(picks, over=inputs.best_over, metric="loss",
                                          what="each (N, D) point", fixed=bool(fixed)))
        if not law.fits_table:
            return _own_fit_main(values, inputs, law)
        _check_modes(values, inputs, law)
        budgets = _budgets(values["budget"].value)
        n_bootstrap, holdout = values["bootstrap"].value, values["holdout"].value
        if inputs.by:
            payload = _grouped_fits(inputs, law, n_bootstrap, raw, budgets,
                                    values["multiplier-against"].value)
        elif holdout:
            held = run_holdout(inputs, law, n_bootstrap, holdout, values["floor"].value, raw)
            sys.stdout.write(format_report(held.fit, inputs.results or "", budgets,
                                           table=held.kept) + "\n" + format_holdout(held))
            predictions = held.fit.to_dict(budgets).get("predictions") or []
            payload = held.to_dict() | (with_baselines(
                {"predictions": predictions}, held.kept.frame) if budgets else {})
        else:
            payload = _one_fit(values, inputs, law, raw, budgets)
        if picks is not None:
            payload |= {"best_over": inputs.best_over,
                        "picks": jsonable(picks.to_dict(orient="records"))}
            payload |= {"pair": inputs.pair} if inputs.pair else {}
        if values["json"].value:
            _write_json(values["json"].value, payload)
    except AttnlabError as error:  # also when called directly, not through attnlab.cli
        sys.stderr.write(f"error: {error}\n")
        return 2
    return 0
