"""Log-likelihoods of continuations under a run's causal decoder, and a task's scores.

A row is ``[separator] + context + continuation`` (the separator, where the tokenizer has one,
begins a document as in training), cut from the left to the trained window
(``data.seq_len`` inputs) as lm-evaluation-harness cuts to its model's length; the
continuation's tokens are scored from all that precedes them. Rows are left-padded to one shape
and scored in fixed-size batches by one jitted program
(:func:`attnlab.train.step.padded_target_scores`); each continuation's losses are summed in
float64.

A task's scores (:func:`task_scores`):

* ``accuracy``: the choice with the highest log-likelihood per UTF-8 byte of its text is the
  gold one (length-normalised, whatever the tokenizer; lm-eval's ``acc_bytes``, and its
  ``acc_norm`` where the text is ASCII); ``accuracy_unnormalised`` takes the highest total
  (lm-eval's ``acc``);
* ``gold_nll``: the gold continuation's summed NLL (nats), mean over examples;
  ``gold_ce``: nats per gold token over the task's gold tokens;
* ``bits_per_byte``: the gold NLL over the task in bits per UTF-8 byte of the gold text.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from attnlab.config import Config
from attnlab.data.tasks import Example, TaskError, tasks_of
from attnlab.errors import AttnlabError, ConfigError
from attnlab.model import resolve
from attnlab.model.masks import left_pad
from attnlab.train.step import packing_for, padded_target_scores


def check_decoder(cfg: Config) -> None:
    """Refuses a run that is not a causal decoder of tokens, naming the field."""
    arch = resolve(cfg.model)
    if not arch.objective.causal or arch.decoder is not None or arch.objective.reads_vectors:
        raise ConfigError("model.objective", f"{cfg.model.objective}: the tasks are scored by "
                          "a causal decoder's next-token log-likelihoods (clm); masked and "
                          "encoder-decoder runs are not scored")


@dataclasses.dataclass(frozen=True)
class Row:
    """One continuation to score: ``tokens`` (the row, cut to the window) of which the last
    ``scored`` are the continuation's."""

    tokens: np.ndarray
    scored: int


class Scorer:
    """Scores continuations after contexts with a run's model (``cfg``) and ``tokenizer``,
    ``batch_size`` rows a program call; the rows are made (and checked) before any parameter
    is read."""

    def __init__(self, cfg: Config, tokenizer, *, batch_size: int = 64):
        check_decoder(cfg)
        self.cfg, self.tokenizer, self.batch_size = cfg, tokenizer, batch_size
        self.window = cfg.data.seq_len
        eos = getattr(tokenizer, "eos_id", -1)
        self.prefix = np.asarray([eos] if eos is not None and eos >= 0 else [], np.int32)

    def row(self, context: str, continuation: str, where: str) -> Row:
        """The row of one pair; raises TaskError naming ``where`` for one it cannot score."""
        context_ids = np.asarray(self.tokenizer.encode(context), np.int32)
        ids = np.asarray(self.tokenizer.encode(continuation), np.int32)
        if len(ids) == 0:
            raise TaskError(f"{where}: a choice encodes to no tokens")
        if len(ids) > self.window:
            raise TaskError(f"{where}: a choice is {len(ids)} tokens, longer than the run's "
                            f"window (data.seq_len={self.window})")
        tokens = np.concatenate([self.prefix, context_ids, ids])
        if len(tokens) < 2 or len(tokens) == len(ids):
            raise TaskError(f"{where}: an empty context, and the tokenizer has no separator "
                            "to begin the row with")
        return Row(tokens[-(self.window + 1):], len(ids))

    def rows(self, examples: list[Example]) -> list[Row]:
        """Every choice of every example, in order (checked before anything compiles)."""
        return [self.row(e.context, c, e.where or "an example") for e in examples
                for c in e.choices]

    def score(self, graphdef, params, rows: list[Row]
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(log-likelihood float64 [n], tokens int [n], greedy bool [n])`` of the rows'
        continuations under ``params`` (greedy: every token the argmax)."""
        length = self.window + 1
        packing = packing_for(self.cfg)
        losses, counts, hits = [], [], []
        for start in range(0, len(rows), self.batch_size):
            batch = rows[start:start + self.batch_size]
            n = len(batch)
            batch = batch + [batch[0]] * (self.batch_size - n)  # one shape for every batch
            tokens, pads = left_pad([r.tokens for r in batch], length=length)
            out = padded_target_scores(graphdef, params, jnp.asarray(tokens), jnp.asarray(pads),
                                       packing=packing)
            # The continuation's targets are each row's last; their losses summed in float64.
            scored = np.arange(length - 1)[None, :] >= length - 1 - np.asarray(
                [r.scored for r in batch])[:, None]
            loss, hit = (np.where(scored, np.asarray(x, np.float64), 0.0)[:n]
                         for x in (out.loss, out.correct))
            losses.append(loss.sum(1))
            hits.append(hit.sum(1))
            counts.append(scored[:n].sum(1))
        loss, count, hit = (np.concatenate(x) for x in (losses, counts, hits))
        return -loss, count, hit == count


def task_scores(examples: list[Example], loglikelihoods: np.ndarray, tokens: np.ndarray
                ) -> dict:
    """The scores of the module doc from each choice's log-likelihood and token count (flat, in
    the order of :meth:`Scorer.rows`), with a record per example."""
    records, offset = [], 0
    for e in examples:
        n = len(e.choices)
        ll, count = loglikelihoods[offset:offset + n], tokens[offset:offset + n]
        offset += n
        nbytes = np.asarray([len(c.encode("utf-8")) for c in e.choices])
        records.append({
            "answer": e.answer, "predicted": int(np.argmax(ll / nbytes)),
            "predicted_unnormalised": int(np.argmax(ll)),
            "gold_nll": float(-ll[e.answer]), "gold_tokens": int(count[e.answer]),
            "gold_nll_per_token": float(-ll[e.answer] / count[e.answer]),
            "gold_bytes": int(nbytes[e.answer]), "loglikelihoods": ll.tolist()})
    nll = sum(r["gold_nll"] for r in records)
    gold_tokens = sum(r["gold_tokens"] for r in records)
    gold_bytes = sum(r["gold_bytes"] for r in records)
    return {
        "accuracy": float(np.mean([r["predicted"] == r["answer"] for r in records])),
        "accuracy_unnormalised": float(np.mean([r["predicted_unnormalised"] == r["answer"]
                                                for r in records])),
        "chance": float(np.mean([1 / len(e.choices) for e in examples])),
        "gold_nll": nll / len(records), "gold_ce": nll / gold_tokens,
        "bits_per_byte": nll / (math.log(2) * gold_bytes),
        "examples": len(records), "choices": int(sum(len(e.choices) for e in examples)),
        "gold_tokens": gold_tokens, "gold_bytes": gold_bytes, "per_example": records}


def evaluate(scorer: Scorer, graphdef, params, examples: list[Example],
             rows: list[Row] | None = None) -> dict:
    """:func:`task_scores` of ``examples`` under ``params`` (``rows``: theirs, if made
    already)."""
    rows = scorer.rows(examples) if rows is None else rows
    loglikelihoods, tokens, _ = scorer.score(graphdef, params, rows)
    return task_scores(examples, loglikelihoods, tokens)


IN_LOOP = ("accuracy", "gold_ce", "gold_nll", "bits_per_byte")  # what train.eval_tasks logs
PREFIX = "eval/"  # of their metrics' names: eval/<task>/<score>


class TaskEvaluation:
    """``train.eval_tasks``: the tasks' rows made (and every file and line checked) once, before
    the run writes or compiles anything, then scored at each evaluation."""

    def __init__(self, cfg: Config, tokenizer):
        try:
            check_decoder(cfg)
            tasks = tasks_of(list(cfg.train.eval_tasks), size=cfg.train.eval_task_examples)
            self.examples = {t.name: t.examples() for t in tasks}
            self.scorer = Scorer(cfg, tokenizer)
            self.rows = {name: self.scorer.rows(e) for name, e in self.examples.items()}
        except AttnlabError as e:
            raise ConfigError("train.eval_tasks", str(e)) from None

    def metrics(self, graphdef, params) -> dict[str, float]:
        """``{eval/<task>/<score>: value}`` of :data:`IN_LOOP` under ``params``."""
        out = {}
        for name, examples in self.examples.items():
            scores = evaluate(self.scorer, graphdef, params, examples, self.rows[name])
            out.update({f"{PREFIX}{name}/{key}": scores[key] for key in IN_LOOP})
        return out
