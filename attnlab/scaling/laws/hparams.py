"""The hyperparameter law: the loss-optimal learning rate and batch size as power laws of the
model's size N and its training tokens D (DeepSeek-AI 2024, sec. 3.1; Porian et al. 2024,
sec. 3; Li et al. 2025, "Step Law"):

    lr*(N, D) = c_lr N^a_lr D^b_lr,    batch*(N, D) = c_B N^a_B D^b_B   (batch in tokens per step)

fitted in two stages to runs that differ in learning rate and batch size at several (N, D):

1. per (N, D) group, the optimum, by one of two methods (``--optimum``):
   smooth  Porian et al.: per batch size a parabola of the loss in log lr (through the best
           rate and its two neighbours) gives that batch's best lr and loss; a parabola of
           those losses in log batch gives the best batch, and the best lr there is
           interpolated in log batch. An optimum outside the grid it was
           fitted on is at the grid's edge: reported, and left out of the law.
   near    Step Law's spirit: the runs within ``--near`` percent of the group's best loss; the
           optimum is their geometric mean.
2. the power laws, by least squares in logs over the groups' optima.

Runs repeated at one (N, D, lr, batch), seeds, are one grid point: their mean loss.

Intervals: a bootstrap that refits both stages on resampled runs: with ``--pair`` (a seed
column) each (N, D) group's seeds, each with its runs at every lr and batch (they share an
initialisation and a data order); without, the runs within each (group, batch) cell (the unit
a single-seed grid repeats). A refit whose optima inside their grids are not the fit's groups
(one lost to an edge, a grid point lost in the draw) has failed; when more than MAX_FAILED_SHARE
fail the interval is refused, not taken over the survivors. Resampling a single-seed grid's
runs loses grid points, so there most refits fail: its intervals come from seeds (``--pair``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from attnlab.cli_vocab import Flag
from attnlab.scaling.bootstrap import MAX_FAILED_SHARE, MIN_REFITS, percentile_interval
from attnlab.scaling.columns import drop_unfinished, pick_column
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.law import Law

METHODS = ("smooth", "near")
# What N is: total parameters, non-embedding ones (Kaplan's N; Step Law's), or the law in
# compute C alone (DeepSeek-AI 2024's lr*(C), B*(C); the table's FLOPs).
SIZES = {"total": ("active_params", "params"),
         "non_embedding": ("active_non_embedding_params", "non_embedding_params"),
         "compute": ("flops",)}
SIZE_WORDS = {"total": "N = total parameters", "non_embedding": "N = non-embedding parameters",
              "compute": "C = training FLOPs (the law in C alone)"}
MERGE = 0.01  # params or tokens this close (relative) belong to one (N, D) group
COLUMNS = {"params": SIZES["total"], "tokens": ("tokens",),
           "lr": ("lr", "train.learning_rate"), "batch": ("batch",),
           "loss": ("loss", "final_val_loss")}
WHY = {"params": "N", "tokens": "D", "lr": "the peak learning rate",
       "batch": "tokens per step", "loss": "the final loss"}
TARGETS = ("lr", "batch")


@dataclasses.dataclass(frozen=True)
class Optimum:
    lr: float
    batch: float
    edge: str = ""  # which coordinate sits at its grid's edge ("" none)


@dataclasses.dataclass(frozen=True)
class FittedPowerLaw:
    """y = coef N^params D^tokens; an exponent that the groups cannot determine is None."""

    coef: float
    exponents: dict[str, float | None]

    def __call__(self, n, d):
        out = self.coef * np.ones_like(np.asarray(n, np.float64))
        for name, x in (("params", n), ("tokens", d)):
            if self.exponents[name] is not None:
                out = out * np.power(np.asarray(x, np.float64), self.exponents[name])
        return out


def _parabola_min(x: np.ndarray, y: np.ndarray) -> tuple[float, float, bool]:
    """(x*, y*, inside): the vertex of the parabola through the best point (mean y per distinct
    x) and its two neighbours in x. A loss against the learning rate is not a parabola far from
    its minimum (past a critical rate training diverges, a cliff), so only the neighbours
    shape it. The best point at either end of the grid is returned with inside False."""
    xs = np.unique(x)
    if xs.size < 3:
        raise ValueError("fewer than 3 distinct values")
    ys = np.array([y[x == v].mean() for v in xs])
    best = int(np.argmin(ys))
    if best in (0, xs.size - 1):
        return float(xs[best]), float(ys[best]), False
    c2, c1, c0 = np.polyfit(xs[best - 1:best + 2], ys[best - 1:best + 2], 2)
    x_star = -c1 / (2 * c2) if c2 > 0 else xs[best]
    return float(x_star), float(c0 + c1 * x_star + c2 * x_star**2), True


def smooth_optimum(lr: np.ndarray, batch: np.ndarray, loss: np.ndarray) -> Optimum:
    """Porian et al.'s two parabolas (see the module's docstring); ValueError if a batch size
    has fewer than 3 learning rates and no other batch size has them."""
    per_batch = []
    for b in np.unique(batch):
        rows = batch == b
        if np.unique(lr[rows]).size < 3:
            continue
        x, y, inside = _parabola_min(np.log(lr[rows]), loss[rows])
        per_batch.append((np.log(b), x, y, inside))
    if not per_batch:
        raise ValueError("no batch size has 3 learning rates")
    log_b, log_lr, best, inside = (np.array(v) for v in zip(*per_batch))
    edge = []
    if log_b.size >= 3:
        b_star, _, b_inside = _parabola_min(log_b, best)
        lr_star = float(np.interp(b_star, log_b, log_lr))
        nearest = int(np.argmin(np.abs(log_b - b_star)))
        edge += [] if b_inside else ["batch"]
        edge += [] if inside[nearest] else ["lr"]
    else:  # one or two batch sizes: the better one, not a fitted optimum
        pick = int(np.argmin(best))
        b_star, lr_star = float(log_b[pick]), float(log_lr[pick])
        edge += [] if inside[pick] else ["lr"]
    return Optimum(float(np.exp(lr_star)), float(np.exp(b_star)), ",".join(edge))


def near_optimum(lr: np.ndarray, batch: np.ndarray, loss: np.ndarray,
                 near: float) -> Optimum:
    """The geometric mean of the runs within ``near`` (a fraction) of the best loss; at an
    edge when a run at the grid's smallest or largest value is among them."""
    close = loss <= loss.min() * (1.0 + near)
    edge = [name for name, v in (("lr", lr), ("batch", batch))
            if np.unique(v).size > 1 and (close & ((v == v.min()) | (v == v.max()))).any()]
    return Optimum(float(np.exp(np.log(lr[close]).mean())),
                   float(np.exp(np.log(batch[close]).mean())), ",".join(edge))


def fit_power_law(n: np.ndarray, d: np.ndarray, y: np.ndarray) -> tuple[FittedPowerLaw, str]:
    """log y = log c + a log N + b log D by least squares, with a note when N or D does not
    vary, or they vary together (D/N fixed), so that one exponent is not determined."""
    log_n, log_d = np.log(n), np.log(d)
    columns = {"params": log_n, "tokens": log_d}
    varies = {k: np.ptp(v) > 1e-9 for k, v in columns.items()}
    note = ""
    if all(varies.values()) and np.linalg.matrix_rank(
            np.column_stack([np.ones_like(log_n), log_n, log_d]), tol=1e-6) < 3:
        varies["tokens"] = False
        note = "N and D vary together across the groups: the law is fitted in N alone"
    used = [k for k in columns if varies[k]]
    design = np.column_stack([np.ones_like(log_n)] + [columns[k] for k in used])
    if len(y) < design.shape[1] + 1:
        raise ValueError(f"{len(y)} group optima for {design.shape[1]} coefficients")
    coef, *_ = np.linalg.lstsq(design, np.log(y), rcond=None)
    exponents = {k: (float(coef[1 + used.index(k)]) if k in used else None) for k in columns}
    return FittedPowerLaw(float(np.exp(coef[0])), exponents), note


def grid_means(frame: pd.DataFrame) -> pd.DataFrame:
    """The mean loss at each (N, D, lr, batch) and the number of runs it averages."""
    return (frame.groupby(["params", "tokens", "lr", "batch"], as_index=False)["loss"]
            .agg(loss="mean", runs="size"))


def group_optima(frame: pd.DataFrame, method: str, near: float) -> dict[tuple, Optimum]:
    """(N, D) -> the group's optimum; a group whose optimum cannot be found is left out."""
    found = {}
    for key, g in grid_means(frame).groupby(["params", "tokens"], sort=True):
        lr, batch, loss = (g[c].to_numpy(np.float64) for c in ("lr", "batch", "loss"))
        try:
            found[key] = (smooth_optimum(lr, batch, loss) if method == "smooth"
                          else near_optimum(lr, batch, loss, near))
        except ValueError:
            continue
    return found


def inner_groups(optima: dict[tuple, Optimum]) -> set[tuple]:
    """The (N, D) groups whose optimum lies inside their grid: the ones the law is fitted on."""
    return {key for key, o in optima.items() if not o.edge}


def fit_laws(optima: dict[tuple, Optimum], size: str = "total") -> tuple[dict, list[str]]:
    """The power laws fitted to the group optima inside their grids, and notes; ValueError
    when too few are. In compute, the groups' C alone (D held out of the law)."""
    keys = sorted(inner_groups(optima))
    inner = {k: optima[k] for k in keys}
    n, d = (np.array([k[i] for k in keys], np.float64) for i in (0, 1))
    if size == "compute":
        d = np.ones_like(d)
    fitted, notes = {}, []
    for target in TARGETS:
        y = np.array([getattr(inner[k], target) for k in keys], np.float64)
        fitted[target], note = fit_power_law(n, d, y)
        if note and note not in notes:
            notes.append(note)
    return fitted, notes


@dataclasses.dataclass(frozen=True)
class HParamsFit:
    method: str
    optima: dict
    laws: dict  # target -> FittedPowerLaw
    intervals: dict  # target -> {coefficient name: (low, high)} or None (not computed)
    replicates: int
    failed: int
    frame: pd.DataFrame
    notes: tuple[str, ...]
    ci_level: float
    pair: str | None = None
    size: str = "total"

    def regret(self) -> list[dict]:
        """Per group: the grid point nearest the law's optimum and its loss (the mean of its
        runs) above the group's best."""
        rows, means = [], grid_means(self.frame)
        for (n, d), optimum in self.optima.items():
            g = means[(means["params"] == n) & (means["tokens"] == d)]
            lr_law, batch_law = (float(self.laws[t](n, d)) for t in TARGETS)
            distance = (np.log(g["lr"] / lr_law) ** 2 + np.log(g["batch"] / batch_law) ** 2)
            nearest = g.loc[distance.idxmin()]
            best = float(g["loss"].min())
            rows.append({"params": n, "tokens": d, "runs": int(g["runs"].sum()),
                         "lr_opt": optimum.lr,
                         "batch_opt": optimum.batch, "edge": optimum.edge, "lr_law": lr_law,
                         "batch_law": batch_law, "best_loss": best,
                         "law_run_loss": float(nearest["loss"]),
                         "regret": float(nearest["loss"]) / best - 1.0})
        return rows

    def to_dict(self) -> dict:
        out = {"law": "hparams", "method": self.method, "size": self.size,
               "ci_level": self.ci_level,
               "bootstrap": {"replicates": self.replicates, "failed": self.failed,
                             "unit": (f"the {self.pair} values within each (N, D) group"
                                      if self.pair else
                                      "runs within each (N, D, batch) cell")},
               "notes": list(self.notes), "groups": self.regret()}
        for target in TARGETS:
            law = self.laws[target]
            ci = self.intervals.get(target)
            out[target] = {"coef": law.coef, "exponents": dict(law.exponents),
                           "ci": ({k: list(v) for k, v in ci.items() if k != "coef"}
                                  if ci else None)}
        return out


def resampling_strata(frame: pd.DataFrame, paired: bool) -> list[list[np.ndarray]]:
    """The bootstrap's strata, each a list of units (the row indices drawn together): paired,
    each (N, D) group's values of the ``unit`` column; else each (N, D, batch) cell's runs."""
    if paired:
        return [[u.index.to_numpy() for _, u in g.groupby("unit")]
                for _, g in frame.groupby(["params", "tokens"])]
    return [[np.array([i]) for i in g.index]
            for _, g in frame.groupby(["params", "tokens", "batch"])]


def bootstrap(frame, method, near, n_bootstrap, seed, ci_level, paired, rescaled=True,
              size="total"):
    """Refits on resampled units (:func:`resampling_strata`): per target the percentile
    intervals of the exponents, or None beyond MAX_FAILED_SHARE failed refits. Paired and
    ``rescaled``, each draw takes n - 1 of a group's n seeds (Rao and Wu 1988's choice): the
    variance of their mean is then that of the n seeds' mean, which n draws of 3 seeds
    understate by a third."""
    rng = np.random.default_rng(seed)
    strata = resampling_strata(frame, paired)
    fewer = int(paired and rescaled)
    fitted_on = inner_groups(group_optima(frame, method, near))
    samples, failed = {t: {"params": [], "tokens": []} for t in TARGETS}, 0
    for _ in range(n_bootstrap):
        rows = np.concatenate([units[i] for units in strata
                               for i in rng.integers(len(units), size=len(units) - fewer)])
        optima = group_optima(frame.loc[rows], method, near)
        # A refit over other groups than the fit's (one lost to its grid's edge, or gained) is
        # another estimator's draw, not a draw of this one: a failure.
        if inner_groups(optima) != fitted_on:
            failed += 1
            continue
        try:
            fitted, _ = fit_laws(optima, size)
        except ValueError:
            failed += 1
            continue
        for t in TARGETS:
            for k in ("params", "tokens"):
                samples[t][k].append(np.nan if fitted[t].exponents[k] is None
                                     else fitted[t].exponents[k])
    if (n_bootstrap == 0 or failed > MAX_FAILED_SHARE * n_bootstrap
            or n_bootstrap - failed < MIN_REFITS):
        return {}, failed
    return {t: {k: percentile_interval(np.array(v), ci_level) for k, v in samples[t].items()}
            for t in TARGETS}, failed


def read_runs(frame: pd.DataFrame, source: str, columns: dict | None,
              pair: str | None = None, size: str = "total") -> tuple[pd.DataFrame, list[str]]:
    """The completed runs' params (``size``'s column: SIZES), tokens, lr, batch (tokens per
    step) and loss, and with ``pair`` its values as ``unit``."""
    mapping, notes = dict(columns or {}), []
    if pair and pair not in frame.columns:
        raise FitInputError(f"--pair={pair}: {source} has no such column")
    frame = drop_unfinished(frame, notes, source)
    out = {}
    for name, candidates in {**COLUMNS, "params": SIZES[size]}.items():
        derived = name == "batch" and {"tokens", "steps"} <= set(frame.columns)
        column = pick_column(frame, name, candidates, mapping, source, WHY[name],
                             required=not derived)
        if column is None:
            out[name] = frame["tokens"] / frame["steps"]
            notes.append("batch = tokens / steps (tokens per step)")
        else:
            out[name] = pd.to_numeric(frame[column], errors="coerce")
    runs = pd.DataFrame(out).reset_index(drop=True)
    bad = ~np.isfinite(runs.to_numpy(np.float64)).all(axis=1) | (runs <= 0).any(axis=1)
    if bad.any():
        raise FitInputError(f"{source}: {int(bad.sum())} run(s) with a missing, non-numeric or "
                            f"non-positive params, tokens, lr, batch or loss")
    for name in ("params", "tokens"):
        merged = merge_close(runs[name].to_numpy(np.float64))
        if np.unique(merged).size < runs[name].nunique():
            notes.append(f"{name} within {MERGE:.0%} of each other are one group (whole "
                         f"batches round a token count differently per batch size)")
        runs[name] = merged
    if pair:
        runs["unit"] = frame[pair].to_numpy()
    return runs, notes


def merge_close(values: np.ndarray, rel: float | None = None) -> np.ndarray:
    """Each value replaced by the geometric mean of its cluster: sorted values within ``rel``
    (default MERGE) of the cluster's smallest."""
    rel = MERGE if rel is None else rel
    order = np.sort(np.unique(values))
    starts = [order[0]]
    for v in order[1:]:
        if v > starts[-1] * (1 + rel):
            starts.append(v)
    starts = np.array(starts)
    members = np.searchsorted(starts, order, side="right") - 1
    means = [order[members == c] for c in range(len(starts))]
    means = [float(m[0]) if m.size == 1 else float(np.exp(np.log(m).mean())) for m in means]
    return np.array([means[c] for c in np.searchsorted(starts, values, side="right") - 1])


def _replicate_notes(frame: pd.DataFrame, pair: str | None) -> tuple[list[str], bool]:
    """Notes on runs repeated at one grid point, and whether the intervals can resample
    ``pair``'s values (every (N, D) group has two or more)."""
    repeats = int(grid_means(frame)["runs"].max())
    notes = []
    if repeats > 1:
        notes.append(f"up to {repeats} runs at one (N, D, lr, batch): their mean loss is the "
                     f"point" + ("" if pair else "; --pair=COLUMN (e.g. train.seed) resamples "
                                                  "each seed's runs together"))
    if not pair:
        return notes, True
    fewest = int(frame.groupby(["params", "tokens"])["unit"].nunique().min())
    if fewest < 2:
        notes.append(f"intervals not computed: an (N, D) group has one {pair} value, so "
                     f"--pair has nothing to resample")
    return notes, fewest >= 2


def fit_hparams(frame: pd.DataFrame, *, method: str = "smooth", near: float = 0.0025,
                n_bootstrap: int = 200, seed: int = 0, ci_level: float = 0.95,
                notes: list[str] | None = None, pair: str | None = None,
                size: str = "total") -> HParamsFit:
    for column, what in (("batch", "batch size"), ("lr", "learning rate")):
        values = np.unique(frame[column].to_numpy(np.float64))
        if values.size < 2:  # no optimum can be placed along an axis the grid does not vary
            raise FitInputError(
                f"--law=hparams: every run has {column} = {values[0]:.4g}: a grid of one {what} "
                f"cannot place {column}*; the law needs several values of each "
                f"(sweep.learning_rate.factors, sweep.axes.data.batch_size)")
    optima = group_optima(frame, method, near)
    try:
        fitted, fit_notes = fit_laws(optima, size)
    except ValueError:
        raise FitInputError(_too_few(frame, optima)) from None
    edge = [k for k, o in optima.items() if o.edge]
    if edge:
        fit_notes.append(f"{len(edge)} of {len(optima)} group optima at their grid's edge, "
                         f"left out of the law: widen the grid there")
    replicate_notes, resamplable = _replicate_notes(frame, pair)
    fit_notes += replicate_notes
    n_bootstrap = n_bootstrap if resamplable else 0
    intervals, failed = bootstrap(frame, method, near, n_bootstrap, seed, ci_level, bool(pair),
                                  size=size)
    if n_bootstrap and not intervals:
        fit_notes.append(_refused(failed, n_bootstrap, bool(pair)))
    return HParamsFit(method, optima, fitted, intervals, n_bootstrap, failed, frame,
                      tuple((notes or []) + fit_notes), ci_level, pair, size)


def _refused(failed: int, n_bootstrap: int, paired: bool) -> str:
    if failed <= MAX_FAILED_SHARE * n_bootstrap:
        return f"intervals not computed: {n_bootstrap - failed} refits, fewer than {MIN_REFITS}"
    return (f"intervals not computed: {failed} of {n_bootstrap} refits did not find the fit's "
            f"group optima inside their grids (more than {MAX_FAILED_SHARE:.0%})"
            + ("" if paired else "; resampling one seed's runs loses grid points: train seeds "
                                 "and pass --pair=train.seed"))


def _too_few(frame: pd.DataFrame, optima: dict[tuple, Optimum]) -> str:
    """Why the law cannot be fitted, in one line: how many groups have an optimum inside their
    grid, and on which side the others lie."""
    groups = frame.groupby(["params", "tokens"]).ngroups
    edges = []
    for target in TARGETS:
        low = high = 0
        for (n, d), o in optima.items():
            if target in o.edge.split(","):
                values = frame[(frame["params"] == n) & (frame["tokens"] == d)][target]
                centre = np.sqrt(values.min() * values.max())  # of the grid, in logs
                at_low = getattr(o, target) < centre
                low, high = low + at_low, high + (not at_low)
        if low or high:
            edges.append(f"{target}: {low} at the grid's low edge, {high} at its high edge")
    both = frame["params"].nunique() > 1 and frame["tokens"].nunique() > 1
    needed = "4 or more (N, D) groups (N and D both vary: 3 coefficients, and one to spare)" \
        if both else "3 or more (N, D) groups"
    return (f"the hyperparameter law needs {needed} with an optimum inside "
            f"their grid; {len(optima) - sum(bool(o.edge) for o in optima.values())} of "
            f"{groups} have one ({'; '.join(edges) or 'too few learning rates per batch'}): "
            f"widen the grid that way (sweep.learning_rate.factors, the batch sizes)")


def format_hparams(fit: HParamsFit, source: str) -> str:
    level = f"{fit.ci_level:.0%}"
    form = "y*(C) = c C^a" if fit.size == "compute" else "y*(N, D) = c N^a D^b"
    lines = [f"hyperparameter law on {source}: optimum per (N, D) by {fit.method!r}, then "
             f"{form} ({len(fit.optima)} groups; {SIZE_WORDS[fit.size]})"]
    axes = (("params", "C"),) if fit.size == "compute" else (("params", "N"), ("tokens", "D"))
    for target in TARGETS:
        law, ci = fit.laws[target], fit.intervals.get(target) or {}
        parts = []
        for name, symbol in axes:
            value = law.exponents[name]
            if value is None:
                parts.append(f"{symbol}: not determined")
                continue
            low, high = ci.get(name, (np.nan, np.nan))
            parts.append(f"{symbol}^{value:+.3f} [{low:+.3f}, {high:+.3f}]" if ci
                         else f"{symbol}^{value:+.3f}")
        lines.append(f"  {target + '*':<7}= {law.coef:.4g} x " + " x ".join(parts)
                     + (f"   ({level} intervals)" if ci else ""))
    lines.append(f"  {'N':>10} {'D':>10} {'runs':>4} {'lr*':>9} {'batch*':>8} {'law lr':>9} "
                 f"{'law batch':>9} {'regret':>7}  edge")
    for row in fit.regret():
        lines.append(f"  {row['params']:>10.4g} {row['tokens']:>10.4g} {row['runs']:>4} "
                     f"{row['lr_opt']:>9.3g} {row['batch_opt']:>8.4g} {row['lr_law']:>9.3g} "
                     f"{row['batch_law']:>9.4g} {row['regret']:>+7.2%}  {row['edge']}")
    lines.append("  regret: the loss at the grid point nearest the law's optimum over the "
                 "group's best, minus 1 (the law's cost inside the grid)")
    lines += [f"note: {note}" for note in fit.notes]
    return "\n".join(lines) + "\n"


class HParams(Law):
    """Optimal learning rate and batch size as power laws of N and D (module docstring)."""

    name = "hparams"
    title = "lr*(N, D), batch*(N, D)"
    n_parameters = 6
    capabilities = frozenset({"pair"})  # its own fit and report, of the results table
    flags = (
        Flag("optimum", "enum", None, "--law=hparams: how each (N, D) group's best learning "
             "rate and batch size are found: parabolas in log lr then log batch (smooth, "
             "Porian et al. 2024; default) or the runs near the best loss (near).",
             enum_values=METHODS),
        Flag("near", "float", None, "--law=hparams --optimum=near: percent above the group's "
             "best loss a run may be and count as near it (default 0.25)."),
        Flag("size", "enum", None, "--law=hparams: what the law is a power of: total "
             "parameters N (default), non-embedding N (Kaplan's; Step Law's), or compute, the "
             "table's FLOPs C alone (DeepSeek-AI 2024's lr*(C), B*(C)).",
             enum_values=tuple(SIZES)))
    refused = ("curves", "by", "budget", "train-longer", "multiplier-against", "fix", "holdout",
               "floor", "cluster")
    scope = "one law over a sweep's (N, D) groups of learning rates and batch sizes"
    column_names = tuple(COLUMNS)

    def options(self, given: dict) -> dict:
        near = given.get("near")
        if near is not None and not 0 < near < 100:
            raise FitInputError(f"--near: a percentage in (0, 100), got {near}")
        return {"method": given.get("optimum") or "smooth",
                "near": 0.0025 if near is None else near / 100,
                "size": given.get("size") or "total"}

    def fit(self, frame, *, source: str, columns=None, pair=None, size="total",
            **options) -> HParamsFit:
        runs, notes = read_runs(frame, source, columns, pair, size)
        return fit_hparams(runs, notes=notes, pair=pair, size=size, **options)

    def report(self, fit: HParamsFit, source: str) -> str:
        return format_hparams(fit, source)
