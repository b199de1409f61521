"""A trained run scored on tasks: everything checked (the run's objective, every task's file
and line, then each choice's tokens) before its parameters are read or anything compiles."""

from __future__ import annotations

from attnlab.data.tasks import tasks_of
from attnlab.train.load import load_config, load_params, run_tokenizer
from attnlab.train.scoring import Scorer, check_decoder, evaluate


def evaluate_run(run: str, specs: list[str], *, step: int | None = None, size: int = 200,
                 seed: int = 0, batch_size: int = 64) -> dict[str, dict]:
    """``{task: scores}`` (:func:`attnlab.train.scoring.task_scores`) of the run's checkpoint
    ``step`` (default: the latest) on the tasks ``specs`` names."""
    cfg = load_config(run)
    check_decoder(cfg)
    examples = {t.name: t.examples() for t in tasks_of(specs, size=size, seed=seed)}
    scorer = Scorer(cfg, run_tokenizer(run, cfg), batch_size=batch_size)
    rows = {name: scorer.rows(e) for name, e in examples.items()}
    _, graphdef, params = load_params(run, step)
    return {name: evaluate(scorer, graphdef, params, e, rows[name])
            for name, e in examples.items()}
