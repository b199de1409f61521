"""Sweep specifications: what an ``experiments/*.py`` file describes, checked once.

An experiment file defines ``get_config(scale="cpu")`` returning a ConfigDict with three parts:

    config.scale  'cpu' | 'gpu' (pass ``--config=experiments/x.py:gpu`` to pick the GPU sizes)
    config.base   the train config every run starts from: a ConfigDict like configs/*.py, or the
                  path of such a file (relative to the experiment file, then to the cwd)
    config.sweep  what varies: mode, shapes or a size ladder, axes, learning-rate and warmup
                  rules, compute budgets (see docs/sweeps.md for every key)

:func:`load_spec` turns that into a frozen :class:`SweepSpec`; nothing here touches JAX or the
disk besides reading the files. Turning a spec into concrete runs is :mod:`attnlab.sweep.planner`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import ml_collections

from attnlab import cli_flags
from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig, from_config_dict
from attnlab.errors import ConfigError

MODES = ("grid", "isoflop", "curves")
SCALES = ("cpu", "gpu")
LR_RULES = ("fixed", "per_shape", "power_law", "inverse_width")
WARMUP_RULES = ("fixed", "fraction", "tokens_per_param")
# Keys of attnlab.model.flops_per_token that may define "FLOPs per token" for isoflop budgets.
FLOP_CONVENTIONS = ("chinchilla", "kaplan", "kaplan_causal", "kaplan_6n")

_SECTIONS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}
_TOP_LEVEL_KEYS = ("scale", "base", "sweep")
_SWEEP_KEYS = ("name", "mode", "shapes", "ladder", "axes", "learning_rate", "warmup", "budgets",
               "flops_per_token", "min_steps", "curve_points", "resources", "centre", "variants",
               "variant_column")
# What a variant (sweep.variants.<name>) may set besides config keys: its own rules.
_VARIANT_RULES = ("centre", "learning_rate", "warmup")


class SweepSpecError(ConfigError):
    """A sweep spec is malformed. ``field`` is its dotted path, e.g. ``sweep.axes.train.seed``."""


@dataclasses.dataclass(frozen=True)
class Shape:
    """One model shape of a sweep. ``learning_rate`` is set only by explicit per-shape values;
    ``target_params`` only by a ladder (the non-embedding count it was generated for)."""

    d_model: int
    n_layers: int
    n_heads: int
    learning_rate: float | None = None
    target_params: float | None = None

    @property
    def label(self) -> str:
        return f"d{self.d_model}-l{self.n_layers}-h{self.n_heads}"


@dataclasses.dataclass(frozen=True)
class Ladder:
    """Shapes generated from target non-embedding parameter counts at a fixed aspect ratio.

    For each target N the planner picks the integer depth L (with d_model = aspect_ratio * L
    rounded to a multiple of head_dim, n_heads = d_model / head_dim) whose exact count from
    :func:`attnlab.model.param_counts` is closest to N in log space.
    """

    non_embedding_params: tuple[float, ...]
    aspect_ratio: float  # d_model / n_layers (Kaplan et al. 2020 Fig. 5: loss is flat in it)
    head_dim: int
    learning_rates: tuple[float, ...] = ()  # optional per-target values (rule per_shape)


@dataclasses.dataclass(frozen=True)
class LearningRateRule:
    """How each run's peak learning rate follows from its shape.

    fixed:          the base config's train.learning_rate for every shape
    per_shape:      the explicit value given with each shape (4th entry of a shape tuple, or
                    ladder.learning_rates)
    power_law:      lr = base * (N / ref_params) ** -exponent, N = non-embedding parameters
    inverse_width:  lr = base * ref_d_model / d_model ("muP-lite": under muP the Adam learning
                    rate of hidden matrices scales as 1/width, Yang et al. 2022)
    """

    rule: str = "fixed"
    base: float = 0.0  # 0 -> the base config's train.learning_rate
    ref_params: float = 0.0
    exponent: float = 0.0
    ref_d_model: int = 0


@dataclasses.dataclass(frozen=True)
class WarmupRule:
    """Warmup length per run. Porian et al. 2024: a warmup too long for small models is one
    of the causes of Kaplan's exponent, so scale it with the run or the model.

    fixed:             the base config's train.warmup_steps
    fraction:          ceil(fraction * total_steps) (at least 1)
    tokens_per_param:  ceil(tokens_per_param * N_total / (batch_size * seq_len)) steps (at
                       least 1): warmup proportional to model size
    """

    rule: str = "fixed"
    fraction: float = 0.0
    tokens_per_param: float = 0.0


@dataclasses.dataclass(frozen=True)
class Resources:
    """What one run asks for: Ray's task request; the local launcher pins threads instead."""

    cpus: float = 1.0
    gpus: float = 0.0


@dataclasses.dataclass(frozen=True)
class CentreRule:
    """IsoFLOP ladders placed around a prior optimum (``sweep.centre``): at budget C a shape is
    planned only if its parameter count (all parameters, Chinchilla's N) lies within a factor
    ``span`` of N*(C) = n_opt · (C / budget)^exponent. From one long list of shapes each budget
    then trains the sizes around its own optimum, so its minimum lies inside its ladder (and no
    compute goes to sizes far from it). The prior comes from an earlier sweep's fit: Chinchilla's
    a ~ 0.5, or one's own approach-2 minima."""

    n_opt: float
    budget: float
    exponent: float = 0.5
    span: float = 3.0

    def target(self, budget: float) -> float:
        """N*(C) at one budget."""
        return self.n_opt * (budget / self.budget) ** self.exponent

    def keeps(self, params: float, budget: float) -> bool:
        target = self.target(budget)
        return target / self.span <= params <= target * self.span


@dataclasses.dataclass(frozen=True)
class Variant:
    """A named variant of the whole sweep (``sweep.variants.<name>``): config overrides (dotted
    keys, e.g. ``model.mixer``) applied to the base config, and optionally its own centre,
    learning-rate and warmup rules. Every variant gets the sweep's full plan (each budget's
    ladder, each axis value), so e.g. one IsoFLOP ladder per architecture, each centred on that
    architecture's prior optimum; the results table names the variant in the column
    ``sweep.variant_column``."""

    name: str
    overrides: tuple[tuple[str, Any], ...] = ()
    centre: CentreRule | None = None
    learning_rate: LearningRateRule | None = None
    warmup: WarmupRule | None = None


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """A validated sweep. ``axes`` keeps the file's order: ((dotted_key, values), ...)."""

    name: str
    mode: str
    scale: str
    base: Config  # the train config every run starts from, validated
    shapes: tuple[Shape, ...] = ()
    ladder: Ladder | None = None
    axes: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    learning_rate: LearningRateRule = LearningRateRule()
    warmup: WarmupRule = WarmupRule()
    budgets: tuple[float, ...] = ()
    centre: CentreRule | None = None
    flops_per_token: str = "chinchilla"
    min_steps: int = 1
    curve_points: int = 0
    resources: Resources = Resources()
    source: str = ""
    variants: tuple[Variant, ...] = ()
    variant_column: str = "variant"

    def set_keys(self) -> dict[str, str]:
        """Config keys the sweep sets besides its axes, each mapped to the spec field that sets
        it (used to reject an axis that sets the same key)."""
        keys: dict[str, str] = {}
        if self.shapes or self.ladder:
            origin = "sweep.shapes" if self.shapes else "sweep.ladder"
            for key in ("model.d_model", "model.n_layers", "model.n_heads"):
                keys[key] = origin
        if self.learning_rate.rule != "fixed":
            keys["train.learning_rate"] = "sweep.learning_rate"
        if self.warmup.rule != "fixed":
            keys["train.warmup_steps"] = "sweep.warmup"
        if self.mode == "isoflop":
            keys["train.tokens"] = keys["train.steps"] = "sweep.budgets"
        if self.mode == "curves" and self.curve_points > 0:
            keys["train.eval_every"] = "sweep.curve_points"
        return keys


def load_spec(path: str, overrides: list[str] | tuple[str, ...] = ()) -> SweepSpec:
    """Reads ``experiments/<name>.py[:scale]`` and applies overrides.

    Overrides are ``--config.sweep.axes.train.seed=(0,1,2)`` or the same without ``--config.``
    (e.g. ``sweep.mode=curves``); ml_collections checks their types (use tuples for lists).

    Raises:
      UsageError: the file or an override cannot be read.
      SweepSpecError: naming the first bad field.
    """
    argv = [f"--config={path}"]
    for override in overrides:
        argv.append(override if override.startswith("--") else f"--config.{override}")
    config = cli_flags.parse(argv, prog="attnlab sweep").config
    return spec_from_config_dict(config, source=config_source(path))


def config_source(path: str) -> str:
    """The file of a ``--config`` value: ml_collections reads ``file.py:arg`` as
    ``get_config(arg)``, so the file is the part before the last ``:``."""
    return path if os.path.exists(path) else path.rpartition(":")[0] or path


def spec_from_config_dict(config: ml_collections.ConfigDict | Mapping[str, Any],
                          source: str = "") -> SweepSpec:
    """Validates an experiment ConfigDict (the output of its get_config) into a SweepSpec."""
    raw = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
    for key in raw:
        if key not in _TOP_LEVEL_KEYS:
            raise SweepSpecError(key, f"unknown top-level key; valid keys are "
                                      f"{', '.join(_TOP_LEVEL_KEYS)}")
    scale = raw.get("scale", "cpu")
    if scale not in SCALES:
        raise SweepSpecError("scale", f"unknown value {scale!r}; valid values are cpu, gpu")
    base = _load_base(raw.get("base"), source)
    sweep = raw.get("sweep")
    if not isinstance(sweep, Mapping):
        raise SweepSpecError("sweep", "missing: an experiment needs a sweep section "
                                      "(mode, shapes or ladder, axes, ...)")
    for key in sweep:
        if key not in _SWEEP_KEYS:
            raise SweepSpecError(f"sweep.{key}", f"unknown key; valid keys are "
                                                 f"{', '.join(_SWEEP_KEYS)}")
    mode = sweep.get("mode", "grid")
    if mode not in MODES:
        raise SweepSpecError("sweep.mode", f"unknown mode {mode!r}; valid modes are "
                                           f"{', '.join(MODES)}")
    name = sweep.get("name") or (os.path.splitext(os.path.basename(source))[0] if source
                                 else "sweep")

    shapes = _parse_shapes(sweep.get("shapes") or ())
    ladder = _parse_ladder(sweep.get("ladder"))
    if shapes and ladder:
        raise SweepSpecError("sweep.ladder", "give either sweep.shapes or sweep.ladder, not both")
    spec = SweepSpec(
        name=str(name),
        mode=mode,
        scale=scale,
        base=base,
        shapes=shapes,
        ladder=ladder,
        axes=_parse_axes(sweep.get("axes") or {}),
        learning_rate=_parse_rule(LearningRateRule, sweep.get("learning_rate"),
                                  "sweep.learning_rate", LR_RULES),
        warmup=_parse_rule(WarmupRule, sweep.get("warmup"), "sweep.warmup", WARMUP_RULES),
        budgets=_parse_budgets(sweep.get("budgets") or ()),
        centre=_parse_centre(sweep.get("centre")),
        flops_per_token=sweep.get("flops_per_token", "chinchilla"),
        min_steps=_int_at_least(sweep.get("min_steps", 1), 1, "sweep.min_steps"),
        curve_points=_int_at_least(sweep.get("curve_points", 0), 0, "sweep.curve_points"),
        resources=_parse_resources(sweep.get("resources"), scale),
        source=source,
        variant_column=_variant_column(sweep.get("variant_column", "variant")),
    )
    _check_relations(spec)
    variants = _parse_variants(sweep.get("variants"), spec)
    if variants:
        spec = dataclasses.replace(spec, variants=variants)
        for variant in variants:  # each variant's own sweep must be valid too
            _check_relations(variant_spec(spec, variant))
    return spec


def variant_spec(spec: SweepSpec, variant: Variant) -> SweepSpec:
    """The sweep of one variant: the base config with its overrides (validated), its own rules
    where it gives them, and no variants.

    Raises:
      SweepSpecError: an override is not a valid config value (naming
        ``sweep.variants.<name>.<section>.<key>``).
    """
    base = spec.base
    if variant.overrides:
        sections: dict[str, dict[str, Any]] = {}
        for dotted, value in variant.overrides:
            section, key = dotted.split(".")
            sections.setdefault(section, {})[key] = value
        try:
            base = dataclasses.replace(base, **{
                section: dataclasses.replace(getattr(base, section), **changes)
                for section, changes in sections.items()})
        except ConfigError as e:
            raise SweepSpecError(f"sweep.variants.{variant.name}.{e.field}", e.reason) from None
    return dataclasses.replace(
        spec, base=base, variants=(),
        centre=variant.centre or spec.centre,
        learning_rate=variant.learning_rate or spec.learning_rate,
        warmup=variant.warmup or spec.warmup)


# ----------------------------------------------------------------------------------------------
# Parsing helpers: each raises SweepSpecError naming the field.


def _load_base(base: Any, source: str) -> Config:
    if base is None:
        raise SweepSpecError("base", "missing: set config.base to a train ConfigDict "
                                     "(e.g. attnlab.config.base_config_dict()) or a configs/*.py path")
    if isinstance(base, str):
        base = _read_config_file(base, source)
    if not isinstance(base, Mapping):
        raise SweepSpecError("base", f"expected a train ConfigDict or a file path, got {base!r}")
    try:
        return from_config_dict(base)
    except ConfigError as e:
        raise SweepSpecError(f"base.{e.field}", e.reason) from None


def _read_config_file(path: str, source: str) -> dict[str, Any]:
    candidates = [path] if os.path.isabs(path) else [
        os.path.join(os.path.dirname(os.path.abspath(source)), path) if source else path,
        os.path.join(os.path.dirname(os.path.abspath(source)), os.pardir, path) if source else path,
        path,
    ]
    for candidate in candidates:
        if os.path.isfile(candidate):
            config = cli_flags.parse([f"--config={candidate}"], prog="attnlab sweep").config
            return config.to_dict()
    raise SweepSpecError("base", f"config file {path!r} not found (looked in "
                                 f"{', '.join(sorted(set(map(os.path.normpath, candidates))))})")


def _parse_shapes(raw: Any) -> tuple[Shape, ...]:
    if not isinstance(raw, (tuple, list)):
        raise SweepSpecError("sweep.shapes", "expected a tuple of (d_model, n_layers, n_heads) "
                                             "or (d_model, n_layers, n_heads, learning_rate)")
    shapes = []
    for i, entry in enumerate(raw):
        field = f"sweep.shapes[{i}]"
        if not isinstance(entry, (tuple, list)) or len(entry) not in (3, 4):
            raise SweepSpecError(field, f"expected (d_model, n_layers, n_heads[, learning_rate]), "
                                        f"got {entry!r}")
        for value, what in zip(entry[:3], ("d_model", "n_layers", "n_heads")):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SweepSpecError(field, f"{what} must be a positive integer, got {value!r}")
        lr = None
        if len(entry) == 4:
            lr = _positive_number(entry[3], f"{field}.learning_rate")
        shapes.append(Shape(*entry[:3], learning_rate=lr))
    if len({s.label for s in shapes}) != len(shapes):
        raise SweepSpecError("sweep.shapes", "the same shape appears twice")
    if any(s.learning_rate is None for s in shapes) and any(s.learning_rate for s in shapes):
        raise SweepSpecError("sweep.shapes", "give a learning rate for every shape or for none")
    return tuple(shapes)


def _parse_ladder(raw: Any) -> Ladder | None:
    if raw is None or (isinstance(raw, Mapping) and not raw):
        return None
    if not isinstance(raw, Mapping):
        raise SweepSpecError("sweep.ladder", f"expected a section, got {raw!r}")
    known = {f.name for f in dataclasses.fields(Ladder)}
    for key in raw:
        if key not in known:
            raise SweepSpecError(f"sweep.ladder.{key}", f"unknown key; valid keys are "
                                                        f"{', '.join(sorted(known))}")
    targets = raw.get("non_embedding_params") or ()
    if not isinstance(targets, (tuple, list)) or not targets:
        raise SweepSpecError("sweep.ladder.non_embedding_params",
                             "empty: give a tuple of target non-embedding parameter counts")
    targets = tuple(_positive_number(t, "sweep.ladder.non_embedding_params") for t in targets)
    if len(set(targets)) != len(targets):
        raise SweepSpecError("sweep.ladder.non_embedding_params", "the same target appears twice")
    aspect = _positive_number(raw.get("aspect_ratio", 0), "sweep.ladder.aspect_ratio")
    head_dim = raw.get("head_dim", 0)
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise SweepSpecError("sweep.ladder.head_dim", f"must be a positive integer, got {head_dim!r}")
    lrs = tuple(raw.get("learning_rates") or ())
    if lrs and len(lrs) != len(targets):
        raise SweepSpecError("sweep.ladder.learning_rates",
                             f"has {len(lrs)} values for {len(targets)} targets")
    lrs = tuple(_positive_number(v, "sweep.ladder.learning_rates") for v in lrs)
    return Ladder(targets, aspect, head_dim, lrs)


def _parse_axes(raw: Any) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """Axes mirror the config: ``axes.model.pos_encoding = ("rope", "alibi")``."""
    if not isinstance(raw, Mapping):
        raise SweepSpecError("sweep.axes", f"expected a section like config.base, got {raw!r}")
    axes = []
    for section, keys in raw.items():
        if section not in _SECTIONS:
            raise SweepSpecError(f"sweep.axes.{section}", "unknown section; axes mirror the "
                                 "config: sweep.axes.model.*, sweep.axes.data.*, sweep.axes.train.*")
        if not isinstance(keys, Mapping):
            raise SweepSpecError(f"sweep.axes.{section}", "expected a section of keys, e.g. "
                                 f"sweep.axes.{section}.<key> = (value1, value2)")
        fields = {f.name: f for f in dataclasses.fields(_SECTIONS[section])}
        for key, values in keys.items():
            field = f"sweep.axes.{section}.{key}"
            if key not in fields:
                raise SweepSpecError(field, f"unknown config key {section}.{key}; valid keys are "
                                            f"{', '.join(sorted(fields))}")
            if isinstance(values, list):
                values = tuple(values)
            if not isinstance(values, tuple):
                raise SweepSpecError(field, f"expected a tuple of values, e.g. ({values!r},), "
                                            f"got {values!r}")
            if not values:
                raise SweepSpecError(field, "empty axis: give at least one value")
            values = tuple(_typed_axis_value(v, fields[key], field) for v in values)
            if len(set(map(repr, values))) != len(values):
                raise SweepSpecError(field, f"a value appears twice in {values!r}")
            axes.append((f"{section}.{key}", values))
    return tuple(axes)


def _typed_axis_value(value: Any, config_field: dataclasses.Field, field: str) -> Any:
    """``value`` as the type of the config field it sets (an int may stand for a float).

    The planner puts axis values into configs with ``dataclasses.replace``, which checks no
    types; converting here gives a run the same config (and so the same run id) as if the
    value had been written in the base config.
    """
    kind = str(config_field.type)
    if value is None:
        if "None" in kind:
            return None
        raise SweepSpecError(field, "must not be None")
    if kind.startswith("bool"):
        if isinstance(value, bool):
            return value
        raise SweepSpecError(field, f"expected true/false, got {value!r}")
    if kind.startswith("int"):
        if isinstance(value, int) and not isinstance(value, bool):
            return int(value)
        raise SweepSpecError(field, f"expected an integer, got {value!r}")
    if kind.startswith("float"):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise SweepSpecError(field, f"expected a number, got {value!r}")
    if kind.startswith("str") and not isinstance(value, str):
        raise SweepSpecError(field, f"expected a string, got {value!r}")
    return value


def _parse_rule(cls, raw: Any, field: str, rules: tuple[str, ...]):
    if raw is None or (isinstance(raw, Mapping) and not raw):
        return cls()
    if not isinstance(raw, Mapping):
        raise SweepSpecError(field, f"expected a section with a rule, got {raw!r}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in known:
            raise SweepSpecError(f"{field}.{key}", f"unknown key; valid keys are "
                                                   f"{', '.join(known)}")
    rule = raw.get("rule", "fixed")
    if rule not in rules:
        raise SweepSpecError(f"{field}.rule", f"unknown rule {rule!r}; valid rules are "
                                              f"{', '.join(rules)}")
    values = {}
    for key, value in raw.items():
        if key == "rule":
            values[key] = value
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise SweepSpecError(f"{field}.{key}", f"must be a number >= 0, got {value!r}")
        else:
            values[key] = type(known[key].default)(value)
    return cls(**values)


def _parse_budgets(raw: Any) -> tuple[float, ...]:
    if not isinstance(raw, (tuple, list)):
        raise SweepSpecError("sweep.budgets", f"expected a tuple of FLOP budgets, got {raw!r}")
    budgets = tuple(_positive_number(b, "sweep.budgets") for b in raw)
    if len(set(budgets)) != len(budgets):
        raise SweepSpecError("sweep.budgets", "the same budget appears twice")
    return budgets


def _parse_centre(raw: Any, field: str = "sweep.centre") -> CentreRule | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise SweepSpecError(field, f"expected a section (n_opt, budget, exponent, span), "
                                    f"got {raw!r}")
    known = {f.name for f in dataclasses.fields(CentreRule)}
    for key in raw:
        if key not in known:
            raise SweepSpecError(f"{field}.{key}", f"unknown key; valid keys are "
                                                   f"{', '.join(sorted(known))}")
    for key in ("n_opt", "budget"):
        if key not in raw:
            raise SweepSpecError(f"{field}.{key}", "missing: the prior optimum N* at a "
                                                   "reference budget")
    values = {key: _positive_number(raw[key], f"{field}.{key}") for key in raw}
    if values.get("span", 3.0) <= 1.0:
        raise SweepSpecError(f"{field}.span", f"must be > 1 (a factor either side of N*), "
                                              f"got {values['span']}")
    return CentreRule(**values)


# Columns the results table already has (attnlab.results): a variant column must not shadow one.
_RESERVED_COLUMNS = ("run_id", "status", "sweep", "mode", "budget", "params",
                     "non_embedding_params", "embedding_params", "tokens", "steps", "total_steps",
                     "flops", "flops_chinchilla", "final_val_loss", "best_val_loss",
                     "final_train_loss", "wall_seconds", "tokens_per_s", "mfu", "error")


def _variant_column(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.isidentifier():
        raise SweepSpecError("sweep.variant_column", f"expected a column name (letters, digits, "
                                                     f"underscores), got {raw!r}")
    if raw in _RESERVED_COLUMNS:
        raise SweepSpecError("sweep.variant_column", f"{raw!r} is already a column of the "
                                                     f"results table; pick another name")
    return raw


def _parse_variants(raw: Any, spec: SweepSpec) -> tuple[Variant, ...]:
    """``sweep.variants.<name>`` sections: ``model`` / ``data`` / ``train`` overrides (mirroring
    the config, like sweep.axes but one value each) and optional ``centre``, ``learning_rate``,
    ``warmup`` rules (like the sweep's own)."""
    if raw is None or (isinstance(raw, Mapping) and not raw):
        return ()
    if not isinstance(raw, Mapping):
        raise SweepSpecError("sweep.variants", f"expected a section of named variants, e.g. "
                                               f"sweep.variants.mamba.model.mixer = 'mamba', "
                                               f"got {raw!r}")
    variants = []
    for name, body in raw.items():
        field = f"sweep.variants.{name}"
        if not str(name).isidentifier():
            raise SweepSpecError(field, "a variant's name must be an identifier")
        if body is None:
            body = {}
        if not isinstance(body, Mapping):
            raise SweepSpecError(field, f"expected a section (model, data, train, "
                                        f"{', '.join(_VARIANT_RULES)}), got {body!r}")
        overrides = []
        rules: dict[str, Any] = {}
        for section, keys in body.items():
            if section in _VARIANT_RULES:
                continue
            if section not in _SECTIONS:
                raise SweepSpecError(f"{field}.{section}", f"unknown section; valid sections "
                                     f"are {', '.join((*_SECTIONS, *_VARIANT_RULES))}")
            if not isinstance(keys, Mapping):
                raise SweepSpecError(f"{field}.{section}", f"expected a section of keys, e.g. "
                                     f"{field}.{section}.<key> = value")
            fields = {f.name: f for f in dataclasses.fields(_SECTIONS[section])}
            for key, value in keys.items():
                if key not in fields:
                    raise SweepSpecError(f"{field}.{section}.{key}", f"unknown config key "
                                         f"{section}.{key}; valid keys are "
                                         f"{', '.join(sorted(fields))}")
                overrides.append((f"{section}.{key}",
                                  _typed_axis_value(value, fields[key],
                                                    f"{field}.{section}.{key}")))
        if "centre" in body:
            rules["centre"] = _parse_centre(body["centre"], f"{field}.centre")
            if not spec.budgets:
                raise SweepSpecError(f"{field}.centre", "centres IsoFLOP ladders: it needs "
                                                        "sweep.budgets (mode isoflop)")
        if "learning_rate" in body:
            rules["learning_rate"] = _parse_rule(LearningRateRule, body["learning_rate"],
                                                 f"{field}.learning_rate", LR_RULES)
        if "warmup" in body:
            rules["warmup"] = _parse_rule(WarmupRule, body["warmup"], f"{field}.warmup",
                                          WARMUP_RULES)
        variant = Variant(str(name), tuple(overrides), **rules)
        owners = variant_spec(spec, variant).set_keys()
        axis_keys = {key for key, _ in spec.axes}
        for key, _ in overrides:
            if key in owners or key in axis_keys:
                raise SweepSpecError(f"{field}.{key}", f"sets {key}, which "
                                     f"{owners.get(key, f'sweep.axes.{key}')} also sets; "
                                     f"remove one of the two")
        variants.append(variant)
    return tuple(variants)


def _parse_resources(raw: Any, scale: str) -> Resources:
    default = Resources(cpus=1.0, gpus=1.0 if scale == "gpu" else 0.0)
    if raw is None or (isinstance(raw, Mapping) and not raw):
        return default
    if not isinstance(raw, Mapping):
        raise SweepSpecError("sweep.resources", f"expected a section (cpus, gpus), got {raw!r}")
    for key in raw:
        if key not in ("cpus", "gpus"):
            raise SweepSpecError(f"sweep.resources.{key}", "unknown key; valid keys are cpus, gpus")
    cpus = _positive_number(raw.get("cpus", default.cpus), "sweep.resources.cpus")
    gpus = raw.get("gpus", default.gpus)
    if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or gpus < 0:
        raise SweepSpecError("sweep.resources.gpus", f"must be a number >= 0, got {gpus!r}")
    return Resources(float(cpus), float(gpus))


def _positive_number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise SweepSpecError(field, f"must be a positive number, got {value!r}")
    return float(value)


def _int_at_least(value: Any, low: int, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SweepSpecError(field, f"must be an integer >= {low}, got {value!r}")
    return value


def _check_relations(spec: SweepSpec) -> None:
    """Rules between fields: one owner per config key, what each mode needs."""
    if spec.flops_per_token not in FLOP_CONVENTIONS:
        raise SweepSpecError("sweep.flops_per_token", f"unknown convention "
                             f"{spec.flops_per_token!r}; valid values are "
                             f"{', '.join(FLOP_CONVENTIONS)}")
    if spec.centre is not None and not spec.budgets:
        raise SweepSpecError("sweep.centre", "centres IsoFLOP ladders: it needs sweep.budgets "
                                             "(mode isoflop)")
    owners = spec.set_keys()
    axis_keys = [key for key, _ in spec.axes]
    for key in axis_keys:
        if key in owners:
            raise SweepSpecError(f"sweep.axes.{key}", f"sets {key}, which {owners[key]} also "
                                                      f"sets; remove one of the two")
    if "train.tokens" in axis_keys and "train.steps" in axis_keys:
        raise SweepSpecError("sweep.axes.train.steps", "sweep.axes.train.tokens and "
                             "sweep.axes.train.steps both set the run length (tokens overrides "
                             "steps); keep one")
    lr = spec.learning_rate
    if lr.rule == "per_shape":
        has_values = (spec.shapes and spec.shapes[0].learning_rate) or (
            spec.ladder and spec.ladder.learning_rates)
        if not has_values:
            raise SweepSpecError("sweep.learning_rate.rule", "per_shape needs a learning rate "
                                 "with every shape: (d_model, n_layers, n_heads, lr) or "
                                 "sweep.ladder.learning_rates")
    elif (spec.shapes and spec.shapes[0].learning_rate) or (spec.ladder and
                                                            spec.ladder.learning_rates):
        raise SweepSpecError("sweep.learning_rate.rule", f"shapes carry learning rates but the "
                             f"rule is {lr.rule!r}; set sweep.learning_rate.rule = 'per_shape'")
    if lr.rule in ("power_law", "inverse_width", "per_shape") and not (spec.shapes or spec.ladder):
        raise SweepSpecError("sweep.learning_rate.rule", f"rule {lr.rule!r} needs "
                                                         "sweep.shapes or sweep.ladder")
    # Explicit reference points keep run ids stable when shapes are added to a sweep later.
    if lr.rule == "power_law" and (lr.ref_params <= 0 or lr.exponent <= 0):
        raise SweepSpecError("sweep.learning_rate.ref_params", "power_law needs ref_params > 0 "
                             "and exponent > 0 (lr = base * (N / ref_params) ** -exponent)")
    if lr.rule == "inverse_width" and lr.ref_d_model <= 0:
        raise SweepSpecError("sweep.learning_rate.ref_d_model", "inverse_width needs "
                             "ref_d_model > 0 (lr = base * ref_d_model / d_model)")
    if spec.warmup.rule == "fraction" and not 0 < spec.warmup.fraction < 1:
        raise SweepSpecError("sweep.warmup.fraction", f"must be in (0, 1), got "
                                                      f"{spec.warmup.fraction}")
    if spec.warmup.rule == "tokens_per_param" and spec.warmup.tokens_per_param <= 0:
        raise SweepSpecError("sweep.warmup.tokens_per_param", "must be > 0")
    n_shapes = len(spec.shapes) or (len(spec.ladder.non_embedding_params) if spec.ladder else 0)
    if spec.mode == "isoflop":
        if not spec.budgets:
            raise SweepSpecError("sweep.budgets", "empty: isoflop mode needs compute budgets "
                                                  "in FLOPs, e.g. (1e12, 3e12)")
        if n_shapes < 2:
            raise SweepSpecError("sweep.shapes", "isoflop mode needs at least 2 shapes "
                                                 "(sweep.shapes or sweep.ladder)")
    elif spec.budgets:
        raise SweepSpecError("sweep.budgets", f"only isoflop mode uses budgets; mode is "
                                              f"{spec.mode!r}")
    if spec.mode == "curves" and spec.curve_points <= 0:
        raise SweepSpecError("sweep.curve_points", "curves mode needs curve_points > 0 "
                                                   "(validation points per run)")
