"""A sweep in stages, checked, run and dry-run; how its runs come about is one class each
(:data:`STAGES`, the first whose ``applies`` holds): ``Tuned``, a tuning stage first (the tuning
sweep in ``DIR/tune``, the picks in ``DIR/tuning.json``, then the study at those rates;
:mod:`attnlab.sweep.tuning` plans and picks); ``Refined``, with ``sweep.learning_rate.refine``
(the grid, then the rates its results call for past the grid's edge, until none does;
:mod:`attnlab.sweep.refine`); ``Plain``, every run at once. :mod:`attnlab.sweep.runner` runs
each stage. :func:`check`, :func:`run_sweep` (the package's) and :func:`dry_run_sweep` are what
``attnlab sweep`` calls."""

from __future__ import annotations

from pathlib import Path

from tqdm.auto import tqdm

from attnlab import rundir
from attnlab.sweep import refine, runner
from attnlab.sweep.definition import SweepSpec
from attnlab.sweep.planner import PlannedRun, plan
from attnlab.sweep import probe
from attnlab.sweep.runner import check_sweep_dir
from attnlab.sweep.tuning import (describe, picked, placeholder, recorded, with_picks, tuning_plan,
                                  tuning_spec)


class Stage:
    """How a sweep's runs come about. check(spec): plans what can be planned before any stage
    runs, so that a bad run config is refused (SweepSpecError naming the field) before anything
    is compiled or written; run and dry_run: what :func:`run_sweep` and :func:`dry_run_sweep`
    do with this kind of spec."""

    @staticmethod
    def applies(spec: SweepSpec) -> bool:
        return True

    def check(self, spec: SweepSpec) -> None:
        """Nothing before it starts: the runner plans (and so checks) all its runs first."""

    def run(self, spec: SweepSpec, workdir, **kw):
        raise NotImplementedError

    def dry_runs(self, spec: SweepSpec, workdir=None, **kw):
        raise NotImplementedError


class Plain(Stage):
    """Every run at once."""

    def run(self, spec, workdir, **kw):
        return runner.run_sweep(spec, workdir, **kw)

    def dry_runs(self, spec, workdir=None, **kw):
        return [(None, *probe.dry_run(spec, workdir, **kw))]


class Tuned(Stage):
    """A tuning stage, then the study at its picks."""

    @staticmethod
    def applies(spec):
        return spec.tune is not None

    def check(self, spec):
        planned_stages(spec)  # the tuning stage's runs and its study's

    def run(self, spec, workdir, **kw):
        return run_tuned(spec, workdir, **kw)

    def dry_runs(self, spec, workdir=None, **kw):
        return dry_run_stages(spec, workdir, **kw)


class Refined(Stage):
    """The grid, then each round of rates its results call for."""

    @staticmethod
    def applies(spec):
        return refine.refining(spec)

    def run(self, spec, workdir, **kw):
        return run_refined(spec, workdir, **kw)

    def dry_runs(self, spec, workdir=None, **kw):
        return dry_run_refined(spec, workdir, **kw)


STAGES = (Tuned, Refined, Plain)


def stage_of(spec: SweepSpec) -> Stage:
    return next(cls() for cls in STAGES if cls.applies(spec))


def check(spec: SweepSpec) -> None:
    """The stage's check of a spec (:meth:`Stage.check`), before anything is written."""
    stage_of(spec).check(spec)


def planned_stages(spec: SweepSpec) -> tuple[list[PlannedRun], list[PlannedRun]]:
    """A spec with a tuning stage: the stage's runs, and the study's at placeholder rates
    (:func:`attnlab.sweep.tuning.placeholder`: its shapes, tokens and FLOPs are right, its
    learning rates and run ids follow from the picks)."""
    return tuning_plan(spec), plan(with_picks(spec, placeholder(spec)))


def run_sweep(spec: SweepSpec, workdir: str | Path, **kw):
    """:func:`attnlab.sweep.runner.run_sweep` in the spec's stages (:func:`stage_of`): with
    ``sweep.tune`` the tuning stage first (:func:`run_tuned`), a refined grid in rounds
    (:func:`run_refined`); the same keyword arguments."""
    return stage_of(spec).run(spec, workdir, **kw)


def run_refined(spec: SweepSpec, workdir: str | Path, *, progress: bool = True, **kw):
    """:func:`attnlab.sweep.run_sweep` of a spec with ``sweep.learning_rate.refine``: the grid
    and the factors already added from earlier results, then each round of new ones, until the
    results call for none. Returns the last round's results table."""
    say = tqdm.write if progress else (lambda _: None)
    current = refine.grown(spec, refine.recorded_outcomes(workdir))
    while True:
        table = runner.run_sweep(current, workdir, progress=progress, **kw)
        bigger = refine.grown(spec, refine.outcomes(table))
        if bigger.grown_by == current.grown_by:
            return table
        for line in refine.describe_growth(current, bigger):
            say(line)
        current = bigger


def dry_run_sweep(spec: SweepSpec, workdir: str | Path | None = None, **kw):
    """``--dry-run``: ``[(title, table, notes), ...]``, one per stage (each
    :func:`attnlab.sweep.probe.dry_run`'s, with its keyword arguments): both stages of a tuned
    sweep (:func:`dry_run_stages`), the grid of a refined one so far (:func:`dry_run_refined`),
    else the sweep (no title)."""
    return stage_of(spec).dry_runs(spec, workdir, **kw)


def dry_run_refined(spec: SweepSpec, workdir: str | Path | None = None, **kw):
    """``--dry-run`` of a refined sweep: the grid with the factors its recorded results already
    call for, and a note on what may follow."""
    current = refine.grown(spec, refine.recorded_outcomes(workdir))
    table, notes = probe.dry_run(current, workdir, **kw)
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
    runs, study = planned_stages(spec)  # a bad config in either stage: refused first
    workdir = Path(workdir).absolute()
    check_sweep_dir(workdir, spec.name, allow_nonempty=allow_nonempty)
    if not kw.get("allow_large"):  # a study too large for the machine: refused before tuning
        from attnlab.train.memory import check_training_fits

        for run in study:
            check_training_fits(run.cfg, where=f"study run {run.run_id.rsplit('-', 1)[0]}: ")
    table = runner.run_sweep(tuning_spec(spec), workdir / rundir.TUNE_DIR, progress=progress,
                             **kw)
    tuning, lines = picked(spec, runs, table, workdir)
    say = tqdm.write if progress else (lambda _: None)
    for line in lines:
        say(line)
    if tuning is None:
        return table
    return runner.run_sweep(with_picks(spec, tuning["arms"]), workdir, progress=progress,
                            allow_nonempty=allow_nonempty, **kw)


def dry_run_stages(spec: SweepSpec, workdir: str | Path | None = None, **kw):
    """``--dry-run`` of both stages: ``[(title, table, notes), ...]`` (each
    :func:`attnlab.sweep.probe.dry_run`'s). Before the tuning has run, the study's rows show
    ``lr`` = ``tuned`` and no run id (both follow from the picks)."""
    runs, _ = planned_stages(spec)  # both stages checked before the first probe compiles
    workdir = Path(workdir) if workdir else None
    tuning = recorded(workdir, runs)
    study = with_picks(spec, tuning["arms"] if tuning else placeholder(spec))
    said = describe(tuning) if tuning else [
        "learning rates 'tuned': picked by the tuning stage above (run ids follow from them; "
        "the estimates hold)"]
    tune_table, tune_notes = probe.dry_run(tuning_spec(spec),
                                     workdir / rundir.TUNE_DIR if workdir else None, **kw)
    table, notes = probe.dry_run(study, workdir, **kw)
    if not tuning:
        table["run_id"] = "(after tuning)"
        table["lr"] = "tuned"
        table["status"] = rundir.PENDING
    return [(f"tuning stage ({rundir.TUNE_DIR}/)", tune_table, tune_notes),
            ("study", table, said + notes)]
