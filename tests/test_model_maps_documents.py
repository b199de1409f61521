"""Token-mixing maps of a document-masked window (``attnlab attention`` on a run trained with
``data.document_mask``): every mixer's map is 0 across documents and, within each document,
equals the map of that document alone (its positions restarted), layer after layer."""

import jax.numpy as jnp
import numpy as np
import pytest

from attnlab import model as lm
from attnlab.config import ModelConfig
from attnlab.model import inspect

SLOW = pytest.mark.slow  # the same code paths as a default-lane case
MIXERS = [dict(pos_encoding="alibi", n_kv_heads=1), dict(mixer="linear", pos_encoding="rope"),
          dict(ngpt=True, pos_encoding="rope", ffn="swiglu"),
          dict(mixer="mamba", attention_every=2, pos_encoding="none", ssm_state=4),
          pytest.param(dict(pos_encoding="rope"), marks=SLOW),
          pytest.param(dict(mixer="performer", pos_encoding="none"), marks=SLOW),
          pytest.param(dict(mixer="mamba", pos_encoding="none", ssm_state=4), marks=SLOW)]


@pytest.mark.parametrize("overrides", MIXERS, ids=lambda o: "-".join(map(str, o.values())) if isinstance(o, dict) else None)
def test_a_packed_windows_maps_are_each_documents_maps_alone(overrides):
    cfg = ModelConfig(**{**dict(vocab_size=32, d_model=16, n_layers=2, n_heads=2, max_len=64,
                                init_std=0.2), **overrides})
    lm.resolve(cfg)
    graphdef, state = lm.init_model(cfg, seed=3)
    tokens = jnp.asarray(np.random.default_rng(3).integers(1, 32, (1, 7)), jnp.int32)
    segments = jnp.asarray([[1, 1, 1, 2, 2, 2, 2]], jnp.int32)
    positions = jnp.asarray([[0, 1, 2, 0, 1, 2, 3]], jnp.int32)
    packed = inspect.attention_maps(graphdef, state, tokens, segments=segments,
                                    positions=positions)
    first = inspect.attention_maps(graphdef, state, tokens[:, :3])
    second = inspect.attention_maps(graphdef, state, tokens[:, 3:])
    unmasked = inspect.attention_maps(graphdef, state, tokens)
    for layer, (m, a, b, u) in enumerate(zip(packed, first, second, unmasked)):
        assert np.all(m[..., 3:, :3] == 0), layer  # no weight on the other document
        np.testing.assert_allclose(m[..., :3, :3], a, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(m[..., 3:, 3:], b, rtol=1e-5, atol=1e-6)
        assert np.abs(u[..., 3:, :3]).max() > 1e-4, layer  # the mask is what removed it
