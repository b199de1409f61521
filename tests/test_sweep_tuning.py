"""A sweep's tuning stage (``sweep.tune``, learning-rate rule ``tuned``): the proxies it plans, the
picks it makes from their losses (checked against a float64 NumPy reference written from the
definitions: argmin of the seed mean, bootstrap over seeds, a least-squares power law in width),
the study it plans from them, and its refusals. The slow test trains a tiny tuned sweep end to
end: interrupted in its tuning stage, resumed, rerun (nothing trains).

Only the slow test trains."""

import dataclasses
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from ml_collections import ConfigDict

from attnlab import rundir
from attnlab.config import base_config_dict
from attnlab.errors import ConfigError
from attnlab.checks import check
from attnlab.sweep import SweepSpecError, load_spec, plan, spec_from_config_dict
from attnlab.sweep import definition, stages, tuning
from repo_files import load_module

ROOT = pathlib.Path(__file__).resolve().parents[1]
MUP = {"parameterization": "mup", "mup_base_d_model": 16, "attention_scale": "mup"}
GRID = (2.0**-9, 2.0**-8, 2.0**-7, 2.0**-6, 2.0**-5)
SEEDS = (0, 1, 2)
TUNE_WIDTHS = (16, 32, 64)


def study(tune: dict | None = None, learning_rate: dict | None = None, variants=None,
          **sweep) -> ConfigDict:
    """A width series 16-128 of 2-layer models; arms ``sp`` and ``mup`` by default."""
    config = ConfigDict()
    config.base = base = base_config_dict()
    base.model.max_len = 64
    base.data.seq_len = 32
    base.train.steps = 200
    base.train.learning_rate = 1e-3  # the placeholder a dry run plans the study at
    config.sweep = ConfigDict({
        "name": "tuned", "mode": "grid", "shapes": tuple((d, 2, 2) for d in (16, 32, 64, 128)),
        "learning_rate": learning_rate or {"rule": "tuned"},
        "variant_column": "arm", "warmup": {"rule": "fraction", "fraction": 0.1},
        "variants": {"sp": {}, "mup": {"model": MUP}} if variants is None else variants,
        "tune": {"shapes": tuple((d, 2, 2) for d in TUNE_WIDTHS), "learning_rates": GRID,
                 "seeds": SEEDS, "steps": 50} if tune is None else tune,
        **sweep})
    return config


def test_the_tuning_stage_plans_every_arm_width_rate_and_seed():
    spec = spec_from_config_dict(study())
    runs = tuning.tuning_plan(spec)
    assert len(runs) == 2 * len(TUNE_WIDTHS) * len(GRID) * len(SEEDS)
    seen = {(r.axes["arm"], r.cfg.model.d_model, r.cfg.train.learning_rate, r.cfg.train.seed)
            for r in runs}
    assert seen == {(a, d, lr, s) for a in ("sp", "mup") for d in TUNE_WIDTHS for lr in GRID
                    for s in SEEDS}
    for r in runs:
        assert r.steps == 50 and r.cfg.model.n_layers == 2
        assert r.cfg.model.parameterization == ("mup" if r.axes["arm"] == "mup" else "sp")
    # The study itself cannot be planned before its rates are picked.
    with pytest.raises(SweepSpecError) as info:
        plan(spec)
    assert info.value.field == "sweep.learning_rate.rule" and "tuning stage" in info.value.reason


def reference_picks(losses, grid, widths, transfers, resamples, seed=0):
    """float64 reference from the definitions. ``losses`` [W, S, L] (inf: diverged)."""
    grid = np.asarray(grid, np.float64)
    mean = losses.mean(axis=1)
    best = [int(np.argmin(row)) for row in mean]
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, losses.shape[1], (resamples, losses.shape[1]))
    intervals = []
    boot_best = np.zeros((len(widths), resamples), int)
    for w in range(len(widths)):
        for r in range(resamples):
            boot_best[w, r] = int(np.argmin(losses[w][draws[r]].mean(axis=0)))
        lo, hi = np.quantile(np.log2(grid[boot_best[w]]), [0.05, 0.95])
        intervals.append((2.0**lo, 2.0**hi))
    if transfers:
        return {"learning_rate": grid[best[-1]], "interval": intervals[-1]}, best, intervals
    x = np.log2(np.asarray(widths, np.float64))
    slope, intercept = np.polyfit(x, np.log2(grid[best]), 1)
    slopes = [np.polyfit(x, np.log2(grid[boot_best[:, r]]), 1)[0] for r in range(resamples)]
    lo, hi = np.quantile(-np.asarray(slopes), [0.05, 0.95])
    return ({"base": 2.0 ** (intercept + slope * x[0]), "exponent": -slope,
             "exponent_interval": (lo, hi)}, best, intervals)


def synthetic_rows(spec, optimum, noise=0.05, diverge_above=None, seed=1):
    """A results row per tuning run: loss = 3 + (log2 lr - log2 optimum(arm, d))^2 / 4 plus
    per-seed noise; runs above ``diverge_above`` diverge."""
    rng = np.random.default_rng(seed)
    rows = {}
    for r in tuning.tuning_plan(spec):
        lr, d = r.cfg.train.learning_rate, r.cfg.model.d_model
        loss = 3 + (math.log2(lr) - math.log2(optimum(r.axes["arm"], d))) ** 2 / 4
        loss += noise * rng.standard_normal()
        diverged = diverge_above is not None and lr > diverge_above
        rows[r.run_id] = {"status": "diverged" if diverged else "completed",
                          "final_val_loss": math.nan if diverged else loss}
    return rows


def losses_of(spec, rows, arm):
    cube = np.full((len(TUNE_WIDTHS), len(SEEDS), len(GRID)), np.inf)
    for r in tuning.tuning_plan(spec):
        if r.axes["arm"] == arm and rows[r.run_id]["status"] == "completed":
            cube[TUNE_WIDTHS.index(r.cfg.model.d_model), SEEDS.index(r.cfg.train.seed),
                 GRID.index(r.cfg.train.learning_rate)] = rows[r.run_id]["final_val_loss"]
    return cube


def optimum(arm, d):
    # sp: the optimum falls as d^-1 from 2^-5.6 at d = 16; mup: flat at 2^-6.9
    return 2**-5.6 * (d / 16) ** -1.0 if arm == "sp" else 2**-6.9


def test_the_picks_match_a_reference_written_from_their_definitions():
    spec = spec_from_config_dict(study())
    rows = synthetic_rows(spec, optimum, diverge_above=2**-6)  # 2^-5 diverges everywhere
    out = tuning.choose(spec, tuning.tuning_plan(spec), rows, resamples=200)
    assert out["tuning_runs"] == [r.run_id for r in tuning.tuning_plan(spec)]
    for arm, transfers in (("sp", False), ("mup", True)):
        expected, best, intervals = reference_picks(losses_of(spec, rows, arm), GRID,
                                                    TUNE_WIDTHS, transfers, 200)
        pick = out["arms"][arm]
        assert [t["best_lr"] for t in pick["widths"]] == [GRID[b] for b in best]
        for t, (lo, hi) in zip(pick["widths"], intervals):
            np.testing.assert_allclose(t["interval"], (lo, hi), rtol=1e-12)
            assert lo <= t["best_lr"] <= hi
            # a diverged rate has no mean loss
            assert t["mean_loss"][f"{2**-5:.6g}"] is None
        if transfers:
            assert pick["rule"] == "transfer" and pick["tuned_d_model"] == 64
            assert pick["learning_rate"] == expected["learning_rate"]
        else:
            assert pick["rule"] == "tuned" and pick["ref_d_model"] == 16
            np.testing.assert_allclose(pick["base"], expected["base"], rtol=1e-6)
            np.testing.assert_allclose(pick["exponent"], expected["exponent"], atol=1e-4)
            np.testing.assert_allclose(pick["exponent_interval"], expected["exponent_interval"],
                                       atol=1e-4)
            assert 0.5 < pick["exponent"] < 1.5  # the synthetic optimum falls as d^-1
    # sp at width 16 is best at 2^-6, below the grid's highest rate (2^-5), which diverged: the
    # optimum is bracketed, so no edge warning.
    assert out["arms"]["sp"]["widths"][0]["best_lr"] == 2**-6
    assert out["arms"]["sp"]["warnings"] == out["arms"]["mup"]["warnings"] == []
    assert json.loads(json.dumps(out)) == out  # what tuning.json holds, exactly


def test_an_optimum_at_the_grids_edge_is_warned_and_all_diverged_is_refused():
    spec = spec_from_config_dict(study())
    rows = synthetic_rows(spec, lambda arm, d: 2**-12, noise=0.0)
    out = tuning.choose(spec, tuning.tuning_plan(spec), rows, resamples=50)
    for arm in ("sp", "mup"):
        assert len(out["arms"][arm]["warnings"]) == len(TUNE_WIDTHS)
        assert "grid's lowest" in out["arms"][arm]["warnings"][0]
    assert out["arms"]["sp"]["exponent"] == 0.0  # the same best at every width: no trend
    rows = synthetic_rows(spec, optimum, diverge_above=0.0)
    with pytest.raises(SweepSpecError) as info:
        tuning.choose(spec, tuning.tuning_plan(spec), rows, resamples=50)
    assert info.value.field == "sweep.tune.learning_rates" and "diverged" in info.value.reason


def test_the_study_trains_each_arm_at_its_pick():
    spec = spec_from_config_dict(study())
    rows = synthetic_rows(spec, optimum, noise=0.0)
    out = tuning.choose(spec, tuning.tuning_plan(spec), rows, resamples=50)
    sp, mup = out["arms"]["sp"], out["arms"]["mup"]
    runs = plan(tuning.with_picks(spec, out["arms"]))
    assert len(runs) == 8
    for run in runs:
        d, lr = run.cfg.model.d_model, run.cfg.train.learning_rate
        if run.axes["arm"] == "mup":
            assert lr == mup["learning_rate"] == 2**-7  # nearest grid point to 2^-6.9
        else:  # extrapolated beyond the widest proxy (64) to 128
            assert lr == float(f"{sp['base'] * (d / 16) ** -sp['exponent']:.6g}")
    by_width = {r.cfg.model.d_model: r.cfg.train.learning_rate for r in runs
                if r.axes["arm"] == "sp"}
    assert by_width[128] < by_width[16]
    mup_line, sp_line = tuning.describe(out)  # each arm's pick in its rule's words
    assert sp_line.startswith("tuned sp (sp): best d16 0.0156") and "(d_model / 16)^-" in sp_line
    assert mup_line.startswith("tuned mup (mup): ") and "lr 0.00781 at every width" in mup_line


def _refusal(config):
    with pytest.raises(SweepSpecError) as info:
        spec_from_config_dict(config)
    assert "\n" not in str(info.value)
    return info.value


@pytest.mark.parametrize("config, field, words", [
    (study(tune={}), "sweep.tune", "missing"),
    (study(learning_rate={"rule": "fixed"}), "sweep.tune", "no arm uses it"),
    (study(tune={"shapes": ((32, 2, 2),), "learning_rates": GRID, "steps": 10}),
     "sweep.tune.shapes", "variant 'sp' is not muP"),
    (study(tune={"shapes": ((32, 2, 2), (32, 1, 2)), "learning_rates": GRID, "steps": 10}),
     "sweep.tune.shapes", "same width"),
    (study(tune={"shapes": ((32, 2, 2), (64, 2, 2)), "learning_rates": (1e-3, 1e-2),
                 "steps": 10}), "sweep.tune.learning_rates", "at least three"),
    (study(tune={"shapes": ((32, 2, 2), (64, 2, 2)), "learning_rates": GRID[::-1],
                 "steps": 10}), "sweep.tune.learning_rates", "increasing"),
    (study(tune={"shapes": ((32, 2, 2), (64, 2, 2)), "learning_rates": GRID}),
     "sweep.tune.steps", ">= 1"),
    (study(tune={"shapes": ((32, 2, 2), (64, 2, 2)), "learning_rates": GRID, "steps": 10,
                 "seeds": (0, 0)}), "sweep.tune.seeds", "distinct"),
    (study(learning_rate={"rule": "tuned", "base": 1e-3}), "sweep.learning_rate.base",
     "takes no fields"),
], ids=["tune-missing", "no-tuned-arm", "sp-one-width", "same-width", "two-rates", "decreasing",
        "no-steps", "seeds", "tuned-with-fields"])
def test_refusals_name_the_field(config, field, words):
    error = _refusal(config)
    assert error.field.startswith(field) and words in error.reason, (error.field, error.reason)


def _planning_refusal(config):
    """The error with which the stages refuse the spec's plan (the spec itself parses)."""
    spec = spec_from_config_dict(config)
    with pytest.raises(SweepSpecError) as info:
        stages.check(spec)
    assert "\n" not in str(info.value)
    return info.value


def test_a_bad_proxy_is_named_by_its_tune_field():
    # muP's base width 16 is not divisible by 3 heads: the proxies, not the study, refuse it.
    config = study(tune={"shapes": ((24, 2, 3), (48, 2, 3)), "learning_rates": GRID,
                         "steps": 10}, variants={"mup": {"model": MUP}})
    error = _planning_refusal(config)
    assert error.field == "base.model.mup_base_d_model", (error.field, error.reason)
    assert "model.n_heads=3" in error.reason and "tuning stage" in error.reason


def test_a_study_that_cannot_be_planned_is_refused_before_its_tuning_stage(tmp_path):
    # The study's shapes take no muP base width 16; the proxies do. Refused by the check, by the
    # dry run before its probe and by the run before anything is written.
    config = study(shapes=((24, 2, 3), (48, 2, 3)), variants={"mup": {"model": MUP}})
    error = _planning_refusal(config)
    assert error.field == "base.model.mup_base_d_model" and "tuning stage" not in error.reason
    spec = spec_from_config_dict(config)
    for stage in (lambda: stages.dry_run_sweep(spec, tmp_path / "sw"),
                  lambda: stages.run_sweep(spec, tmp_path / "sw", allow_large=True)):
        with pytest.raises(SweepSpecError) as info:
            stage()
        assert str(info.value) == str(error)
    assert list(tmp_path.iterdir()) == []


def test_dry_run_shows_both_stages_and_the_recorded_picks(tmp_path):
    spec = spec_from_config_dict(study(tune={"shapes": ((16, 2, 2), (32, 2, 2)),
                                             "learning_rates": GRID[:3], "seeds": (0,),
                                             "steps": 20}))
    (tune_title, tune_table, _), (_, table, notes) = stages.dry_run_stages(spec, tmp_path,
                                                                           probe="none")
    assert tune_title.startswith("tuning") and len(tune_table) == 2 * 2 * 3
    assert set(table["lr"]) == {"tuned"} and len(table) == 8 and "tuned" in notes[0]
    # Once the tuning stage has recorded its picks, the study shows their rates and run ids.
    rows = synthetic_rows(spec, optimum, noise=0.0)
    recorded = tuning.choose(spec, tuning.tuning_plan(spec), rows, resamples=20)
    rundir.write_json_atomic(tmp_path / rundir.TUNING_FILE, recorded)
    _, (_, table, notes) = stages.dry_run_stages(spec, tmp_path, probe="none")
    study_runs = plan(tuning.with_picks(spec, recorded["arms"]))
    assert list(table["run_id"]) == [r.run_id for r in study_runs]
    assert list(table["lr"]) == [r.cfg.train.learning_rate for r in study_runs]
    assert {n.split(" (")[0] for n in notes if n.startswith("tuned ")} == {"tuned sp", "tuned mup"}


def test_architectures_tuned_puts_exactly_the_arms_mup_refuses_under_sp():
    source = ROOT / "experiments" / "architectures_tuned.py"
    module = load_module(source)
    for scale in ("cpu", "gpu"):
        spec = load_spec(f"{source}:{scale}")
        for name, arm in definition.arms(spec):
            model = arm.base.model
            # muP with the arm's own score scale where it has one (cosine attention's)
            scale = "mup" if model.attention_scale in ("rsqrt", "mup") else model.attention_scale
            try:
                check(dataclasses.replace(arm.base, model=dataclasses.replace(
                    model, parameterization="mup", mup_base_d_model=model.d_model,
                    attention_scale=scale)))
                refused = False
            except ConfigError:
                refused = True
            assert refused == (name not in module.MUP_ARMS), (scale, name)
            assert definition.transfers(arm) == (name in module.MUP_ARMS)
        assert {name for name, _ in definition.arms(spec)} == {v.name for v in spec.variants}


# -- end to end ---------------------------------------------------------------------------------

TINY = '''
from ml_collections import ConfigDict
from attnlab.config import base_config_dict

def get_config(scale="cpu"):
    c = ConfigDict()
    c.scale = scale
    c.base = b = base_config_dict()
    b.model.max_len = 16
    b.data.source = "pystdlib"
    b.data.max_bytes = 100_000
    b.data.seq_len = 16
    b.data.batch_size = 4
    b.train.steps = 8
    b.train.warmup_steps = 1
    b.train.eval_every = 1000
    b.train.eval_batches = 1
    b.train.log_every = 1
    b.train.checkpoint_every = 4
    c.sweep = s = ConfigDict()
    s.name = "tiny_tuned"
    s.shapes = ((16, 1, 2), (48, 1, 2))
    s.learning_rate = ConfigDict({"rule": "tuned"})
    s.tune = ConfigDict({"shapes": ((16, 1, 2), (32, 1, 2)),
                         "learning_rates": (2**-8, 2**-6, 2**-4), "seeds": (0, 1), "steps": 40})
    s.variant_column = "arm"
    s.variants = ConfigDict({"sp": {}, "mup": {"model": {
        "parameterization": "mup", "mup_base_d_model": 16, "attention_scale": "mup"}}})
    return c
'''


def _sweep(argv, log):
    handle = open(log, "w")
    return subprocess.Popen([sys.executable, "-m", "attnlab.cli", "sweep", *argv], cwd=ROOT,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"), stdout=handle,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _summaries(workdir):
    return {p.parent.name: p.stat().st_mtime_ns
            for p in [*workdir.glob("runs/*/summary.json"),
                      *workdir.glob(f"{rundir.TUNE_DIR}/runs/*/summary.json")]}


@pytest.mark.uncached
@pytest.mark.slow
def test_tune_then_study_interrupted_resumed_and_rerun(tmp_path):
    source = tmp_path / "tiny_tuned.py"
    source.write_text(TINY)
    workdir = tmp_path / "sweep"
    argv = [f"--config={source}", f"--sweep={workdir}", "--noprogress"]
    log = tmp_path / "first.log"
    proc = _sweep(argv, log)
    # Interrupt once the first tuning ensemble has logged some steps.
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        logged = sum(p.read_text().count('"loss"')
                     for p in workdir.glob(f"{rundir.TUNE_DIR}/runs/*/metrics.jsonl"))
        if logged >= 20:
            break
        time.sleep(0.05)
    assert proc.poll() is None, log.read_text()[-2000:]
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=120) == 130, log.read_text()[-2000:]
    assert not (workdir / rundir.TUNING_FILE).exists()  # the study waits for the tuning

    log = tmp_path / "second.log"
    assert _sweep(argv, log).wait(timeout=900) == 0, log.read_text()[-3000:]
    for path in workdir.glob(f"{rundir.TUNE_DIR}/runs/*/metrics.jsonl"):
        steps = [r["step"] for r in map(json.loads, path.read_text().splitlines()) if "loss" in r]
        assert steps == sorted(set(steps)) and len(steps) == 40, path  # resumed, none twice
    recorded = json.loads((workdir / rundir.TUNING_FILE).read_text())
    spec = load_spec(str(source))
    assert recorded["tuning_runs"] == [r.run_id for r in tuning.tuning_plan(spec)]
    # The study's runs are those of the recorded picks, at their rates, every one completed.
    study_runs = plan(tuning.with_picks(spec, recorded["arms"]))
    from attnlab import results

    table = results.load(workdir)
    assert sorted(table["run_id"]) == sorted(r.run_id for r in study_runs)
    assert set(table["status"]) == {"completed"}
    assert set(results.load(workdir / rundir.TUNE_DIR)["status"]) <= {"completed", "diverged"}
    mup_rates = {r.cfg.train.learning_rate for r in study_runs if r.axes["arm"] == "mup"}
    assert mup_rates == {recorded["arms"]["mup"]["learning_rate"]}

    before = _summaries(workdir)
    assert len(before) == 2 * 2 * 3 * 2 + 4
    log = tmp_path / "third.log"
    assert _sweep(argv, log).wait(timeout=300) == 0, log.read_text()[-3000:]
    assert _summaries(workdir) == before  # a rerun trains nothing
    assert json.loads((workdir / rundir.TUNING_FILE).read_text()) == recorded
