"""Synthetic learning curves drawn from a law of whole curves with known parameters, for tests
and docs: the schedules of attnlab's schedule classes (``curves.schedule_curve``) and a
two-stage drop, the losses ``law.predict`` gives (times exp(noise z), z ~ N(0, 1))."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from attnlab.scaling.curves import Curve, schedule_curve

# Luo et al. 2025's fit at 400M parameters (their schedules peak at 3e-4).
MULTIPOWER_PUBLISHED = {"L0": 2.375, "A": 0.654, "alpha": 0.429, "B": 523.4, "C": 2.025,
                        "beta": 0.594, "gamma": 0.635}


def two_stage(peak: float, total_steps: int, drop_at: int, ratio: float,
              warmup_steps: int = 0) -> np.ndarray:
    """[T] a linear warmup, the peak, then ``ratio`` x the peak from update ``drop_at`` + 1
    (the paper's two-stage schedules)."""
    lr = np.full(total_steps, float(peak))
    lr[:warmup_steps] = peak * np.arange(1, warmup_steps + 1) / max(warmup_steps, 1)
    lr[drop_at:] = peak * ratio
    return lr


def observed(run_id: str, lr: np.ndarray, every: int) -> Curve:
    """A curve of rates ``lr`` observed after every ``every`` updates (and the last)."""
    steps = np.unique(np.append(np.arange(every, len(lr) + 1, every), len(lr)))
    return Curve(run_id, np.asarray(lr, np.float64), steps, np.full(len(steps), np.nan))


def from_schedule(spec: str, every: int, run_id: str | None = None) -> Curve:
    """The curve of a schedule spelled as ``curves.schedule_curve`` reads it."""
    return observed(run_id or spec, schedule_curve(spec).lr, every)


def with_losses(law, params: dict, curves, *, noise: float = 0.0, rng=None,
                settings=None) -> list[Curve]:
    """The curves with the losses ``law`` predicts (times exp(noise z))."""
    rng = rng or np.random.default_rng(0)
    out = []
    for curve in curves:
        loss = law.predict(params, curve, settings)
        out.append(dataclasses.replace(curve, loss=loss * np.exp(
            noise * rng.standard_normal(len(loss)))))
    return out


def curves_frame(curves, *, lr_every_step: bool = True) -> pd.DataFrame:
    """A curves table (run_id, step, lr, loss): a row at every update with the loss empty
    where not observed, or (``lr_every_step=False``) rows at the observed steps alone."""
    frames = []
    for curve in curves:
        steps = np.arange(1, len(curve.lr) + 1)
        loss = np.full(len(steps), np.nan)
        loss[curve.steps - 1] = curve.loss
        frame = pd.DataFrame({"run_id": curve.run_id, "step": steps, "lr": curve.lr,
                              "loss": loss})
        frames.append(frame if lr_every_step else frame.iloc[curve.steps - 1])
    return pd.concat(frames, ignore_index=True)
