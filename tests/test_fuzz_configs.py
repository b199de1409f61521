"""A property-based fuzz (hypothesis) of the whole config space: every field of the model, data
and train sections, every registry choice, and values out of range, of the wrong type, NaN and
infinite. Each generated config either

* is refused by ``from_config_dict`` / ``check`` with one :class:`ConfigError` whose ``field``
  names a real field (``section.name``), and nothing else is raised; or
* builds a tiny model whose forward pass, one train step (loss, gradient norm and updated
  parameters) and, for the decoder, KV-cache decoding are finite, with decoding equal to the
  full forward pass.

Fields are drawn from the dataclasses themselves, so a field or registry entry added later is
fuzzed without touching this file. Running a config means compiling it (seconds each on a CPU),
so each lane has two profiles: many configs traced (shapes and every exception up to XLA, no
compilation) and a few run. The default lane trains a fixed, derandomized sample of the first
objective's configs; the slow lane (CI) the traced sample (a few per objective and registry
choice) and the other objectives' runs; the long lanes (``-m fuzz``, by hand: half an hour and
more on two cores, too long for CI) many more. Numbers per profile are in docs/design.md (reliability)."""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnlab.config import (DTYPES, Config, DataConfig, ModelConfig, TrainConfig,
                            check_warmup, from_config_dict)
from attnlab.checks import check
from attnlab.data import icl_regression, sources
from attnlab.data.tokenizer import TOKENIZERS
from attnlab.errors import ConfigError
from attnlab.schedules import SCHEDULES
from attnlab.model import apply, decode_step, init_model, init_state, resolve
from attnlab.model import moe_dispatch
from attnlab.model.architecture import REMATS, SELECTORS
from attnlab.model.attention import IMPLEMENTATIONS
from attnlab.train.optimizer import optimizer_for
from attnlab.train.state import TrainState, abstract_model
from attnlab.train.step import make_train_step

# Examples per profile: traced (shapes only, nothing compiled) and run (compiled and run, per
# objective: each kind of model is run whatever the draw; the long one per objective and registry
# choice).
TRACED_EXAMPLES_PER_CHOICE, RUN_EXAMPLES_PER_OBJECTIVE = 1, 3
SLOW_TRACED_EXAMPLES, SLOW_RUN_EXAMPLES_PER_CHOICE = 1000, 2

SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}

# Values for the fields whose size sets the cost of a run (kept tiny) or whose valid set is
# known; out-of-range and wrong-typed values included. Every other field gets values by type.
CHOICES: dict[str, list] = {
    "model.vocab_size": [256, 257, 300, 100, 0],
    "model.d_model": [8, 12, 16, 32, 0, -8, 2.5, "16"],
    "model.n_layers": [1, 2, 3, 0, -1],
    "model.n_heads": [1, 2, 3, 4, 0],
    "model.n_kv_heads": [None, 1, 2, 3, 0],
    "model.d_ff": [None, 8, 24, 0, -4],
    "model.max_len": [4, 8, 16, 64, 0],
    "model.attention_chunk": [0, 2, 3, 8, -1],
    "model.attention_window": [0, 1, 3, 8, -2],
    "model.attention_global_tokens": [0, 1, 2, -1],
    "model.attention_every": [0, 1, 2, 5, -1],
    "model.mixer_features": [1, 4, 8, 0],
    "model.mixer_chunk": [1, 3, 8, 0],
    "model.ssm_state": [1, 4, 0],
    "model.ssm_expand": [1, 2, 0],
    "model.ssm_conv": [1, 2, 4, 0],
    "model.t5_num_buckets": [1, 4, 32, 0],
    "model.t5_max_distance": [1, 8, 128, 0],
    "model.rope_factor": [0.5, 1.0, 2.0, 4.0, 0.0, -1.0, math.nan, math.inf],
    "model.rope_original_len": [0, 8, 16, -1],
    "model.rope_scaling": ["none", "pi", "yarn", "ntk?"],
    "model.rope_theta": [10000.0, 100.0, 1.0, 0.0, -1.0, math.nan, math.inf],
    "model.norm_eps": [1e-5, 1e-2, 0.0, -1.0, math.nan],
    "model.init_std": [0.02, 0.5, 0.0, -1.0, math.nan, math.inf],
    "model.cosine_tau_init": [10.0, 1.0, 0.0, -1.0, math.nan],
    "model.dropout": [0.0, 0.1, 0.5, 1.0, 1.5, -0.1, math.nan],
    "model.dtype": [*DTYPES, "float16"],
    "model.attention_impl": [*IMPLEMENTATIONS, "flash"],
    "model.remat": [*REMATS, "all"],
    "data.source": [*sources.SOURCES, "tfds:lm1b/text", "nosuch"],
    "data.tokenizer": [*TOKENIZERS, "sentencepiece"],
    "data.seq_len": [1, 2, 5, 8, 16, 0, -4],
    "data.batch_size": [1, 2, 4, 0],
    "train.schedule": [*SCHEDULES, "linear"],
    "train.grad_accum": [1, 2, 3, 0],
    "train.learning_rate": [3e-3, 1.0, 0.0, -1e-3, math.nan, math.inf],
    "train.steps": [1, 2, 10, 0, -1],
    "train.tokens": [0, 16, 100_000, -5],
    "train.warmup_steps": [0, 1, 5, 100, -1],
    "train.min_lr_ratio": [0.0, 0.1, 1.0, 1.5, -0.1, math.nan],
    "train.decay_fraction": [0.2, 1.0, 0.0, 1.5, math.nan],
    "train.b1": [0.9, 0.0, 0.999, 1.0, -0.1, math.nan],
    "train.b2": [0.95, 0.0, 1.0, math.nan],
    "train.eps": [1e-8, 0.0, -1.0, math.nan, math.inf],
    "train.weight_decay": [0.1, 0.0, 10.0, -1.0, math.nan, math.inf],
    "train.grad_clip": [1.0, 0.0, 1e-3, -1.0, math.nan, math.inf],
    "model.moe_experts": [1, 2, 4, 0, -1],
    "model.moe_top_k": [1, 2, 3, 0],
    "model.mup_base_d_model": [0, 8, 16, 12, -8],
    "model.input_dim": [0, 1, 3, -1],
}
for _field, _registry in SELECTORS.items():
    CHOICES.setdefault(f"model.{_field}", [*_registry, f"{getattr(ModelConfig(), _field)}_typo"])

# The defaults a fuzzed config starts from: tiny, and valid (257 ids: the masked objectives'
# [MASK] after the byte tokenizer's 256).
BASE = {"model": dict(vocab_size=257, d_model=16, n_layers=2, n_heads=2, max_len=16),
        "data": dict(seq_len=8, batch_size=2),
        "train": dict(steps=4, warmup_steps=1)}
# An objective that reads prompts of vectors (in-context regression) starts from its task: a
# read-in of the prompts' width, 4 examples in 8 vectors.
VECTOR_BASE = {"model": dict(BASE["model"], inputs="vectors", input_dim=3),
               "data": dict(source="regression", icl_dim=3, icl_examples=4, seq_len=8,
                            batch_size=2),
               "train": dict(BASE["train"])}


def _reads_vectors(objective: str) -> bool:
    return getattr(SELECTORS["objective"].get(objective), "reads_vectors", False)


def _by_type(default):
    """Values for a field with no entry in CHOICES, from its default's type."""
    if isinstance(default, bool):
        return [True, False, 1, "yes"]
    if isinstance(default, int):
        return [0, 1, 2, -1, 3.5, "2"]
    if isinstance(default, float):
        return [0.0, 0.5, 1.0, -1.0, math.nan, math.inf, "x"]
    if isinstance(default, str):
        return ["", f"{default}_typo", 3]
    return [None, 0, 1, -1, "x"]


def field_strategy(path: str, default, rate: int):
    """``default`` most of the time (1 in ``rate`` draws another value), so that most examples
    differ from a valid config in a few fields and many of them run."""
    values = CHOICES.get(path) or _by_type(default)
    # hypothesis shrinks towards 0: a failure shrinks to the fewest fields off their defaults
    return st.integers(0, rate - 1).flatmap(
        lambda r: st.sampled_from(values) if r == rate - 1 else st.just(default))


# Every registry choice, as (selector, choice): each example sets one of them (its "focus"),
# drawn uniformly, so that every part is reached at the same rate whatever its registry's size
# (drawn only as one selector off its default among ~100 fields, a rare choice, e.g. mlm, came
# up in 1 run of 43). The objective, which decides the kind of model (decoder or not, masks,
# [MASK] ids), is drawn uniformly for every example.
OBJECTIVES = sorted(SELECTORS["objective"])
# Parts chosen by a field other than their selector: nGPT blocks by model.ngpt (it predates the
# registry; model.norm_position=ngpt is refused).
CHOSEN_BY = {("norm_position", "ngpt"): {"ngpt": True}}
FOCUS = sorted((selector, choice) for selector, registry in SELECTORS.items()
               if selector != "objective" for choice in registry)


@st.composite
def raw_configs(draw, objective: str | None = None, focus: tuple[str, str] | None = None):
    """A config as a plain dict (what ``configs/*.py`` and the command line produce):
    ``model.objective`` is ``objective`` (or drawn uniformly from the registry), one other
    registry choice is ``focus`` (or drawn uniformly over all choices), and the rest drawn by
    :func:`field_strategy`: the parts' selectors often, other fields rarely; with ~100 fields,
    about one more selector and one other field off their defaults."""
    if objective is None:
        # a typo now and then: the objective's refusal is fuzzed too
        objective = draw(st.sampled_from(OBJECTIVES * 3 + ["clm_typo"]))
    selector, choice = focus or draw(st.sampled_from(FOCUS))
    base = base_for(objective, selector, choice)
    raw = {}
    for section, cls in SECTIONS.items():
        defaults = {**dataclasses.asdict(cls()), **base[section]}
        raw[section] = {}
        for name, default in defaults.items():
            path = f"{section}.{name}"
            rate = 8 if name in SELECTORS else 80
            if section == "model" and name in SELECTORS[selector][choice].fields:
                rate = 3  # the chosen part's own fields (a window, a base width) often
            raw[section][name] = draw(field_strategy(path, default, rate))
    raw["model"].update(chosen_by(selector, choice), objective=objective)
    return raw


def chosen_by(selector: str, choice: str) -> dict:
    return CHOSEN_BY.get((selector, choice), {selector: choice})


def _refusal(raw: dict) -> ConfigError | None:
    try:
        cfg = from_config_dict(raw)
        check(cfg)
        check_warmup(cfg.train, cfg.total_steps)
    except ConfigError as e:
        return e
    return None


@functools.cache
def base_for(objective: str, selector: str, choice: str) -> dict:
    """:data:`BASE` with ``objective`` and ``selector=choice``, repaired into a config that is
    accepted where a few fields allow it: while it is refused, the field named is given the first
    of its fuzzed values that is accepted or moves the refusal to another field (muP needs
    its base width, Mamba an encoding outside attention, vectors an input size). Parts that
    exclude each other (Mamba and mlm) stay refused. Found by search, so later parts need no
    entry here; the examples of a stratum vary around it."""
    base = VECTOR_BASE if _reads_vectors(objective) else BASE
    raw = {k: dict(v) for k, v in base.items()}
    raw["model"].update(chosen_by(selector, choice), objective=objective)
    fixed = {"model.objective", *(f"model.{k}" for k in chosen_by(selector, choice))}
    for _ in range(6):
        error = _refusal(raw)
        if error is None or error.field in fixed or not _field_exists(error.field):
            break
        section, _, name = error.field.partition(".")
        values = CHOICES.get(error.field) or _by_type(
            getattr(SECTIONS[section](), name))
        for value in values:
            trial = {k: dict(v) for k, v in raw.items()}
            trial[section][name] = value
            moved = _refusal(trial)
            if moved is None or moved.field != error.field:
                raw = trial
                break
        else:
            break
        fixed.add(error.field)
    return {section: {k: v for k, v in fields.items()
                      if k != "objective" and (section, k) not in
                      {("model", s) for s in chosen_by(selector, choice)}}
            for section, fields in raw.items()}


def _field_exists(field: str) -> bool:
    section, _, name = field.partition(".")
    return section in SECTIONS and name in {f.name for f in dataclasses.fields(SECTIONS[section])}


def _finite(tree) -> bool:
    return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree))


def _tokens(cfg: Config) -> np.ndarray:
    """Windows ``[batch, seq_len + 1]`` of ids below every limit: the byte tokenizer's and the
    [MASK] id (the model's last); regression prompts ``[batch, seq_len, icl_dim + 1]``."""
    if resolve(cfg.model).objective.reads_vectors:
        return icl_regression.regression_task(cfg.data).window(0, "train", 0, cfg.data.batch_size)
    high = min(256, cfg.model.vocab_size - 1)
    return np.random.default_rng(0).integers(
        0, high, (cfg.data.batch_size, cfg.data.seq_len + 1)).astype(np.int32)


def _programs(cfg: Config):
    """``(graphdef, init, train_step, forward, decode)`` of ``cfg``, not yet compiled."""
    graphdef, _ = abstract_model(cfg)
    optimizer, schedule = optimizer_for(cfg)

    def init():
        params = init_model(cfg.model, cfg.train.seed)[1]
        return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                          opt_state=optimizer.init(params))

    train_step = make_train_step(cfg, graphdef, optimizer, schedule)
    forward = lambda params, tokens: apply(graphdef, params, tokens)  # noqa: E731
    decode = lambda params, cache, tokens, start: decode_step(  # noqa: E731
        graphdef, params, cache, tokens, start)
    return graphdef, init, train_step, forward, decode


def trace_tiny(cfg: Config) -> str:
    """Shapes only (traced, nothing compiled): init, one train step and, for the decoder, the
    forward pass and a decoding step, with the shapes their callers rely on."""
    arch = resolve(cfg.model)
    _, init, train_step, forward, decode = _programs(cfg)
    seq, batch, accum = cfg.data.seq_len, cfg.data.batch_size, cfg.train.grad_accum
    state = jax.eval_shape(init)
    row, dtype = sources.window_layout(cfg.data)
    tokens = jax.ShapeDtypeStruct((accum, batch // accum, *row), dtype)
    new_state, out = jax.eval_shape(train_step, state, tokens)
    assert jax.tree.structure(new_state) == jax.tree.structure(state)
    shapes = {k: v.shape for k, v in out.items()}
    # every step reports these scalars; a part may log more (an MoE's routing statistics)
    assert {k: shapes.get(k) for k in ("loss", "grad_norm", "lr")} == {
        "loss": (), "grad_norm": (), "lr": ()}
    if arch.objective.uses_mask or arch.decoder is not None or arch.objective.reads_vectors:
        return cfg.model.objective  # (vector decoding: tests/test_model_icl.py)
    inputs = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    logits = jax.eval_shape(forward, state.params, inputs)
    assert logits.shape == (batch, seq, cfg.model.vocab_size) and logits.dtype == jnp.float32
    cache = init_state(cfg.model, batch=batch, max_len=seq)
    one, _ = jax.eval_shape(decode, state.params, cache,
                            jax.ShapeDtypeStruct((batch, 1), jnp.int32), jnp.int32(0))
    assert one.shape == (batch, 1, cfg.model.vocab_size)
    return "clm"


def _decoding_is_exact(cfg: Config) -> bool:
    """Decoding equals the full forward pass, except with an MoE whose dispatch has a capacity
    that some tokens may overflow: "decoding equals the full forward only while nothing is
    dropped" (attnlab/model/moe.py; tests/test_model_moe.py checks both cases). Nothing can be
    dropped when every expert's capacity holds every token, in the full pass and in a step."""
    m = cfg.model
    if ("moe_dispatch" not in SELECTORS["moe"][m.moe].fields
            or not moe_dispatch.DISPATCHES[m.moe_dispatch].reads_capacity):
        return True
    batch, seq = cfg.data.batch_size, cfg.data.seq_len
    return all(moe_dispatch.capacity(t, m.moe_top_k, m.moe_experts, m.moe_capacity_factor) >= t
               for t in (batch * seq, batch))


def run_tiny(cfg: Config) -> str:
    """One forward pass, one train step and (decoders) cached decoding of ``cfg``, compiled and
    run; asserts the contracts. Returns the kind of model run."""
    arch = resolve(cfg.model)
    _, init, train_step, forward, decode = _programs(cfg)
    seq, batch, accum = cfg.data.seq_len, cfg.data.batch_size, cfg.train.grad_accum
    tokens = _tokens(cfg)
    state = jax.jit(init)()
    new_state, out = jax.jit(train_step)(state, tokens.reshape(accum, batch // accum,
                                                               *tokens.shape[1:]))
    assert _finite(out), out
    assert _finite(new_state.params), "parameters not finite after one step"
    if arch.objective.uses_mask or arch.decoder is not None or arch.objective.reads_vectors:
        return cfg.model.objective
    inputs = jnp.asarray(tokens[:, :seq])
    full = np.asarray(jax.jit(forward)(state.params, inputs))
    assert np.isfinite(full).all()
    step = jax.jit(decode)
    cache = init_state(cfg.model, batch=batch, max_len=seq)
    pieces = []
    for i in range(seq):  # one token at a time: one compiled step (prompts: test_model_decoding)
        logits, cache = step(state.params, cache, inputs[:, i:i + 1], jnp.int32(i))
        pieces.append(np.asarray(logits))
    decoded = np.concatenate(pieces, axis=1)
    assert np.isfinite(decoded).all()
    if not _decoding_is_exact(cfg):
        return "clm"
    scale = 1.0 + np.abs(full).max()
    tolerance = 3e-2 if cfg.model.dtype == "bfloat16" else 2e-4
    np.testing.assert_allclose(decoded, full, atol=tolerance * scale, rtol=0)
    return "clm"


OUTCOMES: collections.Counter = collections.Counter()
# How often each registry choice was part of an accepted (traced or run) config.
ACCEPTED_CHOICES: collections.Counter = collections.Counter()


def chosen(cfg: Config) -> list[tuple[str, str]]:
    """The registry choices of ``cfg``'s model, as (selector, choice)."""
    choices = dict((s, getattr(cfg.model, s)) for s in SELECTORS)
    for (selector, choice), fields in CHOSEN_BY.items():
        if all(getattr(cfg.model, k) == v for k, v in fields.items()):
            choices[selector] = choice
    return list(choices.items())


def check_one(raw: dict, go) -> None:
    """The property: a ConfigError naming a real field, or ``go(cfg)`` (trace or run) meeting
    its contracts."""
    try:
        cfg = from_config_dict(raw)
        check(cfg)  # what every entry point checks before anything is built
        check_warmup(cfg.train, cfg.total_steps)
    except ConfigError as e:
        assert _field_exists(e.field), f"ConfigError names no field: {e.field!r} ({e})"
        assert "\n" not in str(e), str(e)
        OUTCOMES[f"refused: {e.field}"] += 1
        return
    OUTCOMES[f"ran: {go(cfg)}"] += 1
    ACCEPTED_CHOICES.update(chosen(cfg))


def _settings(examples: int):
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def _fuzz(examples: int, go, strata=((None, None),)):
    """``examples`` configs through ``go``, split evenly over ``strata``: (objective, registry
    choice) pairs set in every config of a stratum, ``None`` for drawn (hypothesis's examples
    within one run are too alike to spread a rare choice evenly by drawing it)."""
    OUTCOMES.clear()
    ACCEPTED_CHOICES.clear()
    for objective, focus in strata:
        @_settings(max(1, examples // len(strata)))
        @given(raw_configs(objective, focus))
        def fuzz(raw):
            check_one(raw, go)

        fuzz()
    return OUTCOMES


def _report(capsys, name: str, outcomes, least: int) -> None:
    ran = sum(n for k, n in outcomes.items() if k.startswith("ran"))
    refused = sum(outcomes.values()) - ran
    fields = {k for k in outcomes if k.startswith("refused")}
    never = [f"{s}={c}" for s, c in FOCUS if not ACCEPTED_CHOICES[(s, c)]]
    with capsys.disabled():
        print(f"\n{name}: {sum(outcomes.values())} examples, {ran} accepted "
              f"({', '.join(f'{k[5:]} {n}' for k, n in outcomes.items() if k.startswith('ran'))})"
              f", {refused} refused naming {len(fields)} different fields; registry choices in "
              f"accepted configs: {len(FOCUS) - len(never)} of {len(FOCUS)}, least "
              f"{min(ACCEPTED_CHOICES[focus] for focus in FOCUS)} times; never: "
              f"{', '.join(never) or '-'}")
    assert ran >= least, outcomes  # not vacuous: examples reach the model


def _compatible(objective: str) -> list[tuple[str, str]]:
    """The registry choices that some config with ``objective`` accepts (Mamba, nGPT and
    sliding windows are decoder-only)."""
    def accepted(selector, choice):
        raw = {k: dict(v) for k, v in base_for(objective, selector, choice).items()}
        raw["model"].update(chosen_by(selector, choice), objective=objective)
        return _refusal(raw) is None
    return [focus for focus in FOCUS if accepted(*focus)]


@pytest.mark.slow
def test_config_fuzz_traced(capsys):
    """Stratified by objective and registry choice, a few examples each: every part (MoE,
    nGPT, Mamba, muP, vector read-ins, ...) is in accepted configs, so a removed cross-part
    rule shows up here, not only in the long lane."""
    strata = [(objective, focus) for objective in OBJECTIVES for focus in FOCUS]
    examples = TRACED_EXAMPLES_PER_CHOICE * len(strata)
    outcomes = _fuzz(examples, trace_tiny, strata)
    _report(capsys, "traced", outcomes, examples // 6)
    assert {k for k in outcomes if k.startswith("ran")} == {f"ran: {o}" for o in OBJECTIVES}
    trainable = {focus for objective in OBJECTIVES for focus in _compatible(objective)}
    assert all(ACCEPTED_CHOICES[focus] >= 1 for focus in trainable), ACCEPTED_CHOICES


# The default lane trains the causal objective's draws; the others' run with the slow lane.
@pytest.mark.parametrize("objective", [pytest.param(o, marks=() if o == OBJECTIVES[0]
                                                    else pytest.mark.slow) for o in OBJECTIVES])
def test_config_fuzz_run(capsys, objective):
    _report(capsys, f"run ({objective})",
            _fuzz(RUN_EXAMPLES_PER_OBJECTIVE, run_tiny, [(objective, None)]), 1)


@pytest.mark.fuzz
def test_config_fuzz_traced_long(capsys):
    """Stratified by objective and registry choice: each pair is set in the same number of
    examples, and every registry choice is part of accepted configs."""
    strata = [(objective, focus) for objective in OBJECTIVES for focus in FOCUS]
    _report(capsys, "traced (long)", _fuzz(SLOW_TRACED_EXAMPLES, trace_tiny, strata),
            SLOW_TRACED_EXAMPLES // 6)
    trainable = {focus for objective in OBJECTIVES for focus in _compatible(objective)}
    assert all(ACCEPTED_CHOICES[focus] >= 1 for focus in trainable), ACCEPTED_CHOICES
    # every choice is trainable with some objective (vector models: with regression)
    assert set(FOCUS) - trainable == set()


@pytest.mark.fuzz
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_config_fuzz_run_long(capsys, objective):
    """Stratified by registry choice: every choice the objective allows is run."""
    strata = [(objective, focus) for focus in FOCUS]
    examples = SLOW_RUN_EXAMPLES_PER_CHOICE * len(strata)
    _report(capsys, f"run (long, {objective})", _fuzz(examples, run_tiny, strata),
            examples // 6)
    assert all(ACCEPTED_CHOICES[focus] >= 1 for focus in _compatible(objective)), \
        ACCEPTED_CHOICES


# -- what the fuzz found, as named regressions


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_regression_non_finite_floats_are_refused(value):
    """Found by the run profile: NaN passed every range check (``nan <= 0`` is False), so
    ``train.learning_rate=nan`` trained to NaN parameters and ``model.rope_theta=inf`` built a
    model. Every float field of every section now refuses a non-finite value, naming it."""
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            if not str(f.type).startswith("float"):
                continue
            raw = {k: dict(v) for k, v in BASE.items()}
            raw[section][f.name] = value
            with pytest.raises(ConfigError) as e:
                from_config_dict(raw)
            assert e.value.field == f"{section}.{f.name}", (f.name, e.value)


def test_regression_a_vector_model_is_refused_for_training_on_tokens():
    """Found by the long traced profile once it was stratified by registry choice
    (model.inputs=vectors, model.input_dim=1, data.source=pystdlib): the config was accepted and
    the train step fed token ids to the vector read-in (a TypeError from dot_general; `attnlab
    train` wrote its run files first). Every corpus yields token ids, so `check` refuses a model
    that reads vectors, naming model.inputs (errors-table row train-vector-model-on-tokens)."""
    raw = {k: dict(v) for k, v in BASE.items()}
    raw["model"].update(inputs="vectors", input_dim=1)
    with pytest.raises(ConfigError) as e:
        check(from_config_dict(raw))
    assert e.value.field == "model.inputs" and "token ids" in str(e.value)


def test_regression_warmup_longer_than_the_run_is_refused_up_front():
    """Found by the long traced profile (train.warmup_steps=5 with train.steps=4): only building
    the optimizer refused it, after the corpus was prepared, and a sweep planned such runs,
    which then failed in their workers. The entry points now check it with the config
    (``check_warmup``: train, model-info, the sweep's plan; tests/test_errors_table.py,
    sweep-warmup-longer-than-runs and model-info-warmup-longer-than-run)."""
    from attnlab.sweep import load_spec, plan
    from attnlab.sweep.sections import SweepSpecError

    raw = {k: dict(v) for k, v in BASE.items()}
    raw["train"].update(steps=4, warmup_steps=5)
    with pytest.raises(ConfigError) as e:
        cfg = from_config_dict(raw)
        check_warmup(cfg.train, cfg.total_steps)
    assert e.value.field == "train.warmup_steps"
    raw["train"]["schedule"] = "noam"  # its warmup is the schedule's shape, not a phase
    cfg = from_config_dict(raw)
    check_warmup(cfg.train, cfg.total_steps)
    spec = load_spec("experiments/tiny_grid.py")
    base = dataclasses.replace(spec.base, train=dataclasses.replace(spec.base.train,
                                                                    warmup_steps=100))
    with pytest.raises(SweepSpecError, match="base.train.warmup_steps: 100 is longer"):
        plan(dataclasses.replace(spec, base=base))


def part_field_cases() -> list[tuple[str, tuple[str, str], dict]]:
    """For every registry choice, on the first objective that accepts it: each of the part's
    own fields at each of its fuzzed values, and every pair of them over their values. A part's
    rules between its own fields (top_k <= experts, a YaRN factor with its original length)
    are met at their edges here, where drawing ~100 fields rarely puts two of them off their
    defaults at once."""
    first: dict[tuple[str, str], str] = {}
    for objective in OBJECTIVES:
        for focus in _compatible(objective):
            first.setdefault(focus, objective)
    cases = []
    for (selector, choice), objective in sorted(first.items()):
        fields = [f"model.{f}" for f in SELECTORS[selector][choice].fields
                  if f"model.{f}" in CHOICES]
        groups = [(f,) for f in fields] + list(itertools.combinations(fields, 2))
        for group in groups:
            for values in itertools.product(*(CHOICES[f] for f in group)):
                cases.append((objective, (selector, choice), dict(zip(group, values))))
    return cases


@pytest.mark.slow
def test_each_parts_own_fields_are_checked_at_their_edges(capsys):
    OUTCOMES.clear()
    ACCEPTED_CHOICES.clear()
    cases = part_field_cases()
    for objective, (selector, choice), values in cases:
        raw = {k: dict(v) for k, v in base_for(objective, selector, choice).items()}
        raw["model"].update(chosen_by(selector, choice), objective=objective)
        for path, value in values.items():
            section, _, name = path.partition(".")
            raw[section][name] = value
        check_one(raw, trace_tiny)
    _report(capsys, "part fields", OUTCOMES, len(cases) // 4)
