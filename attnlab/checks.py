"""The whole config checked before anything is compiled: the data section with its source
(``attnlab.data.sources``), the model's parts and the rules between them and the train section
(``attnlab.model.architecture``). Entry points call :func:`check`; each rule raises ConfigError
naming its field."""

from __future__ import annotations

from attnlab.config import Config
from attnlab.data import sources
from attnlab.model import architecture


def check(cfg: Config) -> architecture.Architecture:
    """The source's rules, the model resolved, the rules between them, then the model's rules
    with the data and train sections; returns the resolved architecture."""
    source = sources.check(cfg)
    source.check_architecture(cfg, architecture.resolve(cfg.model))
    return architecture.check(cfg)
