"""``attnlab sweep --config=experiments/<name>.py --sweep=DIR [flags]``.

Exit codes: 0 every planned run ended completed or diverged (a diverged run is a result of the
study, e.g. a learning rate too high); 1 some run failed (see the results table's ``error``
column); 2 bad input (printed by the dispatcher, nothing started); 130 interrupted (rerun the same
command to resume).
"""

from __future__ import annotations

import sys

from attnlab import cli_flags, rundir
from attnlab import cli_vocab as vocab
from attnlab.cli_flags import Flag
from attnlab.ensembles import CHOICES, ENSEMBLE_MAX
from attnlab.rundir import COMPLETED, DIVERGED, FAILED, TABLE_FILE
from attnlab.sweep import stages
from attnlab.sweep.launchers import LAUNCHERS, SweepInterrupted
from attnlab.sweep.probe import PROBES, format_table
from attnlab.sweep.spec import config_source, spec_from_config_dict

FLAGS = [
    vocab.CONFIG.flag("The experiment (experiments/*.py).", required=True),
    vocab.SWEEP.flag("The one to write (created if missing); rerunning resumes.", required=True,
                     old_names=("workdir",)),
    vocab.LAUNCHER.flag(default="local", enum_values=tuple(LAUNCHERS)),
    vocab.PARALLEL.flag(default=1),
    Flag("dry-run", "bool", False, "Print the planned runs with estimated times; run nothing."),
    Flag("probe", "enum", "steps", "Dry run: time a few real train steps of the smallest and "
                                   "largest shape (steps), or skip the estimate (none).",
         enum_values=tuple(PROBES)),
    Flag("retry-failed", "bool", False, "Also rerun failed runs (resuming from their checkpoint) "
                                        "and diverged runs (from scratch)."),
    Flag("ray-address", "string", "", "Ray cluster to submit to (e.g. auto, ray://host:10001); "
                                      "empty starts a local one."),
    Flag("cache-dir", "string", "", "JAX persistent compilation cache (default "
                                    "$JAX_COMPILATION_CACHE_DIR, else DIR/jax_cache); share one "
                                    "between sweeps to reuse compiled programs."),
    Flag("compile-ahead", "bool", False, "Local launcher: a worker compiles its next run's "
                                          "programs while the current run trains (faster new "
                                          "shapes; the overlapped run's tokens/s reads low)."),
    Flag("ensemble", "enum", "auto", "on: train runs that differ only in seeds, learning-rate "
                                     "schedule, length or weight decay together, as one "
                                     "compiled program; off: every run alone; auto: on where "
                                     "the runs train on an accelerator, off on a CPU (where "
                                     "ensembles were slower, docs/benchmarks.md).",
         enum_values=CHOICES),
    Flag("ensemble-max", "integer", ENSEMBLE_MAX, "Most runs in one ensemble (also capped by "
                                                  "memory)."),
    vocab.PROGRESS.flag("A bar and one line per finished run.", default=True),
    vocab.ALLOW_LARGE.flag(default=False),
    vocab.ALLOW_NONEMPTY.flag(default=False),
]


def sweep_main(argv: list[str]) -> int:
    values = cli_flags.parse(argv, FLAGS, prog="attnlab sweep")
    spec = spec_from_config_dict(values.config,
                                 source=config_source(values["config"].config_filename))
    stages.check(spec)  # a bad run config is the spec's error: refused before any flag's
    _check_flags(values)
    ensemble = dict(ensemble=values["ensemble"].value, ensemble_max=values["ensemble-max"].value)
    if values["dry-run"].value:
        return _dry_run(spec, values, ensemble)
    return _run(spec, values, ensemble)


def _check_flags(values) -> None:
    """The flags' own rules, before any work: each refusal names its flag."""
    if values["ensemble-max"].value < 1:
        raise cli_flags.UsageError(f"--ensemble-max must be >= 1, got "
                                   f"{values['ensemble-max'].value}")
    if not values["dry-run"].value:
        cli_flags.refuse_given(values, ("probe",), "applies with --dry-run only")
    if values["ensemble"].value == "off":
        cli_flags.refuse_given(values, ("ensemble-max",), "applies with --ensemble=on or auto only")
    if values["cache-dir"].value:
        rundir.check_can_create_dir(values["cache-dir"].value, "--cache-dir")


def _dry_run(spec, values, ensemble: dict) -> int:
    """Prints each stage's planned runs and notes (``--dry-run``)."""
    for title, table, notes in stages.dry_run_sweep(spec, values["sweep"].value,
                                                    probe=values["probe"].value,
                                                    parallel=values["parallel"].value,
                                                    **ensemble):
        if title:
            print(f"## {title}")
        print(format_table(table))
        for note in notes:
            print(f"# {note}")
    return 0


def _run(spec, values, ensemble: dict) -> int:
    """Runs the sweep; prints where its results are and why any run failed."""
    workdir = values["sweep"].value
    try:
        table = stages.run_sweep(spec, workdir, launcher=values["launcher"].value,
                                 parallel=values["parallel"].value,
                                 retry_failed=values["retry-failed"].value,
                                 progress=values["progress"].value,
                                 ray_address=values["ray-address"].value or None,
                                 cache_dir=values["cache-dir"].value or None,
                                 allow_large=values["allow-large"].value,
                                 compile_ahead=values["compile-ahead"].value,
                                 allow_nonempty=values["allow-nonempty"].value, **ensemble)
    except (KeyboardInterrupt, SweepInterrupted):
        sys.stderr.write(f"\ninterrupted; rerun the same command to resume ({workdir})\n")
        return 130
    counts = table["status"].value_counts().to_dict()
    print(f"results: {workdir}/{TABLE_FILE} ({', '.join(f'{n} {s}' for s, n in counts.items())})")
    for line in failure_lines(table):
        print(line)
    # a run not finished once the sweep is (failed, vanished, left partial) fails the command
    return 0 if set(counts) <= {COMPLETED, DIVERGED} else 1


def failure_lines(table, most: int = 3) -> list[str]:
    """One line per failed run (the first ``most``): its id and the first line of its error, so
    a failed sweep says why without a look into each run's summary."""
    failed = table[table["status"] == FAILED] if "error" in table.columns else table.iloc[:0]
    lines = []
    for _, row in failed.head(most).iterrows():
        error = str(row["error"] or "no error recorded").strip().splitlines() or ["?"]
        lines.append(f"failed: {row['run_id']}: {error[0][:300]}")
    if len(failed) > most:
        lines.append(f"failed: {len(failed) - most} more (the results table's error column)")
    return lines
