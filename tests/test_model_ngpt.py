"""nGPT (model.ngpt): unit norms of embeddings, hidden states and weight rows at init and through
real training steps, the renormalising optimizer transform, decoding, counts and config rules."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from attnlab import cli
from attnlab.config import Config, DataConfig, TrainConfig
from attnlab.errors import ConfigError
from attnlab.model import (
    ModelConfig,
    apply,
    count_state_params,
    decode_step,
    init_state,
    init_model,
    param_counts,
    resolve,
    check,
)
from attnlab.model.ngpt import norm_axis, renormalize
from attnlab.train.optimizer import make_optimizer


def ngpt(**overrides) -> ModelConfig:
    """A small nGPT config, resolved (a bad combination raises here)."""
    base = dict(vocab_size=256, d_model=32, n_layers=2, n_heads=2, ngpt=True, ffn="swiglu")
    cfg = ModelConfig(**{**base, **overrides})
    resolve(cfg)
    return cfg


def row_norm_errors(state) -> dict[str, float]:
    """max | |row| - 1 | of every matrix, along its d_model axis."""
    out = {}
    for path, value in nnx.to_flat_state(state):
        axis = norm_axis(path)
        if axis is not None:
            norms = np.linalg.norm(np.asarray(value[...], np.float64), axis=axis)
            out["/".join(map(str, path))] = float(np.abs(norms - 1).max())
    return out


def hidden_norm_errors(graphdef, state, tokens) -> list[float]:
    """max | |h| - 1 | of the embeddings and of the hidden state after every block."""
    model = nnx.merge(graphdef, state)
    positions = jnp.arange(tokens.shape[1])[None]
    x = model.embed(tokens, positions)
    errors = [float(jnp.abs(jnp.linalg.norm(x, axis=-1) - 1).max())]
    for block in model.blocks:
        x, _ = block(x, positions)
        errors.append(float(jnp.abs(jnp.linalg.norm(x, axis=-1) - 1).max()))
    return errors


def test_every_matrix_row_and_hidden_state_starts_on_the_unit_sphere():
    cfg = ngpt(tie_embeddings=False)
    graphdef, state = init_model(cfg, seed=0)
    errors = row_norm_errors(state)
    assert len(errors) == 2 + cfg.n_layers * 7  # embedding, head, q k v o, w_in w_gate w_out
    assert max(errors.values()) < 1e-5, errors
    tokens = jax.random.randint(jax.random.key(0), (2, 12), 0, cfg.vocab_size)
    assert max(hidden_norm_errors(graphdef, state, tokens)) < 1e-5


def test_the_optimizer_transform_puts_updated_rows_back_on_the_sphere():
    cfg = Config(model=ngpt(), train=TrainConfig(warmup_steps=0, weight_decay=0.0,
                                                 learning_rate=0.1))
    _, params = init_model(cfg.model, seed=0)
    constraint = resolve(cfg.model).block.param_constraint()
    assert constraint is renormalize
    tx, _ = make_optimizer(cfg.train, 10, cfg.model.d_model, constraint=constraint)
    state = tx.init(params)
    grads = jax.tree.map(lambda p: jnp.ones_like(p), params)
    updates, state = tx.update(grads, state, params)
    new = optax.apply_updates(params, updates)
    assert max(row_norm_errors(new).values()) < 1e-5
    # Vectors (eigen learning rates, scalings) are updated but not normalised.
    old_alpha = params["blocks"][0]["alpha_attn"]["param"][...]
    new_alpha = new["blocks"][0]["alpha_attn"]["param"][...]
    assert not np.allclose(old_alpha, new_alpha)


def test_norms_stay_one_through_real_training_steps(tmp_path):
    from attnlab.train import load_params, run

    cfg = Config(
        model=ngpt(),
        data=DataConfig(source="markov", markov_tokens=20_000, seq_len=16, batch_size=4,
                        cache_dir=str(tmp_path / "data")),
        train=TrainConfig(steps=5, warmup_steps=0, weight_decay=0.0, learning_rate=1e-2,
                          eval_every=5, eval_batches=1, log_every=1, checkpoint_every=5),
        name="ngpt",
    )
    _, initial = init_model(cfg.model, cfg.train.seed)
    summary = run(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed"
    _, graphdef, state = load_params(tmp_path / "run")
    errors = row_norm_errors(state)
    assert max(errors.values()) < 1e-5, errors
    moved = [float(np.abs(a[...] - b[...]).max()) for (_, a), (_, b) in
             zip(nnx.to_flat_state(initial), nnx.to_flat_state(state))]
    assert min(moved) > 0  # every parameter was trained
    tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 256)
    assert max(hidden_norm_errors(graphdef, state, tokens)) < 1e-5


def test_ngpt_trains_through_the_cli(tmp_path):
    argv = ["train", "--config=configs/tiny.py", f"--run={tmp_path / 'run'}",
            "--config.model.ngpt=true", "--config.model.ffn=swiglu",
            "--config.train.warmup_steps=0", "--config.train.weight_decay=0",
            "--config.train.steps=3", "--config.train.eval_every=3",
            "--config.train.checkpoint_every=3"]
    assert cli.main(argv) == 0


def test_decoding_equals_the_full_forward_pass():
    cfg = ngpt(vocab_size=32)
    graphdef, state = init_model(cfg, seed=0)
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, 32)
    full = apply(graphdef, state, tokens)
    cache = init_state(cfg, 2, 12)
    logits, cache = decode_step(graphdef, state, cache, tokens[:, :4], 0)
    pieces = [logits]
    for i in range(4, 9):
        logits, cache = decode_step(graphdef, state, cache, tokens[:, i:i + 1], i)
        pieces.append(logits)
    np.testing.assert_allclose(jnp.concatenate(pieces, 1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("overrides", [dict(), dict(tie_embeddings=False, n_kv_heads=1,
                                                    pos_encoding="none")])
def test_parameter_counts(overrides):
    cfg = ngpt(**overrides)
    _, state = init_model(cfg, seed=0)
    counts = param_counts(cfg)
    assert count_state_params(state) == {k: counts[k] for k in
                                         ("total", "embedding", "non_embedding")}


@pytest.mark.parametrize("overrides, field", [
    (dict(norm_position="post"), "model.norm_position"),
    (dict(qk_norm=True), "model.qk_norm"),
    (dict(mixer="linear"), "model.mixer"),
    (dict(ffn="gelu"), "model.ffn"),
    (dict(pos_encoding="learned"), "model.pos_encoding"),
    (dict(pos_encoding="sinusoidal"), "model.pos_encoding"),
    (dict(dropout=0.1), "model.dropout"),
])
def test_bad_model_combinations_are_refused(overrides, field):
    with pytest.raises(ConfigError, match=field):
        ngpt(**overrides)


@pytest.mark.parametrize("train, field", [
    (dict(warmup_steps=10, weight_decay=0.0), "train.warmup_steps"),
    (dict(warmup_steps=0, weight_decay=0.1), "train.weight_decay"),
])
def test_weight_decay_and_warmup_are_refused(train, field):
    with pytest.raises(ConfigError, match=field):
        check(Config(model=ngpt(), train=TrainConfig(**train)))
