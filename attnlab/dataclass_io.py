"""Dataclasses built from plain dicts (config files, sweep specs, command lines): each value
checked against its field's type, every error naming the key's path."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from attnlab.errors import ConfigError


def build_dataclass(cls, values: Mapping[str, Any], path: str, *, error=ConfigError):
    """``cls(**values)`` from a section of a config file: unknown keys, missing required keys
    and values of the wrong type raise ``error`` naming ``<path>.<key>``; the dataclass's own
    checks (``__post_init__``) run as it is built. Config sections and sweep specs share it."""
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in known:
            raise error(f"{path}.{key}", f"unknown key; valid keys are {', '.join(sorted(known))}")
        kwargs[key] = coerce(value, known[key], f"{path}.{key}", error=error)
    for name, f in known.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in kwargs:
            raise error(f"{path}.{name}", "missing: a required key")
    return cls(**kwargs)


def coerce(value: Any, field: dataclasses.Field, path: str, *, error=ConfigError) -> Any:
    """``value`` as the type of ``field``'s annotation (an int may stand for a float; a list for
    a tuple), or ``error`` naming ``path``. ``dataclasses.replace`` checks no types, so values
    that reach a config any other way (a sweep's axes) pass through here too."""
    annotation = str(field.type)
    if value is None:
        if "None" not in annotation:
            raise error(path, "must not be None")
        return None
    if annotation.startswith("bool"):
        if not isinstance(value, bool):
            raise error(path, f"expected true/false, got {value!r}")
        return value
    if annotation.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise error(path, f"expected an integer, got {value!r}")
        return int(value)
    if annotation.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise error(path, f"expected a number, got {value!r}")
        if not math.isfinite(value):  # NaN passes every range check (nan <= 0 is False)
            raise error(path, f"must be a finite number, got {value!r}")
        return float(value)
    if annotation.startswith("str"):
        if not isinstance(value, str):
            raise error(path, f"expected a string, got {value!r}")
        return value
    if annotation.startswith("tuple"):
        if not isinstance(value, (tuple, list)):
            raise error(path, f"expected a tuple, got {value!r}")
        return tuple(value)
    return value
