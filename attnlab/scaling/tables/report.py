"""The report ``attnlab fit`` prints for one fit: parameters with intervals, what the bootstrap
kept, each budget's compute-optimal prediction beside the naive baseline, and the lines
``--train-longer`` adds. Shared with the studies that print a fit the same way."""

from __future__ import annotations

from attnlab.scaling.errors import FitInputError
from attnlab.scaling.points import ScalingTable
from attnlab.scaling.result import ScalingFit, pin_rule
from attnlab.scaling.tables.baselines import frontier_baseline
from attnlab.scaling.tables.forecasters import FRONTIER_RULE, at_budget


def _number(value) -> str:
    return "n/a" if value is None else f"{value:.5g}"


def format_trained_longer(fit: ScalingFit, budgets: list[float], multipliers: list[float]) -> str:
    """The lines ``--train-longer`` adds: per budget and multiplier M, N_opt(C) trained on
    M·D_opt(C) tokens, its predicted loss and the change from the compute-optimal loss."""
    if not multipliers:
        return ""
    if not budgets:
        raise FitInputError("--train-longer needs --budget=C[,C...]: it trains each budget's "
                            "compute-optimal model longer")
    if not (fit.has_loss_model and fit.allocation_determined):
        return (f"\ntrained longer: {fit.name} predicts no loss at an allocation (use "
                f"--law=chinchilla --approach=3 or --law=kaplan --form=nd)\n")
    level = f"{100 * fit.ci_level:g}%"
    lines = ["", f"trained longer: N_opt(C) on M x D_opt(C) tokens (M x C FLOPs), {level} "
                 f"intervals at fixed (N, D):",
             f"  {'C':>10}{'M':>7}{'N':>11}{'D':>11}{'D/N':>9}{'loss':>9}{'low':>9}"
             f"{'high':>9}{'change':>9}{'low':>9}{'high':>9}"]
    for budget in budgets:
        for m in multipliers:
            p = fit.predict_trained_longer(budget, m)
            lo, hi = p["ci"].get("loss", (None, None))
            elo, ehi = p["ci"].get("change", (None, None))
            cells = [f"{v:>9.4f}" if v is not None else f"{'n/a':>9}"
                     for v in (p["loss"], lo, hi, p["change"], elo, ehi)]
            lines.append(f"  {budget:>10.3g}{m:>7g}{p['N']:>11.3g}{p['D']:>11.3g}"
                         f"{p['D'] / p['N']:>9.3g}" + "".join(cells))
    return "\n".join(lines) + "\n"


def bootstrap_line(fit: ScalingFit) -> str:
    """What the bootstrap resampled, how many refits it kept, and whether it gives intervals."""
    drawn = fit.resampling or {"unit": "row", "clusters": fit.n_points}
    unit = (f"resampling {drawn['clusters']} clusters, the rows sharing a value of "
            f"{drawn['column']!r} drawn together" if drawn["unit"] == "cluster"
            else f"resampling {drawn['clusters']} {drawn['unit']}s"
            + (f" within each {drawn['within']}" if drawn.get("within") else ""))
    head = f"bootstrap ({unit}): {fit.n_bootstrap} of {fit.n_bootstrap_requested} refits"
    if fit.intervals_refused:
        return f"{head}; intervals {fit.refusal}"
    return f"{head}, {100 * fit.ci_level:g}% percentile intervals"


def below_floor(fit: ScalingFit, budgets: list[float], floor: float | None) -> list[float]:
    """The budgets whose predicted compute-optimal loss lies below ``floor``."""
    if floor is None or not fit.has_loss_model or not fit.allocation_determined:
        return []
    return [c for c in budgets if fit.predict_optimal(c)["loss"] < floor]


def format_report(fit: ScalingFit, source: str, budgets: list[float],
                  floor: float | None = None, table: ScalingTable | None = None) -> str:
    """The human-readable table printed by ``attnlab fit``; with the fitted ``table``, each
    predicted compute-optimal loss has the naive baseline beside it (the best run that spent at
    most that compute)."""
    level = f"{100 * fit.ci_level:g}%"
    unit = "runs" if fit.part.can("curves") else "points"
    lines = [fit.name, f"source: {source} ({fit.n_points} {unit})",
             f"objective: {fit.objective:.6e} ({fit.objective_name})"]
    if "starts_converged" in fit.details:
        lines.append(f"grid: {fit.details['grid']['starts']} L-BFGS starts, "
                     f"{fit.details['starts_converged']} converged; kept the best converged")
    if fit.n_bootstrap_requested:
        lines.append(bootstrap_line(fit))
    else:
        lines.append("bootstrap: none (pass --bootstrap=N for intervals)")
    ci, wide = fit.ci, fit.too_wide
    if wide and fit.intervals_refused:
        lines.append(f"not pinned, no interval to show it: {', '.join(wide)}")
    elif wide:  # lead with what the data pin: these go below the others, by name
        lines.append(f"not pinned, an interval too wide to act on ({pin_rule(fit.part)}): "
                     f"{', '.join(wide)}")
    lines += ["", f"  {'parameter':<10}{'estimate':>14}{level + ' low':>14}{level + ' high':>14}"]
    for name in sorted(fit.params, key=lambda n: n in fit.not_pinned):
        value = fit.params[name]
        low, high = ci.get(name, (None, None))
        flag = ("   not pinned by the data" if name in fit.unpinned
                else "   not pinned: " + wide[name] if name in wide
                else "   held by --fix" if name in fit.details.get("fixed", {}) else "")
        shown = "not pinned" if name in wide else _number(value)
        lines.append(f"  {name:<10}{shown:>14}{_number(low):>14}{_number(high):>14}"
                     f"{flag}")
    for budget in budgets:
        convention = (f"C = {fit.flops_per_param_token:.3g}·N·D" if fit.predicts_loss
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
        lines += _baseline_line(prediction, table, budget)
        if budget in below_floor(fit, [budget], floor):
            lines.append(f"  warning: the predicted loss is below the floor {floor:.6g}: the law "
                         f"extrapolates past what any model can reach")
    for warning in fit.warnings:
        lines.append(f"warning: {warning}")
    for note in fit.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"


def _baseline_line(prediction: dict, table: ScalingTable | None, budget: float) -> list[str]:
    base = frontier_baseline(table.frame, budget) if table is not None else None
    if table is None or prediction.get("loss") is None:
        return []
    if base is None:
        return [f"  {'naive':<10}{'none':>14}   no run spent at most {budget:.3g} FLOPs: "
                f"nothing to set the law against"]
    lines = [f"  {'naive':<10}{_number(base['loss']):>14}   {base['rule']} (N {base['N']:.3g}, "
             f"D {base['D']:.3g}, C {base['C']:.3g}); the law: "
             f"{100 * (prediction['loss'] / base['loss'] - 1):+.1f}%"]
    rules = {"trend": "log L linear in log C through the two largest budgets' best runs",
             "frontier": FRONTIER_RULE}
    for name, loss in at_budget(table.frame, budget).items():
        lines.append(f"  {name:<10}{_number(loss):>14}   {rules[name]}" + (
            f"; the law: {100 * (prediction['loss'] / loss - 1):+.1f}%" if loss else
            " (too few budgets)"))
    return lines
