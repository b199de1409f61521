"""A trained run as an lm-evaluation-harness model (``lm_eval.api.model.LM``), for
``lm_eval.simple_evaluate`` on any task the user has locally::

    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    from attnlab.eval.harness import AttnlabLM

    results = simple_evaluate(model=AttnlabLM("runs/tiny"), tasks=["my_task"],
                              task_manager=TaskManager(include_path="my_tasks/"))

Log-likelihoods are :class:`attnlab.train.scoring.Scorer`'s (the rows ``attnlab eval`` scores);
rolling log-likelihoods cut a text into the trained window with lm-eval's own windows
(``utils.get_rolling_token_windows``); generation is greedy (:func:`attnlab.model.generate`).
Needs the ``eval`` extra (``pip install 'attnlab[eval]'``); nothing else imports this module.
"""

from __future__ import annotations

import jax
import numpy as np

from attnlab.errors import AttnlabError
from attnlab.model import generate
from attnlab.train.load import load_config, load_params, run_tokenizer
from attnlab.train.scoring import Row, Scorer
from attnlab.train.step import packing_for

try:
    from lm_eval import utils as lm_utils
    from lm_eval.api.model import LM
except ImportError:
    raise AttnlabError("attnlab.eval.harness needs lm-evaluation-harness: pip install "
                       "'attnlab[eval]' (or lm-eval>=0.4)") from None

DEFAULT_NEW_TOKENS = 32  # generate_until's tokens when the task gives no max_gen_toks


class AttnlabLM(LM):
    """A run's checkpoint ``step`` (default: the latest) and its tokenizer, scored
    ``batch_size`` rows a program call."""

    def __init__(self, run: str, *, step: int | None = None, batch_size: int = 64):
        super().__init__()
        cfg = load_config(run)
        self.scorer = Scorer(cfg, run_tokenizer(run, cfg), batch_size=batch_size)
        self.cfg, self.graphdef, self.params = load_params(run, step)

    def _loglikelihoods(self, rows: list[Row]):
        return self.scorer.score(self.graphdef, self.params, rows)

    def loglikelihood(self, requests):
        rows = [self.scorer.row(*r.args, f"request {i}") for i, r in enumerate(requests)]
        loglikelihoods, _, greedy = self._loglikelihoods(rows)
        return [(float(ll), bool(g)) for ll, g in zip(loglikelihoods, greedy)]

    def loglikelihood_rolling(self, requests):
        prefix = self.scorer.prefix
        if not len(prefix):
            raise AttnlabError("rolling log-likelihoods begin at the separator, which this "
                               "run's tokenizer does not have")
        rows, owner = [], []
        for i, request in enumerate(requests):
            ids = self.scorer.tokenizer.encode(request.args[0]).tolist()
            windows = lm_utils.get_rolling_token_windows(
                token_list=ids, prefix_token=int(prefix[0]), max_seq_len=self.scorer.window,
                context_len=1)
            for context, predicted in map(lm_utils.make_disjoint_window, windows):
                rows.append(Row(np.asarray(context + predicted, np.int32), len(predicted)))
                owner.append(i)
        loglikelihoods = self._loglikelihoods(rows)[0] if rows else np.zeros(0)
        return [float(loglikelihoods[np.asarray(owner) == i].sum())
                for i in range(len(requests))]

    def generate_until(self, requests):
        return [self._generate(*r.args) for r in requests]

    def _generate(self, context: str, kwargs: dict) -> str:
        """Greedy tokens after ``context`` (its end, within the window) until the first of
        ``kwargs["until"]`` or the separator."""
        until = kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        new = min(int(kwargs.get("max_gen_toks", DEFAULT_NEW_TOKENS)), self.scorer.window - 1)
        ids = np.concatenate([self.scorer.prefix, self.scorer.tokenizer.encode(context)])
        prompt = ids[-(self.scorer.window - new):].astype(np.int32)
        out = generate(self.graphdef, self.params, self.cfg.model, [prompt], new,
                       rng=jax.random.key(0), packing=packing_for(self.cfg))[0]
        text = self.scorer.tokenizer.decode(np.asarray(out)[len(prompt):])
        text = text.decode("utf-8", "replace")
        ends = [text.find(stop) for stop in until + ["\0"] if stop and stop in text]
        return text[:min(ends)] if ends else text
