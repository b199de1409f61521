"""Sweep specifications: what an ``experiments/*.py`` file describes, checked once.

An experiment file defines ``get_config(scale="cpu")`` returning a ConfigDict with three parts:

    config.scale  'cpu' | 'gpu' (pass ``--config=experiments/x.py:gpu`` to pick the GPU sizes)
    config.base   the train config every run starts from: a ConfigDict like configs/*.py, or the
                  path of such a file (relative to the experiment file, then to the cwd)
    config.sweep  what varies: mode, shapes or a size ladder, axes, learning-rate and warmup
                  rules, compute budgets (see docs/sweeps.md for every key)

:func:`load_spec` turns that into a frozen :class:`SweepSpec`; nothing here touches JAX or the
disk besides reading the files, and nothing plans: turning a spec into concrete runs is
:mod:`attnlab.sweep.planner`, and each stage checks its runs' configs as it plans them
(:func:`attnlab.sweep.stages.check` plans a tuning stage's ahead).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import ml_collections

from attnlab import cli_flags
from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig, from_config_dict
from attnlab.dataclass_io import build_dataclass, coerce
from attnlab.errors import ConfigError
from attnlab.checks import check
from attnlab.sweep.definition import (SweepSpec, Variant, arms, check_refine_batch, transfers,
                                      variant_spec)
from attnlab.sweep import modes
from attnlab.sweep.rules import LearningRateRule, WarmupRule, read_lr_law, read_transfer_report
from attnlab.sweep.sections import (Branches, CentreRule, Ladder, Resources, Shape,
                                    SweepSpecError, Tune, int_at_least,
                                    number_at_least_zero, positive_number)

SCALES = ("cpu", "gpu")
# Keys of attnlab.model.flops_per_token that may define "FLOPs per token" for isoflop budgets.
FLOP_CONVENTIONS = ("chinchilla", "kaplan", "kaplan_causal", "kaplan_6n")

_SECTIONS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}
_TOP_LEVEL_KEYS = ("scale", "base", "sweep")
_SWEEP_KEYS = ("name", "mode", "shapes", "ladder", "axes", "learning_rate", "warmup", "budgets",
               "flops_per_token", "min_steps", "max_epochs", "curve_points", "resources",
               "refine_batch",
               "centre", "variants", "variant_column", "baseline", "branches", "tune")


_VARIANT_RULES = {"centre": CentreRule, "learning_rate": LearningRateRule, "warmup": WarmupRule}


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
    scale, sweep = _sections(raw)
    base = _load_base(raw.get("base"), source)
    mode = sweep.get("mode", "grid")
    if mode not in modes.MODES:
        raise SweepSpecError("sweep.mode", f"unknown mode {mode!r}; valid modes are "
                                           f"{', '.join(modes.MODES)}")
    name = sweep.get("name") or (os.path.splitext(os.path.basename(source))[0] if source
                                 else "sweep")

    shapes = _parse_shapes(sweep.get("shapes") or ())
    ladder = _section(Ladder, sweep.get("ladder"), "sweep.ladder")
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
        learning_rate=_section(LearningRateRule, sweep.get("learning_rate"),
                               "sweep.learning_rate", LearningRateRule()),
        warmup=_section(WarmupRule, sweep.get("warmup"), "sweep.warmup", WarmupRule()),
        budgets=_parse_budgets(sweep.get("budgets") or ()),
        centre=_section(CentreRule, sweep.get("centre"), "sweep.centre"),
        flops_per_token=sweep.get("flops_per_token", "chinchilla"),
        min_steps=int_at_least(sweep.get("min_steps", 1), 1, "sweep.min_steps"),
        max_epochs=number_at_least_zero(sweep.get("max_epochs", 0.0), "sweep.max_epochs"),
        refine_batch=int_at_least(sweep.get("refine_batch", 0), 0, "sweep.refine_batch"),
        curve_points=int_at_least(sweep.get("curve_points", 0), 0, "sweep.curve_points"),
        resources=_resources(sweep.get("resources"), scale),
        source=source,
        variant_column=_variant_column(sweep.get("variant_column", "variant")),
        branches=_section(Branches, sweep.get("branches"), "sweep.branches"),
        tune=_section(Tune, sweep.get("tune"), "sweep.tune"),
    )
    if not sweep.get("variants"):
        spec = _with_resolved_learning_rate(spec, "sweep.learning_rate")
    _check_relations(spec)
    spec = _with_variants(spec, sweep)
    check_refine_batch(spec)
    _check_tune(spec)
    return spec


def _sections(raw: Mapping) -> tuple[str, Mapping]:
    """(scale, the sweep section) of an experiment's dict, every key known."""
    for key in raw:
        if key not in _TOP_LEVEL_KEYS:
            raise SweepSpecError(key, f"unknown top-level key; valid keys are "
                                      f"{', '.join(_TOP_LEVEL_KEYS)}")
    scale = raw.get("scale", "cpu")
    if scale not in SCALES:
        raise SweepSpecError("scale", f"unknown value {scale!r}; valid values are cpu, gpu")
    sweep = raw.get("sweep")
    if not isinstance(sweep, Mapping):
        raise SweepSpecError("sweep", "missing: an experiment needs a sweep section "
                                      "(mode, shapes or ladder, axes, ...)")
    for key in sweep:
        if key not in _SWEEP_KEYS:
            raise SweepSpecError(f"sweep.{key}", f"unknown key; valid keys are "
                                                 f"{', '.join(_SWEEP_KEYS)}")
    return scale, sweep


def _with_variants(spec: SweepSpec, sweep: Mapping) -> SweepSpec:
    """``spec`` with its sweep.variants (each checked as its own sweep, each with the tuned
    learning rate of its own model) and the baseline among them."""
    variants = _parse_variants(sweep.get("variants"), spec)
    if not variants:
        if sweep.get("baseline") is not None:
            raise SweepSpecError("sweep.baseline", "names the variant others are compared with, "
                                                   "but the sweep has no sweep.variants")
        return spec
    for variant in variants:  # each variant's own sweep must be valid too
        _check_variant_relations(spec, variant)
    variants = tuple(_variant_with_resolved_learning_rate(spec, v) for v in variants)
    return dataclasses.replace(spec, variants=variants,
                               baseline=_baseline(sweep.get("baseline"), variants))


def _check_variant_relations(spec: SweepSpec, variant: Variant) -> None:
    """The rules between fields (:func:`_check_relations`) on one variant's sweep: a rule the
    variant gives is named under it (``sweep.variants.<name>.learning_rate.ref_params``)."""
    try:
        _check_relations(variant_spec(spec, variant))
    except SweepSpecError as e:
        section, _, rest = e.field.removeprefix("sweep.").partition(".")
        if section in _VARIANT_RULES and getattr(variant, section) is not None:
            raise SweepSpecError(f"sweep.variants.{variant.name}.{section}"
                                 f"{'.' if rest else ''}{rest}", e.reason) from None
        raise SweepSpecError(e.field, f"{e.reason} (variant {variant.name!r})") from None


def _check_tune(spec: SweepSpec) -> None:
    """The rules between ``sweep.tune`` and the learning-rate rules: rule ``tuned`` needs the
    tuning stage, the stage needs an arm that is tuned, and an arm that is not muP needs two
    widths. Planning the stage's runs is the stage's own check
    (:func:`attnlab.sweep.stages.check`)."""
    tuned = arms(spec)
    if spec.tune is None:
        if tuned:
            raise SweepSpecError("sweep.tune", "missing: learning-rate rule 'tuned' needs the "
                                 "tuning stage (shapes, learning_rates, seeds, steps)")
        return
    if not tuned:
        raise SweepSpecError("sweep.tune", "no arm uses it: set sweep.learning_rate.rule = "
                                           "'tuned' (or a variant's)")
    widths = {s.d_model for s in spec.tune.shapes}
    for name, arm in tuned:
        if not transfers(arm) and len(widths) < 2:
            what = f"variant {name!r}" if spec.variants else "the base model"
            raise SweepSpecError("sweep.tune.shapes", f"{what} is not muP (model.parameterization"
                                 f" = {arm.base.model.parameterization!r}): its rate is "
                                 f"extrapolated in width by a power law fitted over the tuning "
                                 f"widths, which needs at least two")


# ----------------------------------------------------------------------------------------------
# Parsing helpers: each raises SweepSpecError naming the field.


def _load_base(base: Any, source: str) -> Config:
    if base is None:
        raise SweepSpecError("base", "missing: set config.base to a train ConfigDict (e.g. "
                                     "attnlab.config.base_config_dict()) or a configs/*.py path")
    if isinstance(base, str):
        base = _read_config_file(base, source)
    if not isinstance(base, Mapping):
        raise SweepSpecError("base", f"expected a train ConfigDict or a file path, got {base!r}")
    try:
        cfg = from_config_dict(base)
        check(cfg)
        return cfg
    except ConfigError as e:
        raise SweepSpecError(f"base.{e.field}", e.reason) from None


def _read_config_file(path: str, source: str) -> dict[str, Any]:
    candidate = _find_file(path, source, "base", "config file")
    return cli_flags.parse([f"--config={candidate}"], prog="attnlab sweep").config.to_dict()


def _find_file(path: str, source: str, field: str, what: str) -> str:
    """A file named by the spec: an absolute path, or relative to the experiment file's folder,
    its parent (the repository root) or the cwd, in that order."""
    candidates = [path] if os.path.isabs(path) else [
        os.path.join(os.path.dirname(os.path.abspath(source)), path) if source else path,
        os.path.join(os.path.dirname(os.path.abspath(source)), os.pardir, path) if source else path,
        path,
    ]
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    raise SweepSpecError(field, f"{what} {path!r} not found (looked in "
                                f"{', '.join(sorted(set(map(os.path.normpath, candidates))))})")


def _with_resolved_learning_rate(spec: SweepSpec, field: str) -> SweepSpec:
    """``spec`` whose rule ``law`` has its report found (a path the planner can open) and read,
    and whose rule ``transfer`` has its learning rate: refused unless the base model is
    muP (only there does the optimum hold across width); a report's row is the mup one at
    ``tuned_d_model`` (default the base width) tuned with the same base width, since under muP a
    learning rate means the one of the base model (hidden matrices get ``lr * base / d``)."""
    rule, model = spec.learning_rate, spec.base.model
    if rule.kind.reads_law:  # found and read now: a bad file is one error before planning
        path = _find_file(rule.report, spec.source, f"{field}.report", "hyperparameter law")
        read_lr_law(path, f"{field}.report")
        return dataclasses.replace(spec, learning_rate=dataclasses.replace(rule, report=path))
    if not rule.kind.transfers:
        return spec
    if not transfers(spec):
        raise SweepSpecError(f"{field}.rule", f"'transfer' applies the learning rate tuned at "
                             f"the base width to every width, which holds only under muP: set "
                             f"model.parameterization = 'mup' and model.mup_base_d_model (the "
                             f"base model's is {model.parameterization!r})")
    if not rule.report:
        return spec
    rows = read_transfer_report(_find_file(rule.report, spec.source, f"{field}.report",
                                           "transfer report"), f"{field}.report")
    width = rule.tuned_d_model or model.mup_base_d_model
    mup_rows = [r for r in rows if r["parameterization"] == model.parameterization]
    for row in mup_rows:
        if (row["d_model"], row["mup_base_d_model"]) == (width, model.mup_base_d_model):
            lr = dataclasses.replace(rule, base_lr=row["learning_rate"])
            return dataclasses.replace(spec, learning_rate=lr)
    found = ", ".join(f"d_model {r['d_model']} (base {r['mup_base_d_model']})"
                      for r in mup_rows) or "none"
    raise SweepSpecError(f"{field}.report", f"{rule.report!r} has no mup row at d_model {width} "
                         f"tuned with model.mup_base_d_model = {model.mup_base_d_model} (its mup "
                         f"rows: {found})")


def _variant_with_resolved_learning_rate(spec: SweepSpec, variant: Variant) -> Variant:
    field = (f"sweep.variants.{variant.name}.learning_rate" if variant.learning_rate
             else "sweep.learning_rate")
    try:
        tuned = _with_resolved_learning_rate(variant_spec(spec, variant), field).learning_rate
    except SweepSpecError as e:
        if e.field.startswith("sweep.variants."):
            raise
        raise SweepSpecError(e.field, f"{e.reason} (variant {variant.name!r})") from None
    if not (tuned.kind.transfers or tuned.kind.reads_law):
        return variant
    return dataclasses.replace(variant, learning_rate=tuned)


def _section(cls, raw: Any, field: str, default=None):
    """A spec section (one of the dataclasses above) from its mapping, by the config's generic
    builder (unknown keys, missing keys and wrong types named), then its own value rules."""
    if raw is None or (isinstance(raw, Mapping) and not raw):
        return default
    if not isinstance(raw, Mapping):
        keys = ", ".join(f.name for f in dataclasses.fields(cls))
        raise SweepSpecError(field, f"expected a section ({keys}), got {raw!r}")
    return build_dataclass(cls, raw, field, error=SweepSpecError).checked(field)


def _resources(raw: Any, scale: str) -> Resources:
    """``sweep.resources``; a GPU sweep's run asks for one GPU unless it says otherwise."""
    default = Resources(gpus=float(scale == "gpu"))
    if isinstance(raw, Mapping) and "gpus" not in raw:
        raw = {**raw, "gpus": default.gpus}
    return _section(Resources, raw, "sweep.resources", default)


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
            lr = positive_number(entry[3], f"{field}.learning_rate")
        shapes.append(Shape(*entry[:3], learning_rate=lr))
    if len({s.label for s in shapes}) != len(shapes):
        raise SweepSpecError("sweep.shapes", "the same shape appears twice")
    if any(s.learning_rate is None for s in shapes) and any(s.learning_rate for s in shapes):
        raise SweepSpecError("sweep.shapes", "give a learning rate for every shape or for none")
    return tuple(shapes)


def _parse_axes(raw: Any) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """Axes mirror the config: ``axes.model.pos_encoding = ("rope", "alibi")``."""
    if not isinstance(raw, Mapping):
        raise SweepSpecError("sweep.axes", f"expected a section like config.base, got {raw!r}")
    axes = []
    for section, keys in raw.items():
        if section not in _SECTIONS:
            raise SweepSpecError(f"sweep.axes.{section}",
                                 "unknown section; axes mirror the config: sweep.axes.model.*, "
                                 "sweep.axes.data.*, sweep.axes.train.*")
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
            values = tuple(coerce(v, fields[key], field, error=SweepSpecError) for v in values)
            if len(set(map(repr, values))) != len(values):
                raise SweepSpecError(field, f"a value appears twice in {values!r}")
            axes.append((f"{section}.{key}", values))
    return tuple(axes)


def _parse_budgets(raw: Any) -> tuple[float, ...]:
    if not isinstance(raw, (tuple, list)):
        raise SweepSpecError("sweep.budgets", f"expected a tuple of FLOP budgets, got {raw!r}")
    budgets = tuple(positive_number(b, "sweep.budgets") for b in raw)
    if len(set(budgets)) != len(budgets):
        raise SweepSpecError("sweep.budgets", "the same budget appears twice")
    return budgets


# Columns the results table already has (attnlab.results): a variant column must not shadow one.
_RESERVED_COLUMNS = ("run_id", "status", "sweep", "mode", "budget", "role", "trunk", "lr_factor",
                     "shared_flops", "params", "non_embedding_params", "embedding_params",
                     "active_params", "active_non_embedding_params", "tokens", "unique_tokens",
                     "epochs", "steps", "total_steps", "flops", "flops_chinchilla",
                     "final_val_loss", "best_val_loss", "final_train_loss", "wall_seconds",
                     "tokens_per_s", "mfu", "error")


def _variant_column(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.isidentifier():
        raise SweepSpecError("sweep.variant_column", f"expected a column name (letters, digits, "
                                                     f"underscores), got {raw!r}")
    if raw in _RESERVED_COLUMNS:
        raise SweepSpecError("sweep.variant_column", f"{raw!r} is already a column of the "
                                                     f"results table; pick another name")
    return raw


def _baseline(raw: Any, variants: tuple[Variant, ...]) -> str | None:
    """``sweep.baseline``: the name of one of the variants (or unset)."""
    names = [v.name for v in variants]
    if raw is not None and raw not in names:
        raise SweepSpecError("sweep.baseline", f"expected one of the variants "
                                               f"({', '.join(names)}), got {raw!r}")
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
                                  coerce(value, fields[key], f"{field}.{section}.{key}",
                                         error=SweepSpecError)))
        for key, cls in _VARIANT_RULES.items():
            if key in body:
                rules[key] = _section(cls, body[key], f"{field}.{key}")  # empty: the sweep's
        if "centre" in rules and not spec.budgets:
            raise SweepSpecError(f"{field}.centre", "centres IsoFLOP ladders: it needs "
                                                    "sweep.budgets (mode isoflop)")
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
    carried = (spec.shapes and spec.shapes[0].learning_rate) or (spec.ladder and
                                                                 spec.ladder.learning_rates)
    if carried and not lr.kind.from_shapes:
        raise SweepSpecError("sweep.learning_rate.rule", f"shapes carry learning rates but the "
                             f"rule is {lr.rule!r}; set sweep.learning_rate.rule = 'per_shape'")
    lr.kind.check_spec(lr, spec)
    spec.warmup.kind.check_spec(spec.warmup)
    n_shapes = len(spec.shapes) or (len(spec.ladder.non_embedding_params) if spec.ladder else 0)
    modes.check(spec, n_shapes)
