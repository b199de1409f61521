"""Downstream evaluation of trained runs (``attnlab eval``): multiple-choice tasks read from
JSON lines or generated from the standard library (:mod:`attnlab.data.tasks`), scored by a
causal decoder's log-likelihoods (:mod:`attnlab.train.scoring`).

    results = evaluate_run("runs/tiny", ["stdlib_next_line", "my_task.jsonl"])
    results["stdlib_next_line"]["accuracy"], results["stdlib_next_line"]["bits_per_byte"]
"""

from attnlab.data.tasks import (TASKS, Example, FileTask, Task, TaskError, read_examples,
                                tasks_of)
from attnlab.eval.run import evaluate_run
from attnlab.train.scoring import Scorer, check_decoder, evaluate, task_scores

__all__ = ["Example", "FileTask", "Scorer", "TASKS", "Task", "TaskError", "check_decoder",
           "evaluate", "evaluate_run", "read_examples", "task_scores", "tasks_of"]
