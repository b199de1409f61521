"""sweep.learning_rate.refine: a point whose best learning rate is at its grid's edge gains the
next rate beyond it, up to ``refine`` a side, recomputed from the results (so a resumed sweep
plans the same runs). The rounds are checked on made-up outcomes, then once with real training."""

import math
import pathlib
import runpy

import pytest

from attnlab import rundir
from attnlab.sweep import plan, run_sweep, spec_from_config_dict
from attnlab.sweep.refine import grown, next_factor, recorded_outcomes
from attnlab.sweep.sections import SweepSpecError
from attnlab.sweep.stages import dry_run_refined

ROOT = pathlib.Path(__file__).resolve().parents[1]
GRID = str(ROOT / "experiments" / "tiny_grid.py")
FACTORS = (0.5, 1.0, 2.0)


def grid(rule=None, seeds=(0, 1), variants=None, batches=None, encodings=None, **sweep):
    """tiny_grid (two shapes, rope and alibi) at FACTORS, refine 2, two seeds."""
    config = runpy.run_path(GRID)["get_config"]().to_dict()
    config["sweep"]["learning_rate"] = rule or {"rule": "per_shape", "factors": FACTORS,
                                                "refine": 2}
    config["sweep"]["axes"]["train"]["seed"] = seeds
    if batches:
        config["sweep"]["axes"]["data"] = {"batch_size": batches}
    if encodings:
        config["sweep"]["axes"]["model"]["pos_encoding"] = encodings
    if variants:
        config["sweep"]["variants"] = variants
        del config["sweep"]["axes"]["model"]
    config["sweep"].update(sweep)
    return spec_from_config_dict(config)


def best_at(spec, optimum):
    """Outcomes of every planned run: loss (log2(factor / optimum[d_model]))^2 plus a seed's
    offset, the same at every factor (so the mean over seeds is lowest at the optimum)."""
    def outcome(run):
        best = optimum[run.cfg.model.d_model]
        return (rundir.COMPLETED, 2.0 + math.log2(run.lr_factor / best) ** 2
                + 0.01 * run.cfg.train.seed)
    return {run.run_id: outcome(run) for run in plan(spec)}


def extra(spec):
    """(shape, factors added) of each point that grew."""
    return sorted((point.split(" ")[0], factors) for (_, point), factors in spec.refinements)


def settle(spec, optimum):
    """The rounds a sweep runs: plan, train (here: the made-up outcomes), grow, until stable."""
    current = grown(spec, {})
    for _ in range(10):
        bigger = grown(spec, best_at(current, optimum))
        if bigger.refinements == current.refinements:
            return current
        current = bigger
    raise AssertionError("did not settle")


def test_a_point_grows_past_its_edge_one_factor_a_round_up_to_the_cap():
    spec = grid()
    first = grown(spec, best_at(spec, {16: 4.0, 32: 1.0}))  # d16's best beyond 2x, d32's inside
    # rope and alibi: each axis value is a point of its own
    assert extra(first) == [("d16-l1-h2", (4.0,))] * 2
    assert extra(settle(spec, {16: 4.0, 32: 1.0})) == [("d16-l1-h2", (4.0, 8.0))] * 2
    settled = settle(spec, {16: 64.0, 32: 1.0})  # far beyond: stops at the cap, 2 a side
    assert extra(settled) == [("d16-l1-h2", (4.0, 8.0))] * 2
    rates = sorted({r.lr_factor for r in plan(settled) if r.cfg.model.d_model == 16})
    assert rates == [0.5, 1.0, 2.0, 4.0, 8.0]
    assert {r.lr_factor for r in plan(settled) if r.cfg.model.d_model == 32} == set(FACTORS)


def test_the_lower_edge_grows_downward_by_the_grids_own_step():
    # best 0.4: 0.5 is at the edge, then 0.25 is worse, so 0.5 is inside and it stops
    assert extra(settle(grid(), {16: 1.0, 32: 0.4})) == [("d32-l2-h2", (0.25,))] * 2
    assert extra(settle(grid(), {16: 1.0, 32: 0.01})) == [("d32-l2-h2", (0.25, 0.125))] * 2


def test_an_unfinished_or_failed_run_holds_its_point_and_a_diverged_rate_is_never_best():
    spec = grid()
    outcomes = best_at(spec, {16: 4.0, 32: 4.0})
    runs = plan(spec)
    top = [r for r in runs if r.lr_factor == 2.0]
    first_seeds = [r for r in top if r.cfg.train.seed == 0]  # one run of each of the 4 points
    held = dict(outcomes)
    held[first_seeds[0].run_id] = (rundir.PARTIAL, math.nan)  # still training
    held[first_seeds[1].run_id] = (rundir.FAILED, math.nan)   # waits for --retry-failed
    grew = dict(grown(spec, held).extra_factors)
    assert sorted(grew) == sorted(r.point for r in first_seeds[2:])
    diverged = dict(outcomes)
    for run in top:
        if run.cfg.train.seed == 1:
            diverged[run.run_id] = (rundir.DIVERGED, math.nan)
    assert grown(spec, diverged).extra_factors == ()  # the best finite rate is 1x: inside
    point = [r for r in runs if r.point == top[0].point]
    assert next_factor(spec, point, diverged, ()) is None


def test_resuming_plans_the_same_runs():
    spec = grid()
    settled = settle(spec, {16: 64.0, 32: 0.01})
    everything = best_at(settled, {16: 64.0, 32: 0.01})
    assert grown(spec, everything).refinements == settled.refinements  # in one call
    assert [r.run_id for r in plan(grown(spec, everything))] == \
        [r.run_id for r in plan(settled)]


def test_variants_grow_their_own_points():
    spec = grid(variants={"rope": {"model": {"pos_encoding": "rope"}},
                          "alibi": {"model": {"pos_encoding": "alibi"}}},
                variant_column="encoding")
    settled = settle(spec, {16: 4.0, 32: 1.0})
    points = dict(settled.refinements)
    assert sorted(points) == [("alibi", "d16-l1-h2"), ("rope", "d16-l1-h2")]
    assert settled.extra_factors == ()  # each variant holds its own
    added = [r for r in plan(settled) if r.lr_factor == 4.0]
    assert sorted(r.axes["encoding"] for r in added) == ["alibi", "alibi", "rope", "rope"]


@pytest.mark.parametrize("rule, sweep, words", [
    ({"rule": "per_shape", "factors": (1.0,), "refine": 1}, {}, "at least two"),
    ({"rule": "per_shape", "factors": FACTORS, "refine": 1.5}, {}, "expected an integer"),
    ({"rule": "per_shape", "factors": FACTORS, "refine": -1}, {}, ">= 0"),
])
def test_a_bad_refine_is_refused_naming_the_field(rule, sweep, words):
    with pytest.raises(SweepSpecError) as info:
        plan(grid(rule, **sweep))
    assert info.value.field.endswith("sweep.learning_rate.refine") and words in str(info.value)


def test_a_ladder_does_not_refine():
    config = runpy.run_path(str(ROOT / "experiments" / "tiny_ladder.py"))["get_config"]()
    config = config.to_dict()
    config["sweep"]["learning_rate"] = {**config["sweep"]["learning_rate"],
                                        "factors": FACTORS, "refine": 1}
    with pytest.raises(SweepSpecError) as info:
        spec_from_config_dict(config)
    assert info.value.field == "sweep.learning_rate.refine" and "trunk" in str(info.value)


def test_without_refine_nothing_grows():
    spec = grid({"rule": "per_shape", "factors": FACTORS})
    assert grown(spec, best_at(spec, {16: 64.0, 32: 64.0})).extra_factors == ()


def test_a_real_sweep_grows_where_its_best_rate_is_the_largest(tmp_path):
    """At a thousandth of tiny_grid's rates, 24 Adam steps lower the loss more the larger the
    rate, so every point's best is its grid's top: refine 1 adds 4x, then stops; a rerun
    trains nothing and plans the same runs."""
    spec = grid({"rule": "per_shape", "factors": (1.0, 2.0), "refine": 1}, seeds=(0,),
                shapes=((16, 1, 2, 1e-5),))
    table = run_sweep(spec, tmp_path, progress=False)
    assert (table["status"] == rundir.COMPLETED).all()
    assert sorted(table["train.learning_rate"].unique()) == pytest.approx([1e-5, 2e-5, 4e-5])
    for _, point in table.groupby("model.pos_encoding"):
        losses = point.sort_values("train.learning_rate")["final_val_loss"].to_numpy()
        assert losses[0] > losses[1] > losses[2]
    assert extra(grown(spec, recorded_outcomes(tmp_path))) == [("d16-l1-h2", (4.0,))] * 2
    summaries = {p: p.stat().st_mtime_ns for p in tmp_path.glob("runs/*/summary.json")}
    again = run_sweep(spec, tmp_path, progress=False)
    assert sorted(again["run_id"]) == sorted(table["run_id"])
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("runs/*/summary.json")} == summaries
    [(_, planned, notes)] = dry_run_refined(spec, tmp_path, probe="none")
    assert sorted(planned["run_id"]) == sorted(table["run_id"])
    assert (planned["status"] == rundir.COMPLETED).all()
    assert "2 added from the results so far" in notes[0]


# -- sweep.refine_batch: the batch-size axis widens where a group's best sits at its edge ------

BATCHES = (2, 4, 8)


def batch_grid(refine_batch=2, rule=None, **sweep):
    """tiny_grid at FACTORS (no rate refinement unless ``rule``) x batch sizes BATCHES."""
    return grid(rule or {"rule": "per_shape", "factors": FACTORS}, batches=BATCHES,
                refine_batch=refine_batch, **sweep)


def best_batch_at(spec, batch, factor=1.0):
    """Outcomes: loss (log2(batch / batch[d_model]))^2 + (log2(factor_ratio))^2 + a seed's
    offset."""
    def outcome(run):
        b = run.cfg.data.batch_size / batch[run.cfg.model.d_model]
        return (rundir.COMPLETED, 2.0 + math.log2(b) ** 2 + math.log2(run.lr_factor / factor) ** 2
                + 0.01 * run.cfg.train.seed)
    return {run.run_id: outcome(run) for run in plan(spec)}


def settle_batches(spec, batch, factor=1.0):
    current = grown(spec, {})
    for _ in range(10):
        bigger = grown(spec, best_batch_at(current, batch, factor))
        if bigger.grown_by == current.grown_by:
            return current
        current = bigger
    raise AssertionError("did not settle")


def added_batches(spec):
    return sorted((group.split(" ")[0], sizes) for group, sizes in spec.extra_batches)


def test_a_group_grows_past_its_largest_batch_size_up_to_the_cap():
    spec = batch_grid()
    first = grown(spec, best_batch_at(spec, {16: 64, 32: 4}))
    assert added_batches(first) == [("d16-l1-h2", (16,))] * 2  # rope and alibi: two groups
    settled = settle_batches(spec, {16: 64, 32: 4})
    assert added_batches(settled) == [("d16-l1-h2", (16, 32))] * 2  # the cap: 2 a side
    d16 = [r for r in plan(settled) if r.cfg.model.d_model == 16]
    assert sorted({r.cfg.data.batch_size for r in d16}) == [2, 4, 8, 16, 32]
    assert {r.lr_factor for r in d16 if r.cfg.data.batch_size == 32} == set(FACTORS)
    assert {r.cfg.data.batch_size for r in plan(settled) if r.cfg.model.d_model == 32} == \
        set(BATCHES)
    assert {r.run_id for r in plan(spec)} <= {r.run_id for r in plan(settled)}


def test_the_smallest_batch_size_grows_down_to_one_sequence():
    settled = settle_batches(batch_grid(), {16: 4, 32: 0.1})
    assert added_batches(settled) == [("d32-l2-h2", (1,))] * 2  # then 1/2 sequence: no more


def test_a_new_batch_sizes_points_refine_their_rates_too():
    spec = batch_grid(rule={"rule": "per_shape", "factors": FACTORS, "refine": 1})
    settled = settle_batches(spec, {16: 64, 32: 4}, factor=8.0)
    assert added_batches(settled) == [("d16-l1-h2", (16, 32))] * 2
    widest = [r for r in plan(settled) if r.cfg.data.batch_size == 32]
    assert {r.lr_factor for r in widest} == {0.5, 1.0, 2.0, 4.0}


def test_resuming_plans_the_same_batch_sizes():
    spec = batch_grid()
    settled = settle_batches(spec, {16: 64, 32: 0.1})
    everything = best_batch_at(settled, {16: 64, 32: 0.1})
    assert grown(spec, everything).grown_by == settled.grown_by
    assert [r.run_id for r in plan(grown(spec, everything))] == \
        [r.run_id for r in plan(settled)]
    first = plan(spec)[0]  # d16, rope: still training, so its group waits
    held = dict(everything) | {first.run_id: (rundir.PARTIAL, math.nan)}
    assert sorted(dict(grown(spec, held).extra_batches)) == sorted(
        g for g, _ in settled.extra_batches if g != first.group)


@pytest.mark.parametrize("change, words", [
    ({"refine_batch": -1}, ">= 0"),
    ({"axes": None}, "at least two values"),
    ({"mode": "ladder"}, "ladder"),
])
def test_a_bad_refine_batch_is_refused_naming_the_field(change, words):
    config = runpy.run_path(GRID)["get_config"]().to_dict()
    config["sweep"]["refine_batch"] = change.get("refine_batch", 1)
    if change.get("axes", 1) is not None:
        config["sweep"]["axes"]["data"] = {"batch_size": (2, 4)}
    if change.get("mode") == "ladder":
        config = runpy.run_path(str(ROOT / "experiments" / "tiny_ladder.py"))[
            "get_config"]().to_dict()
        config["sweep"]["refine_batch"] = 1
        config["sweep"].setdefault("axes", {}).setdefault("data", {})["batch_size"] = (2, 4)
    with pytest.raises(SweepSpecError) as info:
        spec_from_config_dict(config)
    assert info.value.field == "sweep.refine_batch" and words in str(info.value)


def test_a_real_sweep_grows_a_batch_size_where_the_largest_is_best(tmp_path):
    """24 steps each: 4 sequences a step read twice the tokens of 2 and end lower, so the
    largest batch size is best; refine_batch 1 adds the next (8 after 2, 4), then stops
    wherever 8 lands, and a rerun trains nothing."""
    spec = grid({"rule": "per_shape"}, seeds=(0,), shapes=((16, 1, 2, 1e-2),),
                batches=(2, 4), encodings=("rope",), refine_batch=1)
    table = run_sweep(spec, tmp_path, progress=False)
    assert (table["status"] == rundir.COMPLETED).all()
    losses = table.sort_values("data.batch_size")["final_val_loss"].to_numpy()
    assert sorted(table["data.batch_size"]) == [2, 4, 8] and losses[0] > losses[1]
    summaries = {p: p.stat().st_mtime_ns for p in tmp_path.glob("runs/*/summary.json")}
    again = run_sweep(spec, tmp_path, progress=False)
    assert sorted(again["run_id"]) == sorted(table["run_id"])
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("runs/*/summary.json")} == summaries
    [(_, planned, notes)] = dry_run_refined(spec, tmp_path, probe="none")
    assert "refine_batch" in notes[0] and "1 added from the results so far" in notes[0]
