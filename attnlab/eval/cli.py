"""``attnlab eval``: a trained run scored on multiple-choice tasks (:mod:`attnlab.eval`).
``main(argv) -> exit code``, dispatched by :mod:`attnlab.cli`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from attnlab import cli_vocab as vocab
from attnlab.cli_flags import Flag, parse
from attnlab.data.tasks import TASKS
from attnlab.errors import AttnlabError

EVAL_FLAGS = [
    vocab.RUN.flag("Its latest checkpoint is used.", required=True),
    Flag("tasks", "string", "", f"Tasks, separated by commas: registered ones "
         f"({', '.join(TASKS)}) or JSON-lines files (each line: context, choices, answer).",
         required=True),
    Flag("examples", "integer", 200, "Examples of each generated task."),
    Flag("task-seed", "integer", 0, "Seed of the generated tasks' examples."),
    Flag("batch-size", "integer", 64, "Rows (a context and one choice) per program call."),
    vocab.STEP.flag(),
    vocab.JSON.flag("Every task's scores and per-example records.", default=""),
]

DESCRIPTION = ("Scores a causal LM run on multiple-choice tasks: accuracy (the choice of the "
               "highest log-likelihood per byte), the gold answer's cross-entropy and its bits "
               "per byte.")


def eval_main(argv: list[str]) -> int:
    """``attnlab eval --run=DIR --tasks=stdlib_next_line,FILE.jsonl [--json=FILE]``."""
    if any(a.startswith("--config") for a in argv):
        raise AttnlabError("eval uses the run's own config (its config.json): --config and "
                           "--config.* overrides would not be applied, so they are refused")
    values = parse(argv, EVAL_FLAGS, prog="attnlab eval", takes_config=False,
                   description=DESCRIPTION)
    for flag in ("examples", "batch-size"):
        if values[flag].value < 1:
            raise AttnlabError(f"--{flag} must be >= 1, got {values[flag].value}")
    specs = [s.strip() for s in values.tasks.split(",") if s.strip()]
    if not specs:
        raise AttnlabError("--tasks names no task: give task names or JSON-lines files")
    from attnlab.eval import evaluate_run

    results = evaluate_run(values.run, specs, step=values.step, size=values.examples,
                           seed=values["task-seed"].value, batch_size=values["batch-size"].value)
    for line in report_lines(results):
        sys.stdout.write(line + "\n")
    if values.json:
        Path(values.json).write_text(json.dumps({"run": values.run, "step": values.step,
                                                 "tasks": results}, indent=1) + "\n")
    return 0


def report_lines(results: dict[str, dict]) -> list[str]:
    """One line per task: accuracy beside chance, the gold answer's CE and bits per byte."""
    lines = [f"{'task':<20} {'examples':>8} {'accuracy':>9} {'chance':>7} {'acc_raw':>8} "
             f"{'gold_ce':>8} {'gold_nll':>9} {'bpb':>7}"]
    for name, r in results.items():
        lines.append(f"{name:<20} {r['examples']:>8} {r['accuracy']:>9.4f} {r['chance']:>7.3f} "
                     f"{r['accuracy_unnormalised']:>8.4f} {r['gold_ce']:>8.4f} "
                     f"{r['gold_nll']:>9.3f} {r['bits_per_byte']:>7.4f}")
    lines.append("accuracy: the highest log-likelihood per byte; acc_raw: the highest total; "
                 "gold_ce: nats per gold token; gold_nll: nats per example; bpb: bits per byte")
    return lines
