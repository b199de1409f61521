"""A sweep in stages, run and dry-run. With a tuning stage: the tuning sweep in ``DIR/tune``,
the picks in ``DIR/tuning.json``, then the study at those rates (:mod:`attnlab.sweep.tuning`
plans and picks). With ``sweep.learning_rate.refine``: the grid, then the rates its results call
for past the grid's edge, until none does (:mod:`attnlab.sweep.refine`).
:mod:`attnlab.sweep.runner` runs each stage. :func:`run_sweep` is the package's entry point: a
spec with neither goes straight to the runner."""

from __future__ import annotations

from pathlib import Path

from tqdm.auto import tqdm

from attnlab import rundir
from attnlab.sweep import refine, runner
from attnlab.sweep.definition import SweepSpec
from attnlab.sweep.planner import plan
from attnlab.sweep.probe import dry_run
from attnlab.sweep.runner import check_sweep_dir
from attnlab.sweep.tuning import (choose, describe, placeholder, recorded, with_picks, tuning_plan,
                                  tuning_spec)


def run_sweep(spec: SweepSpec, workdir: str | Path, **kw):
    """:func:`attnlab.sweep.runner.run_sweep`, or with ``sweep.tune`` the tuning stage first
    (:func:`run_tuned`); the same keyword arguments."""
    if spec.tune is not None:
        return run_tuned(spec, workdir, **kw)
    if refine.refining(spec):
        return run_refined(spec, workdir, **kw)
    return runner.run_sweep(spec, workdir, **kw)


def run_refined(spec: SweepSpec, workdir: str | Path, *, progress: bool = True, **kw):
    """:func:`attnlab.sweep.run_sweep` of a spec with ``sweep.learning_rate.refine``: the grid
    and the factors already added from earlier results, then each round of new ones, until the
    results call for none. Returns the last round's results table."""
    say = tqdm.write if progress else (lambda _: None)
    current = refine.grown(spec, refine.recorded(workdir))
    while True:
        table = runner.run_sweep(current, workdir, progress=progress, **kw)
        bigger = refine.grown(spec, refine.outcomes(table))
        if bigger.grown_by == current.grown_by:
            return table
        for line in refine.describe(current, bigger):
            say(line)
        current = bigger


def dry_run_refined(spec: SweepSpec, workdir: str | Path | None = None, **kw):
    """``--dry-run`` of a refined sweep: the grid with the factors its recorded results already
    call for, and a note on what may follow."""
    current = refine.grown(spec, refine.recorded(workdir))
    table, notes = dry_run(current, workdir, **kw)
    grown = sum(len(factors) for _, factors in current.refinements)
    said = []
    if refine.refines(spec):
        said.append(f"learning_rate.refine: a point whose best rate is at its grid's edge once "
                    f"its runs finish gains the next rate beyond it (up to "
                    f"{refine.refines(spec)} a side); {grown} added from the results so far")
    if spec.refine_batch:
        added = sum(len(sizes) for _, sizes in current.extra_batches)
        said.append(f"refine_batch: a group whose best batch size is at the axis's edge once its "
                    f"runs finish gains the next one beyond it (up to {spec.refine_batch} a "
                    f"side); {added} added from the results so far")
    return [(None, table, said + notes)]


# -- the two stages ---------------------------------------------------------------------------


def run_tuned(spec: SweepSpec, workdir: str | Path, *, progress: bool = True,
              allow_nonempty: bool = False, **kw):
    """:func:`attnlab.sweep.run_sweep` of a spec with a tuning stage: the tuning sweep in
    ``DIR/tune``, the picks in ``DIR/tuning.json``, then the study in ``DIR``. Returns the
    study's results table, or the tuning stage's while some tuning run failed (the study waits
    for every tuning run to be final: rerun with ``retry_failed``)."""
    workdir = Path(workdir).absolute()
    check_sweep_dir(workdir, spec.name, allow_nonempty=allow_nonempty)
    if not kw.get("allow_large"):  # a study too large for the machine: refused before tuning
        from attnlab.train.memory import check_training_fits

        for run in plan(with_picks(spec, placeholder(spec))):
            check_training_fits(run.cfg, where=f"study run {run.run_id.rsplit('-', 1)[0]}: ")
    tune = tuning_spec(spec)
    runs = tuning_plan(spec)
    table = runner.run_sweep(tune, workdir / rundir.TUNE_DIR, progress=progress, **kw)
    rows = {row["run_id"]: row for row in table.to_dict("records")}
    say = tqdm.write if progress else (lambda _: None)
    unfinished = [r.run_id for r in runs
                  if rows.get(r.run_id, {}).get("status") not in rundir.FINAL_STATUSES
                  or rows[r.run_id]["status"] == rundir.FAILED]
    if unfinished:
        say(f"tuning stage: {len(unfinished)} run(s) not finished ({unfinished[0]}, ...); the "
            f"study waits for them (rerun with --retry-failed)")
        return table
    tuning = choose(spec, runs, rows)
    if rundir.read_json_or_none(workdir / rundir.TUNING_FILE) != tuning:
        rundir.write_json_atomic(workdir / rundir.TUNING_FILE, tuning)
    for line in describe(tuning):
        say(line)
    return runner.run_sweep(with_picks(spec, tuning["arms"]), workdir, progress=progress,
                     allow_nonempty=allow_nonempty, **kw)


def dry_run_stages(spec: SweepSpec, workdir: str | Path | None = None, **kw):
    """``--dry-run`` of both stages: ``[(title, table, notes), ...]`` (each
    :func:`attnlab.sweep.probe.dry_run`'s). Before the tuning has run, the study's rows show
    ``lr`` = ``tuned`` and no run id (both follow from the picks)."""
    workdir = Path(workdir) if workdir else None
    tune = tuning_spec(spec)
    tune_table, tune_notes = dry_run(tune, workdir / rundir.TUNE_DIR if workdir else None, **kw)
    tuning = recorded(workdir, tuning_plan(spec))
    study = with_picks(spec, tuning["arms"] if tuning else placeholder(spec))
    table, notes = dry_run(study, workdir, **kw)
    if tuning:
        notes = describe(tuning) + notes
    else:
        table["run_id"] = "(after tuning)"
        table["lr"] = "tuned"
        table["status"] = rundir.PENDING
        notes = ["learning rates 'tuned': picked by the tuning stage above (run ids follow "
                 "from them; the estimates hold)"] + notes
    return [(f"tuning stage ({rundir.TUNE_DIR}/)", tune_table, tune_notes),
            ("study", table, notes)]
