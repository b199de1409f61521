"""The coordinate check (Yang et al. 2022, Fig. 5) at tiny widths on the tiny config's data:
after a few Adam steps the change of every layer type's activations is flat in width under muP
and the logits' change grows with width under SP. Contracts with tolerances, not exact numbers:
muP's predicted slope is 0 (we allow |slope| <= 0.25 over a 4x range, i.e. <= 1.41x), SP's
logits grow roughly like the width under Adam (we ask for slope >= 0.4)."""

import dataclasses
import json

import pytest

from attnlab import cli
from attnlab.cli_flags import parse
from attnlab.config import from_config_dict
from attnlab.coord_check import LAYER_TYPES, coord_check



def test_activations_are_the_models_outputs():
    """The captured outputs are the model's own: the logits equal ``apply``'s, the last block's
    output through the final norm and head gives them again, one output per layer and type."""
    import jax
    import numpy as np
    from flax import nnx

    from attnlab.config import ModelConfig
    from attnlab.coord_check import activations
    from attnlab.model import apply, init_model

    graphdef, params = init_model(ModelConfig(d_model=32, n_heads=2, n_layers=2), 0)
    tokens = jax.random.randint(jax.random.key(0), (2, 8), 0, 256)
    found = activations(graphdef, params, tokens)
    assert {k: len(v) for k, v in found.items()} == {
        "embedding": 1, "attention_output": 2, "ffn_hidden": 2, "block_output": 2, "logits": 1}
    np.testing.assert_allclose(found["logits"][0], apply(graphdef, params, tokens), rtol=1e-6)
    model = nnx.merge(graphdef, params)
    np.testing.assert_allclose(model.logits(found["block_output"][-1]), found["logits"][0],
                               rtol=1e-5, atol=1e-6)
    assert found["ffn_hidden"][0].shape == (2, 8, 128)


def tiny_config():
    cfg = from_config_dict(parse(["--config=configs/tiny.py"]).config)
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_layers=1))


@pytest.mark.slow  # 6 compiled train steps: ~40 s on an idle 2-core machine, 2 min loaded
def test_mup_is_flat_and_sp_logits_grow():
    report = coord_check(tiny_config(), (32, 64, 128), steps=3, lr=3e-3)
    slopes = report.slopes()
    assert set(slopes) == {"sp", "mup"} and all(set(s) == set(LAYER_TYPES)
                                                for s in slopes.values())
    for kind in LAYER_TYPES:
        assert abs(slopes["mup"][kind]) <= 0.25, (kind, slopes)
    assert slopes["sp"]["logits"] >= 0.4, slopes
    assert slopes["sp"]["logits"] - slopes["mup"]["logits"] >= 0.4, slopes
    # the sizes at init are measured too, and change is zero there by definition
    for p in ("sp", "mup"):
        assert (report.size[p]["logits"][0] > 0).all()
        assert (report.change[p]["logits"][0] == 0).all()


@pytest.mark.slow
def test_cli_writes_the_slopes_schema(tmp_path):
    out = tmp_path / "slopes.json"
    code = cli.main(["coord-check", "--config=configs/tiny.py", "--config.model.n_layers=1",
                     "--widths=32,64", "--steps=1", f"--json={out}",
                     f"--plot={tmp_path / 'coord.png'}"])
    assert code == 0
    slopes = json.loads(out.read_text())
    assert set(slopes) == {"sp", "mup"}
    assert all(set(s) == set(LAYER_TYPES) for s in slopes.values())
    assert (tmp_path / "coord.png").stat().st_size > 0
