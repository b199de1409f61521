"""``--dry-run``: the planned runs as a table, with times estimated from a throughput probe.

The probe trains the smallest and the largest shape of the sweep (by FLOPs per token; of each
variant's runs for a sweep of ``sweep.variants``) for a few real steps in a worker process,
exactly as the sweep would, and reads the step throughput that training logs (which leaves out
the first, compiling step and the evaluations). Each run's time is then its FLOPs divided by the
FLOP rate interpolated for its shape (log-linear in FLOPs per token between the two probes; flat
beyond them), plus its evaluations (forward only, one third of a training step per token).
Start-up and compilation are reported separately: they are paid once per worker and per new
shape, and the persistent compilation cache shrinks them on reruns.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from attnlab import rundir
from attnlab.sweep.launchers import WorkerProcess
from attnlab.sweep.planner import PlannedRun, expand
from attnlab.ensembles import ENSEMBLE_MAX
from attnlab.sweep.runner import check_data, ensemble_units, run_record
from attnlab.sweep.definition import SweepSpec


@dataclasses.dataclass(frozen=True)
class ProbePoint:
    """One probed shape: its FLOPs per token (chinchilla count) and measured rates."""

    label: str
    flops_per_token: float
    tokens_per_s: float
    overhead_seconds: float  # start-up + compilation + first step of this probe run

    @property
    def flops_per_s(self) -> float:
        return self.flops_per_token * self.tokens_per_s


def probe_throughput(runs: list[PlannedRun], *, steps: int = 12,
                     cache_dir: str | None = None) -> list[ProbePoint]:
    """Trains the smallest and largest run's shape for ``steps`` steps; returns their rates.

    A ladder's cooldown branch is probed as a lone run of its shape (the rate is the shape's)."""
    by_cost = sorted(runs, key=lambda r: r.flops_per_token["chinchilla"])
    chosen = [by_cost[0]] if len(by_cost) == 1 else [by_cost[0], by_cost[-1]]
    points = []
    with tempfile.TemporaryDirectory(prefix="attnlab-probe-") as tmp:
        worker = WorkerProcess(cpus=None,
                               cache_dir=cache_dir or str(Path(tmp) / rundir.JAX_CACHE_DIR),
                               log_path=Path(tmp) / "worker.log")
        try:
            for run in chosen:
                train = dataclasses.replace(run.cfg.train, steps=steps, tokens=0,
                                            eval_every=10 * steps, eval_batches=1, log_every=1,
                                            checkpoint_every=10 * steps,
                                            warmup_steps=min(run.cfg.train.warmup_steps, 1),
                                            branch_from="", branch_step=0, keep_steps=())
                cfg = dataclasses.replace(run.cfg, train=train, name="probe")
                probe_run = dataclasses.replace(run, cfg=cfg)
                run_dir = Path(tmp) / run.run_id
                run_dir.mkdir()
                record = run_record(SweepSpec("probe", "grid", "cpu", cfg), probe_run)
                rundir.write_json_atomic(run_dir / rundir.RUN_FILE, record)
                outcome, = worker.execute([run_dir])
                if outcome["status"] != rundir.COMPLETED:
                    raise RuntimeError(f"throughput probe of {run.run_id} {outcome['status']}: "
                                       f"{outcome.get('error')}")
                summary = rundir.read_json(run_dir / rundir.SUMMARY_FILE)
                rates = [r["tokens_per_s"] for r in rundir.read_metrics(
                    run_dir / rundir.METRICS_FILE) if r.get("tokens_per_s")]
                rate = float(np.median(rates))
                step_seconds = steps * run.cfg.data.batch_size * run.cfg.data.seq_len / rate
                points.append(ProbePoint(
                    label=f"d{run.cfg.model.d_model}-l{run.cfg.model.n_layers}",
                    flops_per_token=run.flops_per_token["chinchilla"], tokens_per_s=rate,
                    overhead_seconds=max(0.0, summary["wall_seconds"] - step_seconds)))
        finally:
            worker.close()
    return points


def estimate_seconds(run: PlannedRun, points: list[ProbePoint]) -> float:
    """Training plus evaluation time of ``run`` from the probed FLOP rates (no start-up)."""
    per_token = run.flops_per_token["chinchilla"]
    if len(points) == 1 or points[0].flops_per_token == points[-1].flops_per_token:
        rate = points[0].flops_per_s
    else:
        lo, hi = points[0], points[-1]
        x = (math.log(per_token) - math.log(lo.flops_per_token)) / (
            math.log(hi.flops_per_token) - math.log(lo.flops_per_token))
        x = min(1.0, max(0.0, x))
        rate = math.exp((1 - x) * math.log(lo.flops_per_s) + x * math.log(hi.flops_per_s))
    t = run.cfg.train
    evals = run.steps // t.eval_every + (1 if run.steps % t.eval_every else 0)
    evals -= t.branch_step // t.eval_every  # a branch evaluates only in its cooldown
    eval_tokens = evals * t.eval_batches * run.cfg.data.batch_size * run.cfg.data.seq_len
    return (run.tokens - run.shared_tokens + eval_tokens / 3) * per_token / rate


# --probe: whether a dry run times real train steps (its estimate) or skips them.
PROBES = {"steps": True, "none": False}


def dry_run(spec: SweepSpec, workdir: str | Path | None = None, *, probe: str = "steps",
            parallel: int = 1, ensemble: str = "auto",
            ensemble_max: int = ENSEMBLE_MAX) -> tuple[pd.DataFrame, list[str]]:
    """The planned runs as a table (one row per run) and notes to print under it.

    Columns: run_id, [budget], [role, trunk (its id's hash), from_step, trained_flops
    (chinchilla count, a branch's cooldown only): ladder mode], d_model, n_layers, n_heads,
    other swept values, params, non_emb_params, tokens, steps, lr, warmup, flops_6nd,
    flops_chinchilla, status (from ``workdir``, if it exists), unit (the runs trained together
    as one ensemble share it, as the sweep groups them: ``ensemble`` and ``ensemble_max`` are
    run_sweep's, the platform this machine's),
    est_seconds (with probe='steps'; none for a run too large to probe).
    """
    runs, notes = expand(spec)
    workdir = Path(workdir) if workdir else None
    table = pd.DataFrame([_plan_row(run, workdir) for run in runs])
    ids = [run.run_id for run in runs]
    todo = [run for run, status in zip(runs, table["status"])
            if status not in rundir.FINAL_STATUSES]
    units = ensemble_units(spec, runs, ids, set(ids), ensemble=ensemble,
                           ensemble_max=ensemble_max)
    # A bad data source, or a run over sweep.max_epochs, fails the dry run too, naming its field.
    data_notes = check_data(todo, spec.max_epochs)
    unit_of = {run_id: i for i, unit in enumerate(units) for run_id in unit}
    table["unit"] = [unit_of[run_id] for run_id in ids]
    notes = list(notes) + _plan_notes(spec, runs, units, todo) + data_notes
    too_large = memory_refusals(todo)
    notes += [f"warning: {text}" for text in too_large.values()]
    fits = [run for run in runs if run.run_id not in too_large]  # probing one would not fit
    if PROBES[probe] and fits:
        seconds, probe_notes, overhead = _probe_estimates(spec, fits, workdir)
        table["est_seconds"] = [seconds.get(run_id, np.nan) for run_id in ids]
        notes += probe_notes
        notes.append(_time_note([seconds[run.run_id] for run in todo if run.run_id in seconds],
                                overhead, parallel))
    return table, notes


def _plan_row(run, workdir: Path | None) -> dict:
    """One planned run's row of the dry-run table."""
    c = run.cfg
    row = {"run_id": run.run_id}
    if run.budget is not None:
        row["budget"] = run.budget
    if run.role:  # ladder mode: which run each branch starts from, and where
        row.update(role=run.role, trunk=c.train.branch_from.rsplit("-", 1)[-1] or "-",
                   from_step=c.train.branch_step, trained_flops=run.trained_flops("chinchilla"))
    row.update(d_model=c.model.d_model, n_layers=c.model.n_layers, n_heads=c.model.n_heads)
    for key, value in run.axes.items():
        short = key.split(".", 1)[-1]  # a variant column has no section
        if short not in row and key not in _SHOWN_ELSEWHERE:
            row[short] = value
    row.update(params=run.params["total"], non_emb_params=run.params["non_embedding"],
               tokens=run.tokens, steps=run.steps, lr=c.train.learning_rate,
               warmup=c.train.warmup_steps, flops_6nd=run.flops("kaplan_6n"),
               flops_chinchilla=run.flops("chinchilla"))
    row["status"] = (rundir.run_status(workdir / rundir.RUNS_DIR / run.run_id) if workdir
                     else rundir.PENDING)
    return row


def _plan_notes(spec: SweepSpec, runs: list, units: list, todo: list) -> list[str]:
    """What the plan adds up to: ensembles, runs and FLOPs, the ladder, the design's widths."""
    notes = []
    if len(units) < len(runs):
        notes.append(f"ensembles: {len(runs)} runs in {len(units)} units of up to "
                     f"{max(map(len, units))} runs, each unit one compiled program (the time "
                     f"estimates below are for lone runs: an upper bound)")
    budgets = (f"; isoflop budgets use the '{spec.flops_per_token}' count"
               if spec.kind.uses_budgets else "")
    notes.append(f"{len(runs)} runs ({len(todo)} to run); total "
                 f"{sum(r.trained_flops('chinchilla') for r in runs):.3g} FLOPs (chinchilla "
                 f"count){budgets}")
    if spec.kind.uses_branches:
        notes.append(ladder_note(runs))
    if spec.kind.fitted_by_chinchilla:
        notes += design_notes(runs, spec.variant_column if spec.variants else None)
    return notes


def _probe_estimates(spec: SweepSpec, runs: list, workdir: Path | None
                     ) -> tuple[dict[str, float], list[str], float]:
    """({run_id: estimated seconds}, the probes' notes, their mean start-up + compile seconds
    per run). A sweep of variants (e.g. sequence mixers) probes each variant's own shapes: FLOP
    rates differ by mixer (a scan runs far below a matrix product on a CPU)."""
    cache = rundir.compilation_cache_dir(workdir if workdir and workdir.exists() else None)
    column = spec.variant_column if spec.variants else None
    group_of = {run.run_id: run.axes[column] if column else None for run in runs}
    groups: dict = {}
    for run in runs:
        groups.setdefault(group_of[run.run_id], []).append(run)
    probed = {group: probe_throughput(members, cache_dir=str(cache) if cache else None)
              for group, members in groups.items()}
    seconds = {run.run_id: estimate_seconds(run, probed[group_of[run.run_id]]) for run in runs}
    notes = [
        f"probe {f'{group} ' if group else ''}{p.label}: {p.tokens_per_s:,.0f} tokens/s = "
        f"{p.flops_per_s / 1e9:.2f} GFLOP/s (chinchilla count), start-up + compile "
        f"{p.overhead_seconds:.1f} s" for group, points in probed.items() for p in points]
    overhead = float(np.mean([p.overhead_seconds for points in probed.values() for p in points]))
    return seconds, notes, overhead


def _time_note(remaining: list[float], overhead: float, parallel: int) -> str:
    total = (sum(remaining) + overhead * len(remaining)) / parallel
    return (f"estimated time to run: {sum(remaining) / parallel / 60:.1f} min of training and "
            f"evaluation, {total / 60:.1f} min with ~{overhead:.0f} s start-up and compilation "
            f"per run ({parallel} worker(s); an upper bound: compilations cached from earlier "
            f"runs of a shape load faster)")


_SHOWN_ELSEWHERE = ("train.learning_rate", "train.warmup_steps", "train.tokens",
                    "train.schedule", "train.branch_step", "train.decay_fraction")


def memory_refusals(runs: list[PlannedRun]) -> dict[str, str]:
    """run id -> the line with which the sweep would refuse the run on this machine (its
    memory estimate exceeds the machine's; ``--allow-large`` runs it anyway)."""
    from attnlab.train.memory import TooLargeError, check_training_fits

    refused = {}
    for run in runs:
        try:
            check_training_fits(run.cfg, where=f"run {run.run_id}: ")
        except TooLargeError as e:
            refused[run.run_id] = f"{e} (the sweep refuses it here without --allow-large)"
    return refused


def design_notes(runs: list[PlannedRun], column: str | None = None) -> list[str]:
    """Whether the planned (params, tokens) points can pin approach 3's law
    (``attnlab.scaling.design``): a line per variant (``column``: the variant column) with the
    expected interval widths, and a warning where they miss the targets. A ladder's trunks are
    left out: its points are the branches, whose noise their trunk shares. A point trained at
    several learning rates counts once per seed, as a fit at each point's best rate
    (``--best-over``) reads it."""
    from attnlab.scaling.design import check_design

    groups: dict = {}
    seen = set()
    for run in runs:
        once = (run.point, run.cfg.train.seed, run.cfg.data.seed) if run.point else run.run_id
        if run.role != rundir.TRUNK and once not in seen:
            seen.add(once)
            groups.setdefault(run.axes[column] if column else None, []).append(run)
    notes = []
    for group, members in groups.items():
        check = check_design([r.params["total"] for r in members], [r.tokens for r in members],
                             trunks=[r.cfg.train.branch_from or r.run_id for r in members])
        where = f"[{group}] " if group is not None else ""
        notes.append(where + check.describe())
        notes += [f"warning: {where}{w}" for w in check.warnings()]
    return notes


def ladder_note(runs: list[PlannedRun]) -> str:
    """What a ladder sweep spends against its branches trained as separate runs from scratch
    (chinchilla count: each branch's flops are the separate run's)."""
    branches = [r for r in runs if r.role == rundir.BRANCH]
    trunks = [r for r in runs if r.role == rundir.TRUNK]
    separate = sum(r.flops("chinchilla") for r in branches)
    spent = sum(r.trained_flops("chinchilla") for r in runs if r.role)
    return (f"ladder: {len(trunks)} trunk(s) and {len(branches)} branches train "
            f"{spent:.3g} FLOPs; the branches as separate runs would train {separate:.3g}: "
            f"{1 - spent / separate:.0%} saved ({separate / spent:.2f}x fewer FLOPs)")


def format_table(table: pd.DataFrame) -> str:
    """Human-readable numbers: 3 significant digits for the large counts."""
    shown = table.copy()
    for column in ("budget", "params", "non_emb_params", "tokens", "flops_6nd",
                   "flops_chinchilla", "trained_flops"):
        if column in shown:
            shown[column] = shown[column].map(lambda v: f"{v:.3g}")
    if "est_seconds" in shown:
        shown["est_seconds"] = shown["est_seconds"].map(lambda v: f"{v:.1f}")
    if "lr" in shown:
        shown["lr"] = shown["lr"].map(lambda v: v if isinstance(v, str) else f"{v:.3g}")
    return shown.to_string(index=False)
