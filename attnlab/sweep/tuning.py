"""A sweep's tuning stage: each arm's learning rate from small proxies of itself, then the study.

A spec whose learning-rate rule is ``tuned`` (the sweep's, or a ``sweep.variants`` entry's) has a
``sweep.tune`` section (:class:`attnlab.sweep.sections.Tune`). ``attnlab sweep`` then works in
two stages, both ordinary sweeps (idempotent, resumable, runs grouped into ensembles):

1. **tuning**: every tuned arm (variant) trains at each proxy shape of ``tune.shapes``, each rate
   of the grid ``tune.learning_rates`` and each seed of ``tune.seeds`` for ``tune.steps`` steps,
   in ``DIR/tune`` (a sweep directory of its own, so the study's results table and fits see only
   the study's runs);
2. **picks**: per arm and width, the rate of the lowest seed-mean final validation loss, with a
   90% bootstrap interval over seeds (the seeds resampled with replacement, one draw for every
   rate and width) and a warning where it lies at the grid's edge; then each arm's rule:

   * muP (its parameterisation transfers the rate, Yang et al. 2022 sec. 5): rule ``transfer`` at
     the best rate of the widest proxy (the proxy most like the study's models: at tiny base
     widths the base width's own optimum can sit a grid step below the wider ones',
     docs/mup.md);
   * any other arm (muP refuses its model, e.g. Mamba or nGPT): the best rates' power law in
     width, ``log2 lr* = a - p log2 d`` fitted by least squares over the proxies' widths, so each
     run trains at ``lr*(d_model) = base (d_model / ref_d_model)^-p`` (``ref_d_model`` the
     narrowest proxy); ``p`` gets the same bootstrap interval;

   written to ``DIR/tuning.json``;
3. **study**: the spec with those rules (:func:`with_picks`), run in ``DIR``.

A rerun finds both stages' finished runs and trains nothing; an interrupted tuning stage resumes.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from attnlab import rundir
from attnlab.sweep.definition import ALL, SweepSpec, arms, transfers, tuned
from attnlab.sweep.planner import PlannedRun, plan
from attnlab.sweep.rules import LR_RULES, LearningRateRule, Transfer, Tuned
from attnlab.sweep.sections import SweepSpecError

_RESAMPLES = 1000


def tuning_spec(spec: SweepSpec) -> SweepSpec:
    """The tuning stage as a grid sweep: the tuned arms at the proxy shapes, with axes on the
    learning rate (the grid) and the seed, ``tune.steps`` steps each, each arm's warmup rule."""
    tune = spec.tune
    train = dataclasses.replace(spec.base.train, steps=tune.steps, tokens=0)
    variants = tuple(dataclasses.replace(v, learning_rate=None, centre=None)
                     for v in spec.variants if tuned(spec, v))
    return dataclasses.replace(
        spec, name=f"{spec.name}-tune", mode="grid",
        base=dataclasses.replace(spec.base, train=train), shapes=tune.shapes, ladder=None,
        axes=(("train.learning_rate", tune.learning_rates), ("train.seed", tune.seeds)),
        learning_rate=LearningRateRule(), budgets=(), centre=None, curve_points=0,
        branches=None, variants=variants, baseline=None, tune=None)


# Spec fields of the tuning sweep -> the fields of sweep.tune that set them.
_TUNE_FIELDS = {"sweep.shapes": "sweep.tune.shapes",
                "sweep.axes.train.learning_rate": "sweep.tune.learning_rates",
                "sweep.axes.train.seed": "sweep.tune.seeds"}


def tuning_plan(spec: SweepSpec) -> list[PlannedRun]:
    """The tuning stage's runs; an invalid one is named by its ``sweep.tune`` field."""
    try:
        return plan(tuning_spec(spec))
    except SweepSpecError as e:
        raise SweepSpecError(_TUNE_FIELDS.get(e.field, e.field),
                             f"{e.reason} (in the tuning stage)") from None


def placeholder(spec: SweepSpec) -> dict[str, dict[str, Any]]:
    """Picks that plan the study at each arm's base learning rate: its shapes, tokens and FLOPs
    are right, its learning rates and run ids are not (a dry run before the tuning)."""
    return {name: {"rule": Tuned.name, "base": arm.base.train.learning_rate, "ref_d_model": 1,
                   "exponent": 0.0} for name, arm in arms(spec)}


def with_picks(spec: SweepSpec, picks: dict[str, dict[str, Any]]) -> SweepSpec:
    """The study: every tuned arm's rule from its pick (``tuning.json``'s ``arms``), no tuning
    stage left."""
    def rule(pick: dict[str, Any]) -> LearningRateRule:
        return LearningRateRule(pick["rule"], **LR_RULES[pick["rule"]]().from_pick(pick))

    def keeping_factors(picked: LearningRateRule, given: LearningRateRule) -> LearningRateRule:
        return dataclasses.replace(picked, factors=given.factors)  # a grid around the pick

    if not spec.variants:
        return dataclasses.replace(spec, learning_rate=keeping_factors(
            rule(picks[ALL]), spec.learning_rate), tune=None)
    variants = tuple(dataclasses.replace(v, learning_rate=keeping_factors(
        rule(picks[v.name]), v.learning_rate or spec.learning_rate))
        if v.name in picks else v for v in spec.variants)
    return dataclasses.replace(spec, variants=variants, tune=None)


# -- the picks --------------------------------------------------------------------------------


def _sig(x: float) -> float:
    """Six significant digits: the same bits on every platform, so stable study run ids."""
    return float(f"{x:.6g}")


def _rounded(x) -> float:
    """An exponent to 4 decimals (a fit's float noise is not a measurement), never -0.0."""
    return float(round(float(x), 4)) + 0.0


def _fit(x: np.ndarray, y: np.ndarray) -> tuple[Any, Any]:
    """Least-squares line ``y = slope x + c`` through ``x`` ([W]) and ``y`` ([W] or [W, R]);
    returns the slope and the line's value at ``x[0]`` (each a float, or [R]). Closed form, so
    that best rates on a factor-2 grid with no trend give a slope of exactly 0."""
    dx = x - x.mean()
    y_mean = y.mean(axis=0)
    slope = np.tensordot(dx, y - y_mean, axes=(0, 0)) / (dx @ dx)
    return slope, y_mean + slope * (x[0] - x.mean())


def _loss(row: dict[str, Any]) -> float:
    """A tuning run's score: its final validation loss; a diverged run's is +inf."""
    value = row.get("final_val_loss")
    if row.get("status") != rundir.COMPLETED or value is None or not math.isfinite(value):
        return math.inf
    return float(value)


def choose(spec: SweepSpec, runs: list[PlannedRun], rows: dict[str, dict[str, Any]], *,
           resamples: int = _RESAMPLES) -> dict[str, Any]:
    """``tuning.json``: per tuned arm and proxy width the seed-mean loss at each rate, the best
    rate and its bootstrap interval, and the arm's pick (module docstring).

    Args:
      spec: the study's spec (with ``tune``).
      runs: :func:`tuning_plan` of it.
      rows: run id -> its results row (status, final_val_loss), every run final.

    Raises:
      SweepSpecError: at some width every learning rate of the grid diverged
        (``sweep.tune.learning_rates``).
    """
    tune = spec.tune
    grid = np.asarray(tune.learning_rates)
    column = spec.variant_column if spec.variants else None
    rng = np.random.default_rng(0)
    draws = rng.integers(0, len(tune.seeds), (resamples, len(tune.seeds)))  # [R, S]
    out: dict[str, Any] = {}
    for name, arm in arms(spec):
        members = [r for r in runs if column is None or r.axes[column] == name]
        widths = sorted({r.cfg.model.d_model for r in members})
        losses = np.full((len(widths), len(tune.seeds), len(grid)), np.inf)  # [W, S, lrs]
        for r in members:
            losses[widths.index(r.cfg.model.d_model), tune.seeds.index(r.cfg.train.seed),
                   tune.learning_rates.index(r.cfg.train.learning_rate)] = _loss(rows[r.run_id])
        mean = losses.mean(axis=1)  # [W, lrs]: +inf where any seed diverged
        what = f"{column} {name!r}: " if column else ""
        for w, d in enumerate(widths):
            if not np.isfinite(mean[w]).any():
                raise SweepSpecError("sweep.tune.learning_rates", f"{what}every learning rate "
                                     f"of the grid diverged at d_model {d}: lower the grid")
        best = mean.argmin(axis=1)  # [W]
        boot = losses[:, draws, :].mean(axis=2).argmin(axis=2)  # [W, R]
        table, warnings = [], []
        for w, d in enumerate(widths):
            lo, hi = np.quantile(np.log2(grid[boot[w]]), [0.05, 0.95])
            table.append({"d_model": d, "best_lr": float(grid[best[w]]),
                          "interval": [float(2.0 ** lo), float(2.0 ** hi)],
                          "mean_loss": {f"{lr:.6g}": (float(v) if math.isfinite(v) else None)
                                        for lr, v in zip(grid, mean[w])}})
            if best[w] in (0, len(grid) - 1):
                side = "lowest" if best[w] == 0 else "highest"
                warnings.append(f"{what}the best learning rate at d_model {d} is the grid's "
                                f"{side} ({grid[best[w]]:.3g}): the optimum may lie beyond it; "
                                f"extend sweep.tune.learning_rates")
        pick: dict[str, Any] = {"parameterization": arm.base.model.parameterization,
                                "widths": table}
        if transfers(arm):
            pick.update(rule=Transfer.name, learning_rate=float(grid[best[-1]]),
                        tuned_d_model=widths[-1], interval=table[-1]["interval"])
        else:
            x = np.log2(widths)
            slope, at_ref = _fit(x, np.log2(grid[best]))
            lo, hi = np.quantile(-_fit(x, np.log2(grid[boot]))[0], [0.05, 0.95])
            pick.update(rule=Tuned.name, ref_d_model=widths[0], base=_sig(2.0 ** at_ref),
                        exponent=_rounded(-slope),
                        exponent_interval=[_rounded(lo), _rounded(hi)])
        pick["warnings"] = warnings
        out[name] = pick
    return {"sweep": spec.name, "learning_rates": list(tune.learning_rates),
            "seeds": list(tune.seeds), "steps": tune.steps,
            "shapes": [[s.d_model, s.n_layers, s.n_heads] for s in tune.shapes],
            "tuning_runs": [r.run_id for r in runs], "arms": out}


def picked(spec: SweepSpec, runs: list[PlannedRun], table,
           workdir: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """Once the tuning stage's sweep has run (``table``, its results): ``tuning.json``, written
    to ``workdir`` where it changed, and its lines to say; or None and why the study waits (it
    waits for every tuning run to be final and none failed: rerun with ``retry_failed``)."""
    rows = {row["run_id"]: row for row in table.to_dict("records")}
    unfinished = [r.run_id for r in runs
                  if rows.get(r.run_id, {}).get("status") not in rundir.FINAL_STATUSES
                  or rows[r.run_id]["status"] == rundir.FAILED]
    if unfinished:
        return None, [f"tuning stage: {len(unfinished)} run(s) not finished ({unfinished[0]}, "
                      f"...); the study waits for them (rerun with --retry-failed)"]
    tuning = choose(spec, runs, rows)
    if rundir.read_json_or_none(workdir / rundir.TUNING_FILE) != tuning:
        rundir.write_json_atomic(workdir / rundir.TUNING_FILE, tuning)
    return tuning, describe(tuning)


def describe(tuning: dict[str, Any]) -> list[str]:
    """One line per arm (its pick), then the warnings."""
    lines = []
    for name, pick in tuning["arms"].items():
        widths = ", ".join(f"d{t['d_model']} {t['best_lr']:.3g}" for t in pick["widths"])
        rule = LR_RULES[pick["rule"]]().describe_pick(pick)
        lines.append(f"tuned {name} ({pick['parameterization']}): best {widths}; {rule}")
    for pick in tuning["arms"].values():
        lines += [f"warning: {w}" for w in pick["warnings"]]
    return lines


def recorded(workdir: str | Path | None, runs: list[PlannedRun]) -> dict[str, Any] | None:
    """``DIR/tuning.json`` if it was written for exactly these tuning runs, else None."""
    if workdir is None:
        return None
    tuning = rundir.read_json_or_none(Path(workdir) / rundir.TUNING_FILE)
    if not isinstance(tuning, dict) or tuning.get("tuning_runs") != [r.run_id for r in runs]:
        return None
    return tuning
