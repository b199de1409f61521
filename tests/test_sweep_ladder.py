"""Ladder sweeps: the plan (one constant-LR trunk per shape, a cooldown branch per token count,
each branch starting at its cooldown's first step from a checkpoint the trunk keeps), the dry
run's FLOPs saved, the spec's rules; and (slow lane) a real ladder sweep: its results table,
SIGKILL at a random moment then the same command (the results of an uninterrupted sweep), and a
deleted branch retrained alone."""

import hashlib
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from ml_collections import ConfigDict

import experiments.tiny_ladder as tiny_ladder
from attnlab import results
from attnlab.scaling.curves import curves_from_table
from attnlab.scaling.tables.read import read_curves
from attnlab.scaling.laws.registry import law_named
from attnlab.scaling.tables.prepare import prepare_points
from attnlab.schedules import wsd_decay_start
from attnlab.sweep import SweepSpecError, load_spec, plan, spec_from_config_dict
from attnlab.sweep.probe import dry_run

ROOT = pathlib.Path(__file__).resolve().parents[1]
LADDER = str(ROOT / "experiments" / "tiny_ladder.py")


def test_plan_has_a_trunk_per_shape_and_its_branches():
    spec = load_spec(LADDER)
    runs = plan(spec)
    batch = spec.base.data.batch_size * spec.base.data.seq_len
    trunks = [r for r in runs if r.role == "trunk"]
    assert len(trunks) == 2 and len(runs) == 2 * (1 + 3)
    for trunk in trunks:
        branches = [r for r in runs if r.cfg.train.branch_from == trunk.run_id]
        assert [b.tokens for b in branches] == [2560, 5120, 10240]
        starts = [wsd_decay_start(b.steps, b.cfg.train.warmup_steps, 0.2) for b in branches]
        assert [b.cfg.train.branch_step for b in branches] == starts == [8, 16, 32]
        assert trunk.steps == max(starts) and trunk.cfg.train.keep_steps == (8, 16, 32)
        assert trunk.cfg.train.schedule == "constant"
        for b in branches:
            t = b.cfg.train
            assert (t.schedule, t.cooldown, t.decay_fraction) == ("wsd", "1-sqrt", 0.2)
            # Everything else is the trunk's: same shape, learning rate, warmup, seeds.
            assert b.cfg.model == trunk.cfg.model and b.cfg.data == trunk.cfg.data
            assert (t.learning_rate, t.warmup_steps, t.seed) == (
                trunk.cfg.train.learning_rate, trunk.cfg.train.warmup_steps,
                trunk.cfg.train.seed)
            assert b.shared_tokens == t.branch_step * batch
            per_token = b.flops_per_token["chinchilla"]
            assert b.flops() == pytest.approx(per_token * b.tokens)
            assert b.trained_flops() == pytest.approx(per_token * (b.steps - t.branch_step)
                                                      * batch)


def test_tokens_per_param_scale_with_each_shape():
    spec = load_spec(LADDER, ["sweep.branches.tokens=()",
                              "sweep.branches.tokens_per_param=(0.5, 1.0)",
                              "sweep.branches.params=non_embedding"])
    for run in plan(spec):
        if run.role == "branch":
            batch = run.cfg.data.batch_size * run.cfg.data.seq_len
            ratio = run.tokens / run.params["non_embedding"]
            assert min(abs(ratio - 0.5), abs(ratio - 1.0)) * run.params["non_embedding"] \
                <= batch / 2  # whole batches


def test_a_trunk_id_does_not_change_when_a_shorter_branch_is_added():
    before = {r.run_id for r in plan(load_spec(LADDER)) if r.role == "trunk"}
    more = load_spec(LADDER, ["sweep.branches.tokens=(2560, 3840, 5120, 10240)"])
    after = {r.run_id for r in plan(more) if r.role == "trunk"}
    assert before == after


def test_dry_run_shows_roles_and_the_flops_saved():
    spec = load_spec(LADDER)
    table, notes = dry_run(spec, probe="none")
    assert list(table["role"]) == ["trunk", "branch", "branch", "branch"] * 2
    assert list(table["from_step"]) == [0, 8, 16, 32] * 2
    runs = plan(spec)
    separate = sum(r.flops() for r in runs if r.role == "branch")
    spent = sum(r.trained_flops() for r in runs)
    # Per shape 32 trunk steps + 2 + 4 + 8 cooldown steps against 10 + 20 + 40 steps.
    assert spent / separate == pytest.approx(46 / 70)
    line, = [n for n in notes if n.startswith("ladder:")]
    assert f"{separate:.3g}" in line and f"{1 - spent / separate:.0%} saved" in line
    assert not any("budgets" in note for note in notes)  # a ladder plans no FLOP budgets


@pytest.mark.slow
def test_dry_run_probes_a_ladder_whose_costliest_run_is_a_branch(tmp_path):
    # The probe trains a handful of steps of the costliest shape; when that shape's last run is a
    # branch from step 32, the probe must train the shape alone, not the branch.
    spec = load_spec(LADDER)
    costliest = plan(spec)[-1]
    assert costliest.role == "branch" and costliest.cfg.train.branch_step == 32
    table, notes = dry_run(spec, tmp_path / "w", probe="steps")
    assert np.isfinite(table["est_seconds"]).all() and (table["est_seconds"] > 0).all()
    assert sum(n.startswith("# probe") or n.startswith("probe") for n in notes) == 2


@pytest.mark.parametrize("overrides,field", [
    (["sweep.branches.tokens=()"], "sweep.branches.tokens_per_param"),
    (["sweep.branches.tokens=(2560, 2560)"], "sweep.branches.tokens"),
    (["sweep.branches.tokens=(2560, 2600)"], "sweep.branches"),  # the same whole batches
    (["sweep.branches.fraction=1.0"], "sweep.branches.fraction"),
    (["sweep.branches.cooldown=exp"], "sweep.branches.cooldown"),
    (["sweep.mode=grid"], "sweep.branches"),
    # one step: its cooldown would start after the 2-step warmup, past its own end (a worker
    # refused every such branch after the trunks had trained)
    (["sweep.branches.tokens=(1,)"], "sweep.branches"),
])
def test_ladder_spec_errors_name_the_field(overrides, field):
    with pytest.raises(SweepSpecError) as e:
        plan(load_spec(LADDER, overrides))
    assert e.value.field == field


@pytest.mark.parametrize("key,value,field", [
    ("warmup", {"rule": "fraction", "fraction": 0.1}, "sweep.warmup.rule"),
    ("axes", {"train": {"schedule": ("cosine",)}}, "sweep.axes.train.schedule"),
])
def test_ladder_owns_the_schedule_and_shares_the_warmup(key, value, field):
    config = tiny_ladder.get_config()
    config.sweep[key] = ConfigDict(value)
    with pytest.raises(SweepSpecError) as e:
        plan(spec_from_config_dict(config))
    assert e.value.field == field


# -- a real ladder sweep (slow lane) --------------------------------------------------------------

ENV = dict(os.environ, JAX_PLATFORMS="cpu")
SEED = int(os.environ.get("ATTNLAB_INTERRUPT_SEED", time.time()))


def _sweep(workdir, cache_dir, log) -> subprocess.Popen:
    handle = open(log, "w")
    return subprocess.Popen([sys.executable, "-m", "attnlab.cli", "sweep", f"--config={LADDER}",
                             f"--sweep={workdir}", f"--cache-dir={cache_dir}", "--noprogress",
                             "--config.base.train.log_every=1"],  # a line per step
                            cwd=ROOT, env=ENV, stdout=handle, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _logged(workdir) -> int:
    total = 0
    for path in workdir.glob("runs/*/metrics.jsonl"):
        try:
            total += path.read_text().count('"loss"')
        except OSError:
            pass
    return total


def _hashes(directory: pathlib.Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != "train.log"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("ladder")
    workdir, cache_dir = root / "sweep", root / "jax_cache"
    proc = _sweep(workdir, cache_dir, root / "reference.log")
    assert proc.wait(timeout=900) == 0, (root / "reference.log").read_text()[-3000:]
    return workdir, cache_dir


@pytest.mark.slow
def test_ladder_table_has_branches_as_points(reference):
    workdir, _ = reference
    table = results.load(workdir)
    assert set(table["status"]) == {"completed"}
    branches = table[table["role"] == "branch"].set_index("run_id")
    trunks = table[table["role"] == "trunk"].set_index("run_id")
    assert len(trunks) == 2 and len(branches) == 6
    for run_id, row in branches.iterrows():
        trunk = trunks.loc[row["trunk"]]
        assert row["non_embedding_params"] == trunk["non_embedding_params"]
        per_token = row["flops"] / row["tokens"]  # 6N
        assert row["shared_flops"] == pytest.approx(per_token * min(row["tokens"] * 0.8,
                                                                    trunk["tokens"]))
        assert row["shared_flops"] < row["flops"]
    points = prepare_points(table, law=law_named("chinchilla"))
    assert len(points) == 6 and any("trunk" in note for note in points.notes)


@pytest.mark.slow
def test_the_laws_of_whole_curves_read_each_branch_with_its_trunk(reference):
    """The sweep's curves as --law=multipower reads them: each run's rate at every update
    from its config's schedule (the sweep logs every 4th: the values it logged are these),
    each branch's curve its trunk's losses and rates before its branch point and its own
    cooldown after it; and the multi-power law fitted to one shape's trunk and branches
    follows each of them (mean relative error under 5%)."""
    workdir, _ = reference
    table = read_curves(workdir)
    curves, notes = curves_from_table(table, source=str(workdir))
    by_id = {c.run_id: c for c in curves}
    branches = table[table["role"] == "branch"].groupby("run_id")["trunk"].first()
    assert len(branches) == 6 and any("6 cooldown branch(es)" in n for n in notes), notes
    assert any("8 run(s): the rate at every update from the run's config" in n for n in notes)
    for run_id, rows in table.dropna(subset=["lr"]).groupby("run_id"):
        np.testing.assert_allclose(by_id[run_id].lr[rows["step"].to_numpy() - 1], rows["lr"],
                                   rtol=1e-6)
    for run_id, trunk_id in branches.items():
        branch, trunk = by_id[run_id], by_id[trunk_id]
        own = table.loc[(table["run_id"] == run_id) & table["loss"].notna(), "step"].min()
        before = branch.steps < own
        np.testing.assert_array_equal(branch.steps[before], trunk.steps[trunk.steps < own])
        np.testing.assert_array_equal(branch.loss[before], trunk.loss[trunk.steps < own])
        np.testing.assert_array_equal(branch.lr[:own - 1], trunk.lr[:own - 1])
        assert branch.decays and not trunk.decays
    trunk_id = branches.iloc[0]
    one_shape = [by_id[trunk_id]] + [by_id[r] for r, t in branches.items() if t == trunk_id]
    law = law_named("multipower")
    fit = law.fit(one_shape, n_bootstrap=0, ci_level=0.95, seed=0)
    for curve in (c.fitted() for c in one_shape):
        error = np.abs(law.predict(fit.params, curve) / curve.loss - 1)
        assert error.mean() < 0.05, (curve.run_id, error)


@pytest.mark.uncached
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "ctrl-c"])
def test_interrupted_then_rerun_equals_uninterrupted_and_a_deleted_branch_retrains_alone(
        reference, tmp_path, sig):
    ref_dir, cache_dir = reference
    # Of 2 x 32 trunk steps then 2 x (2 + 4 + 8) cooldown steps: the end of the trunks or a branch.
    at = random.Random(SEED + sig).randint(40, 88)
    context = f"seed {SEED}: {sig.name} to the sweep's group after {at} lines"
    workdir = tmp_path / "sweep"
    proc = _sweep(workdir, cache_dir, tmp_path / "killed.log")
    while _logged(workdir) < at and proc.poll() is None:
        time.sleep(0.02)
    if proc.poll() is not None:
        pytest.skip(f"{context}: the sweep finished before the signal landed")
    os.killpg(proc.pid, sig)  # a terminal's Ctrl-C goes to the whole group too
    returncode = proc.wait(timeout=120)
    if sig == signal.SIGINT:
        assert returncode == 130, f"{context}: " + (tmp_path / "killed.log").read_text()[-3000:]
    statuses = [results.run_status(d) for d in results.run_dirs(workdir)]
    assert "failed" not in statuses, f"{context}: {statuses}"

    rerun = _sweep(workdir, cache_dir, tmp_path / "rerun.log")
    assert rerun.wait(timeout=900) == 0, f"{context}: " + (tmp_path / "rerun.log").read_text()
    table = results.load(workdir).set_index("run_id").sort_index()
    want = results.load(ref_dir).set_index("run_id").sort_index()
    assert set(table["status"]) == {"completed"} and list(table.index) == list(want.index)
    for column in ("final_val_loss", "final_train_loss", "tokens", "flops", "shared_flops"):
        np.testing.assert_allclose(table[column].astype(float), want[column].astype(float),
                                   rtol=1e-6, err_msg=f"{context}: {column}")

    victim = table[table["role"] == "branch"].index[1]
    others = {d.name: _hashes(d) for d in (workdir / "runs").iterdir() if d.name != victim}
    import shutil
    shutil.rmtree(workdir / "runs" / victim)
    again = _sweep(workdir, cache_dir, tmp_path / "again.log")
    assert again.wait(timeout=900) == 0, (tmp_path / "again.log").read_text()[-3000:]
    assert {d.name: _hashes(d) for d in (workdir / "runs").iterdir() if d.name != victim} \
        == others, "a run other than the deleted branch was touched"
    redone = results.load(workdir).set_index("run_id")
    assert redone.loc[victim, "status"] == "completed"
    assert redone.loc[victim, "final_val_loss"] == pytest.approx(
        want.loc[victim, "final_val_loss"], rel=1e-6)


@pytest.mark.slow
def test_branches_of_seeds_train_as_ensembles_with_the_results_of_lone_runs(tmp_path):
    """Two seeds of one shape: the two trunks form one ensemble, and each pair of branches that
    start at the same step another; the table equals the lone runs' to float rounding."""
    from attnlab.sweep import run_sweep

    config = tiny_ladder.get_config()
    config.sweep.shapes = ((16, 1, 2, 1e-2),)
    config.sweep.axes = ConfigDict({"train": {"seed": (0, 1)}})
    spec = spec_from_config_dict(config)
    table, _ = dry_run(spec, probe="none", ensemble="on", ensemble_max=8)
    units = table.groupby("unit")["run_id"].apply(list)
    assert sorted(map(len, units)) == [2, 2, 2, 2]  # the trunks, then a pair per branch point
    for members in units:
        assert table.set_index("run_id").loc[members, "from_step"].nunique() == 1
    cache = tmp_path / "jax_cache"
    together = run_sweep(spec, tmp_path / "together", progress=False, cache_dir=cache,
                         ensemble="on")
    alone = run_sweep(spec, tmp_path / "alone", progress=False, cache_dir=cache, ensemble="off")
    assert set(together["status"]) == {"completed"}
    exact = ["run_id", "status", "role", "trunk", "params", "tokens", "shared_flops"]
    assert together[exact].equals(alone[exact])
    # Float rounding of the batched matmuls only (measured: 1.3e-5 relative after the trunks'
    # 32 steps at lr 1e-2 under jax 0.10, the branches' cooldowns adding none; 6.4e-5 under
    # jax 0.12.0.1, 2026-11-26).
    np.testing.assert_allclose(together["final_val_loss"], alone["final_val_loss"], rtol=3e-4)
