"""A property-based fuzz (hypothesis) of sweep specs: random experiment ConfigDicts (every mode,
shapes and size ladders, axes, budgets, IsoFLOP centres, learning-rate and warmup rules,
variants, ladder branches, resources), mostly close to a valid sweep and with values out of
range, of the wrong type, NaN and infinite. Each generated spec either

* is refused by ``spec_from_config_dict`` or ``plan`` with one :class:`ConfigError` (a
  :class:`SweepSpecError`) in one line whose ``field`` names a real field of the spec (a key
  the spec format has, or one the experiment gave), and nothing else is raised; or
* plans runs whose configs all pass what training checks before it builds anything
  (``attnlab.model.check`` and ``check_warmup``) and read back from their saved JSON as the
  same valid config (every number finite), with distinct run ids.

Planning only (no JAX program is traced or compiled), so the default lane runs a fixed,
derandomized sample in seconds and the slow lane many more. Numbers per profile are in
docs/design.md (reliability)."""

from __future__ import annotations

import collections
import dataclasses
import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnlab.config import DataConfig, ModelConfig, TrainConfig, check_warmup, from_config_dict
from attnlab.errors import ConfigError
from attnlab.schedules import COOLDOWN_SHAPES
from attnlab.checks import check
from attnlab.sweep import plan, spec_from_config_dict, stages
from attnlab.sweep.rules import LR_RULES, WARMUP_RULES, LearningRateRule, WarmupRule
from attnlab.sweep.sections import Branches, CentreRule, Ladder, Resources, Tune
from attnlab.sweep.modes import MODES
from attnlab.sweep.spec import _SWEEP_KEYS, _TOP_LEVEL_KEYS, FLOP_CONVENTIONS

EXAMPLES, SLOW_EXAMPLES = 300, 5000

CONFIG_SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}
SPEC_SECTIONS = {"ladder": Ladder, "learning_rate": LearningRateRule, "warmup": WarmupRule,
                 "centre": CentreRule, "resources": Resources, "branches": Branches,
                 "tune": Tune}
VARIANT_RULES = ("centre", "learning_rate", "warmup")

# Values that are wrong for most fields: out of range, non-finite, of another type.
BAD = [None, 0, -1, 2.5, math.nan, math.inf, -math.inf, "x", True, ()]

# A tiny base model (planning counts its parameters and FLOPs; nothing is built).
BASE = {"model": dict(vocab_size=257, d_model=16, n_layers=2, n_heads=2, max_len=16),
        "data": dict(seq_len=8, batch_size=2),
        "train": dict(steps=20, warmup_steps=1)}
# Base fields the fuzz varies, each with valid and invalid values.
BASE_CHOICES = {
    "model.pos_encoding": ["rope", "alibi", "learned", "none", "nosuch"],
    "model.parameterization": ["sp", "mup", "nosuch"],
    "model.mup_base_d_model": [0, 8, 16, -8],
    "model.mixer": ["softmax", "mamba", "linear", "nosuch"],
    "model.attention_window": [0, 4, -1],
    "data.seq_len": [4, 8, 16, 32, 0],
    "data.batch_size": [1, 2, 4, 0],
    "train.steps": [1, 4, 20, 0],
    "train.tokens": [0, 8, 160, 1000, -5],
    "train.warmup_steps": [0, 1, 5, 100, -1],
    "train.schedule": ["cosine", "constant", "wsd", "noam", "nosuch"],
    "train.learning_rate": [1e-3, 3e-3, 0.0, -1.0, math.nan],
    "train.eval_every": [1, 5, 200],
}
# Axis keys (including ones a shape, a rule or a mode also sets) and their values.
AXES = {
    "model.pos_encoding": [("rope", "alibi"), ("rope",), ("rope", "rope"), ("nosuch",)],
    "model.d_model": [(16, 32), (8,), (15,)],
    "model.n_layers": [(1, 2), (0,)],
    "model.n_heads": [(1, 4), (3,)],
    "model.mixer": [("softmax", "mamba"), ("nosuch",)],
    "model.parameterization": [("sp", "mup")],
    "model.nosuch": [(1, 2)],
    "data.seq_len": [(8, 16), (4,), (64,)],
    "data.batch_size": [(2, 4), (3,)],
    "train.seed": [(0, 1), (0,), (), 0, ("0",), (True,)],
    "train.learning_rate": [(1e-3, 3e-3), (math.nan,), (-1.0,)],
    "train.warmup_steps": [(0, 2), (50,)],
    "train.tokens": [(64, 160), (8,), (1,)],
    "train.steps": [(4, 8), (0,)],
    "train.schedule": [("wsd", "constant"), ("nosuch",)],
    "train.eval_every": [(2, 4)],
    "nosuch.key": [(1,)],
}
# What a variant may override, with values.
VARIANT_OVERRIDES = {
    "model.pos_encoding": ["alibi", "learned", "nosuch", 3],
    "model.mixer": ["mamba", "softmax", "nosuch"],
    "model.parameterization": ["mup", "sp"],
    "model.mup_base_d_model": [16, 8, -1],
    "model.d_model": [32, 15],
    "train.seed": [1, 2, "1"],
    "train.warmup_steps": [2, 1000],
    "train.learning_rate": [1e-2, math.inf],
    "data.seq_len": [16, 0],
    "model.nosuch": [1],
}


def maybe(valid: list, rate: int = 12, bad: list | None = None):
    """One of ``valid`` most of the time; 1 in ``rate`` draws a bad value."""
    bad = BAD if bad is None else bad
    return st.integers(0, rate - 1).flatmap(
        lambda r: st.sampled_from(bad) if r == rate - 1 else st.sampled_from(valid))


def present(p: float = 0.5):
    """Whether an optional key is given (hypothesis shrinks towards 'not given')."""
    return st.integers(0, 99).map(lambda r: r >= 100 * (1 - p))


@st.composite
def shapes(draw, n_min: int, with_lr: bool):
    n = draw(st.integers(n_min, 4))
    out = []
    for _ in range(n):
        entry = [draw(maybe([8, 16, 24, 32], 40)), draw(maybe([1, 2, 3], 40)),
                 draw(maybe([1, 2, 4], 40))]
        if with_lr:
            entry.append(draw(maybe([1e-3, 3e-3, 1e-2], 15)))
        out.append(tuple(entry))
    if draw(st.integers(0, 29)) == 0:  # a malformed entry
        out.append(draw(st.sampled_from([(16, 2), (16, 2, 2, 1e-3, 5), 16, "d16"])))
    return tuple(out)


@st.composite
def ladder(draw, with_lr: bool):
    n = draw(st.integers(1, 3))
    targets = tuple(draw(maybe([1e3, 3e3, 1e4, 3e4, 1e5], 15)) for _ in range(n))
    out = {"non_embedding_params": targets, "aspect_ratio": draw(maybe([4.0, 8, 16.0], 15)),
           "head_dim": draw(maybe([4, 8], 15))}
    if with_lr:
        out["learning_rates"] = tuple(draw(maybe([1e-3, 3e-3], 15))
                                      for _ in range(n + (draw(st.integers(0, 19)) == 0)))
    return out


@st.composite
def lr_rule(draw, rule: str):
    out: dict = {"rule": rule}
    if draw(present(0.3 if rule != "tuned" else 0.03)):  # 'tuned' takes no fields
        out["base"] = draw(maybe([1e-3, 1e-2], 8))
    if rule == "power_law":
        out["ref_params"] = draw(maybe([1e3, 1e4, 1e6], 8))
        out["exponent"] = draw(maybe([0.3, 0.5], 8, [*BAD, 2000.0]))  # 2000: overflows
    elif rule == "inverse_width":
        out["ref_d_model"] = draw(maybe([16, 64], 8))
    elif rule == "transfer":
        out["base_lr"] = draw(maybe([1e-3, 3e-3], 8))
        if draw(present(0.1)):
            out["report"] = draw(st.sampled_from(["nosuch.json", 3]))
        if draw(present(0.1)):
            out["tuned_d_model"] = draw(maybe([16, 32], 4))
    if draw(present(0.05)):  # a key of another rule
        out[draw(st.sampled_from(["ref_params", "base_lr", "tuned_d_model", "nosuch"]))] = 1
    return out


@st.composite
def warmup_rule(draw, rule: str):
    out: dict = {"rule": rule}
    if rule == "fraction" or draw(present(0.05)):
        out["fraction"] = draw(maybe([0.05, 0.1, 0.5], 8, [*BAD, 1.0, 1.5]))
    if rule == "tokens_per_param" or draw(present(0.05)):
        out["tokens_per_param"] = draw(maybe([0.01, 0.1, 1.0], 8))
    return out


@st.composite
def centre(draw):
    out = {"n_opt": draw(maybe([1e3, 1e4, 3e4], 10)), "budget": draw(maybe([3e7, 1e8], 10))}
    if draw(present(0.5)):
        out["exponent"] = draw(maybe([0.5, 0.3], 10))
    if draw(present(0.5)):
        out["span"] = draw(maybe([2.0, 3.0, 10.0], 10, [*BAD, 1.0, 0.5]))
    if draw(present(0.03)):
        del out[draw(st.sampled_from(["n_opt", "budget"]))]  # a required key missing
    return out


@st.composite
def branches(draw):
    out: dict = {}
    which = draw(st.sampled_from(["tokens_per_param", "tokens", "both", "neither"]
                                 if draw(present(0.1)) else ["tokens_per_param", "tokens"]))
    n = draw(st.integers(1, 3))
    if which in ("tokens_per_param", "both"):
        out["tokens_per_param"] = tuple(draw(maybe([0.01, 0.02, 0.05, 0.1], 15))
                                        for _ in range(n))
    if which in ("tokens", "both"):
        out["tokens"] = tuple(draw(maybe([64, 160, 320, 640, 1e9], 15)) for _ in range(n))
    if draw(present(0.3)):
        out["params"] = draw(maybe(["total", "non_embedding"], 6, [*BAD, "active"]))
    if draw(present(0.3)):
        out["cooldown"] = draw(maybe(list(COOLDOWN_SHAPES), 6, [*BAD, "exp"]))
    if draw(present(0.3)):
        out["fraction"] = draw(maybe([0.2, 0.5], 8, [*BAD, 1.0]))
    return out


@st.composite
def axes(draw):
    keys = draw(st.lists(st.sampled_from(sorted(AXES)), max_size=2, unique=True))
    out: dict = collections.defaultdict(dict)
    for key in keys:
        section, name = key.split(".")
        out[section][name] = draw(st.sampled_from(AXES[key]))
    return dict(out)


@st.composite
def variants(draw):
    out = {}
    for name in draw(st.lists(st.sampled_from(["a", "b", "mamba", "1x"]), min_size=1,
                              max_size=3, unique=True)):
        body: dict = collections.defaultdict(dict)
        for key in draw(st.lists(st.sampled_from(sorted(VARIANT_OVERRIDES)), max_size=2,
                                 unique=True)):
            section, field = key.split(".")
            body[section][field] = draw(st.sampled_from(VARIANT_OVERRIDES[key]))
        if draw(present(0.15)):
            body["learning_rate"] = draw(lr_rule(draw(maybe(list(LR_RULES), 8, ["nosuch"]))))
        if draw(present(0.15)):
            body["warmup"] = draw(warmup_rule(draw(maybe(list(WARMUP_RULES), 8, ["nosuch"]))))
        if draw(present(0.1)):
            body["centre"] = draw(centre())
        if draw(present(0.03)):
            body[draw(st.sampled_from(["nosuch", "sweep"]))] = {"x": 1}
        out[name] = dict(body) if body or draw(present(0.5)) else None
    return out


@st.composite
def tune(draw):
    """``sweep.tune``: proxies, a learning-rate grid, seeds, steps; valid, or one field bad."""
    widths = draw(st.lists(st.sampled_from([8, 16, 32]), min_size=1, max_size=3, unique=True))
    out: dict = {"shapes": tuple((w, draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2])))
                                 for w in widths),
                 "learning_rates": draw(st.sampled_from([(1e-3, 2e-3, 4e-3),
                                                         (2e-3, 4e-3, 8e-3, 1.6e-2)])),
                 "steps": draw(st.sampled_from([2, 4, 10]))}
    if draw(present(0.5)):
        out["seeds"] = draw(st.sampled_from([(0,), (0, 1)]))
    if draw(present(0.2)):
        key, bad = draw(st.sampled_from([
            ("shapes", ((8, 0, 2),)), ("shapes", ()), ("shapes", ((8, 1, 1), (8, 2, 2))),
            ("learning_rates", (1e-3, 2e-3)), ("learning_rates", (4e-3, 2e-3, 1e-3)),
            ("seeds", (0, 0)), ("seeds", (-1,)), ("steps", 0), ("nosuch", 1)]))
        out[key] = bad
    return out


@st.composite
def experiments(draw):
    """An experiment's ConfigDict (as a plain dict): a sweep of one mode, its mode's parts
    mostly present and valid, anything else optional."""
    base = {k: dict(v) for k, v in BASE.items()}
    for key, values in BASE_CHOICES.items():
        if draw(st.integers(0, 24)) == 0:
            section, name = key.split(".")
            base[section][name] = draw(st.sampled_from(values))
    mode = draw(maybe(list(MODES), 30, ["nosuch", 3]))
    sweep: dict = {"mode": mode}
    lr = draw(maybe(list(LR_RULES), 20, ["nosuch"]))
    mup = base["model"].get("parameterization") == "mup" or lr == "transfer"
    if mup and draw(present(0.8)):  # mostly a valid muP model (transfer applies only there)
        base["model"].update(parameterization="mup", mup_base_d_model=16, attention_scale="mup")
    use_ladder = draw(present(0.3))
    n_min = 2 if mode == "isoflop" else 1
    if use_ladder:
        sweep["ladder"] = draw(ladder(with_lr=lr == "per_shape"))
    if not use_ladder or draw(present(0.03)):
        if lr in ("power_law", "inverse_width", "per_shape", "transfer") or draw(present(0.6)):
            sweep["shapes"] = draw(shapes(n_min, with_lr=lr == "per_shape"))
    if lr != "fixed" or draw(present(0.2)):
        sweep["learning_rate"] = draw(lr_rule(lr))
    if draw(present(0.4)):
        rules = ["fixed", "tokens_per_param"] if mode == "ladder" else list(WARMUP_RULES)
        sweep["warmup"] = draw(warmup_rule(draw(maybe(rules, 20, ["fraction", "nosuch"]))))
    if mode == "isoflop" or draw(present(0.03)):
        sweep["budgets"] = draw(st.lists(maybe([1e7, 3e7, 1e8, 3e8], 15, [*BAD, 1e3, 1e30]),
                                         min_size=1, max_size=3).map(tuple))
        if draw(present(0.3)):
            sweep["centre"] = draw(centre())
        if draw(present(0.3)):
            sweep["min_steps"] = draw(maybe([1, 2, 5], 8))
        if draw(present(0.3)):
            sweep["flops_per_token"] = draw(maybe(list(FLOP_CONVENTIONS), 8, ["nosuch", 1]))
    if mode == "ladder" or draw(present(0.03)):
        sweep["branches"] = draw(branches())
    if lr == "tuned" and draw(present(0.9)) or draw(present(0.02)):
        sweep["tune"] = draw(tune())
    if mode == "curves" or draw(present(0.03)):
        sweep["curve_points"] = draw(maybe([1, 2, 5], 10, [*BAD, 1000]))
    if draw(present(0.6)):
        sweep["axes"] = draw(axes())
    if draw(present(0.25)):
        sweep["variants"] = draw(variants())
        if draw(present(0.3)):
            sweep["baseline"] = draw(st.sampled_from(["a", "b", "mamba", "nosuch", 3]))
        if draw(present(0.2)):
            sweep["variant_column"] = draw(st.sampled_from(["arch", "status", "a b", 3]))
    if draw(present(0.1)):
        sweep["resources"] = {"cpus": draw(maybe([1, 2.0], 4)), "gpus": draw(maybe([0, 1], 4))}
    if draw(present(0.05)):
        sweep["name"] = draw(st.sampled_from(["fuzz", "", 3]))
    if draw(present(0.02)):
        sweep[draw(st.sampled_from(["nosuch", "shape", "axis"]))] = 1
    raw = {"scale": draw(maybe(["cpu", "gpu"], 30, ["tpu", 3])), "base": base, "sweep": sweep}
    if draw(present(0.01)):
        raw["nosuch"] = 1
    return raw


def _field_names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def real_field(field: str, raw: dict) -> bool:
    """Whether ``field`` names a field of the spec format, or a key the experiment gave (an
    unknown key is named as written): ``sweep.axes.model.d_model``, ``sweep.shapes[1]``,
    ``sweep.variants.a.model.mixer``, ``base.train.warmup_steps`` ..."""
    parts = re.sub(r"\[(\d+)\]", r".[\1]", field).split(".")
    head, rest = parts[0], parts[1:]
    if head not in _TOP_LEVEL_KEYS:
        return head in raw and not rest
    if not rest or head == "scale":
        return not rest
    if head == "base":
        return _config_field(rest, raw["base"])
    key, rest = rest[0], rest[1:]
    given = raw["sweep"]
    if key not in _SWEEP_KEYS:
        return key in given and not rest
    if not rest:
        return True
    if key in SPEC_SECTIONS:
        return len(rest) == 1 and (rest[0] in _field_names(SPEC_SECTIONS[key])
                                   or rest[0] in (given.get(key) or {}))
    if key == "shapes":
        index = re.fullmatch(r"\[(\d+)\]", rest[0])
        return (index is not None and int(index[1]) < len(given.get("shapes", ()))
                and rest[1:] in ([], ["learning_rate"]))
    if key == "axes":
        return _config_field(rest, given.get("axes") or {})
    if key == "variants":
        name, rest = rest[0], rest[1:]
        body = (given.get("variants") or {}).get(name, ...)
        if body is ...:
            return False
        if not rest:
            return True
        if rest[0] in VARIANT_RULES:
            return len(rest) <= 2 and (len(rest) == 1 or rest[1] in _field_names(
                SPEC_SECTIONS[rest[0]]) or rest[1] in (body or {}).get(rest[0], {}))
        return _config_field(rest, body or {})
    return False


def _config_field(parts: list[str], given: dict) -> bool:
    """``section`` or ``section.key`` of a train config, or as the experiment wrote it."""
    section = parts[0]
    if section not in CONFIG_SECTIONS and section not in given:
        return False
    if len(parts) == 1:
        return True
    known = _field_names(CONFIG_SECTIONS[section]) if section in CONFIG_SECTIONS else set()
    return len(parts) == 2 and (parts[1] in known or parts[1] in (given.get(section) or {}))


OUTCOMES: collections.Counter = collections.Counter()


def check_one(raw: dict) -> None:
    """The property: one SweepSpecError / ConfigError naming a real field in one line, or runs
    whose configs training accepts."""
    try:
        spec = spec_from_config_dict(raw)
        # A tuned sweep: its tuning runs, then its study at placeholder rates.
        runs = sum(stages.planned_stages(spec), []) if spec.tune else plan(spec)
    except ConfigError as e:
        assert real_field(e.field, raw), f"names no field of the spec: {e.field!r} ({e})"
        assert "\n" not in str(e), str(e)
        # the field as the user knows it, without list indices
        field = re.sub(r"\[\d+\]", "[i]", e.field)
        OUTCOMES[f"refused: {field}"] += 1
        return
    assert runs, "a spec that plans no runs is refused"
    assert len({r.run_id for r in runs}) == len(runs)
    for run in runs:
        check(run.cfg)
        check_warmup(run.cfg.train, run.cfg.total_steps)
        assert run.cfg.total_steps >= 1 and run.cfg.name == run.run_id
        # what the worker reads back from the run's config.json: the same, valid config
        assert from_config_dict(run.cfg.to_dict()) == run.cfg
    OUTCOMES[f"planned: {spec.mode}"] += 1


def _fuzz(examples: int):
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much])
    @given(experiments())
    def fuzz(raw):
        check_one(raw)

    OUTCOMES.clear()
    fuzz()
    return OUTCOMES


def _report(capsys, name: str, outcomes) -> None:
    planned = {k: n for k, n in outcomes.items() if k.startswith("planned")}
    with capsys.disabled():
        print(f"\n{name}: {sum(outcomes.values())} examples, {sum(planned.values())} planned; "
              + ", ".join(f"{k} x{n}" for k, n in outcomes.most_common()))
    # not vacuous: every mode plans runs, and specs are refused for many fields
    assert set(planned) == {f"planned: {mode}" for mode in MODES}, outcomes
    assert len(outcomes) - len(planned) >= 10, outcomes


def test_sweep_spec_fuzz(capsys):
    _report(capsys, "sweep specs", _fuzz(EXAMPLES))


@pytest.mark.fuzz  # the same contract as the short run, which CI's slow lane runs
def test_sweep_spec_fuzz_long(capsys):
    _report(capsys, "sweep specs (long)", _fuzz(SLOW_EXAMPLES))


# -- what the fuzz found, as named regressions


def _spec(mode: str = "grid", **sweep) -> dict:
    """A valid experiment of ``mode`` on the tiny base, with ``sweep`` keys replaced."""
    parts = {"grid": {"shapes": ((16, 1, 2), (32, 2, 2))},
             "isoflop": {"shapes": ((16, 1, 2), (32, 2, 2)), "budgets": (3e7, 1e8)},
             "curves": {"shapes": ((16, 1, 2),), "curve_points": 2},
             "ladder": {"shapes": ((16, 1, 2),), "branches": {"tokens": (160, 320)}}}[mode]
    return {"base": {k: dict(v) for k, v in BASE.items()},
            "sweep": {"mode": mode, **parts, **sweep}}


def _refused(raw: dict) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        plan(spec_from_config_dict(raw))
    assert real_field(e.value.field, raw) and "\n" not in str(e.value), e.value
    return e.value


@pytest.mark.parametrize("mode", MODES)
def test_regression_the_tiny_specs_of_the_regressions_plan(mode):
    check_one(_spec(mode))  # so that each refusal below is the change's doing


@pytest.mark.parametrize("rules, field", [
    ({"learning_rate": {"rule": "power_law", "ref_params": 0.0, "exponent": 0.5}},
     "sweep.variants.b.learning_rate.ref_params"),  # was ZeroDivisionError in plan
    ({"learning_rate": {"rule": "per_shape"}},
     "sweep.variants.b.learning_rate.rule"),  # was TypeError: shapes carry no rates
    ({"learning_rate": {"rule": "inverse_width"}},
     "sweep.variants.b.learning_rate.ref_d_model"),  # was named after the sweep's rule
    ({"warmup": {"rule": "fraction", "fraction": 0.0}},
     "sweep.variants.b.warmup.fraction"),  # was planned (warmup 1 step), fraction unchecked
])
def test_regression_a_variants_own_rules_are_checked_as_the_sweeps_are(rules, field):
    """Found by the fuzz: the check of each variant's sweep (its own learning-rate, warmup and
    centre rules with the sweep's shapes and mode) sat after a ``raise``, so it never ran; a
    variant's rule reached the planner unchecked. The variant's field is now named."""
    raw = _spec(variants={"a": {"train": {"seed": 1}}, "b": {"train": {"seed": 2}, **rules}})
    assert _refused(raw).field == field


@pytest.mark.parametrize("where, value, field", [
    ("budgets", (math.inf,), "sweep.budgets"),  # was OverflowError (round(inf))
    ("ladder", {"non_embedding_params": (math.inf,), "aspect_ratio": 8, "head_dim": 8},
     "sweep.ladder.non_embedding_params"),  # was ValueError (log of 0)
    ("branches", {"tokens": (160, math.inf)}, "sweep.branches.tokens"),  # was OverflowError
    ("shapes", ((16, 1, 2, math.inf),), "sweep.shapes[0].learning_rate"),  # ran with lr inf
])
def test_regression_infinite_numbers_of_a_spec_are_refused(where, value, field):
    """Found by the fuzz: the spec's own number checks (``x > 0``) let infinity through, so an
    infinite budget or token count crashed the planner and an infinite per-shape learning rate
    was planned (a config the run's own config.json then refuses). Now refused, named."""
    mode = {"budgets": "isoflop", "branches": "ladder"}.get(where, "grid")
    raw = _spec(mode, **{where: value})
    if where == "ladder":
        del raw["sweep"]["shapes"]
    elif where == "shapes":
        raw["sweep"]["learning_rate"] = {"rule": "per_shape"}
    assert _refused(raw).field == field


def test_regression_a_learning_rate_rule_that_overflows_is_refused():
    """Found by the fuzz: power_law with a large exponent overflowed Python's float power
    (OverflowError from the planner). Now one line naming sweep.learning_rate, as a rate that
    underflows to 0 is."""
    for ref_params, exponent in ((1e6, 2000.0), (1.0, 2000.0)):
        raw = _spec(learning_rate={"rule": "power_law", "ref_params": ref_params,
                                   "exponent": exponent})
        assert _refused(raw).field == "sweep.learning_rate"


def test_regression_a_ladder_skips_depths_the_base_model_refuses():
    """Found by the default profile (shrunk to a one-target ladder, head_dim 4, on a muP base
    model of base width 16): the ladder's search tried d_model 12 with 3 heads, whose muP base
    width 16 does not divide by the heads, and the model's ConfigError escaped the planner
    naming ``model.mup_base_d_model`` (no field of the spec). Such depths are now skipped; a
    ladder with no depth the model takes is refused naming sweep.ladder."""
    base = {k: dict(v) for k, v in BASE.items()}
    base["model"].update(parameterization="mup", mup_base_d_model=16, attention_scale="mup")
    raw = {"base": base, "sweep": {"mode": "grid", "ladder": {
        "non_embedding_params": (1000.0,), "aspect_ratio": 4.0, "head_dim": 4}}}
    check_one(raw)
    (run,) = plan(spec_from_config_dict(raw))
    assert run.cfg.model.mup_base_d_model % run.cfg.model.n_heads == 0
    # head_dim 2 at aspect ratio 4: 2 * depth heads, an even count, which 15 never divides
    base["model"].update(mup_base_d_model=15, n_heads=1)
    raw["sweep"]["ladder"]["head_dim"] = 2
    assert _refused(raw).field == "sweep.ladder"


@st.composite
def tuned_experiments(draw):
    """A sweep with a tuning stage: a valid base, muP or not, maybe variants, a drawn tune."""
    base = {k: dict(v) for k, v in BASE.items()}
    if draw(present(0.5)):
        base["model"].update(parameterization="mup", mup_base_d_model=16, attention_scale="mup")
    mode = draw(st.sampled_from(["grid", "isoflop", "curves"]))
    sweep: dict = {"mode": mode, "shapes": draw(shapes(2 if mode == "isoflop" else 1, False)),
                   "learning_rate": {"rule": "tuned"}, "tune": draw(tune())}
    if mode == "isoflop":
        sweep["budgets"] = (3e7, 1e8)
    if mode == "curves":
        sweep["curve_points"] = 2
    if draw(present(0.4)):
        sweep["variants"] = draw(variants())
    return {"scale": "cpu", "base": base, "sweep": sweep}


def test_tuned_sweep_spec_fuzz(capsys):
    """The property of check_one for sweeps with a tuning stage (sweep.tune), some planned."""
    @settings(max_examples=EXAMPLES // 3, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(tuned_experiments())
    def fuzz(raw):
        check_one(raw)

    OUTCOMES.clear()
    fuzz()
    with capsys.disabled():
        print(f"\ntuned sweep specs: {dict(OUTCOMES.most_common())}")
    assert sum(n for k, n in OUTCOMES.items() if k.startswith("planned")) >= 10, OUTCOMES
    assert any(k.startswith("refused: sweep.tune") for k in OUTCOMES), OUTCOMES
