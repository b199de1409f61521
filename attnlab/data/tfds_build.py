"""What a source built through TFDS hands the corpus builder (attnlab/data/corpus.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import tensorflow_datasets as tfds


@dataclasses.dataclass
class TfdsBuild:
    """A TFDS builder and how to read documents from it."""

    name: str
    builder: tfds.core.DatasetBuilder
    feature: str
    split_names: dict[str, str]  # our split -> TFDS split
    separated: bool  # documents end with EOS (False: the records of a split form one stream)
    own_builder: bool  # an attnlab builder: sort by path, manifest in the metadata
    key: Path  # relative directory of the prepared data
