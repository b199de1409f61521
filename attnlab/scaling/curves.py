"""Learning curves with their learning-rate schedules, as the laws of whole curves read them
(the multi-power law, ``laws/multipower.py``; the annealing law, ``laws/annealing.py``).

A :class:`Curve` is one run: the rate ``lr[t - 1]`` of every update t = 1..T and the loss
observed after some of them. It comes from a curves table (run_id, step, lr, loss: attnlab's
``curves.parquet`` or any table with those columns) or from a schedule spelled as attnlab's
schedule classes are (:func:`schedule_curve`, ``wsd:peak=3e-4,warmup_steps=100,...``).

A sweep directory's runs get their rate at every update from their own config's schedule
class, as they trained (:func:`scheduled_rates`, carried in the table's ``attrs["rates"]``).
Another table that logs the rate at every step is read as it is; one that logs it only at some
steps has the per-step rate interpolated linearly between them (the summed rate, the laws' S1,
is then the trapezoid integral between logged steps), and the curves say so (``notes``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import numpy as np
import pandas as pd

from attnlab.config import from_config_dict
from attnlab.errors import ConfigError
from attnlab.rundir import CONFIG_FILE, RUNS_DIR
from attnlab.scaling.columns import pick_column
from attnlab.scaling.errors import FitInputError
from attnlab.schedules import SCHEDULES

MIN_RUNS = 2  # one curve cannot tell the schedule's effect from the loss's own decay


@dataclasses.dataclass(frozen=True)
class Curve:
    """One run: ``lr`` [T] the rate of update t = 1..T; ``steps`` [points] the updates after
    which a loss was observed (1-based, increasing), ``loss`` [points] that loss (NaN where
    only predicted)."""

    run_id: str
    lr: np.ndarray
    steps: np.ndarray
    loss: np.ndarray

    @property
    def peak(self) -> int:
        """The update at which the rate first reaches its maximum: the warmup's end. The laws
        read drops of the rate after it and fit the losses after it."""
        return int(np.argmax(self.lr)) + 1

    @property
    def area(self) -> np.ndarray:
        """[T] S1 after each update: the summed rate, warmup included."""
        return np.cumsum(self.lr)

    @functools.cached_property
    def drops(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(eta_{k-1} - eta_k [drops], eta_k [drops], S_k(t) [points, drops]) over the updates
        k after the peak where the rate drops, S_k(t) = sum_{tau=k..t} eta_tau (0 for k > t)."""
        k = np.arange(self.peak + 1, len(self.lr) + 1)
        drop = self.lr[k - 2] - self.lr[k - 1]
        k, drop = k[drop != 0], drop[drop != 0]
        area = self.area
        summed = area[self.steps - 1][:, None] - (area[k - 1] - self.lr[k - 1])[None, :]
        return drop, self.lr[k - 1], np.maximum(summed, 0.0)

    @property
    def decays(self) -> bool:
        """Whether the rate ever drops after its peak (what identifies a law's decay terms)."""
        return bool(np.any(np.diff(self.lr[self.peak - 1:]) < 0))

    def fitted(self) -> Curve:
        """The curve at its observed steps after the warmup."""
        keep = (self.steps > self.peak) & np.isfinite(self.loss)
        return dataclasses.replace(self, steps=self.steps[keep], loss=self.loss[keep])


def curves_from_table(df: pd.DataFrame, *, source: str, columns=None) -> tuple[list[Curve],
                                                                                 list[str]]:
    """The runs of a curves table (one row per run and step) with the notes on how their rates
    were read; FitInputError naming the file and the column for a missing or bad one."""
    mapping = dict(columns or {})
    used = {"run_id": pick_column(df, "run_id", ("run_id",), mapping, source,
                                  "which run a step belongs to"),
            "step": pick_column(df, "step", ("step",), mapping, source, "the update count"),
            "lr": pick_column(df, "lr", ("lr", "learning_rate"), mapping, source,
                              "the learning rate of each step"),
            "loss": pick_column(df, "loss", ("loss", "val_loss"), mapping, source, "loss L")}
    frame = pd.DataFrame({name: df[column].to_numpy() for name, column in used.items()})
    for name in ("step", "lr", "loss"):
        frame[name] = pd.to_numeric(frame[name], errors="coerce")
    frame = frame[frame["step"] >= 1]
    _check_values(frame, used, source)
    frame, branches = _with_trunks(frame, df)
    rates = df.attrs.get("rates") or {}
    curves, interpolated, scheduled = [], 0, 0
    for run_id, rows in frame.groupby("run_id", sort=True):
        curve, filled = _curve(str(run_id), rows.sort_values("step"), used, source)
        if str(run_id) in rates and len(rates[str(run_id)]) >= len(curve.lr):
            curve = dataclasses.replace(curve, lr=rates[str(run_id)][:len(curve.lr)])
            filled = False
            scheduled += 1
        curves.append(curve)
        interpolated += filled
    if len(curves) < MIN_RUNS:
        raise FitInputError(f"{source}: {len(curves)} run(s) in column {used['run_id']!r}: a "
                            f"law of whole curves needs at least {MIN_RUNS} runs with different "
                            f"schedules")
    notes = [f"{source}: losses from column {used['loss']!r}, rates from {used['lr']!r}"]
    if branches:
        notes.append(f"{branches} cooldown branch(es): each curve is its trunk's (column "
                     f"'trunk') up to the branch point, then its own")
    if scheduled:
        notes.append(f"{scheduled} run(s): the rate at every update from the run's config "
                     f"(its schedule class, as trained)")
    if interpolated:
        notes.append(f"{interpolated} run(s) log the rate only at some steps: the per-step "
                     f"rate is interpolated linearly between them (S1 integrated by the "
                     f"trapezoid rule)")
    return curves, notes


def scheduled_rates(sweep: str | Path) -> dict[str, np.ndarray]:
    """run_id -> the learning rate of each of its updates, from the run's config.json through
    its schedule class, in float32 as the optimizer computes it (train/optimizer.py)."""
    rates = {}
    for path in sorted((Path(sweep) / RUNS_DIR).glob(f"*/{CONFIG_FILE}")):
        cfg = from_config_dict(json.loads(path.read_text()))
        schedule = cfg.train.lr_schedule(cfg.total_steps, cfg.model.d_model)
        rates[path.parent.name] = np.asarray(
            schedule.lr(np.arange(cfg.total_steps), np, "float32"), np.float64)
    return rates


def _with_trunks(frame: pd.DataFrame, df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """A ladder's branch logs only its cooldown, but its rate and loss before it are its
    trunk's (the same updates, bitwise: train/branch.py): a run whose ``trunk`` names another
    run of the table gets the trunk's rows before its own first step. (frame, branches)."""
    if "trunk" not in df.columns:
        return frame, 0
    trunk_of = dict(zip(frame["run_id"], df["trunk"].to_numpy()[frame.index.to_numpy()]))
    known = set(frame["run_id"])
    added = []
    for run_id, trunk in trunk_of.items():
        if isinstance(trunk, str) and trunk in known and trunk != run_id:
            first = frame.loc[frame["run_id"] == run_id, "step"].min()
            before = frame[(frame["run_id"] == trunk) & (frame["step"] < first)]
            added.append(before.assign(run_id=run_id))
    return (pd.concat([frame, *added], ignore_index=True) if added else frame), len(added)


def _check_values(frame, used, source) -> None:
    lr, loss = frame["lr"].to_numpy(), frame["loss"].to_numpy()
    bad_lr = ~np.isnan(lr) & ~(np.isfinite(lr) & (lr >= 0))
    bad_loss = ~np.isnan(loss) & ~(np.isfinite(loss) & (loss > 0))
    for name, bad, rule in (("lr", bad_lr, ">= 0"), ("loss", bad_loss, "> 0")):
        if bad.any():
            raise FitInputError(f"{source}: column {used[name]!r} ({name}) has "
                                f"{int(bad.sum())} value(s) not finite and {rule} (first at "
                                f"row {frame.index[bad][0]})")


def _curve(run_id, rows, used, source) -> tuple[Curve, bool]:
    steps = rows["step"].to_numpy()
    if not np.all(steps == np.round(steps)) or np.any(np.diff(steps) == 0):
        raise FitInputError(f"{source}: run {run_id}: column {used['step']!r} must hold each "
                            f"update count once, as a whole number")
    with_lr = rows[rows["lr"].notna()]
    if len(with_lr) < 2:
        raise FitInputError(f"{source}: run {run_id}: column {used['lr']!r} has "
                            f"{len(with_lr)} value(s); the laws need the rate along the run")
    total = int(steps.max())
    every = np.arange(1, total + 1, dtype=np.float64)
    lr = np.interp(every, with_lr["step"].to_numpy(np.float64), with_lr["lr"].to_numpy())
    observed = rows[rows["loss"].notna()]
    if observed.empty:
        raise FitInputError(f"{source}: run {run_id}: no value in column {used['loss']!r}")
    curve = Curve(run_id, lr, observed["step"].to_numpy(np.int64),
                  observed["loss"].to_numpy(np.float64))
    return curve, len(with_lr) < total


def schedule_curve(spec: str, flag: str = "--predict-schedule") -> Curve:
    """A curve to predict from ``NAME:FIELD=VALUE,...`` in the fields of attnlab's schedule
    classes (``schedules.SCHEDULES``): e.g. ``wsd:peak=3e-4,warmup_steps=100,total_steps=3000,
    decay_fraction=0.2,cooldown=linear``; unset decay fields take the schedule's defaults."""
    name, _, rest = spec.strip().partition(":")
    if name not in SCHEDULES:
        raise FitInputError(f"{flag}: {spec!r}: the schedule must be one of "
                            f"{', '.join(SCHEDULES)} (NAME:FIELD=VALUE,...)")
    cls = SCHEDULES[name]
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    given: dict = {"warmup_steps": 0, "d_model": 1} | dict(cls.decay_defaults)
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, _, value = (s.strip() for s in item.partition("="))
        if key not in fields:
            raise FitInputError(f"{flag}: {spec!r}: {key!r} is not a field of the {name} "
                                f"schedule ({', '.join(fields)})")
        try:
            given[key] = value if key == "cooldown" else (
                int(value) if key in ("warmup_steps", "total_steps", "d_model") else float(value))
        except ValueError:
            raise FitInputError(f"{flag}: {spec!r}: {key}={value!r} is not a number") from None
    missing = [k for k in ("peak", "total_steps") if k not in given]
    if missing:
        raise FitInputError(f"{flag}: {spec!r} needs {' and '.join(missing)}")
    try:
        schedule = cls(**given)
    except (ConfigError, TypeError) as error:
        raise FitInputError(f"{flag}: {spec!r}: {error}") from None
    lr = np.asarray(schedule.lr(np.arange(given["total_steps"]), np, "float64"), np.float64)
    steps = np.arange(1, len(lr) + 1)
    return Curve(spec.strip(), lr, steps, np.full(len(lr), np.nan))
