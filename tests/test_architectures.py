"""The architecture scaling study (issue #17): experiments/architectures.py and the variant study.

Fast tests check the plan (planning is pure: no JAX, no training): every architecture present,
each run's FLOPs counted by its own mixer's formula, each budget's ladder centred on its prior, and
the sweep.variants spec's errors. Slow tests run a tiny real study of three architectures end to
end (sweep, per-architecture fits, ranking, frontier plot, r(4x)), and an interrupted one that is
resumed and must give the same table.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.image
import numpy as np
import pandas as pd
import pytest

from attnlab import cli, study
from attnlab.model import flops_per_token
from attnlab.sweep import SweepSpecError, load_spec, plan, spec_from_config_dict
from repo_files import load_module

EXPERIMENT = "experiments/architectures.py"
CPU_ARCHITECTURES = {"gpt", "alibi", "cosine", "window", "linear", "ngpt", "mamba", "moe"}


# --- the plan -------------------------------------------------------------------------------------

@pytest.mark.parametrize("scale", ["cpu", "gpu"])
def test_every_architecture_has_a_ladder_at_every_budget(scale):
    spec = load_spec(f"{EXPERIMENT}:{scale}")
    runs = plan(spec)
    expected = CPU_ARCHITECTURES | ({"hybrid"} if scale == "gpu" else set())
    assert {r.axes["architecture"] for r in runs} == expected
    for name in expected:
        mine = [r for r in runs if r.axes["architecture"] == name]
        for budget in spec.budgets:
            ladder = [r for r in mine if r.budget == budget]
            assert len(ladder) >= 3, (name, budget)  # a profile needs three sizes


@pytest.mark.parametrize("scale", ["cpu", "gpu"])
def test_flops_are_counted_by_each_mixers_own_formula(scale):
    spec = load_spec(f"{EXPERIMENT}:{scale}")
    runs = plan(spec)
    for run in runs:
        own = flops_per_token(run.cfg.model, run.cfg.data.seq_len)
        assert run.flops_per_token == own
        # The budget buys D = C / (own FLOPs per token) tokens, to within one batch.
        batch = run.cfg.data.batch_size * run.cfg.data.seq_len
        assert abs(run.flops("chinchilla") - run.budget) <= own["chinchilla"] * batch / 2 + 1
    # The same shape costs different FLOPs per token under different mixers: a count shared by
    # all architectures would make these equal.
    by_arch = {}
    for run in runs:
        key = (run.cfg.model.d_model, run.cfg.model.n_layers)
        by_arch.setdefault(key, {})[run.axes["architecture"]] = run.flops_per_token["chinchilla"]
    shared = [counts for counts in by_arch.values() if {"gpt", "mamba", "window"} <= set(counts)]
    assert shared
    for counts in shared:
        assert counts["mamba"] != counts["gpt"]
        assert counts["window"] < counts["gpt"]  # the band is narrower than the full context


def test_mixers_and_rules_reach_the_run_configs():
    runs = plan(load_spec(f"{EXPERIMENT}:cpu"))
    first = {}
    for run in runs:
        first.setdefault(run.axes["architecture"], run)
    m = {name: run.cfg.model for name, run in first.items()}
    assert m["gpt"].pos_encoding == "rope" and m["gpt"].mixer == "softmax"
    assert m["alibi"].pos_encoding == "alibi"
    assert m["cosine"].attention_scale == "cosine"
    assert m["window"].attention_window > 0
    assert m["linear"].mixer == "linear" and m["mamba"].mixer == "mamba"
    assert m["ngpt"].ngpt and first["ngpt"].cfg.train.warmup_steps == 0
    assert m["moe"].moe == "token_choice" and m["moe"].moe_experts == 8
    assert first["ngpt"].cfg.train.weight_decay == 0
    # Every other architecture follows the sweep's shared warmup rule (5% of the run).
    for name, run in first.items():
        if name != "ngpt":
            assert run.cfg.train.warmup_steps == math.ceil(0.05 * run.steps)
    # Same data order and schedule rules everywhere.
    assert len({(r.cfg.data.seed, r.cfg.data.source, r.cfg.train.seed, r.cfg.train.schedule)
                for r in runs}) == 1
    # The baseline is the quickstart's model: its runs share the run ids of the quickstart's
    # four-budget plan (issue #20's first try; the quickstart has since moved to three budgets
    # with denser ladders, and this study keeps its finished runs).
    assert {r.run_id for r in runs if r.axes["architecture"] == "gpt"} <= QUICKSTART_FOUR_BUDGETS


QUICKSTART_FOUR_BUDGETS = {
    "d12-l1-rope-t898k-s0-df691a23", "d16-l1-rope-t643k-s0-0b28ded9",
    "d20-l1-rope-t492k-s0-96b6897d", "d24-l1-rope-t389k-s0-7dfcc4bf",
    "d16-l1-rope-t1.61M-s0-dbc58f95", "d20-l1-rope-t1.23M-s0-6694bb02",
    "d24-l1-rope-t972k-s0-55370a16", "d32-l1-rope-t671k-s0-fe431a74",
    "d32-l2-rope-t430k-s0-06f50400", "d20-l1-rope-t3.07M-s0-e617e037",
    "d24-l1-rope-t2.43M-s0-d9835bc4", "d32-l1-rope-t1.68M-s0-5f3045e3",
    "d32-l2-rope-t1.08M-s0-390b36d7", "d40-l2-rope-t780k-s0-702707bb",
    "d32-l1-rope-t4.21M-s0-0fb1116d", "d32-l2-rope-t2.7M-s0-da14770d",
    "d40-l2-rope-t1.95M-s0-c8a6ee58", "d48-l2-rope-t1.48M-s0-cd9e4b7e",
}


def test_ladders_are_centred_on_the_prior():
    spec = load_spec(f"{EXPERIMENT}:cpu")
    runs = plan(spec)
    for run in runs:  # centred on what a token uses (the total for all but the moe arm)
        target = spec.centre.target(run.budget)
        active = run.params.get("active", run.params["total"])
        assert target / spec.centre.span <= active <= target * spec.centre.span
    for name in CPU_ARCHITECTURES:
        for budget in spec.budgets:
            sizes = [r.params.get("active", r.params["total"]) for r in runs
                     if r.axes["architecture"] == name and r.budget == budget]
            target = spec.centre.target(budget)
            assert min(sizes) < target < max(sizes), (name, budget)  # the prior lies inside


def test_the_paired_plan_adds_seed_1_to_the_tuned_plans_runs():
    """cpu_tuned_pair: GPT and Mamba at the largest budget, seed 0's runs the tuned plan's own
    (same ids, so finished ones are reused), and each run again at seed 1."""
    tuned = plan(load_spec(f"{EXPERIMENT}:cpu_tuned"))
    paired = plan(load_spec(f"{EXPERIMENT}:cpu_tuned_pair"))
    top = max(r.budget for r in tuned)
    expected = [r for r in tuned if r.budget == top and r.axes["architecture"] in ("gpt", "mamba")]
    seed0 = [r for r in paired if r.cfg.train.seed == 0]
    seed1 = [r for r in paired if r.cfg.train.seed == 1]
    assert sorted(r.run_id for r in seed0) == sorted(r.run_id for r in expected)
    assert len(seed1) == len(seed0) and not {r.run_id for r in seed1} & {r.run_id for r in seed0}
    points = [sorted((r.axes["architecture"], r.params["total"], r.cfg.train.learning_rate)
                     for r in runs) for runs in (seed0, seed1)]
    assert points[0] == points[1]


def test_the_tuned_plan_reaches_past_the_ladders_tops_where_the_best_sat():
    """Mamba's, ALiBi's and MoE's best runs sat at a ladder's largest size: the tuned plan keeps
    every untuned run's point and adds larger sizes at each budget for them (ALiBi's wider band a
    smaller one too); the other arms' ladders are the same."""
    def sizes(scale):
        found = {}
        for run in plan(load_spec(f"{EXPERIMENT}:{scale}")):
            found.setdefault((run.axes["architecture"], run.budget), set()).add(
                run.params["total"])
        return found

    untuned, tuned = sizes("cpu"), sizes("cpu_tuned")
    assert untuned.keys() == tuned.keys()
    for (arm, budget), ladder in untuned.items():
        if arm in ("alibi", "mamba", "moe"):
            added = tuned[arm, budget] - ladder
            assert ladder < tuned[arm, budget] and max(added) > max(ladder)
            below = {n for n in added if n < min(ladder)}
            assert added - below == {n for n in added if n > max(ladder)}
            assert not below or arm == "alibi"
        else:
            assert tuned[arm, budget] == ladder


def test_variant_rules_override_the_sweeps_own():
    config = load_module(EXPERIMENT).get_config("cpu")
    config.sweep.variants.mamba.centre = {"n_opt": 2e4, "budget": 1.5e11, "span": 1.6}
    spec = spec_from_config_dict(config)
    mamba = [r for r in plan(spec) if r.axes["architecture"] == "mamba"]
    for run in mamba:
        target = 2e4 * (run.budget / 1.5e11) ** 0.5
        assert target / 1.6 <= run.params["total"] <= target * 1.6


@pytest.mark.parametrize("edit, field", [
    (lambda s: setattr(s.variants.linear.model, "mixers", "x"),
     "sweep.variants.linear.model.mixers"),
    (lambda s: setattr(s.variants.linear.model, "mixer", "lstm"),
     "sweep.variants.linear.model.mixer"),
    (lambda s: setattr(s.variants.gpt, "optimizer", {"x": 1}), "sweep.variants.gpt.optimizer"),
    (lambda s: setattr(s.variants.gpt, "model", {"d_model": 64}),
     "sweep.variants.gpt.model.d_model"),
    (lambda s: setattr(s.variants.mamba, "centre", {"n_opt": 1e4}),
     "sweep.variants.mamba.centre.budget"),
    (lambda s: setattr(s, "variant_column", "params"), "sweep.variant_column"),
    (lambda s: setattr(s, "baseline", "transformer"), "sweep.baseline"),
    # nGPT without its own warmup rule: its warmup_steps = 0 collides with the sweep's rule.
    (lambda s: s.variants.ngpt.__delattr__("warmup"), "sweep.variants.ngpt.train.warmup_steps"),
])
def test_bad_variants_name_the_field(edit, field):
    config = load_module(EXPERIMENT).get_config("cpu")
    edit(config.sweep)
    with pytest.raises(SweepSpecError) as error:
        plan(spec_from_config_dict(config))
    assert error.value.field == field


def test_two_identical_variants_are_refused():
    config = load_module(EXPERIMENT).get_config("cpu")
    config.sweep.variants.rope_again = {"model": {"pos_encoding": "rope"}}
    with pytest.raises(SweepSpecError, match="same run as variant 'gpt'"):
        plan(spec_from_config_dict(config))


def test_bad_variant_exits_2_on_the_command_line(capsys, tmp_path):
    code = cli.main(["sweep", f"--config={EXPERIMENT}", f"--sweep={tmp_path / 'w'}",
                     "--dry-run", "--probe=none",
                     "--config.sweep.variants.mamba.model.mixer=lstm"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and "sweep.variants.mamba" in err
    assert "Traceback" not in err


def test_dry_run_shows_the_architecture_column(capsys, tmp_path):
    assert cli.main(["sweep", f"--config={EXPERIMENT}", f"--sweep={tmp_path / 'w'}",
                     "--dry-run", "--probe=none"]) == 0
    out = capsys.readouterr().out
    assert "architecture" in out and "mamba" in out and "ngpt" in out


# --- a tiny real study --------------------------------------------------------------------------

TINY_ARCHITECTURES = ("gpt", "linear", "mamba")


def tiny_config():
    """experiments/architectures.py at test size: three architectures (two without positions),
    two budgets of three sizes each."""
    config = load_module(EXPERIMENT).get_config("cpu")
    for name in list(config.sweep.variants):
        if name not in TINY_ARCHITECTURES:
            del config.sweep.variants[name]
    base = config.base
    base.model.max_len = 64
    base.model.mixer_chunk = 16
    base.data.max_bytes = 200_000
    base.data.seq_len = 32
    base.data.batch_size = 8
    base.train.eval_batches = 2
    base.train.log_every = 4
    base.train.checkpoint_every = 8
    config.sweep.name = "tiny_architectures"
    config.sweep.budgets = (1.5e9, 4e9)
    config.sweep.min_steps = 4
    config.sweep.shapes = ((8, 1, 1), (16, 1, 1), (32, 1, 2))
    config.sweep.centre = {"n_opt": 8e3, "budget": 4e9, "exponent": 0.5, "span": 100.0}
    return config


def tiny_spec():
    return spec_from_config_dict(tiny_config(), source=EXPERIMENT)


def _run_tiny_study(workdir, out=None):
    return study.run_study(tiny_spec(), workdir, n_bootstrap=16, progress=False,
                           out=out or open(os.devnull, "w"))


@pytest.fixture(scope="session")
def straight_study(tmp_path_factory):
    """The tiny study run once, straight through: (workdir, StudyResult, what it printed).
    Its tests share an xdist group, so that one worker runs it once (CI: --dist loadgroup);
    session-scoped, because a module fixture is torn down when the worker's next test is
    another module's, and the group's tests need not come in a row."""
    workdir = tmp_path_factory.mktemp("architectures") / "straight"
    log = workdir.parent / "study.log"
    with open(log, "w") as out:
        result = _run_tiny_study(workdir, out=out)
    return workdir, result, log.read_text()


@pytest.mark.xdist_group("architectures_study")
@pytest.mark.slow
def test_tiny_study_fits_ranks_and_plots_each_architecture(straight_study, capsys):
    workdir, result, out = straight_study
    grouped = result.grouped
    assert grouped is not None and grouped.by == "architecture"
    results = pd.read_csv(workdir / "results.csv")
    assert set(results["architecture"]) == set(TINY_ARCHITECTURES)
    assert (results["status"] == "completed").all()

    # One approach-3 and one approach-2 fit per architecture, with intervals around estimates.
    ranking = pd.read_csv(workdir / study.RANKING_FILE)
    assert set(ranking["architecture"]) == set(TINY_ARCHITECTURES)
    assert list(ranking["rank"]) == [1, 2, 3]
    finite = ranking[np.isfinite(ranking["loss"])]
    assert (np.diff(finite["loss"]) >= 0).all()  # ranked best first
    for _, row in finite.iterrows():
        if np.isfinite(row["loss_low"]):
            assert row["loss_low"] <= row["loss"] + 1e-9 and row["loss"] <= row["loss_high"] + 1e-9
        assert 0.5 < row["loss"] < 8.0  # nats per byte token: between the floor and uniform
    # The model-free check: the best observed loss at the largest budget is a real run's.
    for _, row in ranking.iterrows():
        run = results[results["run_id"] == row["best_run"]].iloc[0]
        assert run["architecture"] == row["architecture"]
        assert run["final_val_loss"] == pytest.approx(row["best_observed"])
        assert run["budget"] == results["budget"].max()
    assert grouped.fits3 is not None
    assert set(grouped.fits3.fits) | set(grouped.fits3.skipped) == set(TINY_ARCHITECTURES)
    # Approach 2 needs each budget's minimum inside its ladder, which tiny training need not
    # give: either a fit per architecture (or a skip with its reason), or one note saying why.
    if grouped.fits2 is not None:
        assert set(grouped.fits2.fits) | set(grouped.fits2.skipped) == set(TINY_ARCHITECTURES)
    else:
        assert any(m.startswith("approach 2 skipped") for m in result.messages)
        assert not np.isfinite(ranking["a2"]).any()
    # The reference compute is the largest run's own count, per architecture's formula.
    assert grouped.ranking.attrs["budget"] == pytest.approx(results["flops_chinchilla"].max(),
                                                            rel=1e-2)

    # r(4x) for every architecture, mixers without positions included (finite, positive).
    assert set(grouped.ratios) == set(TINY_ARCHITECTURES)
    for name, (ratio, run_id, note) in grouped.ratios.items():
        assert ratio is not None and 0 < ratio < 100, (name, note)
        largest = results[results["architecture"] == name].sort_values(["budget", "params"])
        assert run_id == largest.iloc[-1]["run_id"]
    assert np.isfinite(ranking["r(4x)"]).all()

    # All frontiers in one figure, and one IsoFLOP figure per fitted architecture.
    frontiers = workdir / "plots" / "frontiers.png"
    assert matplotlib.image.imread(frontiers).shape[0] > 100
    for name in (grouped.fits2.fits if grouped.fits2 else ()):
        assert (workdir / "plots" / f"isoflop_{name}.png").exists()
    assert (workdir / study.FIT_FILE).exists()
    assert (workdir / study.FIT_APPROACH2_FILE).exists() == (grouped.fits2 is not None)
    assert "ranking by approach 3's compute-optimal loss" in out and "r(4x)" in out
    # Every other architecture's compute multiplier against gpt (sweep.baseline): a value with
    # its interval, or a one-line note saying why not.
    multipliers = pd.read_csv(workdir / study.MULTIPLIERS_FILE)
    multipliers["note"] = multipliers["note"].fillna("")
    assert set(multipliers["architecture"]) == set(TINY_ARCHITECTURES) - {"gpt"}
    for _, row in multipliers.iterrows():
        assert np.isfinite(row["multiplier"]) or row["note"], row
    assert "effective compute multiplier against architecture=gpt" in out

    # The same fits from `attnlab fit --by=architecture`.
    assert cli.main(["fit", f"--sweep={workdir}", "--law=chinchilla", "--approach=3",
                     "--by=architecture", "--bootstrap=0"]) == 0
    assert "one fit per architecture" in capsys.readouterr().out

    # Rerunning the finished study trains nothing and writes the same ranking.
    before = (workdir / study.RANKING_FILE).read_text()
    again = _run_tiny_study(workdir)
    assert (workdir / study.RANKING_FILE).read_text() == before
    assert again.failed_runs == 0


STUDY_SCRIPT = """
import sys
from attnlab import study
sys.path.insert(0, {tests!r})
from test_architectures import tiny_spec
study.run_study(tiny_spec(), {workdir!r}, n_bootstrap=16, progress=False)
"""


def _ranking_values(workdir):
    ranking = pd.read_csv(Path(workdir) / study.RANKING_FILE).sort_values("architecture")
    return ranking.reset_index(drop=True)


def _signal_masks(pid: int) -> dict[str, str]:
    """The process's blocked, ignored and caught signals (hex masks, from /proc)."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)
            if k in ("SigBlk", "SigIgn", "SigCgt")}


@pytest.mark.xdist_group("architectures_study")
@pytest.mark.slow
def test_a_resumed_study_gives_the_same_table(straight_study, tmp_path):
    """Interrupted mid-sweep (SIGINT once some runs are done), then rerun: the results and the
    ranking equal those of a study that ran straight through (to training's float noise)."""
    straight, resumed = straight_study[0], tmp_path / "resumed"

    script = STUDY_SCRIPT.format(tests=str(Path(__file__).parent), workdir=str(resumed))
    process = subprocess.Popen([sys.executable, "-c", script], cwd=os.getcwd(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    deadline = time.time() + 240
    runs = resumed / "runs"
    while time.time() < deadline and process.poll() is None:
        done = list(runs.glob("*/summary.json")) if runs.exists() else []
        if len(done) >= 4:
            break
        time.sleep(0.2)
    assert process.poll() is None, "the study ended before it could be interrupted"
    masks = _signal_masks(process.pid)
    os.killpg(process.pid, signal.SIGINT)
    try:
        output = process.communicate(timeout=120)[0].decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"still running 120 s after SIGINT; its signal masks when it was sent: "
                    f"{masks}; its output: {(e.output or b'').decode(errors='replace')}")
    assert process.returncode != 0, output
    assert not (resumed / study.RANKING_FILE).exists()  # it stopped before the fits

    _run_tiny_study(resumed)
    a = pd.read_csv(straight / "results.csv").sort_values("run_id").reset_index(drop=True)
    b = pd.read_csv(resumed / "results.csv").sort_values("run_id").reset_index(drop=True)
    assert list(a["run_id"]) == list(b["run_id"])
    assert (b["status"] == "completed").all()
    np.testing.assert_allclose(b["final_val_loss"], a["final_val_loss"], rtol=2e-3)

    ra, rb = _ranking_values(straight), _ranking_values(resumed)
    assert list(ra["architecture"]) == list(rb["architecture"])
    assert list(ra["best_run"]) == list(rb["best_run"]) or np.allclose(
        ra["best_observed"], rb["best_observed"], rtol=2e-3)
    for column in ("loss", "N_opt", "a3", "a2", "r(4x)", "best_observed"):
        both = np.isfinite(ra[column]) & np.isfinite(rb[column])
        assert (np.isfinite(ra[column]) == np.isfinite(rb[column])).all(), column
        np.testing.assert_allclose(rb[column][both], ra[column][both], rtol=0.05, err_msg=column)


@pytest.mark.xdist_group("architectures_study")
@pytest.mark.slow
def test_architectures_notebook_runs_on_the_tiny_study(straight_study, tmp_path, monkeypatch):
    """notebooks/architectures.ipynb, every cell, against the tiny study (fits only: the sweep is
    done and its extrapolation reports are reused)."""
    import nbformat
    from nbclient import NotebookClient
    from notebook_outputs import finish

    root = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("ATTNLAB_SWEEP_DIR", str(straight_study[0]))
    monkeypatch.setenv("ATTNLAB_FIGURES_DIR", str(tmp_path / "figures"))
    monkeypatch.setenv("ATTNLAB_BOOTSTRAP", "8")
    notebook = nbformat.read(root / "notebooks" / "architectures.ipynb", as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(root)}}).execute()
    text = "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code"
                   for o in c.get("outputs", []) if o.output_type == "stream")
    assert "ranking by approach 3's compute-optimal loss" in text
    assert (tmp_path / "figures" / "frontiers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finish(notebook, "architectures.ipynb", straight_study[0].parent, tmp_path)


@pytest.mark.slow
def test_dry_run_probes_each_architectures_own_speed(tmp_path):
    """Mixers run at different FLOP rates (a scan is slower per FLOP than a matrix product), so
    a sweep of variants times each variant's own shapes."""
    from attnlab.sweep import dry_run

    table, notes = dry_run(tiny_spec(), tmp_path / "w", probe="steps")
    for name in TINY_ARCHITECTURES:
        assert any(n.startswith(f"probe {name} ") for n in notes), notes
    assert (table["est_seconds"] > 0).all()
    assert any(n.startswith("estimated time to run") for n in notes)
