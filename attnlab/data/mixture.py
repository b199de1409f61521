"""A mixture of data sources (``data.mixture``): its entries, the fixed interleave that gives
each source its share of every batch, and the corpus and batches that read the sources'
prepared corpora through it. The source class that checks and prepares a mixture is
:class:`attnlab.data.sources.Mixture`.

``data.mixture='web@shards:/data/fineweb=0.7,pystdlib=0.3'``: entries separated by commas,
each ``[<name>@]<source>[:<path>]=<weight>``. Weights are relative (normalised by their sum).

Global row r of the training stream (batch i holds rows ``[i B, (i + 1) B)``) goes to source
``pattern[r mod P]`` and is that source's row ``(r // P) n_s + before_s[r mod P]``, which the
source's own :class:`~attnlab.data.batches.Batches` maps to a window (its epochs, its seeded
order). The pattern is a period of ``P = 2^16`` rows holding ``n_s`` rows of source s
(``n_s / P`` = its weight, rounded by largest remainders), each source's rows spread evenly
over the period: any run of m rows holds ``m w_s`` rows of source s to within a couple of rows
(measured in docs/data.md), in every batch and not only on average. So
batch i is a pure function of (the sources' corpora, the weights, seed, i), with no state.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings

import numpy as np

from attnlab.data.batches import (BatchRows, Batches, check_budget, epochs_read,
                                  validation_batches)
from attnlab.errors import ConfigError

PERIOD = 1 << 16  # rows of one period of the interleave (weights are exact to 1 / PERIOD)
FIELD = "data.mixture"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One source of a mixture: its name (columns ``tokens/<name>``), its ``data.source``, its
    ``data.path`` and its weight as written."""

    name: str
    source: str
    path: str
    weight: float
    text: str  # the entry as written, for error messages


def parse(spec: str, path_sources) -> list[Entry]:
    """The entries of ``data.mixture``; ``path_sources``: the sources whose ``<source>:<path>``
    carries a ``data.path`` (others keep any ``:``, e.g. ``tfds:lm1b/text``). Raises
    ConfigError naming data.mixture."""
    if not spec.strip():
        raise ConfigError(FIELD, "data.source=mixture needs its sources: "
                                 "data.mixture='<source>=<weight>,...'")
    entries = [_entry(text.strip(), path_sources) for text in spec.split(",")]
    names = [e.name for e in entries]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        named = all("@" in e.text.split("=")[0] for e in entries if e.name == twice)
        raise ConfigError(FIELD, f"two sources named {twice!r}: " + (
            "give each a name of its own" if named else
            f"name them, e.g. web@{twice}...=0.5,code@{twice}...=0.5"))
    if len(entries) < 2:
        raise ConfigError(FIELD, f"a mixture needs two or more sources, got {spec!r} "
                                 "(one source: set data.source)")
    weights = np.array([e.weight for e in entries], np.float64)
    if not math.isfinite(sum(e.weight for e in entries)):
        raise ConfigError(FIELD, f"the weights sum to more than a number holds ({spec!r}): "
                                 f"give them in smaller units")
    unread = [e.text for e, n in zip(entries, apportion(PERIOD, weights)) if n == 0]
    if unread:
        raise ConfigError(FIELD, f"{unread[0]!r}: its weight is below 1/{PERIOD} of the sum, "
                                 f"so the mixture would read none of it; raise it or leave the "
                                 f"source out")
    return entries


def _entry(text: str, path_sources) -> Entry:
    where, equals, weight = text.rpartition("=")
    if not text:
        raise ConfigError(FIELD, "an empty source (two commas, or one at an end)")
    if not equals or not where.strip():
        raise ConfigError(FIELD, f"{text!r} is not <source>=<weight> (e.g. pystdlib=0.3)")
    try:
        value = float(weight)
    except ValueError:
        raise ConfigError(FIELD, f"{text!r}: the weight {weight!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(FIELD, f"{text!r}: weights must be positive numbers, got {weight}")
    name, at, source = where.strip().partition("@")
    if not at or not re.fullmatch(r"[\w.-]+", name):  # no name (or an @ inside a path)
        name, at, source = "", "", where.strip()
    source, colon, path = source.partition(":")
    if not colon or source not in path_sources:
        source, path = source + colon + path, ""
    elif not path:
        raise ConfigError(FIELD, f"{text!r}: an empty path after {source}:")
    return Entry(name=name if at else source, source=source, path=path, weight=value,
                 text=text)


def for_entry(entry: Entry, function, *args, errors=ConfigError):
    """``function(*args)`` for ``entry``: an error about its source or path (which the entry
    gives), or about its data, names data.mixture and the entry."""
    try:
        return function(*args)
    except errors as e:
        if isinstance(e, ConfigError):
            if e.field not in ("data.source", "data.path"):
                raise
            raise ConfigError(FIELD, f"{entry.text!r}: {e.reason}") from None
        raise type(e)(f"{FIELD} entry {entry.text!r}: {e}") from None


def apportion(total: int, weights: np.ndarray) -> np.ndarray:
    """Integers summing to ``total`` in the proportions of ``weights`` (largest remainders)."""
    exact = total * weights / weights.sum()
    counts = np.floor(exact).astype(np.int64)
    counts[np.argsort(counts - exact, kind="stable")[: total - counts.sum()]] += 1
    return counts


class Interleave:
    """Which source each global row reads, and the how-manieth row of that source it is."""

    def __init__(self, weights: np.ndarray):
        self.counts = apportion(PERIOD, np.asarray(weights, np.float64))
        ids = np.repeat(np.arange(len(self.counts)), self.counts)
        # Source s's j-th row of a period sits at (j + 1/2) / n_s of it: evenly spread.
        keys = np.concatenate([(np.arange(n) + 0.5) / n for n in self.counts])
        self.pattern = ids[np.lexsort((ids, keys))]
        onehot = self.pattern[None, :] == np.arange(len(self.counts))[:, None]
        # before[s, p]: rows of source s among the first p rows of a period
        self.before = np.zeros((len(self.counts), PERIOD + 1), np.int64)
        np.cumsum(onehot, axis=1, out=self.before[:, 1:])

    def assign(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(source, row of that source)`` of each global row."""
        periods, place = np.divmod(rows, PERIOD)
        source = self.pattern[place]
        return source, periods * self.counts[source] + self.before[source, place]

    def rows_of(self, source: int, rows: int) -> int:
        """Rows of ``source`` among global rows ``[0, rows)``."""
        periods, place = divmod(rows, PERIOD)
        return int(periods * self.counts[source] + self.before[source, place])


class MixtureCorpus:
    """The prepared corpora of a mixture's entries in the place of one corpus (the methods of
    :class:`attnlab.data.Corpus` that training and evaluation use)."""

    def __init__(self, spec: str, entries: list[Entry], corpora: list):
        self.entries, self.corpora = entries, corpora
        self.weights = np.array([e.weight for e in entries]) / sum(e.weight for e in entries)
        self.name = "mixture"
        documented = [c for c in corpora if c.manifest.get("separator", {}).get("kind") == "eos"]
        self.tokenizer = (documented or corpora)[0].tokenizer
        self.vocab_size = max(c.vocab_size for c in corpora)
        self.directory = None  # each source's corpus has its own
        self.interleave = Interleave(self.weights)
        self.manifest = {
            "name": self.name, "source": self.name, "mixture": spec,
            "interleave": f"fixed: a period of {PERIOD} rows, each source's rows spread evenly",
            "sources": [{"name": e.name, "source": e.source, "path": e.path,
                         "weight": float(w), "manifest": c.manifest}
                        for e, w, c in zip(entries, self.weights, corpora)],
            "tokenizer": corpora[0].manifest["tokenizer"],
            "separator": (documented or corpora)[0].manifest.get("separator"),
            "splits": {s: {k: sum(c.manifest.get("splits", {}).get(s, {}).get(k, 0)
                                  for c in corpora) for k in ("documents", "bytes")}
                       for s in self.splits},
            "tokens": {s: self.num_tokens(s) for s in self.splits},
        }

    @property
    def splits(self) -> tuple[str, ...]:
        return self.corpora[0].splits

    def num_tokens(self, split: str) -> int:
        return sum(c.num_tokens(split) for c in self.corpora)

    def tokens(self, split: str) -> np.ndarray:
        """[n_tokens] int32: the sources' splits one after the other (for evaluations that
        read a whole split)."""
        return np.concatenate([c.tokens(split) for c in self.corpora])

    def train_batches(self, seq_len: int, batch_size: int, seed: int, process_index: int = 0,
                      process_count: int = 1) -> MixtureBatches:
        return MixtureBatches(self, "train", seq_len, batch_size, seed, process_index,
                              process_count)

    def validation_set(self, seq_len: int, batch_size: int, n_batches: int) -> np.ndarray:
        """[n_batches, batch_size, seq_len + 1] int32: every source's evenly spread validation
        windows, as many as the interleave gives it, in the interleave's order."""
        rows = np.arange(n_batches * batch_size)
        source, _ = self.interleave.assign(rows)
        out = np.empty((len(rows), seq_len + 1), np.int32)
        for k, corpus in enumerate(self.corpora):
            here = source == k
            if here.any():
                out[here] = validation_batches(corpus, seq_len, 1, int(here.sum()))[:, 0]
        return out.reshape(n_batches, batch_size, seq_len + 1)

    def epochs(self, tokens: int, seq_len: int) -> float:
        """The most any source's training split is read by its share of ``tokens``."""
        return max(epochs_read(c, int(tokens * w), seq_len)
                   for w, c in zip(self.weights, self.corpora))

    def budget_warnings(self, tokens: int, seq_len: int) -> list[str]:
        """Each source's :func:`~attnlab.data.batches.check_budget` on its share of the
        tokens."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = [f"{e.name}: {m}" for e, w, c in zip(self.entries, self.weights,
                                                          self.corpora)
                     for m in check_budget(c, int(tokens * w), seq_len)]
        for message in found:
            warnings.warn(message, stacklevel=2)
        return found

    def __repr__(self) -> str:
        parts = ", ".join(f"{e.name}={w:.3g}: {c!r}" for e, w, c in
                          zip(self.entries, self.weights, self.corpora))
        return f"Mixture({parts})"


class MixtureBatches:
    """``batches[i]`` -> [batch_size // process_count, seq_len + 1] int32, this process's rows
    of global batch i, each row from the source the interleave assigns it; the counts of
    :class:`~attnlab.data.batches.Batches` per source."""

    def __init__(self, corpus: MixtureCorpus, split: str, seq_len: int, batch_size: int,
                 seed: int, process_index: int = 0, process_count: int = 1):
        self.rows = BatchRows(batch_size, process_index, process_count)
        # Each source's Batches only maps its rows to windows (batch size 1: a source with a
        # small weight may hold fewer windows than a batch).
        self.parts = [Batches(c, split, seq_len, 1, seed) for c in corpus.corpora]
        self.entries, self.interleave = corpus.entries, corpus.interleave
        self.seq_len, self.batch_size = seq_len, batch_size
        self.tokens_per_batch = batch_size * seq_len
        self.windows_per_epoch = sum(p.windows_per_epoch for p in self.parts)

    def __getitem__(self, i: int) -> np.ndarray:
        source, row = self.interleave.assign(self.rows(i))
        out = np.empty((len(row), self.seq_len + 1), np.int32)
        for k, part in enumerate(self.parts):
            here = source == k
            if here.any():
                out[here] = part.windows(part.windows_of_rows(row[here]))
        return out

    def epoch(self, i: int) -> float:
        """Rows read once batches 0..i are done over the sources' windows, all together."""
        return (i + 1) * self.batch_size / self.windows_per_epoch

    def tokens_after(self, i: int) -> int:
        return (i + 1) * self.tokens_per_batch

    def unique(self) -> dict[str, int]:
        """``unique_tokens`` (all sources) and ``unique_tokens/<name>`` of each."""
        each = {f"unique_tokens/{e.name}": p.unique_tokens
                for e, p in zip(self.entries, self.parts)}
        return {"unique_tokens": sum(each.values()), **each}

    def consumed(self, steps: int) -> dict[str, float]:
        """``epochs`` (all tokens / all unique tokens) and each source's ``tokens/<name>``
        (predicted tokens read from it) and ``epochs/<name>`` once ``steps`` batches are
        done."""
        total = sum(p.unique_tokens for p in self.parts)
        out: dict[str, float] = {"epochs": steps * self.tokens_per_batch / total}
        for k, (entry, part) in enumerate(zip(self.entries, self.parts)):
            tokens = self.interleave.rows_of(k, steps * self.batch_size) * self.seq_len
            out[f"tokens/{entry.name}"] = tokens
            out[f"epochs/{entry.name}"] = tokens / part.unique_tokens
        return out
