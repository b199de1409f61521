"""``model.scan_layers`` (one stacked layer run by a scan) and ``model.remat`` (layers
rematerialised in the backward pass) change how the model is computed, never what it computes.

The scanned model is checked against the unrolled one given the same per-layer parameters,
stacked here by the test itself (``stacked_like``); KV-cache decoding against the full forward
pass; each remat policy's loss and gradients against ``remat=none``'s. Tolerances are float32
rounding: the scan and the rematerialised backward evaluate the same expressions in another
fusion, so results agree to ~1e-7 relative, asserted at 1e-5.
"""

import contextlib
import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.ad_checkpoint import print_saved_residuals

from attnlab import cli
from attnlab.config import ModelConfig
from attnlab.model import (
    apply,
    count_state_params,
    decode_step,
    init_state,
    init_model,
    param_counts,
    resolve,
)
from attnlab.model.ngpt import renormalize
from attnlab.train import load_params
from attnlab.train.sharding import param_spec, state_shardings
from attnlab.train.step import mean_loss

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 32
TOL = 1e-5


def tiny_cfg(**overrides) -> ModelConfig:
    base = dict(vocab_size=VOCAB, d_model=16, n_layers=3, n_heads=4, max_len=16, init_std=0.1)
    base.update(overrides)
    return ModelConfig(**base)


def random_tokens(seed, batch=2, seq=10):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.integers(0, VOCAB, size=(batch, seq)), jnp.int32)


def stacked_like(unrolled: dict, n_layers: int) -> dict:
    """The unrolled model's parameters (a pure dict with ``blocks: {0: ..., 1: ...}``) in the
    scanned layout: each layer leaf stacked along a new leading axis."""
    layers = [unrolled["blocks"][i] for i in range(n_layers)]
    out = {k: v for k, v in unrolled.items() if k != "blocks"}
    out["blocks"] = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *layers)
    return out


def scanned_from(cfg: ModelConfig, unrolled_state) -> tuple[nnx.GraphDef, nnx.State]:
    """A scanned model (built from another seed) given the unrolled model's parameters."""
    graphdef, state = init_model(dataclasses.replace(cfg, scan_layers=True), seed=123)
    nnx.replace_by_pure_dict(state, stacked_like(nnx.to_pure_dict(unrolled_state), cfg.n_layers))
    return graphdef, state


VARIANTS = {
    "rope_pre_layernorm": {},
    "learned_post_rmsnorm_swiglu": dict(pos_encoding="learned", norm_position="post",
                                        norm="rmsnorm", ffn="swiglu", n_kv_heads=2),
    "t5_shared": dict(pos_encoding="t5", t5_num_buckets=8, t5_max_distance=16),
    "t5_per_layer": dict(pos_encoding="t5", t5_num_buckets=8, t5_max_distance=16,
                         t5_per_layer=True),
    "alibi_window_chunked": dict(pos_encoding="alibi", attention_window=4, attention_chunk=4),
    "ngpt": dict(ngpt=True, ffn="swiglu"),
    "mamba": dict(mixer="mamba", pos_encoding="none"),
    "linear": dict(mixer="linear", mixer_chunk=4),
    "mlm_encoder": dict(objective="mlm"),
}


@pytest.mark.parametrize("overrides", VARIANTS.values(), ids=list(VARIANTS))
def test_scanned_logits_equal_unrolled_with_the_same_layers(overrides):
    cfg = tiny_cfg(**overrides)
    graphdef, state = init_model(cfg, seed=0)
    scan_graphdef, scan_state = scanned_from(cfg, state)
    tokens = random_tokens(0)
    want = np.asarray(jax.jit(lambda s: apply(graphdef, s, tokens))(state))
    got = np.asarray(jax.jit(lambda s: apply(scan_graphdef, s, tokens))(scan_state))
    assert np.abs(want).max() > 0.1  # not a degenerate all-zero comparison
    np.testing.assert_allclose(got, want, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("overrides", [{}, VARIANTS["ngpt"], VARIANTS["t5_per_layer"],
                                       VARIANTS["mamba"]], ids=["gpt", "ngpt", "t5", "mamba"])
def test_the_same_seed_builds_the_same_layers_stacked(overrides):
    """scan_layers only changes the layout: seed s gives the unrolled model's layers, stacked
    (same RNG draws; nGPT's unit rows included); counts match the config's."""
    cfg = tiny_cfg(**overrides)
    _, state = init_model(cfg, seed=0)
    scan_cfg = dataclasses.replace(cfg, scan_layers=True)
    _, scan_state = init_model(scan_cfg, seed=0)
    want = stacked_like(nnx.to_pure_dict(state), cfg.n_layers)
    got = nnx.to_pure_dict(scan_state)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(b), a)
    kernel = got["blocks"]["ffn"]["w_out"]["kernel"]
    assert kernel.shape == (cfg.n_layers, resolve(cfg).ffn.width, cfg.d_model)
    counts = count_state_params(scan_state)
    expected = param_counts(scan_cfg)
    assert counts["total"] == expected["total"]
    assert counts["non_embedding"] == expected["non_embedding"]


def test_dropout_draws_the_unrolled_layers_keys():
    cfg = tiny_cfg(dropout=0.3)
    graphdef, state = init_model(cfg, seed=0)
    scan_graphdef, scan_state = scanned_from(cfg, state)
    tokens, rng = random_tokens(1), jax.random.key(7)
    want = np.asarray(apply(graphdef, state, tokens, dropout_rng=rng))
    got = np.asarray(apply(scan_graphdef, scan_state, tokens, dropout_rng=rng))
    np.testing.assert_allclose(got, want, atol=TOL, rtol=TOL)
    # ... and the masks are really drawn per layer (not one key for all): another key differs.
    other = np.asarray(apply(scan_graphdef, scan_state, tokens, dropout_rng=jax.random.key(8)))
    assert np.abs(other - got).max() > 1e-3


DECODE = {"softmax_rope_gqa": dict(n_kv_heads=2), "t5_per_layer": VARIANTS["t5_per_layer"],
          "ngpt": VARIANTS["ngpt"], "mamba": VARIANTS["mamba"], "linear": VARIANTS["linear"]}


@pytest.mark.parametrize("overrides", DECODE.values(), ids=list(DECODE))
def test_scanned_kv_cache_decoding_equals_full_forward(overrides):
    cfg = tiny_cfg(scan_layers=True, **overrides)
    graphdef, state = init_model(cfg, seed=0)
    tokens = random_tokens(2)
    full = np.asarray(jax.jit(lambda s, t: apply(graphdef, s, t))(state, tokens))
    step = jax.jit(decode_step, static_argnums=0)
    cache = init_state(cfg, batch=2, max_len=12)
    pieces = []
    for start, stop in [(0, 4)] + [(i, i + 1) for i in range(4, 10)]:  # a prompt, then tokens
        logits, cache = step(graphdef, state, cache, tokens[:, start:stop], start)
        pieces.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=2e-5)


def loss_and_grads(cfg: ModelConfig, state, tokens, rng=None):
    graphdef, _ = init_model(cfg, seed=0)
    fn = jax.jit(jax.value_and_grad(lambda p: mean_loss(graphdef, p, tokens, rng)))
    loss, grads = fn(state)
    return float(loss), nnx.to_pure_dict(grads), fn


@pytest.mark.parametrize("policy, scan", [
    ("full", True), *(pytest.param(p, s, marks=pytest.mark.slow)
                      for p, s in (("full", False), ("save_dots", False), ("save_dots", True)))],
    ids=["full-scanned", "full-unrolled", "save_dots-unrolled", "save_dots-scanned"])
def test_remat_gives_the_loss_and_gradients_of_none(policy, scan):
    cfg = tiny_cfg(scan_layers=scan, dropout=0.1, pos_encoding="t5", t5_per_layer=True,
                   t5_num_buckets=8, t5_max_distance=16)
    _, state = init_model(cfg, seed=0)
    tokens, rng = random_tokens(3, seq=11), jax.random.key(1)
    loss, grads, _ = loss_and_grads(cfg, state, tokens, rng)
    remat_cfg = dataclasses.replace(cfg, remat=policy)
    remat_loss, remat_grads, fn = loss_and_grads(remat_cfg, state, tokens, rng)
    np.testing.assert_allclose(remat_loss, loss, rtol=TOL)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(remat_grads)):
        assert np.abs(a).max() > 0 or np.abs(b).max() == 0
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=TOL, rtol=TOL)
    # The policy is really in the program: the gradient's jaxpr holds jax.checkpoint's
    # primitive (remat2), which the program of remat=none has not.
    assert "remat2[" in str(jax.make_jaxpr(fn)(state))
    none_fn = loss_and_grads(cfg, state, tokens, rng)[2]
    assert "remat2[" not in str(jax.make_jaxpr(none_fn)(state))


def test_remat_of_the_encoder_decoder_gives_the_gradients_of_none():
    cfg = tiny_cfg(objective="span", vocab_size=VOCAB + 1, d_model=16, n_layers=2)
    _, state = init_model(cfg, seed=0)
    tokens = random_tokens(4, seq=17)
    loss, grads, _ = loss_and_grads(cfg, state, tokens)
    remat_loss, remat_grads, fn = loss_and_grads(dataclasses.replace(cfg, remat="full"), state,
                                                 tokens)
    np.testing.assert_allclose(remat_loss, loss, rtol=TOL)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(remat_grads)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=TOL, rtol=TOL)
    assert "remat2[" in str(jax.make_jaxpr(fn)(state))


def test_ngpt_renormalises_each_layer_of_a_stacked_matrix():
    cfg = tiny_cfg(ngpt=True, ffn="swiglu")
    _, state = init_model(cfg, seed=0)
    params = nnx.to_pure_dict(state)
    perturbed = jax.tree.map(lambda x: x * (1.0 + 0.5 * np.arange(x.size).reshape(x.shape)
                                            / x.size), params)
    want = stacked_like(renormalize(perturbed), cfg.n_layers)
    got = renormalize(stacked_like(perturbed, cfg.n_layers))
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6)
    rows = np.linalg.norm(np.asarray(got["blocks"]["attn"]["o_proj"]["kernel"]), axis=2)
    np.testing.assert_allclose(rows, 1.0, rtol=1e-6)  # o_proj [layers, in, d_model]: axis 2


def test_fsdp_never_splits_the_layer_axis():
    assert param_spec((8, 32, 16), 8, stacked=True) == jax.sharding.PartitionSpec(None, "fsdp",
                                                                                  None)
    assert param_spec((64, 32, 16), 8, stacked=True)[0] is None
    assert param_spec((64, 32, 16), 8)[0] == "fsdp"  # unrolled tensors keep the plain rule
    cfg = tiny_cfg(scan_layers=True, n_layers=8, d_model=16)
    _, state = init_model(cfg, seed=0)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "fsdp"))
    specs = state_shardings(jax.eval_shape(lambda: state), mesh)
    kernel = nnx.to_pure_dict(specs)["blocks"]["ffn"]["w_in"]["kernel"]
    assert kernel.spec[0] is None


# --- through the CLI: train, checkpoint, resume, generate, extrapolate; 8 devices ------------

STEPS = 6


def train_argv(data_dir, workdir, *extra):
    return ["train", "--config=configs/tiny.py", f"--config.data.cache_dir={data_dir}",
            "--config.data.max_bytes=200000", f"--config.train.steps={STEPS}",
            "--config.train.log_every=1", "--config.train.eval_every=3",
            "--config.train.checkpoint_every=3", "--config.train.eval_batches=2",
            "--config.model.scan_layers=True", "--config.model.remat=save_dots",
            f"--run={workdir}", *extra]


@pytest.fixture(scope="module")
def scanned_run(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("data")
    workdir = tmp_path_factory.mktemp("runs") / "scan"
    assert cli.main(train_argv(data_dir, workdir)) == 0
    return data_dir, workdir


def test_a_scanned_run_trains_checkpoints_and_resumes(scanned_run, tmp_path, capsys):
    data_dir, workdir = scanned_run
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert json.loads((workdir / "config.json").read_text())["model"]["scan_layers"] is True
    lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in lines if "loss" in r]
    assert losses[-1] < losses[0]
    _, _, params = load_params(workdir)
    assert params["blocks"]["attn"]["q_proj"]["kernel"].shape == (2, 32, 32)
    # Lose everything after step 3; the rerun resumes from the stacked checkpoint, bitwise.
    resumed = tmp_path / "resumed"
    shutil.copytree(workdir, resumed)
    shutil.rmtree(resumed / "checkpoints" / str(STEPS))
    (resumed / "summary.json").write_text(json.dumps({**summary, "status": "running"}))
    capsys.readouterr()
    assert cli.main(train_argv(data_dir, resumed)) == 0
    captured = capsys.readouterr()
    assert f"from step 3/{STEPS}" in captured.out + captured.err
    _, _, got = load_params(resumed)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))


def test_a_scanned_run_generates_and_extrapolates(scanned_run, tmp_path, capsys):
    _, workdir = scanned_run
    capsys.readouterr()
    assert cli.main(["generate", f"--run={workdir}", "--prompt=def ",
                     "--max-new-tokens=8"]) == 0
    assert capsys.readouterr().out.startswith("def ")
    run = tmp_path / "run"
    shutil.copytree(workdir, run)  # extrapolation.json is written into the run
    assert cli.main(["extrapolate", f"--run={run}", "--multipliers=1,4", "--max-tokens=4096",
                     "--progress=false"]) == 0
    report = json.loads((run / "extrapolation.json").read_text())
    assert "128" in json.dumps(report)  # 4 x seq_len 32 was scored


SHARDED = textwrap.dedent("""
    import sys, jax
    from attnlab import cli
    assert jax.device_count() == 8
    sys.exit(cli.main(sys.argv[1:]))
""")


def test_a_scanned_run_on_8_devices_with_fsdp_matches_one_device(scanned_run, tmp_path):
    data_dir, reference = scanned_run
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu", ATTNLAB_CACHE_DIR=str(tmp_path / "cache"))
    workdir = tmp_path / "sharded"
    argv = train_argv(data_dir, workdir, "--config.train.mesh_fsdp=4")
    proc = subprocess.run([sys.executable, "-c", SHARDED, *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["device"]["mesh"] == {"data": 2, "fsdp": 4, "expert": 1}
    _, _, want = load_params(reference)
    _, _, got = load_params(workdir)
    worst = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)))
    assert worst < 1e-4, worst  # test_train_parallel's bound: summation order, then Adam


REFUSED = {
    "hybrid": (["--config.model.mixer=mamba", "--config.model.attention_every=2"],
               "model.attention_every=2"),
    "performer": (["--config.model.mixer=performer"], "model.mixer=performer"),
    "span": (["--config.model.objective=span"], "model.objective=span"),
}


@pytest.mark.parametrize("overrides, names", REFUSED.values(), ids=list(REFUSED))
def test_layers_that_differ_are_refused_in_one_line(overrides, names, tmp_path, capsys):
    argv = ["train", "--config=configs/tiny.py", f"--run={tmp_path / 'x'}",
            "--config.model.scan_layers=True", *overrides]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "model.scan_layers" in err and names in err
    assert not (tmp_path / "x").exists()


def test_an_unknown_remat_policy_is_refused(tmp_path, capsys):
    argv = ["train", "--config=configs/tiny.py", f"--run={tmp_path / 'x'}",
            "--config.model.remat=everything"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model.remat" in err


def saved_residuals(cfg: ModelConfig) -> list[str]:
    """What the backward pass of ``cfg``'s loss keeps from the forward (jax's own account)."""
    graphdef, state = init_model(cfg, seed=0)
    tokens = random_tokens(2)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_saved_residuals(lambda p: mean_loss(graphdef, p, tokens), state)
    return printed.getvalue().splitlines()


def test_save_dots_keeps_the_projections_and_full_keeps_none():
    """save_dots keeps the layers' matmul outputs (the projections sit inside layers.project's
    custom VJP, so they are saved by name): the FFN's hidden [layers, batch, seq, d_ff] is among
    the scan's saved outputs under save_dots and not under full."""
    cfg = tiny_cfg(scan_layers=True)
    hidden = f"f32[{cfg.n_layers},2,9,{resolve(cfg).ffn.width}] output of scan"
    kept = {policy: saved_residuals(dataclasses.replace(cfg, remat=policy))
            for policy in ("none", "save_dots", "full")}
    assert any(line.startswith(hidden) for line in kept["save_dots"])
    assert not any(line.startswith(hidden) for line in kept["full"])
    assert len(kept["full"]) < len(kept["save_dots"]) < len(kept["none"])
