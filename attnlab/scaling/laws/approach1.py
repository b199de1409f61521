"""Chinchilla approach 1: the lower envelope of learning curves (Hoffmann et al. 2022 Sec. 3.1).

Every run's loss is read along its learning curve as a function of FLOPs C. On a log-spaced grid
of C, the run with the lowest (interpolated) loss at each C marks N_opt(C) (its size) and D_opt(C)
(its tokens at that point); N_opt = k_N·C^a and D_opt = k_D·C^b are then fitted in log-log space.
Envelope points won by the smallest or the largest size of the sweep are dropped: there the true
optimum may lie outside the sizes trained, and keeping them flattens the fitted slope.
Bootstrap replicates resample whole runs (a curve is one unit) and redo the envelope and the fit.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnlab.scaling.errors import FitInputError
from attnlab.scaling.laws.chinchilla import ChinchillaLaw
from attnlab.scaling.result import ScalingFit

GRID_POINTS = 250  # log-spaced FLOP values (Chinchilla used 1,500 over a much wider range)


def lower_envelope(run_id, n, d, loss, flops, *, grid_points: int = GRID_POINTS) -> pd.DataFrame:
    """The lowest loss over runs at each of ``grid_points`` log-spaced FLOP values.

    Inputs are [rows] arrays, one row per (run, logged step). Curves are interpolated linearly in
    log C (loss) and log C-log D (tokens); a run counts only inside its own FLOP range, and only
    FLOP values covered by runs of at least two sizes are kept. Returns columns flops, params,
    tokens, loss, run_id, boundary (won by the sweep's smallest or largest size).
    """
    frame = pd.DataFrame({"run_id": run_id, "n": n, "d": d, "loss": loss, "c": flops})
    runs = [(key, group.sort_values("c")) for key, group in frame.groupby("run_id", sort=True)]
    log_c = np.log(frame["c"].to_numpy())
    grid = np.linspace(log_c.min(), log_c.max(), grid_points)
    losses = np.full((len(runs), grid_points), np.inf)
    log_tokens = np.zeros((len(runs), grid_points))
    sizes = np.array([group["n"].iloc[0] for _, group in runs])
    for i, (_, group) in enumerate(runs):
        x = np.log(group["c"].to_numpy())
        inside = (grid >= x[0]) & (grid <= x[-1])
        losses[i, inside] = np.interp(grid[inside], x, group["loss"].to_numpy())
        log_tokens[i, inside] = np.interp(grid[inside], x, np.log(group["d"].to_numpy()))
    covered = np.isfinite(losses)
    distinct_sizes = np.array([len(np.unique(sizes[covered[:, j]])) for j in range(grid_points)])
    keep = distinct_sizes >= 2
    winner = np.argmin(losses, axis=0)[keep]
    columns = np.flatnonzero(keep)
    won_by = sizes[winner]
    return pd.DataFrame({"flops": np.exp(grid[keep]), "params": won_by,
                         "tokens": np.exp(log_tokens[winner, columns]),
                         "loss": losses[winner, columns],
                         "run_id": [runs[i][0] for i in winner],
                         "boundary": (won_by == sizes.min()) | (won_by == sizes.max())})


def _power_laws(envelope: pd.DataFrame):
    log_c = np.log(envelope["flops"].to_numpy())
    log_n = np.log(envelope["params"].to_numpy())
    log_d = np.log(envelope["tokens"].to_numpy())
    a, log_kn = np.polyfit(log_c, log_n, 1)
    b, log_kd = np.polyfit(log_c, log_d, 1)
    residual = log_n - (a * log_c + log_kn)
    return ({"a": float(a), "b": float(b), "k_N": float(np.exp(log_kn)),
             "k_D": float(np.exp(log_kd))}, float(residual @ residual))


def _interior(envelope: pd.DataFrame) -> pd.DataFrame | None:
    inner = envelope[~envelope["boundary"]]
    return inner if inner["params"].nunique() >= 2 else None


def fit_approach1(run_id, n, d, loss, flops, *, n_bootstrap: int = 0, ci_level: float = 0.95,
                  seed: int = 0, grid_points: int = GRID_POINTS,
                  source: str = "curves") -> ScalingFit:
    """Fits N_opt ~ C^a, D_opt ~ C^b to the lower envelope of learning curves.
    Inputs: [rows] arrays, one row per (run, logged step)."""
    run_id = np.asarray(run_id)
    n, d, loss, flops = (np.asarray(x, np.float64) for x in (n, d, loss, flops))
    size_of_run = pd.Series(n).groupby(run_id).first()
    if size_of_run.nunique() < 3:
        raise FitInputError(f"{source}: approach 1 needs learning curves of at least three model "
                            f"sizes (an envelope won by an interior size); found "
                            f"{size_of_run.nunique()}")
    envelope = lower_envelope(run_id, n, d, loss, flops, grid_points=grid_points)
    inner = _interior(envelope)
    if inner is None:
        raise FitInputError(f"{source}: approach 1: the lower envelope of the learning curves is "
                            f"won by fewer than two interior model sizes (the curves do not "
                            f"cross); train sizes whose curves overlap in FLOPs")
    params, rss = _power_laws(inner)
    notes = [f"envelope: {len(envelope)} FLOP values, {int(envelope['boundary'].sum())} won by "
             f"the smallest or largest size were dropped; {inner['params'].nunique()} sizes win "
             f"the rest"]

    samples: dict[str, list] = {}
    if n_bootstrap > 0:
        rng = np.random.default_rng(seed)
        runs = size_of_run.index.to_numpy()
        failed = 0
        for _ in range(n_bootstrap):
            chosen = np.unique(rng.choice(runs, size=len(runs), replace=True))
            rows = np.isin(run_id, chosen)
            if pd.Series(n[rows]).nunique() < 3:
                failed += 1
                continue
            replicate = _interior(lower_envelope(run_id[rows], n[rows], d[rows], loss[rows],
                                                 flops[rows], grid_points=grid_points))
            if replicate is None:
                failed += 1
                continue
            for name, value in _power_laws(replicate)[0].items():
                samples.setdefault(name, []).append(value)
        if failed:
            notes.append(f"{failed} of {n_bootstrap} bootstrap refits had no usable envelope "
                         f"and were dropped")
    return ScalingFit(part=Envelope(), params=params,
                      samples={k: np.asarray(v) for k, v in samples.items()},
                      ci_level=ci_level, n_points=int(len(size_of_run)), objective=rss,
                      objective_name="sum of squared residuals of log N_opt against log C "
                                     "on the envelope",
                      n_bootstrap_requested=n_bootstrap, notes=tuple(notes),
                      resampling={"unit": "run", "column": "run_id",
                                  "clusters": int(len(size_of_run))},
                      details={"envelope": envelope, "runs": int(len(size_of_run)),
                               "envelope_points": int(len(inner))})


class Envelope(ChinchillaLaw):
    """Approach 1: power laws fitted to the lower envelope of the runs' learning curves."""

    variant = 1
    title = ("Chinchilla approach 1: lower envelope of learning curves, "
             "N_opt = k_N C^a, D_opt = k_D C^b")
    n_parameters = 4
    capabilities = ChinchillaLaw.capabilities | {"curves"}
    refused = ("cluster",)
    scope = "one fit of the runs' learning curves, each run's curve resampled whole"

    def fit(self, table, *, n_bootstrap, ci_level, seed, **_):
        if "run_id" not in table.frame:
            raise FitInputError(f"{table.source}: approach 1 needs learning curves (one row per "
                                f"logged step, with run_id); pass --curves=FILE or a sweep "
                                f"directory")
        return fit_approach1(table.array("run_id"), table.array("params"),
                             table.array("tokens"), table.array("loss"), table.array("flops"),
                             n_bootstrap=n_bootstrap, ci_level=ci_level, seed=seed,
                             source=table.source)
