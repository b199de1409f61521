"""Pictures of what a positional encoding does with positions (``attnlab.model.inspect``,
``attnlab model-info --plot``), each against a float64 NumPy reference written from
its paper's equation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flax import nnx

from attnlab import cli
from attnlab.cli_flags import parse
from attnlab.config import from_config_dict
from attnlab.model import init_model
from attnlab.model.inspect import (DistancePicture, SimilarityPicture, has_position_pictures,
                                   position_pictures)

TINY = "configs/tiny.py"


def _model(**model):
    overrides = [f"--config.model.{k}={v}" for k, v in model.items()]
    cfg = from_config_dict(parse([f"--config={TINY}", *overrides]).config)
    graphdef, params = init_model(cfg.model, 0)
    return cfg, nnx.merge(graphdef, params)


def _cosine(vectors: np.ndarray) -> np.ndarray:
    unit = vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)
    return unit @ unit.T


def test_sinusoidal_similarity_is_the_cosine_of_vaswanis_table():
    cfg, model = _model(pos_encoding="sinusoidal")
    n, d = 40, cfg.model.d_model
    p, i = np.arange(n)[:, None], np.arange(d // 2)[None]
    angle = p / 10000.0 ** (2 * i / d)  # Vaswani et al. 2017, sec. 3.5
    table = np.zeros((n, d))
    table[:, 0::2], table[:, 1::2] = np.sin(angle), np.cos(angle)
    [picture] = position_pictures(model, n)
    assert isinstance(picture, SimilarityPicture)
    np.testing.assert_allclose(picture.matrix, _cosine(table), atol=2e-5)


def test_learned_similarity_is_the_cosine_of_the_tables_rows():
    _, model = _model(pos_encoding="learned")
    table = np.asarray(model.position_embedding[...], np.float64)
    [picture] = position_pictures(model, 24)
    np.testing.assert_allclose(picture.matrix, _cosine(table[:24]), atol=1e-5)


def test_rope_kernel_is_the_mean_cosine_of_its_phases():
    cfg, model = _model(pos_encoding="rope", rope_theta=500.0)
    n, head_dim = 64, cfg.model.head_dim
    theta = 500.0 ** (-np.arange(0, head_dim, 2) / head_dim)  # Su et al. 2021, eq. 15
    expected = np.cos(np.arange(n)[:, None] * theta[None]).mean(axis=1)
    [picture] = position_pictures(model, n)
    assert isinstance(picture, DistancePicture) and picture.values.shape == (1, n)
    np.testing.assert_allclose(picture.values[0], expected, atol=2e-5)
    assert picture.values[0, 0] == pytest.approx(1.0, abs=1e-6)


def test_alibi_bias_falls_linearly_with_each_heads_slope():
    _, model = _model(pos_encoding="alibi", n_heads=4, d_model=32)
    n = 20
    slopes = 2.0 ** (-8.0 * np.arange(1, 5) / 4)  # Press et al. 2022, sec. 3: 2^(-8h/n)
    [picture] = position_pictures(model, n)  # the same in every layer: one picture
    assert "every layer" in picture.title
    np.testing.assert_allclose(picture.values, -slopes[:, None] * np.arange(n)[None], atol=1e-5)


def _t5_causal_bucket(distance: int, buckets: int, max_distance: int) -> int:
    """Raffel et al. 2020's relative-position buckets for a decoder: exact below half the
    buckets, log-spaced up to ``max_distance``, the last bucket beyond."""
    exact = buckets // 2
    if distance < exact:
        return distance
    log_ratio = math.log(distance / exact) / math.log(max_distance / exact)
    return min(buckets - 1, exact + int(log_ratio * (buckets - exact)))


@pytest.mark.parametrize("per_layer", [False, True])
def test_t5_bias_reads_the_table_at_each_distances_bucket(per_layer):
    cfg, model = _model(pos_encoding="t5", t5_num_buckets=8, t5_max_distance=20,
                        t5_per_layer=per_layer)
    n, layers = 32, cfg.model.n_layers
    table = np.asarray(model.position_embedding[...], np.float64)
    tables = list(table) if per_layer else [table]
    pictures = position_pictures(model, n)
    assert len(pictures) == (layers if per_layer else 1)
    buckets = [_t5_causal_bucket(d, 8, 20) for d in range(n)]
    for picture, layer_table in zip(pictures, tables):
        np.testing.assert_allclose(picture.values, layer_table[buckets].T, atol=1e-6)


@pytest.mark.parametrize("encoding", ["none", "sinusoidal", "learned", "rope", "alibi", "t5"])
def test_whether_an_encoding_has_pictures_is_known_before_drawing(encoding):
    _, model = _model(pos_encoding=encoding)
    assert has_position_pictures(model.encoding) == bool(position_pictures(model, 16))
    assert (encoding == "none") == (position_pictures(model, 16) == [])


def test_model_info_draws_a_configs_encoding(tmp_path, capsys):
    out = tmp_path / "rope.png"
    assert cli.main(["model-info", f"--config={TINY}", f"--plot={out}"]) == 0
    assert out.stat().st_size > 1000
    assert "initial weights" in capsys.readouterr().out


def test_model_info_draws_a_trained_runs_table(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli.main(["train", f"--config={TINY}", "--config.model.pos_encoding=learned",
                     "--config.train.steps=2", "--config.train.warmup_steps=1",
                     f"--run={run}", "--noprogress"]) == 0
    out = tmp_path / "learned.png"
    assert cli.main(["model-info", f"--run={run}", f"--plot={out}"]) == 0
    printed = capsys.readouterr().out
    assert "pos=learned" in printed and "trained weights" in printed
    assert out.stat().st_size > 1000


@pytest.mark.parametrize("argv, words", [
    (["--config.model.pos_encoding=none", "--plot={d}/x.png"],
     "model.pos_encoding=none adds nothing"),
    (["--plot={d}/missing/x.png"], "missing does not exist"),
    (["--run={d}", "--plot={d}/x.png"], "give --config or --run, not both"),
])
def test_model_info_refuses_what_it_cannot_draw(argv, words, tmp_path, capsys):
    argv = [a.format(d=tmp_path) for a in argv]
    assert cli.main(["model-info", f"--config={TINY}", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]
