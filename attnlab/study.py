"""``attnlab quickstart``: a whole scaling study in one command.

    attnlab quickstart [--workdir=runs/quickstart] [--config=experiments/quickstart.py[:gpu]]
                       [--config.sweep.budgets='(1e11,3e11,1e12)'] [--bootstrap=200]

1. runs the IsoFLOP sweep of the experiment file (``attnlab.sweep.run_sweep``: finished runs are
   reused, interrupted ones resume);
2. fits Chinchilla approach 3, L(N, D) = E + A/N^alpha + B/D^beta, with bootstrap intervals, and
   approach 2 (IsoFLOP parabolas) when the sweep has budgets;
3. prints the fitted parameters and the compute-optimal N, D and loss at 1x, 10x and 100x the
   largest run's compute, and writes the fits as JSON (the format of ``attnlab fit --json``);
4. draws the standard figures (``attnlab.plots.scaling``) as PNGs into ``WORKDIR/plots/``.

A sweep of named variants (``sweep.variants``, e.g. experiments/architectures.py) is a comparison
study instead: one approach-3 and one approach-2 fit per variant (``attnlab fit --by``, with
bootstrap intervals), a table ranking the variants by their compute-optimal loss at a reference
compute (the largest budget) with intervals (``ranking.csv``), every variant's compute-optimal
frontier in one figure, and the extrapolation ratio r(4x) = ppl(4L) / ppl(L) of each variant's
largest run (``attnlab extrapolate``, nonoverlapping windows).

Everything here is orchestration: the sweep, the fits and the figures come from
``attnlab.sweep``, ``attnlab.scaling`` and ``attnlab.plots.scaling``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab import cli_flags
from attnlab.cli_flags import Flag
from attnlab.errors import AttnlabError

if TYPE_CHECKING:  # the heavy imports (JAX, pandas) wait until the command runs
    from attnlab.scaling import ScalingFit, ScalingTable
    from attnlab.sweep import SweepSpec

# The experiment shipped with the repository (an editable install keeps it beside the package).
DEFAULT_EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "quickstart.py"
DEFAULT_WORKDIR = "runs/quickstart"
# Budgets for the printed compute-optimal allocation, as multiples of the largest run's compute.
PREDICTION_MULTIPLIERS = (1.0, 10.0, 100.0)
FIT_FILE = "fit.json"  # approach 3
FIT_APPROACH2_FILE = "fit_approach2.json"
PLOTS_DIR = "plots"
RANKING_FILE = "ranking.csv"
RANKING_TEXT_FILE = "ranking.txt"
# r(k) of each variant's largest run; ppl at 4x the training length (Press et al. 2022 compare
# orderings at >= 4x: seed noise at 1x is ~1-2% of ppl).
EXTRAPOLATION_MULTIPLIER = 4
# Validation tokens scored per length: bounds the evaluation's time on a CPU.
EXTRAPOLATION_MAX_TOKENS = 1 << 18

FLAGS = [
    Flag("workdir", "string", DEFAULT_WORKDIR, "Study directory: the sweep's runs, results table, "
                                               "fits and plots (rerun to reuse finished runs)."),
    Flag("bootstrap", "integer", 200, "Bootstrap refits for the intervals (0: none)."),
    Flag("parallel", "integer", 1, "Runs at a time, each pinned to cpu_count/parallel cores."),
    Flag("progress", "bool", True, "Show the sweep's progress bar and one line per run."),
    Flag("allow-large", "bool", False, "Run even if a run's estimated memory exceeds the "
                                        "machine's."),
]
# Printed above the flags by --help.
SUMMARY = ("attnlab quickstart: the sweep of experiments/quickstart.py (or of --config), "
           "Chinchilla\nfits with bootstrap intervals, compute-optimal predictions, PNG plots in "
           "WORKDIR/plots/.\nRerun the same command to reuse the finished runs.\n\n")


class StudyError(AttnlabError):
    """The study cannot start (e.g. the default experiment file is missing)."""


@dataclasses.dataclass(frozen=True)
class StudyResult:
    """What one ``quickstart`` produced.

    table: the sweep's results (one row per run); fit: Chinchilla approach 3, or None when no
    scaling law fits the runs; fit_approach2: approach 2, or None when the sweep has no budgets
    or the fit failed (see ``messages`` for either);
    budgets: the FLOP budgets of the printed predictions; plots: kind -> PNG path;
    json_paths: the fit files; failed_runs: how many runs ended failed.
    """

    table: ScalingTable
    fit: ScalingFit | None
    fit_approach2: ScalingFit | None
    budgets: tuple[float, ...]
    plots: dict[str, Path]
    json_paths: tuple[Path, ...]
    failed_runs: int
    messages: tuple[str, ...] = ()
    grouped: GroupedStudy | None = None


@dataclasses.dataclass(frozen=True)
class GroupedStudy:
    """The per-variant part of a study of ``sweep.variants``: ``by`` the variant column; ``fits3``
    / ``fits2`` the grouped fits (``attnlab.scaling.grouped.GroupedFits``, None when no group
    could be fitted); ``ranking`` the table of :func:`attnlab.scaling.grouped.rank_at` with an
    ``r(4x)`` column; ``ratios`` variant -> (r(4x) or None, run id or None, note)."""

    by: str
    fits3: object | None
    fits2: object | None
    ranking: object
    ratios: dict


def default_argv(argv: list[str]) -> list[str]:
    """Adds ``--config=<repo>/experiments/quickstart.py`` unless the user named a config file
    (``--config.x=...`` overrides alone still apply to the default file)."""
    if any(a == "--config" or a.startswith("--config=") for a in argv):
        return list(argv)
    if not DEFAULT_EXPERIMENT.exists():
        raise StudyError(f"the default experiment {DEFAULT_EXPERIMENT} is missing (a non-editable "
                         f"install?): pass --config=experiments/quickstart.py from a checkout")
    return [f"--config={DEFAULT_EXPERIMENT}", *argv]


def prediction_budgets(table: ScalingTable,
                       multipliers=PREDICTION_MULTIPLIERS) -> tuple[float, ...]:
    """Multiples of the largest compute among the runs used in the fit (FLOPs, in the count the
    fit uses: the ScalingTable's ``flops`` column)."""
    largest = float(table.frame["flops"].max())
    return tuple(float(f"{m * largest:.3g}") for m in multipliers)


def fit_study(workdir: str | Path, *, n_bootstrap: int = 200, seed: int = 0):
    """Fits Chinchilla approach 3 (and approach 2 when the runs carry budgets) to a sweep
    directory. Returns (table, fit3 or None, fit2 or None, messages): a fit that fails is a
    message, so the study still reports and plots what it has."""
    from attnlab.scaling import FitError, FitInputError, GridEdgeWarning, fit_table
    from attnlab.scaling import prepare_points, read_table

    results = read_table(workdir)
    table = prepare_points(results, law="chinchilla", source=str(workdir))
    messages = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)  # reported through fit.warnings
        fit3 = fit2 = None
        try:
            fit3 = fit_table(table, law="chinchilla", approach=3, n_bootstrap=n_bootstrap,
                             seed=seed)
        except (FitInputError, FitError) as error:
            messages.append(f"approach 3 skipped: {error}")
        if table.budget is None:
            messages.append("approach 2 skipped: the sweep has no compute budgets (only isoflop "
                            "sweeps have them)")
        else:
            try:
                fit2 = fit_table(table, law="chinchilla", approach=2, n_bootstrap=n_bootstrap,
                                 seed=seed)
            except (FitInputError, FitError) as error:
                messages.append(f"approach 2 skipped: {error}")
    return table, fit3, fit2, messages


def draw_plots(table: ScalingTable, fit3: ScalingFit | None, fit2: ScalingFit | None,
               out_dir: str | Path) -> tuple[dict[str, Path], list[str]]:
    """The standard scaling figures as PNGs in ``out_dir``; returns (kind -> path, messages).

    Runs after the fits and tables are written, and a figure that fails to draw becomes a
    message, never an exception: a plot must not cost the user an hour of training."""
    from attnlab.plots import scaling as plots

    out_dir = Path(out_dir)
    figures = {
        "loss_vs_compute": lambda: plots.plot_loss_vs_compute(table.frame),
        "loss_vs_params": lambda: plots.plot_loss_vs_params(table.frame, fit3),
    }
    if fit3 is not None:
        figures["contours"] = lambda: plots.plot_loss_contours(fit3, table.frame)
        figures["allocation"] = lambda: plots.plot_optimal_allocation(fit3, table.frame)
    if fit2 is not None:
        figures["isoflop"] = lambda: plots.plot_isoflops(fit2)
    return _save_figures(figures, out_dir)


def _save_figures(figures: dict, out_dir: Path) -> tuple[dict, list[str]]:
    """Draws each ``kind -> make()`` figure to ``out_dir/<kind>.png``: (kind -> path, messages
    naming the figures that could not be drawn; a plot never stops the study)."""
    from attnlab.plots.scaling import save_figure

    written, messages = {}, []
    for kind, make in figures.items():
        try:
            written[kind] = save_figure(make(), out_dir / f"{kind}.png")
        except Exception as error:  # noqa: BLE001 - any drawing failure is reported, not raised
            messages.append(f"plot {kind!r} not drawn: {type(error).__name__}: {error}")
    return written, messages


def headline(fit3: ScalingFit) -> str:
    """The fitted law and the allocation exponents, next to the published ones. A parameter the
    data do not pin is shown by its name, not by a value that means nothing."""
    p = fit3.params

    def value(name: str, spec: str) -> str:
        return name if name in fit3.unpinned else format(p[name], spec)

    lines = ["fitted law (L: validation loss in nats per token, N: parameters, D: tokens):",
             f"  L(N, D) = {value('E', '.3f')} + {value('A', '.4g')} / N^{value('alpha', '.3f')} "
             f"+ {value('B', '.4g')} / D^{value('beta', '.3f')}"]
    if fit3.allocation_determined:
        lines.append(f"  N_opt ~ C^{p['a']:.3f}, D_opt ~ C^{p['b']:.3f}   (Hoffmann et al. 2022, "
                     f"approach 3: C^0.46, C^0.54)")
    else:
        lines.append(f"  N_opt ~ C^a: not determined, these runs do not pin "
                     f"{', '.join(n for n in fit3.unpinned if n not in ('a', 'b', 'G'))} "
                     f"(degenerate fit: see the warnings below; add sizes or budgets)")
    return "\n".join(lines)


def run_study(spec: SweepSpec, workdir: str | Path, *, n_bootstrap: int = 200, parallel: int = 1,
              progress: bool = True, out=None, allow_large: bool = False) -> StudyResult:
    """Sweep, fit, print and plot (see the module docstring); ``out`` (default stdout) receives
    the report."""
    import numpy as np

    from attnlab.sweep import run_sweep

    workdir = Path(workdir)
    out = out or sys.stdout
    say = lambda text="": print(text, file=out, flush=True)  # noqa: E731
    start = time.time()
    say(f"attnlab quickstart: sweep {spec.name!r} ({spec.mode}, scale {spec.scale}) in {workdir}")
    results = run_sweep(spec, workdir, parallel=parallel, progress=progress,
                        allow_large=allow_large)
    swept = time.time()
    counts = results["status"].value_counts().to_dict()
    say(f"sweep done in {(swept - start) / 60:.1f} min: "
        + ", ".join(f"{n} {s}" for s, n in counts.items()))
    failed = int(counts.get("failed", 0))
    if failed:
        say(f"warning: {failed} run(s) failed; their errors are in the 'error' column of "
            f"{workdir / 'results.csv'} and in each run's train.log. Fitting the rest.")
    if spec.variants:
        with np.errstate(all="ignore"):
            result = finish_grouped_study(workdir, spec.variant_column, n_bootstrap=n_bootstrap,
                                          say=say, failed=failed)
        say(f"\ndone in {(time.time() - start) / 60:.1f} min (sweep {(swept - start) / 60:.1f} "
            f"min, fits, extrapolation and plots {(time.time() - swept) / 60:.1f} min); rerun "
            f"to reuse the finished runs")
        return result

    # Bootstrap replicates of a small sweep can be degenerate (alpha + beta ~ 0, E ~ 0): their
    # overflow warnings would bury the report, and the intervals already show that spread.
    with np.errstate(all="ignore"):
        table, fit3, fit2, messages = fit_study(workdir, n_bootstrap=n_bootstrap)
        budgets = prediction_budgets(table)
        say("\n" + report(fit3, fit2, messages, str(workdir), budgets))
        json_paths = write_fits(workdir, fit3, fit2, budgets)
        plots, plot_messages = draw_plots(table, fit3, fit2, workdir / PLOTS_DIR)
    for message in plot_messages:
        say(f"warning: {message}")
    say("wrote")
    for path in json_paths:
        say(f"  {path}")
    say(f"  {workdir / 'results.parquet'} (one row per run; also results.csv)")
    for path in plots.values():
        say(f"  {path}")
    say(f"\ndone in {(time.time() - start) / 60:.1f} min (sweep {(swept - start) / 60:.1f} min, "
        f"fits and plots {(time.time() - swept) / 60:.1f} min); rerun to reuse the finished runs")
    return StudyResult(table=table, fit=fit3, fit_approach2=fit2, budgets=budgets, plots=plots,
                       json_paths=tuple(json_paths), failed_runs=failed,
                       messages=tuple(messages))


def fit_grouped_study(workdir: str | Path, by: str, *, n_bootstrap: int = 200, seed: int = 0):
    """One approach-3 and one approach-2 fit per value of column ``by`` of a sweep directory's
    results. Returns (results, fits3 or None, fits2 or None, messages)."""
    from attnlab.scaling import FitInputError, read_table
    from attnlab.scaling.grouped import fit_by

    results = read_table(workdir)
    fitted, messages = {}, []
    for approach in (3, 2):
        try:
            fitted[approach] = fit_by(results, by, law="chinchilla", approach=approach,
                                      n_bootstrap=n_bootstrap, seed=seed, source=str(workdir))
        except FitInputError as error:
            fitted[approach] = None
            messages.append(f"approach {approach} skipped: {error}")
    return results, fitted[3], fitted[2], messages


def largest_runs(results, by: str) -> dict:
    """variant -> the run id of its largest completed run: the largest budget (or compute),
    then the most parameters (the run that best shows how the variant behaves at scale)."""
    done = results[results["status"] == "completed"]
    order = ["budget" if "budget" in done.columns else "flops_chinchilla", "params"]
    picked = {}
    for group, runs in done.groupby(done[by].astype(str), sort=True):
        picked[group] = str(runs.sort_values(order, kind="stable").iloc[-1]["run_id"])
    return picked


def extrapolation_ratios(workdir: str | Path, results, by: str,
                         multiplier: int = EXTRAPOLATION_MULTIPLIER,
                         max_tokens: int = EXTRAPOLATION_MAX_TOKENS) -> dict:
    """variant -> (r(k), run id, note): ``attnlab extrapolate``'s ppl ratio ppl(kL) / ppl(L) of
    each variant's largest run (nonoverlapping windows; a report made earlier from the same
    checkpoint is reused). A run that cannot be evaluated gives (None, run id, why)."""
    from attnlab.extrapolation import EvalSettings, evaluate_run
    from attnlab.rundir import RUNS_DIR

    settings = EvalSettings(multipliers=(1, multiplier), max_tokens=max_tokens)
    ratios = {}
    for group, run_id in largest_runs(results, by).items():
        try:
            report = evaluate_run(Path(workdir) / RUNS_DIR / run_id, settings, progress=False)
        except AttnlabError as error:
            ratios[group] = (None, run_id, f"not evaluated: {error}")
            continue
        rows = [r for r in report["results"] if r["status"] == "ok"
                and r["protocol"] == "nonoverlapping" and r["multiplier"] == multiplier]
        if rows and rows[0]["ppl_ratio"] is not None:
            ratios[group] = (float(rows[0]["ppl_ratio"]), run_id, "")
        else:
            reasons = {r.get("reason") for r in report["results"] if r.get("reason")}
            ratios[group] = (None, run_id, "; ".join(sorted(map(str, reasons))) or
                             f"no {multiplier}x row")
    return ratios


def finish_grouped_study(workdir: str | Path, by: str, *, n_bootstrap: int = 200,
                         say=print, failed: int = 0) -> StudyResult:
    """Fits, ranks, evaluates and plots a finished sweep of variants (see the module docstring);
    writes fit.json / fit_approach2.json (``attnlab fit --by --json``'s format), ranking.csv and
    ranking.txt into ``workdir`` and the figures into ``workdir/plots``."""
    import pandas as pd

    from attnlab.scaling import prepare_points
    from attnlab.scaling.grouped import format_grouped, format_ranking, rank_at

    workdir = Path(workdir)
    results, fits3, fits2, messages = fit_grouped_study(workdir, by, n_bootstrap=n_bootstrap)
    table = prepare_points(results, law="chinchilla", source=str(workdir))
    # The reference compute: the largest run's (in each variant's own FLOP count), so the
    # ranking interpolates inside every variant's data rather than extrapolating.
    reference = float(f"{table.frame['flops'].max():.3g}")
    budgets = (reference, 10 * reference)
    for grouped in (fits3, fits2):
        if grouped is not None:
            say("\n" + format_grouped(grouped, budgets if grouped is fits3 else ()).rstrip())
    ratios = extrapolation_ratios(workdir, results, by)
    column = f"r({EXTRAPOLATION_MULTIPLIER}x)"
    if fits3 is not None or fits2 is not None:
        ranking = rank_at(reference, fits3, fits2, results)
        ranking[column] = [ratios.get(g, (None,))[0] for g in ranking[by]]
        ranking[column] = pd.to_numeric(ranking[column])
        ranking["largest_run"] = [ratios.get(g, (None, None))[1] for g in ranking[by]]
    else:
        ranking = pd.DataFrame({by: sorted(ratios)})
    say("\n" + (format_ranking(ranking) if len(ranking.columns) > 1 else "no ranking: no "
                                                                           "group was fitted"))
    say(f"{column} = ppl({EXTRAPOLATION_MULTIPLIER}L) / ppl(L) of each {by}'s largest run "
        f"(nonoverlapping windows, L = the training length)")
    for group, (_, run_id, note) in ratios.items():
        if note:
            messages.append(f"{column} of {group} ({run_id}): {note}")
    for message in messages:
        say(f"note: {message}")

    json_paths = []
    for grouped, name in ((fits3, FIT_FILE), (fits2, FIT_APPROACH2_FILE)):
        if grouped is not None:
            path = workdir / name
            path.write_text(json.dumps(grouped.to_dict(budgets), indent=2) + "\n")
            json_paths.append(path)
    ranking_path = workdir / RANKING_FILE
    ranking.to_csv(ranking_path, index=False)
    (workdir / RANKING_TEXT_FILE).write_text(format_ranking(ranking) if len(ranking.columns) > 1
                                             else "")
    json_paths.append(ranking_path)
    plots, plot_messages = draw_grouped_plots(fits3, fits2, workdir / PLOTS_DIR)
    for message in plot_messages:
        say(f"warning: {message}")
    say("wrote")
    for path in [*json_paths, workdir / RANKING_TEXT_FILE, *plots.values()]:
        say(f"  {path}")
    return StudyResult(table=table, fit=None, fit_approach2=None, budgets=budgets, plots=plots,
                       json_paths=tuple(json_paths), failed_runs=failed,
                       messages=tuple(messages),
                       grouped=GroupedStudy(by=by, fits3=fits3, fits2=fits2, ranking=ranking,
                                            ratios=ratios))


def draw_grouped_plots(fits3, fits2, out_dir: str | Path) -> tuple[dict[str, Path], list[str]]:
    """Every group's compute-optimal frontier in one figure (approach 3: N_opt(C) and the loss
    along it; approach 2: N_opt(C)), and one IsoFLOP figure per group. A figure that fails to
    draw is a message (as in :func:`draw_plots`)."""
    from attnlab.plots import scaling as plots

    out_dir = Path(out_dir)
    figures = {}
    if fits3 is not None:
        figures["frontiers"] = lambda: plots.plot_group_frontiers(fits3)
    if fits2 is not None:
        figures["frontiers_approach2"] = lambda: plots.plot_group_frontiers(fits2)
        for group, fit in fits2.fits.items():
            figures[f"isoflop_{group}"] = lambda fit=fit: plots.plot_isoflops(fit)
    return _save_figures(figures, out_dir)


def report(fit3: ScalingFit | None, fit2: ScalingFit | None, messages: list[str], source: str,
           budgets: tuple[float, ...]) -> str:
    """The printed summary: the law, `attnlab fit`'s table of estimates and compute-optimal
    allocations, and approach 2's exponents."""
    from attnlab.scaling.cli import format_report  # the report `attnlab fit` prints

    lines = []
    if fit3 is not None:
        lines += [headline(fit3), "", format_report(fit3, source, list(budgets)).rstrip()]
    if fit2 is not None:
        ci = fit2.ci
        interval = lambda name: (f" [{ci[name][0]:.3f}, {ci[name][1]:.3f}]"  # noqa: E731
                                 if name in ci else "")
        lines += ["", f"approach 2 (IsoFLOP parabolas): N_opt ~ C^{fit2.params['a']:.3f}"
                      f"{interval('a')}, D_opt ~ C^{fit2.params['b']:.3f}{interval('b')}"]
        lines += [f"approach 2 warning: {w}" for w in fit2.warnings]
        seen = fit3.notes if fit3 is not None else ()
        lines += [f"approach 2 note: {n}" for n in fit2.notes if n not in seen]
    lines += [f"note: {message}" for message in messages]
    return "\n".join(lines) + "\n"


def write_fits(workdir: Path, fit3: ScalingFit | None, fit2: ScalingFit | None,
               budgets: tuple[float, ...]) -> list[Path]:
    """The fits as JSON, in the format of ``attnlab fit --json``, with the predictions."""
    written = []
    for fit, name in ((fit3, FIT_FILE), (fit2, FIT_APPROACH2_FILE)):
        if fit is not None:
            path = workdir / name
            path.write_text(json.dumps(fit.to_dict(budgets), indent=2) + "\n")
            written.append(path)
    return written


def quickstart_main(argv: list[str]) -> int:
    """Exit codes: 0 done; 1 some run failed (the fit used the rest); 2 bad input;
    130 interrupted (rerun the same command to resume)."""
    from attnlab.sweep import SweepInterrupted, spec_from_config_dict
    from attnlab.sweep.spec import config_source

    values = cli_flags.parse(default_argv(argv), FLAGS, prog="attnlab quickstart",
                             config_required=False, description=SUMMARY)
    spec = spec_from_config_dict(values.config,
                                 source=config_source(values["config"].config_filename))
    if values["bootstrap"].value < 0:
        raise cli_flags.UsageError(f"--bootstrap must be >= 0, got {values['bootstrap'].value}")
    workdir = values["workdir"].value
    try:
        result = run_study(spec, workdir, n_bootstrap=values["bootstrap"].value,
                           parallel=values["parallel"].value, progress=values["progress"].value,
                           allow_large=values["allow-large"].value)
    except (KeyboardInterrupt, SweepInterrupted):
        sys.stderr.write(f"\ninterrupted; rerun the same command to resume ({workdir})\n")
        return 130
    return 1 if result.failed_runs else 0
