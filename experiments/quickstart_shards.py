"""The quickstart's study on web-text shards: experiments/quickstart.py's IsoFLOP sweep (its
budgets, model sizes, schedule and byte-level models) trained on a directory of Parquet and
JSON-lines shards (``data.source=shards``) instead of the embedded corpus.

    python benchmarks/data_shards.py --corpus=runs/web_corpus --mb=16      # ~16 MB of shards
    attnlab quickstart --config=experiments/quickstart_shards.py:runs/web_corpus \\
        --sweep=runs/quickstart_shards

The part after the colon is ``data.path``: the generated corpus above (Zipf-distributed words
in documents of 20-2,000 words, alternating Parquet and JSONL.zst shards of 8 MB), or any
directory, glob or comma-separated list of shards, e.g. a downloaded FineWeb sample
(docs/data.md). The largest run of the plan reads 4.0M tokens, so 16 MB of shards (about 14M
training tokens with the byte tokenizer) are read less than once by every run; the results
table's ``unique_tokens`` and ``epochs`` say so per run. The corpus is tokenized once, by every
core (``data.workers=0``), into the cache at the first run; the others memory-map it.
"""

import importlib.util
from pathlib import Path

from ml_collections import ConfigDict


def _quickstart():
    """experiments/quickstart.py, loaded from beside this file (experiments is no package)."""
    spec = importlib.util.spec_from_file_location("quickstart_experiment",
                                                  Path(__file__).with_name("quickstart.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_config(corpus: str = "runs/web_corpus") -> ConfigDict:
    config = _quickstart().get_config("cpu")
    config.base.data.source = "shards"
    config.base.data.path = corpus
    config.sweep.name = "quickstart_shards"
    return config
