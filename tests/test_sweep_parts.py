"""A new sweep mode and a new learning-rate rule are each one class and one registry line: here a
mode that trains every shape on a fixed number of tokens per parameter (Hoffmann et al. 2022's
D = 20 N, at 0.5 tokens per parameter so that the tiny runs take seconds), planned and trained
end to end by ``run_sweep``, and a rule lr = base * (ref_d_model / d_model) ** 0.5. The spec,
the planner and the dry run ask the parts; nothing else changes."""

import math
import pathlib
import runpy

import pytest

from attnlab.sweep import modes, plan, run_sweep, rules, spec_from_config_dict
from attnlab.sweep.sections import SweepSpecError

GRID = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "tiny_grid.py"


class TokensPerParam(modes.Mode):
    name = "tokens_per_param"
    ratio = 0.5

    def set_keys(self, spec):
        return {"train.tokens": "sweep.mode", "train.steps": "sweep.mode"}

    def run_length(self, spec, budget, counts, per_token, batch_tokens):
        steps = max(1, round(self.ratio * counts["total"] / batch_tokens))
        return {"train.tokens": steps * batch_tokens}


class InverseSqrtWidth(rules.LearningRate):
    name = "inverse_sqrt_width"
    needs_shapes = True

    def value(self, rule, spec, shape, cfg, non_embedding):
        return (rule.base or cfg.train.learning_rate) * math.sqrt(rule.ref_d_model
                                                                  / cfg.model.d_model)


@pytest.fixture
def parts(monkeypatch):
    monkeypatch.setitem(modes.MODES, TokensPerParam.name, TokensPerParam)
    monkeypatch.setitem(rules.LR_RULES, InverseSqrtWidth.name, InverseSqrtWidth)


def tiny_spec(**sweep):
    config = runpy.run_path(str(GRID))["get_config"]()
    config.sweep.shapes = ((16, 1, 2), (32, 2, 2))
    config.sweep.axes.model.pos_encoding = ("rope",)
    for key, value in sweep.items():
        config.sweep[key] = value
    return spec_from_config_dict(config.to_dict())


def test_a_registered_mode_and_rule_plan_and_train_end_to_end(parts, tmp_path):
    spec = tiny_spec(mode="tokens_per_param",
                     learning_rate={"rule": "inverse_sqrt_width", "base": 1e-2,
                                    "ref_d_model": 16})
    runs = plan(spec)
    batch_tokens = spec.base.data.batch_size * spec.base.data.seq_len
    assert len(runs) == 2
    for run in runs:
        assert abs(run.tokens - 0.5 * run.params["total"]) <= batch_tokens / 2
        d_model = run.cfg.model.d_model
        assert run.cfg.train.learning_rate == pytest.approx(1e-2 * math.sqrt(16 / d_model),
                                                            rel=1e-6)
    table = run_sweep(spec, tmp_path, progress=False)
    assert set(table["status"]) == {"completed"}
    assert sorted(table["tokens"]) == sorted(r.tokens for r in runs)


def test_a_registered_mode_owns_the_keys_it_sets(parts):
    with pytest.raises(SweepSpecError) as error:
        tiny_spec(mode="tokens_per_param", axes={"model": {"pos_encoding": ("rope",)},
                                                 "train": {"tokens": (1024,)}})
    assert error.value.field == "sweep.axes.train.tokens"
    assert "sweep.mode also sets" in error.value.reason


def test_unregistered_parts_are_refused_with_the_registered_names():
    with pytest.raises(SweepSpecError, match="valid modes are grid, isoflop, curves, ladder"):
        tiny_spec(mode="tokens_per_param")
    with pytest.raises(SweepSpecError, match="valid rules are fixed, per_shape, power_law, "
                                             "inverse_width, transfer, tuned"):
        tiny_spec(learning_rate={"rule": "inverse_sqrt_width"})


def test_budgets_and_branches_are_refused_by_the_modes_that_do_not_read_them():
    with pytest.raises(SweepSpecError, match="only isoflop mode uses budgets; mode is 'grid'"):
        tiny_spec(budgets=(1e9, 2e9), learning_rate={"rule": "fixed"})
