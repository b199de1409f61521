"""Data: TFDS sources (pystdlib, text_files, markov, any TFDS catalog text dataset), byte and
BPE tokenizers, and deterministic, resumable, exactly counted batches.

    corpus = prepare(cfg.data)                       # builds once into the cache, then reuses
    train = Batches(corpus, "train", seq_len, batch_size, seed)
    batch = train[i]                                 # [batch, seq_len + 1] int32
    val = validation_batches(corpus, seq_len, batch_size, n_batches)
"""

from attnlab.data.batches import Batches, check_budget, validation_batches
from attnlab.data.corpus import Corpus, load_corpus
from attnlab.data.errors import (
    CacheError,
    CorpusTooSmallError,
    DataError,
    DataSourceError,
    UnknownDatasetError,
)
from attnlab.data.markov import window_loss_floor
from attnlab.data.sources import prepare
from attnlab.data.tokenizer import BpeTokenizer, ByteTokenizer, Tokenizer

__all__ = [
    "Batches",
    "BpeTokenizer",
    "ByteTokenizer",
    "CacheError",
    "Corpus",
    "CorpusTooSmallError",
    "DataError",
    "DataSourceError",
    "Tokenizer",
    "UnknownDatasetError",
    "check_budget",
    "load_corpus",
    "prepare",
    "validation_batches",
    "window_loss_floor",
]
