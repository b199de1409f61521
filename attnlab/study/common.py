"""What the studies share: their files, their result, and drawing figures without ever letting a
plot stop a study."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.errors import AttnlabError

if TYPE_CHECKING:  # the heavy imports (JAX, pandas) wait until the command runs
    from attnlab.scaling import ScalingFit, ScalingTable

# The experiment shipped with the repository (an editable install keeps it beside the package).
DEFAULT_EXPERIMENT = Path(__file__).resolve().parents[2] / "experiments" / "quickstart.py"
DEFAULT_WORKDIR = "runs/quickstart"
# Budgets for the printed compute-optimal allocation, as multiples of the largest run's compute.
PREDICTION_MULTIPLIERS = (1.0, 10.0, 100.0)
FIT_FILE = "fit.json"  # approach 3
FIT_APPROACH2_FILE = "fit_approach2.json"
PLOTS_DIR = "plots"
RANKING_FILE = "ranking.csv"
RANKING_TEXT_FILE = "ranking.txt"
MULTIPLIERS_FILE = "multipliers.csv"  # each variant against sweep.baseline
MULTIPLIERS_JSON_FILE = "multipliers.json"
# r(k) of each variant's largest run; ppl at 4x the training length (Press et al. 2022 compare
# orderings at >= 4x: seed noise at 1x is ~1-2% of ppl).
EXTRAPOLATION_MULTIPLIER = 4
# Validation tokens scored per length: bounds the evaluation's time on a CPU.
EXTRAPOLATION_MAX_TOKENS = 1 << 18


# The column a study that trains each point at several learning rates picks the best of.
LEARNING_RATE_COLUMN = "train.learning_rate"


def study_results(workdir: str | Path, *, by: str | None = None,
                  best_over: str | None = None):
    """(the sweep's results table, notes): with ``best_over``, each (N, D) point's runs at its
    best value of that column (``attnlab fit --best-over``'s pick) and a note saying so."""
    from attnlab.scaling import FitRequest

    inputs = FitRequest.of(workdir, by=by, best_over=best_over).read()
    return inputs.kept, pick_notes(inputs.picks, best_over)


def pick_notes(picks, best_over: str | None) -> list[str]:
    """The note a study prints on its --best-over picks (none without them)."""
    if picks is None:
        return []
    ends = int((picks["edge"] != "").sum())
    return [f"each of the {len(picks)} (N, D) points is fitted at its best {best_over} "
                  f"(lowest mean loss over seeds); {ends} of the picks are the end of the "
                  f"point's grid (attnlab fit --best-over={best_over} lists them); the "
                  f"intervals hold the picks fixed (with seeds at every value, attnlab fit "
                  f"--best-over={best_over} --pair=train.seed redraws them)"]


class StudyError(AttnlabError):
    """The study cannot start (e.g. the default experiment file is missing)."""


@dataclasses.dataclass(frozen=True)
class StudyResult:
    """What one ``quickstart`` produced.

    table: the sweep's results (one row per run); fit: Chinchilla approach 3, or None when no
    scaling law fits the runs; fit_approach2: approach 2, or None when the sweep has no budgets
    or the fit failed (see ``messages`` for either);
    budgets: the FLOP budgets of the printed predictions; plots: kind -> PNG path;
    json_paths: the fit files; failed_runs: how many runs ended failed.
    """

    table: ScalingTable
    fit: ScalingFit | None
    fit_approach2: ScalingFit | None
    budgets: tuple[float, ...]
    plots: dict[str, Path]
    json_paths: tuple[Path, ...]
    failed_runs: int
    messages: tuple[str, ...] = ()
    grouped: GroupedStudy | None = None


@dataclasses.dataclass(frozen=True)
class GroupedStudy:
    """The per-variant part of a study of ``sweep.variants``: ``by`` the variant column;
    ``fits3`` / ``fits2`` the grouped fits (``attnlab.scaling.tables.grouped.GroupedFits``, None
    when no group could be fitted); ``ranking`` the table of
    :func:`attnlab.scaling.tables.grouped.rank_at` with an ``r(4x)`` column; ``ratios`` variant ->
    (r(4x) or None, run id or None, note); ``multipliers`` the table of
    :func:`attnlab.scaling.tables.multiplier.multipliers_against` against the baseline variant
    (None without one, or when no law was fitted)."""

    by: str
    fits3: object | None
    fits2: object | None
    ranking: object
    ratios: dict
    multipliers: object | None = None


def save_figures(figures: dict, out_dir: Path) -> tuple[dict, list[str]]:
    """Draws each ``kind -> make()`` figure to ``out_dir/<kind>.png``: (kind -> path, messages
    naming the figures that could not be drawn; a plot never stops the study)."""
    from attnlab.plots.scaling import save_figure

    written, messages = {}, []
    for kind, make in figures.items():
        try:
            written[kind] = save_figure(make(), out_dir / f"{kind}.png")
        except Exception as error:  # noqa: BLE001 - any drawing failure is reported, not raised
            messages.append(f"plot {kind!r} not drawn: {type(error).__name__}: {error}")
    return written, messages


def write_fits(workdir: Path, fit3, fit2, budgets: tuple[float, ...],
               table: ScalingTable | None = None) -> list[Path]:
    """The approach-3 and approach-2 fits (``ScalingFit`` or grouped fits; None: skipped) as
    JSON, in the format of ``attnlab fit --json``, with the predictions at ``budgets`` (and
    their naive baselines, given the fitted ``table``)."""
    from attnlab.scaling.tables.forecasters import with_baselines

    written = []
    for fit, name in ((fit3, FIT_FILE), (fit2, FIT_APPROACH2_FILE)):
        if fit is not None:
            path = workdir / name
            payload = fit.to_dict(budgets)
            if table is not None:
                payload = with_baselines(payload, table.frame)
            path.write_text(json.dumps(payload, indent=2) + "\n")
            written.append(path)
    return written
