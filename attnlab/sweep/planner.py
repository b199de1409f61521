"""From a :class:`SweepSpec` to concrete runs, each a validated :class:`Config` with a stable id.

Planning is pure (no JAX, no disk) and checks every run's config before any run starts, so a bad
value anywhere in a sweep is reported before the first minute of training is spent.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
from typing import Any

from attnlab import rundir
from attnlab.config import Config, ModelConfig, check_warmup
from attnlab.schedules import wsd_decay_start
from attnlab.errors import ConfigError
from attnlab.identity import RESUMABLE_DIFFERENCES, identity
from attnlab.checks import with_values
from attnlab.model import flops_per_token, param_counts, recorded_counts
from attnlab.sweep.definition import BATCH_KEY, SweepSpec, variant_point, variant_spec
from attnlab.sweep.modes import OFF_CENTRE
from attnlab.sweep.sections import Ladder, Shape, SweepSpecError

# Fields that say how a run is launched, not what it computes (training accepts them changed on
# resume): they do not enter the run id, so e.g. another mesh keeps finished runs valid.
NOT_IN_RUN_ID = ("name", *sorted(RESUMABLE_DIFFERENCES))
_MAX_LADDER_LAYERS = 512
# Axes whose values replicate a point rather than move it: a point's best learning rate is the
# one with the lowest mean over them.
REPLICATE_KEYS = ("train.seed", "data.seed")


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One run of a sweep.

    Attributes:
      run_id: ``<readable prefix>-<hash8>``; the hash covers the full resolved config.
      cfg: the run's config (``cfg.name == run_id``).
      axes: every config key the sweep set for this run (dotted name -> value): shape keys,
        axis values, rule-derived learning rate / warmup, isoflop tokens.
      budget: the isoflop compute budget C in FLOPs (None in other modes).
      params: :func:`attnlab.model.recorded_counts` ({'total', 'non_embedding', 'embedding'}, and
        'active', 'active_non_embedding' for a mixture of experts).
      flops_per_token: attnlab.model.flops_per_token at the run's seq_len.
      role: ladder mode: 'trunk' (the constant-LR phase a size's branches share) or 'branch'
        (a cooldown from the trunk's checkpoint at ``cfg.train.branch_step``); '' otherwise.
      point: the runs that differ from this one only in learning-rate factor and seed share it
        (:func:`point_name`); lr_factor: the run's factor of the rule's rate.
      group: the points that differ only in batch size share it (:func:`group_name`).
    """

    run_id: str
    cfg: Config
    axes: dict[str, Any]
    budget: float | None
    params: dict[str, int]
    flops_per_token: dict[str, float]
    role: str = ""
    point: str = ""
    lr_factor: float = 1.0
    group: str = ""

    @property
    def steps(self) -> int:
        return self.cfg.total_steps

    @property
    def tokens(self) -> int:
        """Tokens the run trains on (whole batches)."""
        return self.steps * self.cfg.data.batch_size * self.cfg.data.seq_len

    @property
    def shared_tokens(self) -> int:
        """Tokens a branch takes over from its trunk (0 for any other run)."""
        return self.cfg.train.branch_step * self.cfg.data.batch_size * self.cfg.data.seq_len

    def flops(self, convention: str = "chinchilla") -> float:
        """The compute of the run's result: a branch's counts its trunk's up to the branch."""
        return self.flops_per_token[convention] * self.tokens

    def trained_flops(self, convention: str = "chinchilla") -> float:
        """The compute the run itself spends: a branch's only its cooldown."""
        return self.flops_per_token[convention] * (self.tokens - self.shared_tokens)


def plan(spec: SweepSpec) -> list[PlannedRun]:
    """Every run of the sweep, in a stable order (budget, shape, then axes in file order).

    Raises:
      SweepSpecError: naming the spec field behind the first invalid run config.
    """
    return expand(spec)[0]


def expand(spec: SweepSpec) -> tuple[list[PlannedRun], list[str]]:
    """Like :func:`plan`, plus notes on (budget, shape) pairs left out of an isoflop sweep
    because the budget buys fewer than ``sweep.min_steps`` steps of that shape, or the shape
    lies outside the budget's centred ladder (``sweep.centre``).

    With ``sweep.variants`` every variant is planned as a sweep of its own (its overrides on
    the base config, its own rules) and the runs are concatenated, variant by variant; each
    run's ``axes`` then starts with ``{variant_column: name}`` and holds the value of every key
    any variant overrides (so the results table has a full column for each)."""
    if spec.variants:
        return _expand_variants(spec)
    shapes: list[Shape | None] = list(resolve_shapes(spec, spec.base.model)) or [None]
    axis_keys = [key for key, _ in spec.axes]
    combos = [dict(zip(axis_keys, combo))
              for combo in itertools.product(*(values for _, values in spec.axes))]
    factors, extra = spec.learning_rate.factors or (1.0,), dict(spec.extra_factors)
    budgets = spec.kind.budgets(spec)
    runs: list[PlannedRun] = []
    notes: list[str] = []
    if spec.kind.uses_branches:  # a trunk per shape, its branches the runs of each token count
        for shape in shapes:
            for values in combos:
                for factor in factors:
                    runs += ladder_runs(spec, _plan_one(spec, shape, values, None, factor))
    for budget in budgets:
        kept, off_centre = 0, 0
        for shape in shapes:
            for values in combos + extra_batch_combos(spec, shape, budget, combos):
                point = point_name(shape, values, budget)
                for factor in factors + extra.get(point, ()):
                    run = _plan_one(spec, shape, values, budget, factor)
                    if isinstance(run, str):  # why a point is left out never reads its rate
                        label = shape.label if shape else "base"
                        what = " ".join(filter(None, (label,
                                                      _combo_label(tuple(values.values())))))
                        notes.append(f"budget {budget:.3g}: {what} left out ({run})")
                        off_centre += run.startswith(OFF_CENTRE)
                        break
                    runs.append(dataclasses.replace(run, point=point, lr_factor=factor,
                                                    group=group_name(shape, values, budget)))
                    kept += 1
        if budget is not None and kept == 0 and off_centre:
            raise SweepSpecError(
                "sweep.centre",
                f"no shape of the sweep lies within {spec.centre.span:g}x of N* = "
                f"{spec.centre.target(budget):.3g} parameters at budget {budget:.3g} FLOPs: add "
                f"shapes near it or widen sweep.centre.span")
        if budget is not None and kept == 0:
            smallest = min(shapes, key=lambda s: s.d_model * s.n_layers)
            needed = _isoflop_flops_for_steps(spec, smallest, spec.min_steps)
            raise SweepSpecError(
                "sweep.budgets",
                f"budget {budget:.3g} FLOPs is too small: the smallest shape {smallest.label} "
                f"needs {needed:.3g} FLOPs for {spec.min_steps} step(s) of one batch "
                f"({spec.base.data.batch_size}x{spec.base.data.seq_len} tokens)")
    seen: dict[str, PlannedRun] = {}
    for run in runs:
        if run.run_id in seen:
            raise SweepSpecError("sweep", f"two runs resolve to the same config ({run.run_id}): "
                                          f"{seen[run.run_id].axes} and {run.axes}")
        seen[run.run_id] = run
    return runs, notes


def _expand_variants(spec: SweepSpec) -> tuple[list[PlannedRun], list[str]]:
    keys = list(dict.fromkeys(key for v in spec.variants for key, _ in v.overrides))
    runs: list[PlannedRun] = []
    notes: list[str] = []
    seen: dict[str, str] = {}
    for variant in spec.variants:
        try:
            variant_runs, variant_notes = expand(variant_spec(spec, variant))
        except SweepSpecError as e:
            if e.field.startswith("sweep.variants."):
                raise
            raise SweepSpecError(e.field, f"{e.reason} (variant {variant.name!r})") from None
        notes += [f"{variant.name}: {note}" for note in variant_notes]
        for run in variant_runs:
            run = dataclasses.replace(run, point=variant_point(variant.name, run.point))
            if run.run_id in seen:
                raise SweepSpecError(f"sweep.variants.{variant.name}",
                                     f"gives the same run as variant {seen[run.run_id]!r} "
                                     f"({run.run_id}): two variants must differ in config")
            seen[run.run_id] = variant.name
            resolved = {}
            sections = {"model": run.cfg.model, "data": run.cfg.data,
                        "train": run.cfg.train.decay()}
            for dotted in keys:
                section, key = dotted.split(".")
                resolved[dotted] = getattr(sections[section], key)
            axes = {spec.variant_column: variant.name, **resolved, **run.axes}
            runs.append(dataclasses.replace(run, axes=axes))
    return runs, notes


def resolve_shapes(spec: SweepSpec, base_model: ModelConfig) -> tuple[Shape, ...]:
    """The sweep's explicit shapes, or the ladder's generated ones."""
    if spec.shapes:
        return spec.shapes
    if spec.ladder:
        return ladder_shapes(spec.ladder, base_model)
    return ()


def ladder_shapes(ladder: Ladder, base_model: ModelConfig) -> tuple[Shape, ...]:
    """For each target non-embedding count, the depth L (d_model = aspect_ratio * L rounded to a
    multiple of head_dim, n_heads = d_model / head_dim) whose exact count is nearest in log space.

    Depths whose shape the base model refuses (e.g. muP's base width not divisible by the
    heads) are skipped.

    Raises:
      SweepSpecError: two targets give the same shape (spread them further apart), or no depth
        gives a shape the base model takes.
    """
    shapes = []
    refusal: ConfigError | None = None
    for i, target in enumerate(ladder.non_embedding_params):
        best: tuple[float, Shape] | None = None
        for n_layers in range(1, _MAX_LADDER_LAYERS + 1):
            d_model = max(1, round(ladder.aspect_ratio * n_layers / ladder.head_dim)) * ladder.head_dim
            n_heads = d_model // ladder.head_dim
            model = dataclasses.replace(base_model, d_model=d_model, n_layers=n_layers,
                                        n_heads=n_heads)
            try:
                count = param_counts(model)["non_embedding"]
            except ConfigError as e:  # a shape this model cannot take (muP's base width...)
                refusal = e
                continue
            error = abs(math.log(count / target))
            if best is None or error < best[0]:
                lr = ladder.learning_rates[i] if ladder.learning_rates else None
                best = (error, Shape(d_model, n_layers, n_heads, learning_rate=lr,
                                     target_params=target))
            if count > 4 * target:  # counts grow with depth: nothing closer beyond here
                break
        if best is None:
            raise SweepSpecError("sweep.ladder", f"no depth up to {_MAX_LADDER_LAYERS} gives a "
                                 f"shape the base model takes: {refusal}")
        shapes.append(best[1])
    labels = [s.label for s in shapes]
    for i, label in enumerate(labels):
        if labels.index(label) != i:
            raise SweepSpecError(
                "sweep.ladder.non_embedding_params",
                f"targets {ladder.non_embedding_params[labels.index(label)]:.3g} and "
                f"{ladder.non_embedding_params[i]:.3g} both give shape {label}; spread the "
                f"targets further apart or lower sweep.ladder.head_dim")
    return tuple(shapes)


def run_id(cfg: Config) -> str:
    """``d128-l4-rope-t2.05M-s0-1a2b3c4d``: a readable prefix plus the first 8 hex digits of the
    SHA-256 of the config's identity as sorted JSON (less :data:`NOT_IN_RUN_ID`; fields added
    since the first release count only when set away from their defaults)."""
    raw = identity(cfg)
    for dotted in NOT_IN_RUN_ID:
        section, _, key = dotted.rpartition(".")
        (raw[section] if section else raw).pop(key, None)
    digest = hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:8]
    tokens = cfg.total_steps * cfg.data.batch_size * cfg.data.seq_len
    m = cfg.model
    window = f"-w{m.attention_window}" if m.attention_window else ""  # windowed runs get their own id
    return (f"d{m.d_model}-l{m.n_layers}-{m.pos_encoding}{window}-t{_short_count(tokens)}"
            f"-s{cfg.train.seed}-{digest}")


# ----------------------------------------------------------------------------------------------


def _plan_one(spec: SweepSpec, shape: Shape | None, axis_values: dict[str, Any],
              budget: float | None, factor: float = 1.0) -> PlannedRun | str:
    """The run at one (shape, axis values, budget), or why it is left out: the budget buys too
    few steps, or the shape lies outside the budget's centred ladder (``sweep.centre``).

    ``swept`` collects every value the sweep sets, in the order it is derived (each rule needs
    the config so far: the learning rate the parameter count, warmup the run length); each step
    overrides the base config with all of them, so the run's config never depends on the order.
    """
    swept: dict[str, Any] = {}
    if shape is not None:
        for key in ("d_model", "n_layers", "n_heads"):
            swept[f"model.{key}"] = getattr(shape, key)
    swept.update(axis_values)
    cfg = _override(spec, swept)
    counts = param_counts(cfg.model)
    per_token = flops_per_token(cfg.model, cfg.data.seq_len)
    batch_tokens = cfg.data.batch_size * cfg.data.seq_len

    length = spec.kind.run_length(spec, budget, counts, per_token, batch_tokens)
    if isinstance(length, str):
        return length
    # A rule may read the run's length (a law in N and D): it sees the sized config.
    lr = _learning_rate(spec, shape, _override(spec, {**swept, **length}),
                        counts["non_embedding"], factor)
    if lr is not None:
        swept["train.learning_rate"] = lr
    swept.update(length)
    cfg = _override(spec, swept)
    if cfg.train.tokens and cfg.train.tokens < batch_tokens:
        origin = ("sweep.axes.train.tokens" if "train.tokens" in axis_values else
                  "base.train.tokens")
        raise SweepSpecError(origin, f"{cfg.train.tokens} tokens is less than one batch "
                                     f"(batch_size x seq_len = {batch_tokens})")
    warmup = _warmup_steps(spec, cfg, counts["total"])
    if warmup is not None:
        swept["train.warmup_steps"] = warmup
    if spec.kind.uses_curve_points:  # the logging cadence: set, not a variable of the study
        every = max(1, cfg.total_steps // spec.curve_points)
        cfg = _override(spec, {"train.log_every": min(cfg.train.log_every, every), **swept,
                               "train.eval_every": every})
    else:
        cfg = _override(spec, swept)
    try:  # checked on the final config: a warmup rule is applied after the first override
        check_warmup(cfg.train, cfg.total_steps)
    except ConfigError as e:
        origin = "sweep.warmup" if "train.warmup_steps" in swept else "base.train.warmup_steps"
        raise SweepSpecError(origin, f"{e.reason} (with sweep values "
                             f"{', '.join(f'{k}={v}' for k, v in swept.items())})") from None
    rid = run_id(cfg)
    return PlannedRun(rid, dataclasses.replace(cfg, name=rid), swept, budget,
                      recorded_counts(counts), per_token)


def ladder_runs(spec: SweepSpec, template: PlannedRun) -> list[PlannedRun]:
    """One shape's trunk and branches (ladder mode), from the run planned at that shape.

    Branch ``i`` trains ``D_i`` tokens (whole batches) with a wsd schedule whose last
    ``fraction`` decays; it starts from the trunk's checkpoint at the step its cooldown starts
    (:func:`attnlab.config.wsd_decay_start`). The trunk trains the constant-LR phase up to the
    latest of those steps and keeps a checkpoint at each (``train.keep_steps``, not part of its
    run id, so adding a branch below the longest keeps the trunk's id).
    """
    b = spec.branches
    cfg = template.cfg
    batch = cfg.data.batch_size * cfg.data.seq_len
    n = template.params[b.params]
    targets = b.tokens or tuple(t * n for t in b.tokens_per_param)
    steps = [max(1, round(d / batch)) for d in targets]
    label = f"d{cfg.model.d_model}-l{cfg.model.n_layers}"
    for i, s in enumerate(steps):
        if s in steps[:i]:
            raise SweepSpecError("sweep.branches", f"{label}: two token counts round to the "
                                 f"same {s} steps of {batch} tokens; spread them further apart")
    starts = [wsd_decay_start(s, cfg.train.warmup_steps, b.fraction) for s in steps]
    warmup = cfg.train.warmup_steps
    for s, start in zip(steps, starts):
        # A branch starts after its trunk's warmup and cools down for at least one step: the
        # worker refuses anything shorter (its warmup would outlast the run).
        if start < 1 or start >= s:
            raise SweepSpecError("sweep.branches", f"{label}: a branch of {s} step(s) has no "
                                 f"constant-LR step before its cooldown (the warmup takes "
                                 f"{warmup}); give it more tokens")
    trunk = _ladder_run(spec, template, {
        "train.schedule": "constant", "train.tokens": max(starts) * batch,
        "train.keep_steps": tuple(sorted(set(starts)))}, rundir.TRUNK)
    runs = [trunk]
    for s, start in zip(steps, starts):
        runs.append(_ladder_run(spec, template, {
            "train.schedule": "wsd", "train.tokens": s * batch,
            "train.decay_fraction": b.fraction, "train.cooldown": b.cooldown,
            "train.branch_from": trunk.run_id, "train.branch_step": start}, rundir.BRANCH))
    return runs


def _ladder_run(spec: SweepSpec, template: PlannedRun, values: dict[str, Any],
                role: str) -> PlannedRun:
    swept = {**template.axes, **values}
    cfg = _override(spec, swept)
    rid = run_id(cfg)
    axes = {k: v for k, v in swept.items() if k not in ("train.keep_steps", "train.branch_from")}
    return dataclasses.replace(template, run_id=rid, cfg=dataclasses.replace(cfg, name=rid),
                               axes=axes, role=role)


def _override(spec: SweepSpec, swept: dict[str, Any]) -> Config:
    """The base config with ``swept`` applied and validated; an invalid result is a
    SweepSpecError naming the spec field that set the offending value (or the base's)."""
    try:
        return with_values(spec.base, swept)
    except ConfigError as e:
        if e.field in swept:
            origin = spec.set_keys().get(e.field, f"sweep.axes.{e.field}")
            where = ", ".join(f"{k}={v}" for k, v in swept.items())
            raise SweepSpecError(origin, f"gives {e.field} = {swept[e.field]!r}: {e.reason} "
                                         f"(run with {where})") from None
        raise SweepSpecError(f"base.{e.field}", f"{e.reason} (with sweep values "
                             f"{', '.join(f'{k}={v}' for k, v in swept.items())})") from None


def _learning_rate(spec: SweepSpec, shape: Shape | None, cfg: Config,
                   non_embedding: int, factor: float = 1.0) -> float | None:
    """The rule's rate at this shape times ``factor`` (one of ``sweep.learning_rate.factors``),
    rounded; None: the base config's (rule fixed, no factor)."""
    rule = spec.learning_rate
    lr = rule.kind.value(rule, spec, shape, cfg, non_embedding)
    # Nothing to scale or round; on a grid of factors every run records its rate, the rule's
    # own included, so that a pick over train.learning_rate sees each one.
    if not rule.factors and (lr is None or rule.kind.transfers):
        return lr
    lr = (cfg.train.learning_rate if lr is None else lr) * factor
    if not 0 < lr < math.inf:  # 0 after an underflow; the config checks no upper bound
        raise SweepSpecError("sweep.learning_rate", f"rule {rule.rule!r} gives learning rate "
                             f"{lr:g} at d_model {cfg.model.d_model}, {non_embedding:,} "
                             f"non-embedding parameters")
    # Six significant digits: readable, and the same bits on every platform (stable run ids).
    return float(f"{lr:.6g}")


def _warmup_steps(spec: SweepSpec, cfg: Config, total_params: int) -> int | None:
    return spec.warmup.kind.steps(spec.warmup, cfg, total_params)


def _isoflop_flops_for_steps(spec: SweepSpec, shape: Shape, steps: int) -> float:
    cfg = _override(spec, {f"model.{k}": getattr(shape, k)
                           for k in ("d_model", "n_layers", "n_heads")})
    per_token = flops_per_token(cfg.model, cfg.data.seq_len)[spec.flops_per_token]
    return per_token * steps * cfg.data.batch_size * cfg.data.seq_len


def point_name(shape: Shape | None, values: dict[str, Any], budget: float | None) -> str:
    """What the runs of one point share: the shape, the budget and every axis value but the
    seeds (its runs differ only in learning-rate factor and seed)."""
    kept = {k: v for k, v in values.items() if k not in REPLICATE_KEYS}
    label = shape.label if shape else "base"
    where = f" at {budget:.6g} FLOPs" if budget is not None else ""
    return label + where + (f" {json.dumps(kept, sort_keys=True, default=str)}" if kept else "")


def group_name(shape: Shape | None, values: dict[str, Any], budget: float | None) -> str:
    """What the points of one batch-size group share: the point's name but its batch size."""
    return point_name(shape, {k: v for k, v in values.items() if k != BATCH_KEY}, budget)


def extra_batch_combos(spec: SweepSpec, shape: Shape | None, budget: float | None,
                       combos: list[dict]) -> list[dict]:
    """The axis values of the batch sizes sweep.refine_batch added to this shape's groups
    (``spec.extra_batches``), one per seed as the axis's own."""
    extra = dict(spec.extra_batches)
    if not extra:
        return []
    first = dict(spec.axes)[BATCH_KEY][0]
    return [{**values, BATCH_KEY: batch} for values in combos if values[BATCH_KEY] == first
            for batch in extra.get(group_name(shape, values, budget), ())]


def _combo_label(combo: tuple[Any, ...]) -> str:
    return "(" + ", ".join(map(str, combo)) + ")" if combo else ""


def _short_count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(int(n))
