"""A study of named variants (``sweep.variants``, e.g. experiments/architectures.py): one
approach-3 and one approach-2 fit per variant (``attnlab fit --by``, with bootstrap intervals), a
table ranking the variants by their compute-optimal loss at a reference compute (the largest
budget) with intervals (``ranking.csv``), each variant's effective compute multiplier against
the baseline (``sweep.baseline``) at that compute and its loss difference at the largest budget
(``multipliers.csv`` / ``multipliers.json``), every variant's compute-optimal frontier in one
figure, and the extrapolation ratio r(4x) = ppl(4L) / ppl(L) of each variant's largest run
(``attnlab extrapolate``, nonoverlapping windows)."""

from __future__ import annotations

from pathlib import Path

from attnlab.errors import AttnlabError
from attnlab.study.common import (EXTRAPOLATION_MAX_TOKENS, EXTRAPOLATION_MULTIPLIER,
                                  MULTIPLIERS_FILE, MULTIPLIERS_JSON_FILE, PLOTS_DIR, RANKING_FILE,
                                  RANKING_TEXT_FILE, GroupedStudy, StudyResult, pick_notes,
                                  save_figures, write_fits)


def fit_grouped_study(workdir: str | Path, by: str, *, n_bootstrap: int = 200, seed: int = 0,
                      best_over: str | None = None):
    """One approach-3 and one approach-2 fit per value of column ``by`` of a sweep directory's
    results, each point at its best ``best_over`` value when given. Returns (results, fits3 or
    None, fits2 or None, messages)."""
    from attnlab.scaling import FitInputError, FitRequest

    requests = {approach: FitRequest.of(workdir, approach=approach, by=by, best_over=best_over,
                                        n_bootstrap=n_bootstrap, seed=seed)
                for approach in (3, 2)}
    inputs = requests[3].read()
    messages = pick_notes(inputs.picks, best_over)
    fitted = {}
    for approach, request in requests.items():
        try:
            fitted[approach] = request.grouped(inputs)
        except FitInputError as error:
            fitted[approach] = None
            messages.append(f"approach {approach} skipped: {error}")
    return inputs.kept, fitted[3], fitted[2], messages


def largest_runs(results, by: str) -> dict:
    """variant -> the run id of its largest completed run: the largest budget (or compute),
    then the most parameters (the run that best shows how the variant behaves at scale)."""
    done = results[results["status"] == "completed"]
    order = ["budget" if "budget" in done.columns else "flops_chinchilla", "params"]
    picked = {}
    for group, runs in done.groupby(done[by].astype(str), sort=True):
        picked[group] = str(runs.sort_values(order, kind="stable").iloc[-1]["run_id"])
    return picked


def extrapolation_ratios(workdir: str | Path, results, by: str,
                         multiplier: int = EXTRAPOLATION_MULTIPLIER,
                         max_tokens: int = EXTRAPOLATION_MAX_TOKENS) -> dict:
    """variant -> (r(k), run id, note): ``attnlab extrapolate``'s ppl ratio ppl(kL) / ppl(L) of
    each variant's largest run (nonoverlapping windows; a report made earlier from the same
    checkpoint is reused). A run that cannot be evaluated gives (None, run id, why)."""
    from attnlab.extrapolation import EvalSettings, evaluate_run
    from attnlab.rundir import RUNS_DIR

    settings = EvalSettings(multipliers=(1, multiplier), max_tokens=max_tokens)
    ratios = {}
    for group, run_id in largest_runs(results, by).items():
        try:
            report = evaluate_run(Path(workdir) / RUNS_DIR / run_id, settings, progress=False)
        except AttnlabError as error:
            ratios[group] = (None, run_id, f"not evaluated: {error}")
            continue
        rows = [r for r in report["results"] if r["status"] == "ok"
                and r["protocol"] == "nonoverlapping" and r["multiplier"] == multiplier]
        if rows and rows[0]["ppl_ratio"] is not None:
            ratios[group] = (float(rows[0]["ppl_ratio"]), run_id, "")
        else:
            reasons = {r.get("reason") for r in report["results"] if r.get("reason")}
            ratios[group] = (None, run_id, "; ".join(sorted(map(str, reasons))) or
                             f"no {multiplier}x row")
    return ratios


def finish_grouped_study(workdir: str | Path, by: str, *, n_bootstrap: int = 200,
                         say=print, failed: int = 0, baseline: str | None = None,
                         best_over: str | None = None) -> StudyResult:
    """Fits, ranks, evaluates and plots a finished sweep of variants (see the module docstring);
    writes fit.json / fit_approach2.json (``attnlab fit --by --json``'s format), ranking.csv,
    ranking.txt and (given a ``baseline`` variant) multipliers.csv / multipliers.json into
    ``workdir`` and the figures into ``workdir/plots``."""
    import pandas as pd

    from attnlab.scaling import FitInputError, law_named, prepare_points
    from attnlab.scaling.tables.grouped import format_grouped, format_ranking, rank_at
    from attnlab.scaling.tables.multiplier import format_multipliers, multipliers_against

    workdir = Path(workdir)
    results, fits3, fits2, messages = fit_grouped_study(workdir, by, n_bootstrap=n_bootstrap,
                                                        best_over=best_over)
    table = prepare_points(results, law=law_named("chinchilla"), source=str(workdir))
    # The reference compute: the largest run's (in each variant's own FLOP count), so the
    # ranking interpolates inside every variant's data rather than extrapolating.
    reference = float(f"{table.frame['flops'].max():.3g}")
    budgets = (reference, 10 * reference)
    for grouped in (fits3, fits2):
        if grouped is not None:
            say("\n" + format_grouped(grouped, budgets if grouped is fits3 else ()).rstrip())
    ratios = extrapolation_ratios(workdir, results, by)
    column = f"r({EXTRAPOLATION_MULTIPLIER}x)"
    if fits3 is not None or fits2 is not None:
        ranking = rank_at(reference, fits3, fits2, results)
        ranking[column] = [ratios.get(g, (None,))[0] for g in ranking[by]]
        ranking[column] = pd.to_numeric(ranking[column])
        ranking["largest_run"] = [ratios.get(g, (None, None))[1] for g in ranking[by]]
    else:
        ranking = pd.DataFrame({by: sorted(ratios)})
    say("\n" + (format_ranking(ranking) if len(ranking.columns) > 1 else "no ranking: no "
                                                                           "group was fitted"))
    say(f"{column} = ppl({EXTRAPOLATION_MULTIPLIER}L) / ppl(L) of each {by}'s largest run "
        f"(nonoverlapping windows, L = the training length)")
    for group, (_, run_id, note) in ratios.items():
        if note:
            messages.append(f"{column} of {group} ({run_id}): {note}")
    multipliers, multiplier_paths = None, []
    if baseline is not None and fits3 is not None:
        try:
            multipliers = multipliers_against(fits3, baseline, reference)
        except FitInputError as error:
            messages.append(f"no multipliers: {error}")
        else:
            say("\n" + format_multipliers(multipliers).rstrip())
            multiplier_paths = write_multipliers(workdir, multipliers)
    for message in messages:
        say(f"note: {message}")

    json_paths = write_fits(workdir, fits3, fits2, budgets)
    ranking_path = workdir / RANKING_FILE
    ranking.to_csv(ranking_path, index=False)
    (workdir / RANKING_TEXT_FILE).write_text(format_ranking(ranking) if len(ranking.columns) > 1
                                             else "")
    json_paths += [ranking_path, *multiplier_paths]
    plots, plot_messages = draw_grouped_plots(fits3, fits2, workdir / PLOTS_DIR)
    for message in plot_messages:
        say(f"warning: {message}")
    say("wrote")
    for path in [*json_paths, workdir / RANKING_TEXT_FILE, *plots.values()]:
        say(f"  {path}")
    return StudyResult(table=table, fit=None, fit_approach2=None, budgets=budgets, plots=plots,
                       json_paths=tuple(json_paths), failed_runs=failed,
                       messages=tuple(messages),
                       grouped=GroupedStudy(by=by, fits3=fits3, fits2=fits2, ranking=ranking,
                                            ratios=ratios, multipliers=multipliers))


def write_multipliers(workdir: Path, multipliers) -> list[Path]:
    """The multipliers table as CSV and as JSON records (NaN and inf as null, ``base`` and ``by``
    beside them)."""
    import json

    from attnlab.scaling.result import jsonable

    csv_path, json_path = workdir / MULTIPLIERS_FILE, workdir / MULTIPLIERS_JSON_FILE
    multipliers.to_csv(csv_path, index=False)
    payload = {"by": multipliers.attrs["by"], "base": multipliers.attrs["base"],
               "ci_level": multipliers.attrs["level"],
               "rows": jsonable(multipliers.to_dict(orient="records"))}
    json_path.write_text(json.dumps(payload, indent=2) + "\n")
    return [csv_path, json_path]


def draw_grouped_plots(fits3, fits2, out_dir: str | Path) -> tuple[dict[str, Path], list[str]]:
    """Every group's compute-optimal frontier in one figure (approach 3: N_opt(C) and the loss
    along it; approach 2: N_opt(C)), and one IsoFLOP figure per group. A figure that fails to
    draw is a message (as in :func:`draw_plots`)."""
    from attnlab.plots import scaling as plots

    out_dir = Path(out_dir)
    figures = {}
    if fits3 is not None:
        figures["frontiers"] = lambda: plots.plot_group_frontiers(fits3)
    if fits2 is not None:
        figures["frontiers_approach2"] = lambda: plots.plot_group_frontiers(fits2)
        for group, fit in fits2.fits.items():
            figures[f"isoflop_{group}"] = lambda fit=fit: plots.plot_isoflops(fit)
    return save_figures(figures, out_dir)
