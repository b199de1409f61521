"""Downstream evaluation of trained runs (``attnlab eval``): multiple-choice tasks read from
JSON lines or generated from the standard library (:mod:`attnlab.eval.tasks`), scored by a
causal decoder's log-likelihoods (:mod:`attnlab.eval.scoring`).

    results = evaluate_run("runs/tiny", ["stdlib_next_line", "my_task.jsonl"])
    results["stdlib_next_line"]["accuracy"], results["stdlib_next_line"]["bits_per_byte"]
"""

from attnlab.eval.run import evaluate_run, tasks_of
from attnlab.eval.scoring import Scorer, check_decoder, evaluate, task_scores
from attnlab.eval.tasks import TASKS, Example, FileTask, Task, TaskError, read_examples

__all__ = ["Example", "FileTask", "Scorer", "TASKS", "Task", "TaskError", "check_decoder",
           "evaluate", "evaluate_run", "read_examples", "task_scores", "tasks_of"]
