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
compilation) and a few run. The default lane runs a fixed, derandomized sample; the slow lane
many more. Numbers per profile are in docs/design.md (reliability)."""

from __future__ import annotations

import collections
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnlab.config import (DATA_SOURCES, DTYPES, SCHEDULES, TOKENIZERS, Config, DataConfig,
                            ModelConfig, TrainConfig, check_warmup, from_config_dict)
from attnlab.errors import ConfigError
from attnlab.model import apply, check, decode_step, init_model, init_state, resolve
from attnlab.model.architecture import REMATS, SELECTORS
from attnlab.model.attention import IMPLEMENTATIONS
from attnlab.train.optimizer import optimizer_for
from attnlab.train.state import TrainState, abstract_model
from attnlab.train.step import make_train_step

# Examples per profile: traced (shapes only, nothing compiled) and run (compiled and run).
TRACED_EXAMPLES, RUN_EXAMPLES = 60, 8
SLOW_TRACED_EXAMPLES, SLOW_RUN_EXAMPLES = 1000, 150

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
    "data.source": [*DATA_SOURCES, "tfds:lm1b/text", "nosuch"],
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


@st.composite
def raw_configs(draw):
    """A config as a plain dict (what ``configs/*.py`` and the command line produce)."""
    raw = {}
    for section, cls in SECTIONS.items():
        defaults = {**dataclasses.asdict(cls()), **BASE[section]}
        raw[section] = {}
        for name, default in defaults.items():
            path = f"{section}.{name}"
            # the parts' selectors often (every registry choice is reached), the rest rarely:
            # with ~100 fields, about one selector and one other field off their defaults
            rate = 8 if name in SELECTORS else 80
            raw[section][name] = draw(field_strategy(path, default, rate))
    return raw


def _field_exists(field: str) -> bool:
    section, _, name = field.partition(".")
    return section in SECTIONS and name in {f.name for f in dataclasses.fields(SECTIONS[section])}


def _finite(tree) -> bool:
    return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree))


def _tokens(cfg: Config) -> np.ndarray:
    """Windows ``[batch, seq_len + 1]`` of ids below every limit: the byte tokenizer's and the
    [MASK] id (the model's last)."""
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
    tokens = jax.ShapeDtypeStruct((accum, batch // accum, seq + 1), jnp.int32)
    new_state, out = jax.eval_shape(train_step, state, tokens)
    assert jax.tree.structure(new_state) == jax.tree.structure(state)
    shapes = {k: v.shape for k, v in out.items()}
    # every step reports these scalars; a part may log more (an MoE's routing statistics)
    assert {k: shapes.get(k) for k in ("loss", "grad_norm", "lr")} == {
        "loss": (), "grad_norm": (), "lr": ()}
    if arch.objective.uses_mask or arch.decoder is not None:
        return cfg.model.objective
    inputs = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    logits = jax.eval_shape(forward, state.params, inputs)
    assert logits.shape == (batch, seq, cfg.model.vocab_size) and logits.dtype == jnp.float32
    cache = init_state(cfg.model, batch=batch, max_len=seq)
    one, _ = jax.eval_shape(decode, state.params, cache,
                            jax.ShapeDtypeStruct((batch, 1), jnp.int32), jnp.int32(0))
    assert one.shape == (batch, 1, cfg.model.vocab_size)
    return "clm"


def run_tiny(cfg: Config) -> str:
    """One forward pass, one train step and (decoders) cached decoding of ``cfg``, compiled and
    run; asserts the contracts. Returns the kind of model run."""
    arch = resolve(cfg.model)
    _, init, train_step, forward, decode = _programs(cfg)
    seq, batch, accum = cfg.data.seq_len, cfg.data.batch_size, cfg.train.grad_accum
    tokens = _tokens(cfg)
    state = jax.jit(init)()
    new_state, out = jax.jit(train_step)(state, tokens.reshape(accum, batch // accum, seq + 1))
    assert _finite(out), out
    assert _finite(new_state.params), "parameters not finite after one step"
    if arch.objective.uses_mask or arch.decoder is not None:
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
    scale = 1.0 + np.abs(full).max()
    tolerance = 3e-2 if cfg.model.dtype == "bfloat16" else 2e-4
    np.testing.assert_allclose(decoded, full, atol=tolerance * scale, rtol=0)
    return "clm"


OUTCOMES: collections.Counter = collections.Counter()


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


def _settings(examples: int):
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def _fuzz(examples: int, go):
    @_settings(examples)
    @given(raw_configs())
    def fuzz(raw):
        check_one(raw, go)

    OUTCOMES.clear()
    fuzz()
    return OUTCOMES


def _report(capsys, name: str, outcomes, least: int) -> None:
    ran = sum(n for k, n in outcomes.items() if k.startswith("ran"))
    with capsys.disabled():
        print(f"\n{name}: {sum(outcomes.values())} examples, {ran} accepted; "
              + ", ".join(f"{k} x{n}" for k, n in outcomes.most_common()))
    assert ran >= least, outcomes  # not vacuous: examples reach the model


def test_config_fuzz_traced(capsys):
    _report(capsys, "traced", _fuzz(TRACED_EXAMPLES, trace_tiny), TRACED_EXAMPLES // 6)


def test_config_fuzz_run(capsys):
    _report(capsys, "run", _fuzz(RUN_EXAMPLES, run_tiny), 1)


@pytest.mark.slow
def test_config_fuzz_traced_long(capsys):
    _report(capsys, "traced (long)", _fuzz(SLOW_TRACED_EXAMPLES, trace_tiny),
            SLOW_TRACED_EXAMPLES // 6)


@pytest.mark.slow
def test_config_fuzz_run_long(capsys):
    _report(capsys, "run (long)", _fuzz(SLOW_RUN_EXAMPLES, run_tiny), SLOW_RUN_EXAMPLES // 6)


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
