"""``attnlab quickstart``: the sweep, Chinchilla's approaches 3 and 2, the report and the
figures (see :mod:`attnlab.study`); a sweep of variants goes on to :mod:`attnlab.study.grouped`."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab import cli_flags
from attnlab import cli_vocab as vocab
from attnlab import rundir
from attnlab.study.common import (DEFAULT_EXPERIMENT, DEFAULT_WORKDIR, LEARNING_RATE_COLUMN,
                                  PLOTS_DIR, PREDICTION_MULTIPLIERS, StudyError, StudyResult,
                                  pick_notes, save_figures, write_fits)
from attnlab.study.grouped import finish_grouped_study

if TYPE_CHECKING:  # the heavy imports (JAX, pandas) wait until the command runs
    from attnlab.scaling import ScalingFit, ScalingTable
    from attnlab.sweep import SweepSpec

FLAGS = [
    vocab.CONFIG.flag("The experiment (default experiments/quickstart.py)."),
    vocab.SWEEP.flag("The study's: the sweep's runs, results table, fits and plots (rerun to "
                     "reuse finished runs).", default=DEFAULT_WORKDIR, old_names=("workdir",)),
    vocab.BOOTSTRAP.flag("For the intervals.", default=200),
    vocab.PARALLEL.flag(default=1),
    vocab.PROGRESS.flag("The sweep's bar and one line per run.", default=True),
    vocab.ALLOW_LARGE.flag(default=False),
    vocab.ALLOW_NONEMPTY.flag(default=False),
]
# Printed above the flags by --help.
SUMMARY = ("attnlab quickstart: the sweep of experiments/quickstart.py (or of --config), "
           "Chinchilla\nfits with bootstrap intervals, compute-optimal predictions, PNG plots in "
           "SWEEP/plots/.\nRerun the same command to reuse the finished runs.\n\n")


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


def fit_study(workdir: str | Path, *, n_bootstrap: int = 200, seed: int = 0,
              best_over: str | None = None):
    """Fits Chinchilla approach 3 (and approach 2 when the runs carry budgets) to a sweep
    directory, each point at its best ``best_over`` value when given. Returns (table, fit3 or
    None, fit2 or None, messages): a fit that fails is a message, so the study still reports and
    plots what it has."""
    from attnlab.scaling import FitError, FitInputError, FitRequest

    three, two = (FitRequest.of(workdir, approach=approach, best_over=best_over,
                                n_bootstrap=n_bootstrap, seed=seed) for approach in (3, 2))
    inputs = three.read()
    messages = pick_notes(inputs.picks, best_over)
    table = three.table(inputs)
    fit3 = fit2 = None
    try:
        fit3 = three.fit(inputs)[1]
    except (FitInputError, FitError) as error:
        messages.append(f"approach 3 skipped: {error}")
    if two.table(inputs).budget is None:  # a ladder's branches lie on lines of constant N
        messages.append("approach 2 skipped: the sweep has no compute budgets (only isoflop "
                        "and ladder sweeps have them)")
    else:
        try:
            fit2 = two.fit(inputs)[1]
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
    return save_figures(figures, out_dir)


def headline(fit3: ScalingFit) -> str:
    """The fitted law and the allocation exponents, next to the published ones. A parameter the
    data do not pin (``ScalingFit.not_pinned``: undetermined, or an interval too wide to act on)
    is shown by its name, not by a value that means nothing."""
    p = fit3.params

    def value(name: str, spec: str) -> str:
        return name if name in fit3.not_pinned else format(p[name], spec)

    lines = ["fitted law (L: validation loss in nats per token, N: parameters, D: tokens):",
             f"  L(N, D) = {value('E', '.3f')} + {value('A', '.4g')} / N^{value('alpha', '.3f')} "
             f"+ {value('B', '.4g')} / D^{value('beta', '.3f')}"]
    if fit3.allocation_determined and "a" in fit3.too_wide:
        lines.append(f"  N_opt ~ C^a: not pinned, {fit3.too_wide['a']} (Hoffmann et al. 2022, "
                     f"approach 3: C^0.46)")
    elif fit3.allocation_determined:
        lines.append(f"  N_opt ~ C^{p['a']:.3f}, D_opt ~ C^{p['b']:.3f}   (Hoffmann et al. 2022, "
                     f"approach 3: C^0.46, C^0.54)")
    else:
        lines.append(f"  N_opt ~ C^a: not determined, these runs do not pin "
                     f"{', '.join(n for n in fit3.unpinned if n not in ('a', 'b', 'G'))} "
                     f"(degenerate fit: see the warnings below; add sizes or budgets)")
    return "\n".join(lines)


def run_study(spec: SweepSpec, workdir: str | Path, *, n_bootstrap: int = 200, parallel: int = 1,
              progress: bool = True, out=None, allow_large: bool = False,
              allow_nonempty: bool = False) -> StudyResult:
    """Sweep, fit, print and plot (see the module docstring); ``out`` (default stdout) receives
    the report."""
    import numpy as np

    from attnlab.results import describe_seed_spread
    from attnlab.sweep import run_sweep

    workdir = Path(workdir)
    out = out or sys.stdout
    say = lambda text="": print(text, file=out, flush=True)  # noqa: E731
    start = time.time()
    say(f"attnlab quickstart: sweep {spec.name!r} ({spec.mode}, scale {spec.scale}) in {workdir}")
    results = run_sweep(spec, workdir, parallel=parallel, progress=progress,
                        allow_large=allow_large, allow_nonempty=allow_nonempty)
    swept = time.time()
    counts = results["status"].value_counts().to_dict()
    say(f"sweep done in {(swept - start) / 60:.1f} min: "
        + ", ".join(f"{n} {s}" for s, n in counts.items()))
    spread = describe_seed_spread(results)
    if spread:
        say(spread)
    failed = int(counts.get(rundir.FAILED, 0)) + int(counts.get(rundir.MISSING, 0))
    if failed:
        say(f"warning: {failed} run(s) failed or went missing; their errors are in the 'error' "
            f"column of {workdir / 'results.csv'} and in each run's train.log. Fitting the "
            f"rest.")
    best_over = LEARNING_RATE_COLUMN if spec.tries_rates else None
    if spec.variants:
        with np.errstate(all="ignore"):
            result = finish_grouped_study(workdir, spec.variant_column, n_bootstrap=n_bootstrap,
                                          say=say, failed=failed, baseline=spec.baseline,
                                          best_over=best_over)
        say(f"\ndone in {(time.time() - start) / 60:.1f} min (sweep {(swept - start) / 60:.1f} "
            f"min, fits, extrapolation and plots {(time.time() - swept) / 60:.1f} min); rerun "
            f"to reuse the finished runs")
        return result

    # Bootstrap replicates of a small sweep can be degenerate (alpha + beta ~ 0, E ~ 0): their
    # overflow warnings would bury the report, and the intervals already show that spread.
    with np.errstate(all="ignore"):
        table, fit3, fit2, messages = fit_study(workdir, n_bootstrap=n_bootstrap,
                                                best_over=best_over)
        budgets = prediction_budgets(table)
        say("\n" + report(fit3, fit2, messages, str(workdir), budgets, table))
        json_paths = write_fits(workdir, fit3, fit2, budgets, table)
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


def report(fit3: ScalingFit | None, fit2: ScalingFit | None, messages: list[str], source: str,
           budgets: tuple[float, ...], table: ScalingTable | None = None) -> str:
    """The printed summary: the law, `attnlab fit`'s table of estimates and compute-optimal
    allocations, and approach 2's exponents."""
    from attnlab.scaling.tables.report import format_report  # the report `attnlab fit` prints

    lines = []
    # The allocation the data pin comes first: approach 2's, where approach 3's is loose.
    leads = (fit2 is not None and "a" in fit2.ci and "a" not in fit2.not_pinned
             and (fit3 is None or "a" in fit3.not_pinned))
    if leads:
        lines += [f"pinned by these runs: {approach2_line(fit2)}   (Hoffmann et al. 2022, "
                  f"approach 2: C^0.49, C^0.51)", ""]
    if fit3 is not None:
        lines += [headline(fit3), "",
                  format_report(fit3, source, list(budgets), table=table).rstrip()]
    if fit2 is not None:
        lines += [""] + ([] if leads else [approach2_line(fit2)])
        lines += [f"approach 2 warning: {w}" for w in fit2.warnings]
        seen = fit3.notes if fit3 is not None else ()
        lines += [f"approach 2 note: {n}" for n in fit2.notes if n not in seen]
    lines += [f"note: {message}" for message in messages]
    return "\n".join(lines) + "\n"


def approach2_line(fit2: ScalingFit) -> str:
    ci = fit2.ci
    interval = lambda name: (f" [{ci[name][0]:.3f}, {ci[name][1]:.3f}]"  # noqa: E731
                             if name in ci else "")
    return (f"approach 2 (IsoFLOP parabolas): N_opt ~ C^{fit2.params['a']:.3f}{interval('a')}, "
            f"D_opt ~ C^{fit2.params['b']:.3f}{interval('b')}")


def quickstart_main(argv: list[str]) -> int:
    """Exit codes: 0 done; 1 some run failed (the fit used the rest); 2 bad input;
    130 interrupted (rerun the same command to resume)."""
    from attnlab.sweep import SweepInterrupted, spec_from_config_dict
    from attnlab.sweep.spec import config_source

    values = cli_flags.parse(default_argv(argv), FLAGS, prog="attnlab quickstart",
                             description=SUMMARY)
    spec = spec_from_config_dict(values.config,
                                 source=config_source(values["config"].config_filename))
    if values["bootstrap"].value < 0:
        raise cli_flags.UsageError(f"--bootstrap must be >= 0, got {values['bootstrap'].value}")
    workdir = values["sweep"].value
    try:
        result = run_study(spec, workdir, n_bootstrap=values["bootstrap"].value,
                           parallel=values["parallel"].value, progress=values["progress"].value,
                           allow_large=values["allow-large"].value,
                           allow_nonempty=values["allow-nonempty"].value)
    except (KeyboardInterrupt, SweepInterrupted):
        sys.stderr.write(f"\ninterrupted; rerun the same command to resume ({workdir})\n")
        return 130
    return 1 if result.failed_runs else 0
