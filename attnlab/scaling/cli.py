"""``attnlab fit`` and ``attnlab plot``.

    attnlab fit --results=sweeps/isoflop --law=chinchilla --approach=3 --bootstrap=1000 \
        --budget=1e18 --json=fit.json
    attnlab plot --results=sweeps/isoflop --kind=isoflop --out=isoflop.png

Bad input (a missing column, a non-positive value, too few points, one budget for approach 2)
prints one ``error: ...`` line and returns 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from attnlab.errors import AttnlabError
from attnlab.scaling.approach3 import CHINCHILLA_GRID, InitGrid
from attnlab.scaling.errors import FitInputError, GridEdgeWarning
from attnlab.scaling.fitting import fit_table
from attnlab.scaling.result import ScalingFit
from attnlab.scaling.table import (ScalingTable, parse_columns, prepare_curves, prepare_points,
                                   read_curves, read_table)

PLOT_KINDS = ("loss-vs-params", "loss-vs-compute", "isoflop", "contours", "allocation")


def _budgets(text: str | None) -> list[float]:
    if not text:
        return []
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise FitInputError(f"--budget: {text!r} is not a comma-separated list of FLOP counts "
                            f"(e.g. 1e18,1e19)") from None
    if not all(v > 0 for v in values):
        raise FitInputError(f"--budget: FLOP budgets must be > 0, got {text!r}")
    return values


def _add_input_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", help="a sweep directory or a results .parquet/.csv with "
                                          "columns params, tokens, loss (optional flops, budget)")
    parser.add_argument("--curves", help="learning curves for approach 1: a .parquet/.csv with "
                                         "run_id, step, tokens, params, loss (optional flops), a "
                                         "directory holding curves.parquet, or a sweep directory")
    parser.add_argument("--law", choices=("kaplan", "chinchilla"), default=None)
    parser.add_argument("--approach", type=int, choices=(1, 2, 3), default=None,
                        help="Chinchilla approach (default 3)")
    parser.add_argument("--form", choices=("nd", "n", "d"), default="nd",
                        help="Kaplan law: L(N, D) (default), L(N) or L(D)")
    parser.add_argument("--columns", default=None,
                        help="rename columns, e.g. 'params:Model Size,tokens:Tokens'")
    parser.add_argument("--ci-level", type=float, default=0.95,
                        help="coverage of the percentile intervals (default 0.95)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.add_argument("--grid", default=None,
                        help="approach 3 initialisation grid overrides, NAME:START:STOP:STEP "
                             "for NAME in a, b, e, alpha, beta (default: Hoffmann et al.'s grid)")


def load_table(args: argparse.Namespace, law: str, approach: int | None) -> ScalingTable:
    """The checked table the chosen fit needs: curves for approach 1, run results otherwise."""
    columns = parse_columns(args.columns)
    if law == "chinchilla" and approach == 1:
        source = args.curves or args.results
        if not source:
            raise FitInputError("approach 1 needs --curves=FILE (or --results=SWEEP_DIR)")
        runs = None
        if args.results and Path(args.results).exists() and args.curves:
            runs = read_table(args.results)
        return prepare_curves(read_curves(source), law=law, source=str(source),
                              columns=columns, runs=runs)
    if not args.results:
        raise FitInputError("--results=FILE is required (a sweep directory or a .parquet/.csv)")
    return prepare_points(read_table(args.results), law=law, source=str(args.results),
                          columns=columns)


def run_fit(args: argparse.Namespace, law: str, approach: int | None,
            n_bootstrap: int) -> tuple[ScalingTable, ScalingFit]:
    grid = InitGrid.parse(args.grid) if args.grid else CHINCHILLA_GRID
    table = load_table(args, law, approach)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)  # reported from fit.warnings instead
        fit = fit_table(table, law=law, approach=approach, form=args.form,
                        n_bootstrap=n_bootstrap, ci_level=args.ci_level, seed=args.seed,
                        grid=grid)
    return table, fit


def _number(value) -> str:
    return "n/a" if value is None else f"{value:.5g}"


def format_report(fit: ScalingFit, source: str, budgets: list[float]) -> str:
    """The human-readable table printed by ``attnlab fit``."""
    level = f"{100 * fit.ci_level:g}%"
    unit = "runs" if fit.approach == 1 else "points"
    lines = [fit.name, f"source: {source} ({fit.n_points} {unit})",
             f"objective: {fit.objective:.6e} ({fit.objective_name})"]
    if fit.approach == 3:
        lines.append(f"grid: {fit.details['grid']['starts']} L-BFGS starts, "
                     f"{fit.details['starts_converged']} converged; kept the best converged")
    if fit.samples:
        lines.append(f"bootstrap: {fit.n_bootstrap} of {fit.n_bootstrap_requested} refits, "
                     f"{level} percentile intervals")
    else:
        lines.append("bootstrap: none (pass --bootstrap=N for intervals)")
    ci = fit.ci
    lines += ["", f"  {'parameter':<10}{'estimate':>14}{level + ' low':>14}{level + ' high':>14}"]
    for name, value in fit.params.items():
        low, high = ci.get(name, (None, None))
        flag = "   not pinned by the data" if name in fit.unpinned else ""
        lines.append(f"  {name:<10}{_number(value):>14}{_number(low):>14}{_number(high):>14}"
                     f"{flag}")
    for budget in budgets:
        convention = (f"C = {fit.flops_per_param_token:.3g}·N·D" if fit.approach in (3, None)
                      else "power laws in C")
        lines += ["", f"compute-optimal at C = {budget:.4g} FLOPs ({convention}):"]
        if not fit.allocation_determined:
            lines.append("  not determined: the fit does not pin the allocation (see the "
                         "warnings)")
            continue
        prediction = fit.predict_optimal(budget)
        for name in ("N_opt", "D_opt", "loss"):
            low, high = prediction["ci"].get(name, (None, None))
            value = prediction[name]
            if name == "loss" and value is None:
                lines.append(f"  {'loss':<10}{'n/a':>14}   (approach {fit.approach} models no "
                             f"loss; use approach 3)")
                continue
            lines.append(f"  {name:<10}{_number(value):>14}{_number(low):>14}{_number(high):>14}")
    for warning in fit.warnings:
        lines.append(f"warning: {warning}")
    for note in fit.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"


def fit_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="attnlab fit", description=(
        "Fit Kaplan or Chinchilla scaling laws to a sweep's results, with bootstrap intervals."))
    _add_input_flags(parser)
    parser.add_argument("--bootstrap", type=int, default=200,
                        help="bootstrap refits for the intervals (default 200; 0: none)")
    parser.add_argument("--budget", default=None,
                        help="FLOP budget(s), comma-separated: print the compute-optimal N, D "
                             "and loss there, with intervals")
    parser.add_argument("--json", default=None, help="write the fit as JSON to this file")
    args = parser.parse_args(argv)
    try:
        if args.law is None:
            raise FitInputError("--law is required: kaplan or chinchilla")
        approach = (args.approach or 3) if args.law == "chinchilla" else None
        budgets = _budgets(args.budget)
        table, fit = run_fit(args, args.law, approach, args.bootstrap)
        sys.stdout.write(format_report(fit, table.source, budgets))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(fit.to_dict(budgets), indent=2) + "\n")
    except AttnlabError as error:
        sys.stderr.write(f"error: {error}\n")
        return 2
    return 0


def plot_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="attnlab plot", description=(
        "Draw the standard scaling-law figures (PNG or PDF, by the --out extension)."))
    _add_input_flags(parser)
    parser.add_argument("--kind", required=True, choices=PLOT_KINDS, help=(
        "loss-vs-params: loss against N per D with Kaplan lines; loss-vs-compute: loss against "
        "FLOPs with the frontier; isoflop: IsoFLOP parabolas (Chinchilla Fig. 3); contours: "
        "fitted L(N, D) with the efficient frontier (Chinchilla Fig. 4); allocation: N_opt(C) "
        "and D_opt(C) with interval bands"))
    parser.add_argument("--out", required=True, help="output file, .png or .pdf")
    parser.add_argument("--bootstrap", type=int, default=None,
                        help="bootstrap refits for the bands (default 200 for allocation, else 0)")
    args = parser.parse_args(argv)
    from attnlab.plots import scaling as scaling_plots  # matplotlib only when plotting

    try:
        suffix = Path(args.out).suffix.lower()
        if suffix not in (".png", ".pdf"):
            raise FitInputError(f"--out must end in .png or .pdf, not {args.out!r}")
        n_bootstrap = args.bootstrap if args.bootstrap is not None else (
            200 if args.kind == "allocation" else 0)
        kind = args.kind
        if kind == "loss-vs-params":
            law = args.law or "kaplan"
            table, fit = run_fit(args, law, None if law == "kaplan" else (args.approach or 3),
                                 n_bootstrap)
            figure = scaling_plots.plot_loss_vs_params(table.frame, fit)
        elif kind == "loss-vs-compute":
            law = args.law or "chinchilla"
            if args.curves:
                table, fit = run_fit(args, law, 1, n_bootstrap)
                figure = scaling_plots.plot_loss_vs_compute(table.frame, fit)
            else:
                table = load_table(args, law, None)
                figure = scaling_plots.plot_loss_vs_compute(table.frame)
        elif kind == "isoflop":
            table, fit = run_fit(args, "chinchilla", 2, n_bootstrap)
            figure = scaling_plots.plot_isoflops(fit)
        elif kind == "contours":
            table, fit = run_fit(args, "chinchilla", 3, n_bootstrap)
            figure = scaling_plots.plot_loss_contours(fit, table.frame)
        else:
            law = args.law or "chinchilla"
            approach = (args.approach or 3) if law == "chinchilla" else None
            table, fit = run_fit(args, law, approach, n_bootstrap)
            figure = scaling_plots.plot_optimal_allocation(fit, table.frame)
        path = scaling_plots.save_figure(figure, args.out)
        sys.stdout.write(f"wrote {path}\n")
    except AttnlabError as error:
        sys.stderr.write(f"error: {error}\n")
        return 2
    return 0
