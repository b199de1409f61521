"""The train steps lower for accelerators without them: a GPU or TPU run meets no op that has no
lowering there (a host callback, a CPU-only primitive). ``jit(...).trace(...).lower(
lowering_platforms=...)`` runs XLA's platform lowering on the CPU, from abstract shapes, so not even
GPT-2 small's parameters are allocated."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from attnlab.cli_flags import parse
from attnlab.config import from_config_dict
from attnlab.train.ensemble import make_ensemble_step, stack
from attnlab.train.optimizer import optimizer_for
from attnlab.train.state import abstract_model, abstract_train_state
from attnlab.train.step import make_train_step

PLATFORMS = ("cuda", "tpu")


def abstract(cfg):
    """``(graphdef, abstract train state, optimizer, schedule)`` of ``cfg``, nothing allocated."""
    graphdef, _ = abstract_model(cfg)
    tx, schedule = optimizer_for(cfg)
    state = abstract_train_state(cfg, tx)
    return graphdef, state, tx, schedule


def batch_of(cfg, *lead):
    accum = cfg.train.grad_accum
    return jax.ShapeDtypeStruct((*lead, accum, cfg.data.batch_size // accum,
                                 cfg.data.seq_len + 1), jnp.int32)


def lowered_text(traced, platform: str) -> str:
    return traced.lower(lowering_platforms=(platform,)).as_text()


@pytest.fixture(scope="module")
def gpt2_small():
    return from_config_dict(parse(["--config=configs/gpt2_small.py"]).config)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_gpt2_small_train_step_lowers_for(platform, gpt2_small):
    graphdef, state, tx, schedule = abstract(gpt2_small)
    traced = jax.jit(make_train_step(gpt2_small, graphdef, tx, schedule),
                     donate_argnums=0).trace(state, batch_of(gpt2_small))
    text = lowered_text(traced, platform)
    # bf16 compute reached the lowered program, and no host callback did
    assert "bf16" in text and "callback" not in text


@pytest.mark.parametrize("members", ["vmap", "map"])
@pytest.mark.parametrize("platform", PLATFORMS)
def test_an_ensemble_step_lowers_for(platform, members, gpt2_small):
    small = dataclasses.replace(gpt2_small, model=dataclasses.replace(
        gpt2_small.model, d_model=64, n_layers=2, n_heads=2, vocab_size=512, max_len=128),
        data=dataclasses.replace(gpt2_small.data, seq_len=128, batch_size=8, bpe_vocab_size=512),
        train=dataclasses.replace(gpt2_small.train, grad_accum=1))
    cfgs = [dataclasses.replace(small, train=dataclasses.replace(small.train, seed=s,
                                                                 learning_rate=lr))
            for s, lr in [(0, 1e-3), (1, 1e-3), (2, 2e-3), (3, 2e-3)]]
    graphdef, state, _, _ = abstract(small)
    states = jax.eval_shape(lambda s: stack([s] * len(cfgs)), state)
    step = make_ensemble_step(cfgs, graphdef, members=members)
    traced = jax.jit(step, donate_argnums=0).trace(
        states, batch_of(small, len(cfgs)), jax.ShapeDtypeStruct((len(cfgs),), jnp.bool_))
    text = lowered_text(traced, platform)
    assert "bf16" in text and "callback" not in text
    # the member axis leads the stacked parameters in the lowered program
    assert "tensor<4x512x64xf32>" in text


@pytest.mark.slow
def test_gpu_benchmark_runs_its_smoke_stand_in_on_cpu():
    """benchmarks/gpu.py is meant for the first GPU machine lent: its code paths (config file,
    cuDNN on/off, ensembles) must already run, here on a tiny stand-in."""
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(repo / "benchmarks" / "gpu.py"), "--smoke",
                          "--ks", "1,2"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| cuDNN on (xla) |" in out.stdout and "| cuDNN off (einsum) |" in out.stdout
    assert "| k=2 map |" in out.stdout and "| k=2 vmap |" in out.stdout
