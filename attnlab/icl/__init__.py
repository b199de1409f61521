"""In-context learning evaluations of trained runs (``attnlab icl``) and attention maps
(``attnlab attention``); the tasks themselves are data sources (:mod:`attnlab.data.icl`)."""

from attnlab.icl.evaluate import evaluate_induction, evaluate_mqar, evaluate_run

__all__ = ["evaluate_induction", "evaluate_mqar", "evaluate_run"]
