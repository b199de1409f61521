"""Two-step task prediction (Bhagia et al. 2024, arXiv 2412.04403, the OLMo ladder): a task's
accuracy at (N, D) through the task's loss.

    step 1  L(N, D) = E + A/N^alpha + B/D^beta          the task's loss (e.g. gold-answer CE)
    step 2  Acc(L)  = a / (1 + exp(-k (L - L0))) + b    its accuracy from that loss

chained: Acc(N, D) = Acc(L(N, D)). Step 1 is approach 3's fit itself (Huber(1e-3) on log L,
L-BFGS from the grid, ``--grid``); step 2 is scipy's least squares on accuracy from a few
starts, with a, b in [0, 1] and k <= 0 (accuracy falls as the loss grows). The bootstrap draws
runs (clusters whole) and refits both steps on each draw, so a predicted accuracy's interval
carries both steps' uncertainty.

The table: ``--columns=task_loss:COL,accuracy:COL`` (the task's loss, and its accuracy as a
fraction in (0, 1]). A hold-out predicts held-out runs' accuracy from their (N, D) beside step 2
alone on their observed task loss (what step 1 costs) and a power law of the error 1 - Acc in
compute (``StepTwoAlone``, ``PowerInCompute``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
from scipy.optimize import least_squares

from attnlab.cli_vocab import Flag
from attnlab.scaling import equations, parametric
from attnlab.scaling.bootstrap import percentile_interval, resample_weights
from attnlab.scaling.columns import pick_column, positive_column
from attnlab.scaling.errors import FitError, FitInputError
from attnlab.scaling.huber import with_delta
from attnlab.scaling.law import Law, identifying_design
from attnlab.scaling.laws import approach3
from attnlab.scaling.result import ScalingFit

STEP1 = ("E", "A", "B", "alpha", "beta")
STEP2 = ("a", "k", "L0", "b")
# Bounds of (a, k, L0, b): accuracies are fractions, and accuracy falls as the task loss grows.
BOUNDS = ([0.0, -np.inf, -np.inf, 0.0], [1.0, 0.0, np.inf, 1.0])
MIN_SIGMOID_RUNS = 4  # step 2 fits 4 parameters


def accuracy(params, loss):
    """Acc(L) = a / (1 + exp(-k (L - L0))) + b (Bhagia et al. 2024 eq. 2)."""
    loss = np.asarray(loss, np.float64)
    with np.errstate(over="ignore"):
        return params["a"] / (1.0 + np.exp(-params["k"] * (loss - params["L0"]))) + params["b"]


def two_step_accuracy(params, n, d):
    """Acc(L(N, D)): step 2 of step 1's Chinchilla-form task loss."""
    return accuracy(params, equations.chinchilla_loss(params, n, d))


def _starts(loss: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """[starts, 4] (a, k, L0, b): midpoints at the losses' quartiles, slopes over their span,
    floors below the least accuracy."""
    span = max(float(np.ptp(loss)), 1e-6)
    rows = []
    for l0, slope, floor in itertools.product(np.quantile(loss, (0.25, 0.5, 0.75)),
                                              (2.0, 8.0, 32.0), (0.5, 0.95)):
        b = floor * float(acc.min())
        rows.append((min(1.0, float(acc.max()) - b + 0.05), -slope / span, l0, b))
    return np.array(rows)


def fit_sigmoid(loss, acc, weights=None) -> dict | None:
    """a, k, L0, b of step 2 by least squares on accuracy (weights: [runs] multiplicities, a
    bootstrap draw), the best of a few starts; None with fewer than MIN_SIGMOID_RUNS runs
    drawn or no start converging."""
    loss, acc = np.asarray(loss, np.float64), np.asarray(acc, np.float64)
    weights = np.ones_like(loss) if weights is None else np.asarray(weights, np.float64)
    drawn = weights > 0
    if len(np.unique(loss[drawn])) < MIN_SIGMOID_RUNS:
        return None
    root = np.sqrt(weights[drawn])

    def residual(x):
        return root * (accuracy(dict(zip(STEP2, x)), loss[drawn]) - acc[drawn])

    best = None
    for start in _starts(loss[drawn], acc[drawn]):
        found = least_squares(residual, np.clip(start, *BOUNDS), bounds=BOUNDS)
        if found.success and (best is None or found.cost < best.cost):
            best = found
    return None if best is None else dict(zip(STEP2, map(float, best.x))) | {
        "cost": float(best.cost)}


def _data(n, d, task_loss) -> tuple:
    return with_delta((np.log(n), np.log(d), np.log(task_loss)))


def _bootstrap(step1: ScalingFit, n, d, task_loss, acc, *, n_bootstrap, seed, clusters, grid):
    """(samples of both steps' parameters, notes): each draw's step 1 refitted as approach 3's
    bootstrap refits it, then step 2 on the same draw."""
    rng = np.random.default_rng(seed)
    weights = resample_weights(len(n), n_bootstrap, rng, clusters)
    theta = np.array([step1.details["theta"][k] for k in approach3.THETA_NAMES])
    design = identifying_design(approach3.Parametric(), {"params": n, "tokens": d})
    refits = parametric.bootstrap_refits(
        approach3.huber_objective, theta, grid.points(), _data(n, d, task_loss), len(n),
        n_bootstrap=n_bootstrap, grid_starts=4, seed=seed, clusters=clusters,
        admissible=parametric.admissible, max_steps=500, design=design, weights=weights)
    first = approach3.params_from_theta(refits.params)
    second = [fit_sigmoid(task_loss, acc, weights[r]) for r in refits.kept]
    ok = np.array([s is not None for s in second], bool)
    samples = {k: np.asarray(first[k])[ok] for k in STEP1}
    samples |= {k: np.array([s[k] for s in second if s is not None]) for k in STEP2}
    notes = refits.notes(n_bootstrap, "did not converge to a law with alpha, beta > 0",
                         parametric.design_why(design))
    if (~ok).any():
        notes.append(f"{int((~ok).sum())} of {n_bootstrap} bootstrap draws held too few "
                     f"distinct task losses for step 2's sigmoid, or its refit did not "
                     f"converge, and count as failed refits")
    return samples, notes


def fit_two_step(n, d, task_loss, acc, *, grid=approach3.CHINCHILLA_GRID, n_bootstrap=0,
                 ci_level=0.95, seed=0, clusters=None, source="data") -> ScalingFit:
    """Both steps fitted to runs (N, D, task loss, accuracy, each [runs]), bootstrap refits of
    both on each draw of runs (clusters whole)."""
    n, d, task_loss, acc = (np.asarray(x, np.float64) for x in (n, d, task_loss, acc))
    step1 = approach3.fit_approach3(n, d, task_loss, grid=grid, source=source)
    step2 = fit_sigmoid(task_loss, acc)
    if step2 is None:
        raise FitError(f"{source}: step 2 (the sigmoid of accuracy in the task loss) needs "
                       f"{MIN_SIGMOID_RUNS} distinct task losses and a converged fit")
    params = {k: step1.params[k] for k in STEP1} | {k: step2[k] for k in STEP2}
    samples, notes = ({}, [])
    if n_bootstrap > 0:
        samples, notes = _bootstrap(step1, n, d, task_loss, acc, n_bootstrap=n_bootstrap,
                                    seed=seed, clusters=clusters, grid=grid)
    low, high = float(task_loss.min()), float(task_loss.max())
    warnings = tuple(f"step 1 (task loss): {w}" for w in step1.warnings)
    if not low <= step2["L0"] <= high:
        warnings += (f"step 2's midpoint L0={step2['L0']:.4g} lies outside the observed task "
                     f"losses [{low:.4g}, {high:.4g}]: a, b and L0 extrapolate the sigmoid",)
    return ScalingFit(part=TwoStep(), params=params, samples=samples, ci_level=ci_level,
                      n_points=len(n), objective=step2["cost"],
                      objective_name="step 2: half the sum of squared accuracy residuals "
                                     f"(step 1: {step1.objective:.6e}, {step1.objective_name})",
                      n_bootstrap_requested=n_bootstrap, warnings=warnings,
                      notes=_step1_notes(step1) + tuple(notes),
                      details={"step1": {k: v for k, v in step1.details.items()}},
                      unpinned=step1.unpinned)


def _step1_notes(step1: ScalingFit) -> tuple[str, ...]:
    """Step 1's notes, its Huber-delta note on E, alpha and beta alone (approach 3's also
    lists its allocation exponents a, b, which are not step 2's a, b)."""
    notes = [s for s in step1.notes if not s.startswith("Huber delta")]
    found = step1.details.get("huber_sensitivity") or {}
    if found:
        cells = [f"{k} " + " / ".join("n/a" if row is None else f"{row[k]:.4g}"
                                      for row in found.values()) for k in ("E", "alpha", "beta")]
        notes.append(f"Huber delta {' / '.join(found)}: " + ", ".join(cells))
    return tuple(f"step 1 (task loss): {s}" for s in notes)


def parse_pairs(text: str | None) -> list[tuple[float, float]]:
    """``"1e9:2e10,7e9:1.4e11"`` -> [(N, D), ...]; FitInputError naming --accuracy-at."""
    pairs = []
    for item in filter(None, (s.strip() for s in (text or "").split(","))):
        n, sep, d = item.partition(":")
        try:
            pair = (float(n), float(d))
        except ValueError:
            sep = ""
        if not sep or not all(0 < v < math.inf for v in pair):
            raise FitInputError(f"--accuracy-at: {item!r} is not N:D with N, D > 0 (e.g. "
                                f"1e9:2e10)")
        pairs.append(pair)
    return pairs


def _interval(fit: ScalingFit, values) -> list:
    return list(percentile_interval(values, fit.ci_level)) if fit.interval_samples else [None,
                                                                                          None]


def format_pairs(fit: ScalingFit, pairs) -> tuple[str, dict]:
    """The lines and JSON of ``--accuracy-at``: each (N, D)'s predicted task loss and
    accuracy, with intervals over the refits of both steps."""
    if not pairs:
        return "", {}
    samples, rows = fit.interval_samples, []
    for n, d in pairs:
        loss = equations.chinchilla_loss(samples, n, d) if samples else ()
        rows.append({"N": n, "D": d,
                     "task_loss": float(equations.chinchilla_loss(fit.params, n, d)),
                     "task_loss_ci": _interval(fit, loss),
                     "accuracy": float(two_step_accuracy(fit.params, n, d)),
                     "accuracy_ci": _interval(fit, accuracy(samples, loss) if samples else ())})
    lines = ["", f"predicted at (N, D), {100 * fit.ci_level:g}% intervals over refits of both "
                 f"steps:", f"  {'N':>11}{'D':>11}{'task loss':>11}{'low':>9}{'high':>9}"
                            f"{'accuracy':>10}{'low':>9}{'high':>9}"]
    for row in rows:
        cells = "".join(f"{'n/a':>9}" if v is None else f"{v:>9.4f}"
                        for v in (*row["task_loss_ci"], row["accuracy"], *row["accuracy_ci"]))
        lines.append(f"  {row['N']:>11.4g}{row['D']:>11.4g}{row['task_loss']:>11.4f}{cells}")
    return "\n".join(lines) + "\n", {"accuracy_at": rows}


class StepTwoAlone:
    """A hold-out baseline: the kept runs' sigmoid applied to a held-out run's observed task
    loss, the prediction were step 1 exact (a forecaster, as
    ``tables/forecasters.Forecaster``)."""

    name, column, rule_column = "step2 alone", "step2", None
    needs = "4 kept runs with distinct task losses"

    def predict(self, kept, test):
        params = fit_sigmoid(kept["task_loss"], kept["loss"])
        if params is None:
            return np.full(len(test), np.nan), None
        return accuracy(params, test["task_loss"]), None


class PowerInCompute:
    """A hold-out baseline: accuracy fitted directly in compute, the error as a power law
    1 - Acc = A C^-c (least squares in logs over the kept runs)."""

    name, column, rule_column = "power in C", "power_c", None
    needs = "2 kept runs at different compute, each with accuracy < 1"

    def predict(self, kept, test):
        log_c = np.log(kept["flops"].to_numpy(np.float64))
        if np.ptp(log_c) == 0 or kept["loss"].max() >= 1:  # log(1 - Acc) needs Acc < 1
            return np.full(len(test), np.nan), None
        slope, intercept = np.polyfit(log_c, np.log1p(-kept["loss"].to_numpy(np.float64)), 1)
        return -np.expm1(intercept + slope * np.log(test["flops"].to_numpy(np.float64))), None


class TwoStep(Law):
    """Bhagia et al. 2024's two-step prediction of a task's accuracy (module docstring)."""

    name = "two_step"
    title = ("two-step task prediction (Bhagia et al. 2024): Acc = a / (1 + exp(-k (L(N, D) "
             "- L0))) + b, L(N, D) = E + A/N^alpha + B/D^beta")
    n_parameters = 9
    capabilities = frozenset({"table", "run-loss"})
    exponents = ("alpha", "beta")
    varies = approach3.Parametric.varies
    floor = "E"
    flags = approach3.Parametric.flags  # --grid: step 1's approach-3 grid
    report_flags = (Flag("accuracy-at", "string", None, "--law=two_step: N:D pairs, comma-"
                         "separated (e.g. 1e9:2e10): the predicted task loss and accuracy of "
                         "each, with intervals over refits of both steps."),)
    column_names = ("task_loss", "accuracy")
    loss_name, loss_columns, loss_what = "accuracy", (), "the task's accuracy, a fraction"
    forecasters = ("persistence", "trend")  # the frontier reads the lowest value as the best
    own_forecasters = (StepTwoAlone, PowerInCompute)
    # --coverage would simulate accuracies but keep the observed task losses step 1 refits.
    refused = ("curves", "by", "budget", "multiplier-against", "train-longer", "fix",
               "coverage")
    scope = "one chained fit of a task's loss and accuracy over a table's runs"

    def options(self, given):
        return approach3.Parametric().options(given) | {
            "accuracy_at": parse_pairs(given.get("accuracy-at"))}

    def run_loss(self, params, n, d, **_):
        return two_step_accuracy(params, n, d)

    def table_columns(self, df, mapping, source):
        if "task_loss" not in mapping:
            raise FitInputError(f"{source}: --law=two_step needs --columns=task_loss:COLUMN "
                                f"(the task's loss step 1 fits)")
        return {"task_loss": pick_column(df, "task_loss", (), mapping, source, "")}

    def check_table(self, table):
        return check_task_table(table)

    def extra_report(self, fit, budgets, settings):
        return format_pairs(fit, settings.get("accuracy_at", []))

    def fit(self, table, *, n_bootstrap, ci_level, seed, grid=approach3.CHINCHILLA_GRID,
            clusters=None, **_):
        return fit_two_step(table.array("params"), table.array("tokens"),
                            table.array("task_loss"), table.array("loss"), grid=grid,
                            n_bootstrap=n_bootstrap, ci_level=ci_level, seed=seed,
                            clusters=clusters, source=table.source)


def check_task_table(table):
    """The table with its task loss as numbers, refusing (naming the column) a task loss that
    is not finite and > 0, an accuracy above 1, or the two read from one column."""
    columns, frame = table.columns, table.frame.copy()
    if columns["task_loss"] == columns["loss"]:
        raise FitInputError(f"{table.source}: task_loss and accuracy both read column "
                            f"{columns['loss']!r}: name two columns")
    frame["task_loss"] = positive_column(table, "task_loss", "step 1 takes its logarithm")
    if frame["loss"].max() > 1:
        raise FitInputError(f"{table.source}: column {columns['loss']!r} (accuracy) has values "
                            f"above 1 (max {frame['loss'].max():.4g}): accuracy is a fraction")
    return dataclasses.replace(table, frame=frame)
