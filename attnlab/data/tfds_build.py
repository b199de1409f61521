"""What a source built through TFDS hands the corpus builder (attnlab/data/corpus.py), and
the check that a catalog dataset's feature is text."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds

from attnlab.data.errors import UnknownDatasetError


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


def check_feature(builder, name: str, feature: str) -> None:
    """Raises UnknownDatasetError unless ``feature`` is a text string of the dataset."""
    features = builder.info.features
    if feature not in features.keys():
        raise UnknownDatasetError(
            f"data.source: {name} has no feature {feature!r}; its features are "
            f"{', '.join(sorted(features.keys()))}"
        )
    spec = features[feature]
    if np.dtype(spec.np_dtype) != np.dtype(object) or tuple(spec.shape) != ():
        raise UnknownDatasetError(
            f"data.source: feature {feature!r} of {name} is {type(spec).__name__} "
            f"{spec.np_dtype} {spec.shape}, not a text string"
        )
