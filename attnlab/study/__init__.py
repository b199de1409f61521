"""Studies in one command: ``attnlab quickstart`` runs a whole scaling study.

    attnlab quickstart [--sweep=runs/quickstart] [--config=experiments/quickstart.py[:gpu]]
                       [--config.sweep.budgets='(1e11,3e11,1e12)'] [--bootstrap=200]

1. runs the IsoFLOP sweep of the experiment file (``attnlab.sweep.run_sweep``: finished runs are
   reused, interrupted ones resume);
2. fits Chinchilla approach 3, L(N, D) = E + A/N^alpha + B/D^beta, with bootstrap intervals, and
   approach 2 (IsoFLOP parabolas) when the sweep has budgets;
3. prints the fitted parameters and the compute-optimal N, D and loss at 1x, 10x and 100x the
   largest run's compute, and writes the fits as JSON (the format of ``attnlab fit --json``);
4. draws the standard figures (``attnlab.plots.scaling``) as PNGs into ``SWEEP/plots/``.

A sweep of named variants (``sweep.variants``, e.g. experiments/architectures.py) is a comparison
study instead: one approach-3 and one approach-2 fit per variant (``attnlab fit --by``, with
bootstrap intervals), a table ranking the variants by their compute-optimal loss at a reference
compute (the largest budget) with intervals (``ranking.csv``), every variant's compute-optimal
frontier in one figure, and the extrapolation ratio r(4x) = ppl(4L) / ppl(L) of each variant's
largest run (``attnlab extrapolate``, nonoverlapping windows).

Everything here is orchestration: the sweep, the fits and the figures come from
``attnlab.sweep``, ``attnlab.scaling`` and ``attnlab.plots.scaling``.
"""

from attnlab.study.common import (DEFAULT_EXPERIMENT, DEFAULT_WORKDIR, FIT_APPROACH2_FILE,
                                  FIT_FILE, MULTIPLIERS_FILE, MULTIPLIERS_JSON_FILE, PLOTS_DIR,
                                  RANKING_FILE, RANKING_TEXT_FILE, GroupedStudy, StudyError, StudyResult)
from attnlab.study.grouped import (extrapolation_ratios, finish_grouped_study, fit_grouped_study,
                                   largest_runs)
from attnlab.study.quickstart import (default_argv, draw_plots, fit_study, headline,
                                      prediction_budgets, quickstart_main, report, run_study,
                                      write_fits)

__all__ = [
    "DEFAULT_EXPERIMENT", "DEFAULT_WORKDIR", "FIT_APPROACH2_FILE", "FIT_FILE", "GroupedStudy",
    "MULTIPLIERS_FILE", "MULTIPLIERS_JSON_FILE", "PLOTS_DIR", "RANKING_FILE", "RANKING_TEXT_FILE", "StudyError", "StudyResult",
    "default_argv", "draw_plots", "extrapolation_ratios", "finish_grouped_study", "fit_grouped_study",
    "fit_study", "headline", "largest_runs", "prediction_budgets", "quickstart_main", "report",
    "run_study", "write_fits",
]
