"""The train steps lower for accelerators without them: a GPU or TPU run meets no op that has no
lowering there (a host callback, a CPU-only primitive). ``jit(...).trace(...).lower(
lowering_platforms=...)`` runs XLA's platform lowering on the CPU, from abstract shapes, so not even
GPT-2 small's parameters are allocated."""

import dataclasses
import re
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


def products(text: str) -> list[tuple[list[int], ...]]:
    """Each ``stablehlo.dot_general``'s (lhs, rhs, result) as (shape + [dtype]) lists."""
    found = []
    for lhs, rhs, out in re.findall(r"stablehlo\.dot_general .*?: \(tensor<([^>]*)>, "
                                    r"tensor<([^>]*)>\) -> tensor<([^>]*)>", text):
        found.append(tuple(t.split("x") for t in (lhs, rhs, out)))
    return found


def test_a_bf16_step_multiplies_in_bf16_outside_attention(gpt2_small):
    """GPT-2 small's bf16 step, lowered for a GPU: every matrix product but attention's
    (cuDNN's fused kernel there) takes bf16 operands. A float32 operand is an upcast weight or
    gradient, a GEMM at half the bf16 rate or less: the head's backward products (the largest,
    over the 50k vocabulary) were float32 until the projection's backward rounded the float32
    logits' gradient to bf16. Parameters and Adam's moments stay float32 (updates of ~1e-3 of a
    weight vanish in bf16)."""
    graphdef, state, tx, schedule = abstract(gpt2_small)
    text = lowered_text(jax.jit(make_train_step(gpt2_small, graphdef, tx, schedule),
                                donate_argnums=0).trace(state, batch_of(gpt2_small)), "cuda")
    seq, vocab = str(gpt2_small.data.seq_len), str(gpt2_small.model.vocab_size)
    attention = [p for p in products(text) if any(t.count(seq) >= 2 for t in p)]
    others = [p for p in products(text) if p not in attention]
    assert attention and len(others) > 6 * gpt2_small.model.n_layers
    assert sum(vocab in p[0] + p[1] for p in others) == 3  # the head: forward, dx, dW
    assert all(p[0][-1] == p[1][-1] == "bf16" for p in others), \
        [p for p in others if p[0][-1] != "bf16" or p[1][-1] != "bf16"]
    assert {str(leaf.dtype) for leaf in jax.tree.leaves(state.params)} == {"float32"}
    assert {str(leaf.dtype) for leaf in jax.tree.leaves(state.opt_state)} <= {"float32", "int32"}


def test_the_train_step_donates_the_whole_state():
    """The run's jitted train step (attnlab/train/programs.py) updates the state in place:
    every parameter and optimizer buffer is aliased to an output, so no second copy exists."""
    from attnlab.train.programs import build_programs
    from attnlab.train.sharding import make_mesh

    cfg = from_config_dict(parse(["--config=configs/tiny.py"]).config)
    programs = build_programs(cfg, make_mesh(cfg))
    accum = cfg.train.grad_accum
    batch = jax.ShapeDtypeStruct((accum, cfg.data.batch_size // accum, cfg.data.seq_len + 1),
                                 jnp.int32)
    text = programs.train_step.trace(programs.abstract_state, batch).lower().as_text()
    assert text.count("tf.aliasing_output") == len(jax.tree.leaves(programs.abstract_state))


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
