"""The whole config checked before anything is compiled: the data section with its source
(``attnlab.data.sources``), the model's parts and the rules between them and the train section
(``attnlab.model.architecture``). Entry points call :func:`check`; each rule raises ConfigError
naming its field."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Mapping

from attnlab.config import Config
from attnlab.data import sources
from attnlab.model import architecture


def check(cfg: Config) -> architecture.Architecture:
    """The source's rules, the model resolved, the rules between them, then the model's rules
    with the data and train sections; returns the resolved architecture."""
    source = sources.check(cfg)
    source.check_architecture(cfg, architecture.resolve(cfg.model))
    return architecture.check(cfg)


def with_values(cfg: Config, values: Mapping[str, Any]) -> Config:
    """``cfg`` with the dotted fields of ``values`` replaced (``{'model.d_model': 64}``), checked.

    Each changed section is rebuilt with ``dataclasses.replace``, which checks its fields (the
    config dataclasses check themselves in ``__post_init__``), then the whole config
    (:func:`check`). Raises ConfigError naming the first bad field.
    """
    sections: dict[str, dict[str, Any]] = collections.defaultdict(dict)
    for dotted, value in values.items():
        section, key = dotted.split(".")
        sections[section][key] = value
    cfg = dataclasses.replace(cfg, **{
        section: dataclasses.replace(getattr(cfg, section), **changes)
        for section, changes in sections.items()})
    check(cfg)
    return cfg
