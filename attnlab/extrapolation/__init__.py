"""Length extrapolation: evaluate trained runs at context lengths beyond their training length.

    report = evaluate_run("runs/rope", EvalSettings(multipliers=(1, 2, 4, 8, 16)))
    study = run_study(attnlab.sweep.load_spec("experiments/pe_extrapolation.py"), "sweeps/pe")

Protocols (nonoverlapping, sliding) are in :mod:`protocol`, scoring and run reports in
:mod:`evaluate`, whole studies (sweep + evaluation + plots) in :mod:`study`, red-flag checks in
:mod:`checks`. See docs/extrapolation.md.
"""

from attnlab.extrapolation.checks import red_flags
from attnlab.extrapolation.evaluate import (
    EvalSettings,
    evaluate_model,
    evaluate_run,
    is_current,
    not_applicable_reason,
    ntk_rope_theta,
)
from attnlab.extrapolation.protocol import (
    PROTOCOLS,
    EvaluationError,
    WindowPlan,
    make_plan,
    nonoverlapping_plan,
    scored_target_count,
    sliding_plan,
)
from attnlab.extrapolation.study import Study, run_study

__all__ = [
    "PROTOCOLS",
    "EvalSettings",
    "EvaluationError",
    "Study",
    "WindowPlan",
    "evaluate_model",
    "evaluate_run",
    "is_current",
    "make_plan",
    "nonoverlapping_plan",
    "not_applicable_reason",
    "ntk_rope_theta",
    "red_flags",
    "run_study",
    "scored_target_count",
    "sliding_plan",
]
