"""A trained run evaluated on its token task, beside the task's exact optimum.

* induction (Olsson et al. 2022): loss per position (nats), its mean over the repeat (the
  targets after the repeat's first token, :meth:`InductionTask.repeat_targets`) against
  ``ln V``, and the induction / previous-token score of every head;
* mqar (Arora et al. 2023): accuracy of the argmax at every answer (a queried key's value),
  per query index, and against the number of pairs (windows of the trained length holding
  fewer pairs);
* regression (Garg et al. 2022): the squared error normalised by ``d`` against the number of
  in-context examples, beside least squares, ridge, 3-NN, averaging and one GD step
  (:mod:`attnlab.icl.regression`).

The token tasks' numbers come from their validation stream (:meth:`TaskCorpus.validation_set`),
regression's from its test stream: the same windows for every run of a task.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from attnlab.config import Config
from attnlab.data import icl, icl_regression, sources
from attnlab.errors import ConfigError
from attnlab.model import apply, inspect, resolve
from attnlab.model.objectives import token_losses


def _forward(graphdef, params):
    @jax.jit
    def run(tokens):
        logits = apply(graphdef, params, tokens[:, :-1])
        return token_losses(logits, tokens[:, 1:]), jnp.argmax(logits, axis=-1)
    return run


def _stream(task: icl.TokenTask, batch_size: int, n_batches: int) -> np.ndarray:
    """[n_batches * batch_size, seq_len + 1] int32: the task's validation windows."""
    return icl.TaskCorpus(task).validation_set(task.seq_len, batch_size,
                                               n_batches).reshape(-1, task.seq_len + 1)


def _losses_and_predictions(forward, windows: np.ndarray, batch_size: int):
    losses, predictions = [], []
    for start in range(0, len(windows), batch_size):
        loss, prediction = forward(jnp.asarray(windows[start : start + batch_size]))
        losses.append(np.asarray(loss, np.float64))
        predictions.append(np.asarray(prediction))
    return np.concatenate(losses), np.concatenate(predictions)


def evaluate_induction(cfg: Config, graphdef, params, task: icl.InductionTask, *,
                       batch_size: int = 32, n_batches: int = 8, map_rows: int = 16) -> dict:
    """The repeat's loss, per-position losses and the heads' scores (see the module doc)."""
    windows = _stream(task, batch_size, n_batches)
    losses, _ = _losses_and_predictions(_forward(graphdef, params), windows, batch_size)
    per_position = losses.mean(axis=0)
    repeat = task.repeat_targets(windows)  # [windows, seq_len]
    optimal = task.optimal_losses()
    maps = inspect.attention_maps(graphdef, params, windows[:map_rows, :-1],
                                  distributions_only=True)
    scores = inspect.head_scores(maps, task.prefixes(windows[:map_rows]))
    best = scores["best_induction_head"]
    ln_vocab = math.log(task.vocab)
    repeat_loss = float(losses[repeat].mean())
    per_window = (losses * repeat).sum(axis=1) / repeat.sum(axis=1)
    first = np.arange(1, task.seq_len + 1)[None] < task.prefixes(windows)[:, None]
    return {
        "task": task.name, "windows": len(windows),
        "prefix_range": [task.min_prefix, task.max_prefix], "ln_vocab": ln_vocab,
        "repeat_loss": repeat_loss, "repeat_loss_over_ln_vocab": repeat_loss / ln_vocab,
        "repeat_loss_stderr": float(per_window.std(ddof=1) / math.sqrt(len(windows))),
        "prefix_loss": float(losses[first].mean()),
        "loss": float(losses.mean()), "optimal_loss": float(optimal.mean()),
        "loss_per_position": per_position.tolist(),
        "optimal_loss_per_position": optimal.tolist(),
        "induction_score": None if best is None else best[2],
        "best_induction_head": None if best is None else best[:2],
        "head_scores": scores,
    }


def evaluate_mqar(cfg: Config, graphdef, params, task: icl.MQARTask, *, batch_size: int = 32,
                  n_batches: int = 8, pairs: tuple[int, ...] = ()) -> dict:
    """Accuracy per query at the trained number of pairs, and against ``pairs`` (default:
    1, 2, 4, .. up to the trained number)."""
    forward = _forward(graphdef, params)
    trained = task.pairs
    powers = {2**i for i in range(trained.bit_length()) if 2**i < trained}
    pairs = tuple(sorted(set(pairs or powers) | {trained}))
    curve = []
    for n in pairs:
        variant = dataclasses.replace(task, pairs=n)
        variant.validate()
        windows = _stream(variant, batch_size, n_batches)
        losses, predictions = _losses_and_predictions(forward, windows, batch_size)
        answers = variant.answer_targets()
        correct = predictions[:, answers] == windows[:, 1:][:, answers]  # [windows, n]
        curve.append(float(correct.mean()))
        if n == trained:
            per_query = correct.mean(axis=0).tolist()
            loss = float(losses.mean())
            stderr = float(correct.mean(axis=1).std(ddof=1) / math.sqrt(len(windows)))
    return {
        "task": task.name, "windows": len(windows), "pairs": list(pairs), "accuracy": curve,
        "accuracy_at_trained_pairs": curve[pairs.index(trained)], "accuracy_stderr": stderr,
        "accuracy_per_query": per_query, "trained_pairs": trained,
        "loss": loss, "optimal_loss": float(task.optimal_losses().mean()),
        "ln_vocab": math.log(task.vocab),
    }


class TaskReport:
    """What ``attnlab icl`` does with one task's runs: evaluate them, the headline number a sweep
    tabulates per run (``headline``, a key of the result, drawn against width with
    ``headline_label``), the lines it prints and the picture of one result.

    Adding a task is one subclass and one line in :data:`REPORTS`."""

    task: type = icl.TokenTask  # or icl_regression.RegressionTask
    headline = ""
    headline_stderr = ""  # the headline's standard error in the result ("" if none)
    headline_label = ""

    def evaluate(self, cfg: Config, graphdef, params, task, **kwargs) -> dict:
        raise NotImplementedError

    def lines(self, result: dict) -> list[str]:
        raise NotImplementedError

    def plot(self, result: dict, ax) -> None:
        raise NotImplementedError


class InductionReport(TaskReport):
    task = icl.InductionTask
    headline = "repeat_loss"
    headline_stderr = "repeat_loss_stderr"
    headline_label = "repeat loss (nats)"

    def evaluate(self, cfg, graphdef, params, task, **kwargs):
        return evaluate_induction(cfg, graphdef, params, task, **kwargs)

    def lines(self, result):
        out = [f"repeat loss {result['repeat_loss']:.4f} nats/token = "
               f"{result['repeat_loss_over_ln_vocab']:.3f} ln V (ln V = "
               f"{result['ln_vocab']:.3f}); mean loss {result['loss']:.4f} (optimum "
               f"{result['optimal_loss']:.4f})"]
        head = result["best_induction_head"]
        if head is not None:
            out.append(f"best induction head: layer {head[0]} head {head[1]}, score "
                       f"{result['induction_score']:.3f}")
        return out

    def plot(self, result, ax):
        from attnlab.icl.plots import draw_repeat_loss
        draw_repeat_loss(result, ax)


class MQARReport(TaskReport):
    task = icl.MQARTask
    headline = "accuracy_at_trained_pairs"
    headline_stderr = "accuracy_stderr"
    headline_label = "recall accuracy"

    def evaluate(self, cfg, graphdef, params, task, **kwargs):
        return evaluate_mqar(cfg, graphdef, params, task, **kwargs)

    def lines(self, result):
        return [f"{n:>4} pairs: accuracy {acc:.4f}"
                for n, acc in zip(result["pairs"], result["accuracy"])]

    def plot(self, result, ax):
        from attnlab.icl.plots import draw_recall
        draw_recall(result, ax)


class RegressionReport(TaskReport):
    task = icl_regression.RegressionTask
    headline = "error_at_largest_k"
    headline_stderr = "error_at_largest_k_stderr"
    headline_label = "squared error / d at the largest k"

    def evaluate(self, cfg, graphdef, params, task, *, batch_size=32, n_batches=8):
        from attnlab.icl import regression

        return regression.evaluate(graphdef, params, task, rows=batch_size * n_batches,
                                   batch_size=batch_size)

    def lines(self, result):
        names = list(result["baselines"])
        out = [f"{'k':>3} {'model':>15} " + " ".join(f"{n[:13]:>13}" for n in names)]
        for k in result["k"]:
            out.append(f"{k:>3} {result['error'][k]:8.4f}+-{result['stderr'][k]:.3f} "
                       + " ".join(f"{result['baselines'][n][k]:13.4f}" for n in names))
        out += [f"{claim}: {held}" for claim, held in result.get("matches", {}).items()]
        return out

    def plot(self, result, ax):
        from attnlab.icl.plots import draw_regression
        draw_regression(result, ax)


REPORTS = {r.task.name: r for r in (InductionReport(), MQARReport(), RegressionReport())}


def report_of(result: dict) -> TaskReport:
    """The report of an evaluation's task (``result["task"]``)."""
    return REPORTS[result["task"]]


def evaluate_run(cfg: Config, graphdef, params, **kwargs) -> dict:
    """The evaluation of ``cfg``'s own task (``data.source``)."""
    task = sources.task_of(cfg.data)
    if task is None:
        raise ConfigError("data.source", f"{cfg.data.source} is not an in-context learning "
                          f"task; attnlab icl evaluates runs of {', '.join(REPORTS)}")
    arch = resolve(cfg.model)
    if not arch.objective.causal or arch.decoder is not None:
        raise ConfigError("model.objective", f"{cfg.model.objective}: attnlab icl evaluates "
                          "causal decoders (clm, regression)")
    return REPORTS[task.name].evaluate(cfg, graphdef, params, task, **kwargs)
