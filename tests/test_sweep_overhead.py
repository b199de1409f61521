"""The fixed per-run cost of a sweep's runs: a new seed of a shape already trained in
the process compiles and traces nothing, and its results are those of a run trained alone."""

import concurrent.futures
import dataclasses

import jax
import numpy as np
import pytest

from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
from attnlab.train import ProgramCache, load_params, loop
from attnlab.train.programs import programs_key
from attnlab.train.sharding import make_mesh
from attnlab.train.optimizer import make_optimizer
from attnlab.train.state import init_train_state

COMPILE_EVENTS = ("/jax/core/compile/backend_compile_duration",
                  "/jax/core/compile/jaxpr_trace_duration")


def tiny(cache_dir, seed: int = 0, **model) -> Config:
    return Config(
        model=ModelConfig(**{"d_model": 32, "n_layers": 1, "n_heads": 2, "max_len": 32, **model}),
        data=DataConfig(seq_len=16, batch_size=4, max_bytes=200_000, cache_dir=str(cache_dir)),
        train=TrainConfig(steps=4, warmup_steps=1, log_every=2, eval_every=2, eval_batches=1,
                          checkpoint_every=2, seed=seed))


@pytest.fixture
def compile_events(no_compilation_cache):
    """The tracing and XLA compilations recorded while the test runs, by event name."""
    seen = []

    def listener(event, duration, **kwargs):
        if event in COMPILE_EVENTS:
            seen.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    yield seen
    jax.monitoring.unregister_event_duration_listener(listener)


def final_params(workdir):
    _, _, params = load_params(workdir)
    return [np.asarray(x) for x in jax.tree.leaves(params)]


def test_init_with_a_key_argument_is_the_seeds_init():
    # The seed used to be closed over (one program per seed); the key as an argument gives the
    # same numbers.
    cfg = tiny("unused", seed=3)
    tx, _ = make_optimizer(cfg.train, cfg.total_steps, cfg.model.d_model)
    closed = jax.jit(lambda: init_train_state(cfg, tx))()
    argument = jax.jit(lambda key: init_train_state(cfg, tx, key))(jax.random.key(3))
    for a, b in zip(jax.tree.leaves(closed), jax.tree.leaves(argument), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_programs_key_ignores_the_seed_only_without_dropout():
    a, b = tiny("d", seed=0), tiny("d", seed=1)
    assert programs_key(a) == programs_key(b)
    assert programs_key(dataclasses.replace(a, name="other")) == programs_key(a)
    assert programs_key(tiny("d", dropout=0.1)) != programs_key(
        tiny("d", seed=1, dropout=0.1))  # the dropout key comes from the seed
    assert programs_key(tiny("d", n_layers=2)) != programs_key(a)


def test_second_seed_compiles_nothing_and_matches_a_run_alone(tmp_path, compile_events):
    cache = ProgramCache()
    loop.run(tiny(tmp_path / "data", seed=0), tmp_path / "seed0", progress=False, programs=cache)
    assert "/jax/core/compile/jaxpr_trace_duration" in compile_events  # the listener hears
    jax.random.key(1)  # the key's own tiny program, once per process
    compile_events.clear()
    summary = loop.run(tiny(tmp_path / "data", seed=1), tmp_path / "seed1", progress=False,
                       programs=cache)
    assert summary["status"] == "completed"
    assert compile_events == []  # no tracing, no XLA compilation: the programs were reused

    # The same seed trained by freshly built programs (a run given no cache builds its own).
    alone = loop.run(tiny(tmp_path / "data", seed=1), tmp_path / "alone", progress=False)
    assert alone["final_val_loss"] == summary["final_val_loss"]
    for a, b in zip(final_params(tmp_path / "seed1"), final_params(tmp_path / "alone"),
                    strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(
        final_params(tmp_path / "seed0"), final_params(tmp_path / "seed1"), strict=True))


def test_programs_are_kept_for_a_few_shapes_only(tmp_path):
    cache = ProgramCache(kept=3)
    for layers in range(1, cache.kept + 2):
        cfg = tiny(tmp_path / "data", n_layers=layers)
        mesh = make_mesh(cfg)
        programs = cache.get(cfg, mesh)
        assert cache.get(cfg, mesh) is programs
    assert len(cache) == cache.kept
    first = tiny(tmp_path / "data", n_layers=1)  # the oldest shape was dropped: built again
    assert cache.get(first, make_mesh(first)) is not programs


def test_a_precompiled_run_compiles_and_traces_nothing(tmp_path, compile_events):
    # What a sweep worker does for its next run while the current one trains.
    cache = ProgramCache()
    cfg = tiny(tmp_path / "data", seed=2, n_layers=2)
    cache.precompile(cfg)
    assert "/jax/core/compile/backend_compile_duration" in compile_events
    jax.random.key(2)  # the key's own tiny program, once per process
    compile_events.clear()
    summary = loop.run(cfg, tmp_path / "run", progress=False, programs=cache)
    assert summary["status"] == "completed"
    assert compile_events == []


@pytest.mark.slow
def test_precompile_beside_a_training_run_changes_nothing(tmp_path):
    # A worker compiles its next shape in a thread while training: the run's numbers are those
    # of the run trained alone.
    alone = loop.run(tiny(tmp_path / "data"), tmp_path / "alone", progress=False)
    cache = ProgramCache()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        compiling = pool.submit(cache.precompile, tiny(tmp_path / "data", n_layers=3))
        beside = loop.run(tiny(tmp_path / "data"), tmp_path / "beside", progress=False,
                          programs=cache)
        compiling.result()
    assert beside["final_val_loss"] == alone["final_val_loss"]
    for a, b in zip(final_params(tmp_path / "alone"), final_params(tmp_path / "beside"),
                    strict=True):
        np.testing.assert_array_equal(a, b)
