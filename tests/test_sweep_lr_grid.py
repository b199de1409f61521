"""sweep.learning_rate.factors: every shape trains at its rule's rate times each factor, a grid
around the rule's prior for the hyperparameter law (experiments/hparams.py)."""

import collections
import pathlib
import runpy

import pytest

from attnlab.sweep import load_spec, plan, spec_from_config_dict
from attnlab.sweep.sections import SweepSpecError

ROOT = pathlib.Path(__file__).resolve().parents[1]
HPARAMS = str(ROOT / "experiments" / "hparams.py")
GRID = str(ROOT / "experiments" / "tiny_grid.py")
FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)


def test_each_cell_trains_the_prior_times_every_factor():
    runs = plan(load_spec(HPARAMS))
    assert len(runs) == 3 * 2 * 3 * len(FACTORS)
    cells = collections.defaultdict(list)
    for run in runs:
        cfg = run.cfg
        cells[(cfg.model.d_model, cfg.train.tokens, cfg.data.batch_size)].append(
            cfg.train.learning_rate)
    assert len(cells) == 18
    for (d_model, _, _), rates in cells.items():
        prior = 7.5e-3 * 32 / d_model  # rule inverse_width, ref_d_model 32
        assert sorted(rates) == pytest.approx([prior * f for f in FACTORS], rel=1e-5)


def grid(rule: dict | None = None, axes_train: dict | None = None):
    """tiny_grid's spec with its learning-rate section (and train axes) replaced."""
    config = runpy.run_path(GRID)["get_config"]().to_dict()
    if rule is not None:
        config["sweep"]["learning_rate"] = rule
    config["sweep"]["axes"]["train"].update(axes_train or {})
    return spec_from_config_dict(config)


def test_without_factors_the_plan_is_the_rules_alone():
    base = plan(grid())
    same = plan(grid({"rule": "per_shape", "factors": (1.0,)}))
    assert [r.run_id for r in same] == [r.run_id for r in base]
    doubled = plan(grid({"rule": "per_shape", "factors": (0.5, 2.0)}))
    assert len(doubled) == 2 * len(base)
    assert sorted(r.cfg.train.learning_rate for r in doubled) == pytest.approx(sorted(
        r.cfg.train.learning_rate * f for r in base for f in (0.5, 2.0)))


@pytest.mark.parametrize("factors,words", [((0.0, 1.0), "positive"),
                                            ((1.0, 1.0), "repeats a factor")])
def test_bad_factors_are_refused_naming_the_field(factors, words):
    with pytest.raises(SweepSpecError) as info:
        plan(grid({"rule": "per_shape", "factors": factors}))
    assert info.value.field == "sweep.learning_rate.factors" and words in str(info.value)


def test_a_learning_rate_axis_and_factors_are_one_too_many():
    with pytest.raises(SweepSpecError) as info:
        plan(grid({"rule": "fixed", "factors": (0.5, 2.0)},
                  {"learning_rate": (1e-3, 2e-3)}))
    assert info.value.field == "sweep.axes.train.learning_rate"


def test_the_refined_gpu_grid_reaches_past_the_edges_the_first_one_hit():
    """experiments/hparams.py:gpu put the 4M-token optima at its largest rate (4x the prior)
    and smallest batch (32); :gpu_refined reaches 16x and 16 sequences, 120 runs."""
    runs = plan(load_spec(f"{HPARAMS}:gpu_refined"))
    assert len(runs) == 3 * 2 * 4 * 5
    factors = {round(r.cfg.train.learning_rate * r.cfg.model.d_model / 32 / 7.5e-3, 6)
               for r in runs}
    assert factors == {1.0, 2.0, 4.0, 8.0, 16.0}
    assert {r.cfg.data.batch_size for r in runs} == {16, 32, 64, 128}
    assert max(r.cfg.train.tokens for r in runs) < runs[0].cfg.data.markov_tokens  # read once


def test_the_design_check_counts_a_point_once_per_seed_at_any_number_of_rates():
    """A fit reads each point at one rate (--best-over): 5 rates are not 5 replicates."""
    import dataclasses

    from attnlab.sweep.probe import design_notes

    spec = load_spec(HPARAMS)
    one_rate = dataclasses.replace(
        spec, learning_rate=dataclasses.replace(spec.learning_rate, factors=()))
    assert len(plan(spec)) == len(FACTORS) * len(plan(one_rate))
    assert design_notes(plan(spec)) == design_notes(plan(one_rate))


def test_every_run_of_a_grid_records_its_rate_the_rules_own_included():
    """With rule fixed the rule's own rate is the base config's; on a grid of factors it is
    still written to each run's axes, so --best-over=train.learning_rate can pick it."""
    def fixed(rule):
        config = runpy.run_path(GRID)["get_config"]().to_dict()
        config["sweep"]["shapes"] = ((16, 1, 2), (32, 2, 2))
        config["sweep"]["learning_rate"] = rule
        return plan(spec_from_config_dict(config))

    runs = fixed({"rule": "fixed", "factors": (0.5, 1.0, 2.0)})
    base = runs[0].cfg.train.learning_rate / runs[0].lr_factor
    assert all(r.axes["train.learning_rate"] == pytest.approx(base * r.lr_factor) for r in runs)
    alone = fixed({"rule": "fixed"})
    assert "train.learning_rate" not in alone[0].axes  # no grid: the base config's, unrecorded
    assert {r.run_id for r in runs if r.lr_factor == 1.0} == {r.run_id for r in alone}
