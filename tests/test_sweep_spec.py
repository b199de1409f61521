"""Sweep specs and planning: run ids, modes, rules, and one clear error per kind of bad input.

Nothing here trains; every test plans from the real experiment files or small variations.
"""

import dataclasses
import math
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from attnlab import cli_flags
from attnlab.cli_flags import UsageError
from attnlab.model import flops_per_token, param_counts
from attnlab.sweep import (
    LauncherError,
    SweepSpecError,
    expand,
    load_spec,
    plan,
    run_id,
    run_sweep,
    spec_from_config_dict,
)
from repo_files import load_module


def experiment(name: str):
    """The ConfigDict of experiments/<name>.py (unlocked, so tests can add bad keys)."""
    return load_module(f"experiments/{name}.py").get_config()


def spec_error(config) -> SweepSpecError:
    with pytest.raises(SweepSpecError) as info:
        plan(spec_from_config_dict(config))
    return info.value


# -- planning ----------------------------------------------------------------------------------


def test_tiny_grid_is_the_product_of_shapes_and_axes():
    runs = plan(load_spec("experiments/tiny_grid.py"))
    assert len(runs) == 4
    combos = {(r.cfg.model.d_model, r.cfg.model.n_layers, r.cfg.model.pos_encoding) for r in runs}
    assert combos == {(16, 1, "rope"), (16, 1, "alibi"), (32, 2, "rope"), (32, 2, "alibi")}
    for run in runs:
        assert run.cfg.name == run.run_id
        # per-shape learning rates from the 4-tuples
        assert run.cfg.train.learning_rate == {16: 1e-2, 32: 5e-3}[run.cfg.model.d_model]
        assert run.axes["train.learning_rate"] == run.cfg.train.learning_rate
        assert run.tokens == 24 * 8 * 32
        assert run.params["total"] == param_counts(run.cfg.model)["total"]


def test_run_ids_are_stable_readable_and_follow_the_config():
    first = [r.run_id for r in plan(load_spec("experiments/tiny_grid.py"))]
    again = [r.run_id for r in plan(load_spec("experiments/tiny_grid.py"))]
    assert first == again and len(set(first)) == 4
    run = plan(load_spec("experiments/tiny_grid.py"))[0]
    assert run.run_id.startswith("d16-l1-rope-t6.14k-s0-")
    assert len(run.run_id.rsplit("-", 1)[1]) == 8
    # Any training field changes the id; launch-only fields (mesh, cache dir, name) do not.
    lr = dataclasses.replace(run.cfg, train=dataclasses.replace(run.cfg.train, b2=0.99))
    assert run_id(lr) != run.run_id
    mesh = dataclasses.replace(run.cfg, name="x",
                               train=dataclasses.replace(run.cfg.train, mesh_data=1),
                               data=dataclasses.replace(run.cfg.data, cache_dir="/elsewhere"))
    assert run_id(mesh) == run.run_id


def test_overrides_and_scale_argument():
    spec = load_spec("experiments/tiny_grid.py:gpu",
                     ["--config.sweep.axes.train.seed=(0,1,2)", "sweep.shapes=((16,1,2,1e-2),)"])
    assert spec.scale == "gpu" and spec.resources.gpus == 1.0
    runs = plan(spec)
    assert len(runs) == 1 * 2 * 3
    assert sorted({r.cfg.train.seed for r in runs}) == [0, 1, 2]


@pytest.mark.parametrize("name", ["kaplan", "chinchilla_isoflop", "quickstart",
                                  "pe_extrapolation"])
def test_config_scale_override_picks_the_files_gpu_plan(name):
    # --config.scale=gpu must reach get_config(scale), not just relabel the CPU plan.
    module = load_module(f"experiments/{name}.py")
    expected = spec_from_config_dict(module.get_config("gpu"), source=f"experiments/{name}.py")
    cpu = load_spec(f"experiments/{name}.py")
    gpu = load_spec(f"experiments/{name}.py", ["--config.scale=gpu"])
    assert gpu == expected and gpu.scale == "gpu"
    assert plan(gpu) != plan(cpu)
    assert load_spec(f"experiments/{name}.py:gpu", ["scale=gpu"]) == expected


def test_config_scale_override_errors_are_clear():
    with pytest.raises(UsageError, match="contradicts"):
        load_spec("experiments/kaplan.py:cpu", ["--config.scale=gpu"])
    with pytest.raises(UsageError, match="takes no scale argument"):
        cli_flags.parse(["--config=configs/tiny.py", "--config.scale=gpu"])
    with pytest.raises(UsageError, match="needs --config=FILE"):
        cli_flags.parse(["--config.scale=gpu"], config_required=False)
    with pytest.raises(SweepSpecError, match="config.scale"):
        load_spec("experiments/kaplan.py", ["--config.scale=tpu"])


def test_isoflop_runs_spend_their_budget_in_whole_batches():
    spec = load_spec("experiments/tiny_isoflop.py")
    runs, notes = expand(spec)
    assert notes == []
    assert sorted({r.budget for r in runs}) == [1e9, 2e9]
    batch_tokens = 8 * 32
    for run in runs:
        per_token = flops_per_token(run.cfg.model, 32)["chinchilla"]
        assert run.tokens % batch_tokens == 0 and run.cfg.train.tokens == run.tokens
        # D = C / (FLOPs per token), rounded to the nearest whole batch
        assert abs(run.tokens * per_token - run.budget) <= per_token * batch_tokens / 2
        assert run.steps >= spec.min_steps
        # warmup: ceil(10% of the run), lr: base * 16 / d_model (inverse_width)
        assert run.cfg.train.warmup_steps == max(1, math.ceil(0.1 * run.steps))
        assert run.cfg.train.learning_rate == pytest.approx(1e-2 * 16 / run.cfg.model.d_model,
                                                            rel=1e-5)
    # within one budget, bigger models get fewer tokens
    for budget in (1e9, 2e9):
        sizes = sorted((r.params["non_embedding"], r.tokens) for r in runs if r.budget == budget)
        assert [t for _, t in sizes] == sorted((t for _, t in sizes), reverse=True)


def test_isoflop_leaves_out_shapes_the_budget_cannot_train():
    config = experiment("tiny_isoflop")
    config.sweep.min_steps = 10
    runs, notes = expand(spec_from_config_dict(config))
    assert all(r.steps >= 10 for r in runs)
    assert len(notes) == 1 and "d48-l3-h6" in notes[0] and "1e+09" in notes[0]


def test_ladder_hits_its_targets_at_the_aspect_ratio():
    config = experiment("tiny_isoflop")
    config.sweep.mode, config.sweep.budgets = "grid", ()
    config.sweep.ladder.non_embedding_params = (1e4, 1e5, 1e6)
    config.sweep.ladder.aspect_ratio = 32.0
    config.sweep.ladder.head_dim = 16
    spec = spec_from_config_dict(config)
    base = spec.base.model
    shapes = sorted({(r.cfg.model.d_model, r.cfg.model.n_layers, r.cfg.model.n_heads)
                     for r in plan(spec)})
    assert len(shapes) == 3
    for (d, layers, heads), target in zip(shapes, (1e4, 1e5, 1e6)):
        assert heads * 16 == d and d % 16 == 0
        assert d / layers == pytest.approx(32.0, rel=0.5)

        def count(n_layers):
            width = max(1, round(32.0 * n_layers / 16)) * 16
            return param_counts(dataclasses.replace(base, d_model=width, n_layers=n_layers,
                                                    n_heads=width // 16))["non_embedding"]
        # no other depth on the ladder comes closer to the target (in log space)
        best = abs(math.log(count(layers) / target))
        assert all(best <= abs(math.log(count(n) / target)) for n in range(1, 30))


def test_power_law_learning_rate_rule():
    config = experiment("tiny_grid")
    config.sweep.shapes = ((16, 1, 2), (32, 2, 2), (64, 2, 4))
    config.sweep.learning_rate = {"rule": "power_law", "base": 4e-3, "ref_params": 1e4,
                                  "exponent": 0.5}
    runs = plan(spec_from_config_dict(config))
    for run in runs:
        n = run.params["non_embedding"]
        expected = 4e-3 * (np.float64(n) / 1e4) ** -0.5
        assert run.cfg.train.learning_rate == pytest.approx(expected, rel=1e-5)


def test_tokens_per_param_warmup_and_curves_mode():
    config = experiment("tiny_grid")
    config.sweep.mode = "curves"
    config.sweep.curve_points = 6
    config.sweep.warmup = {"rule": "tokens_per_param", "tokens_per_param": 0.25}
    config.sweep.axes.train.steps = (48, 96)
    for run in plan(spec_from_config_dict(config)):
        assert run.cfg.train.eval_every == run.steps // 6
        assert run.cfg.train.log_every <= run.cfg.train.eval_every
        assert run.cfg.train.warmup_steps == math.ceil(0.25 * run.params["total"] / (8 * 32))
        assert "train.eval_every" not in run.axes
    # a rule that gives a run a warmup longer than the run is refused by the plan (the run
    # could not train: its schedule would never reach the peak)
    config.sweep.warmup = {"rule": "tokens_per_param", "tokens_per_param": 2.0}
    error = spec_error(config)
    assert error.field == "sweep.warmup" and "longer than the run" in str(error)


# -- bad input: one clear error each, naming the field -------------------------------------------


def test_unknown_axis_key():
    config = experiment("tiny_grid")
    config.sweep.axes.model.d_modle = (16,)
    error = spec_error(config)
    assert error.field == "sweep.axes.model.d_modle" and "d_model" in str(error)


def test_unknown_axis_section_and_sweep_key():
    config = experiment("tiny_grid")
    config.sweep.axes.seed = (0, 1)
    assert spec_error(config).field == "sweep.axes.seed"
    config = experiment("tiny_grid")
    config.sweep.budget = (1e9,)
    assert spec_error(config).field == "sweep.budget"


def test_empty_axis():
    config = experiment("tiny_grid")
    config.sweep.axes.train.seed = ()
    error = spec_error(config)
    assert error.field == "sweep.axes.train.seed" and "empty" in str(error)


def test_axis_value_is_validated_before_anything_runs(tmp_path):
    config = experiment("tiny_grid")
    config.sweep.axes.model.pos_encoding = ("rope", "rotary")
    spec = spec_from_config_dict(config)
    with pytest.raises(SweepSpecError) as info:
        run_sweep(spec, tmp_path / "sweep", progress=False)
    assert info.value.field == "sweep.axes.model.pos_encoding" and "rotary" in str(info.value)
    assert not (tmp_path / "sweep").exists()


def test_axis_values_take_their_config_field_types():
    # An int for a float field gives the same config, and run id, as the float would.
    as_int, as_float = experiment("tiny_grid"), experiment("tiny_grid")
    as_int.sweep.axes.model.rope_theta = (10000, 500000)
    as_float.sweep.axes.model.rope_theta = (10000.0, 500000.0)
    runs = plan(spec_from_config_dict(as_int))
    assert {type(r.cfg.model.rope_theta) for r in runs} == {float}
    assert [r.run_id for r in runs] == [r.run_id for r in plan(spec_from_config_dict(as_float))]
    for key, value, expected in [("seed", "1", "expected an integer"),
                                 ("seed", True, "expected an integer"),
                                 ("weight_decay", None, "must not be None")]:
        config = experiment("tiny_grid")
        config.sweep.axes.train[key] = (value,)
        error = spec_error(config)
        assert error.field == f"sweep.axes.train.{key}" and expected in str(error)


def test_budget_too_small_for_one_batch():
    config = experiment("tiny_isoflop")
    config.sweep.budgets = (1e9, 1e6)
    error = spec_error(config)
    assert error.field == "sweep.budgets" and "1e+06" in str(error)
    config = experiment("tiny_grid")
    config.sweep.axes.train.tokens = (8 * 32 * 4, 100)
    error = spec_error(config)
    assert error.field == "sweep.axes.train.tokens" and "one batch" in str(error)


@pytest.mark.parametrize("axis, value, owner", [
    ("model.d_model", (64,), "sweep.shapes"),          # shapes set d_model
    ("train.learning_rate", (1e-3,), "sweep.learning_rate"),  # per_shape rule sets it
])
def test_two_settings_of_the_same_key(axis, value, owner):
    config = experiment("tiny_grid")
    section, key = axis.split(".")
    config.sweep.axes[section][key] = value
    error = spec_error(config)
    assert error.field == f"sweep.axes.{axis}" and owner in str(error)


def test_isoflop_tokens_axis_and_steps_with_tokens_conflict():
    config = experiment("tiny_isoflop")
    config.sweep.axes = {"train": {"tokens": (1024,)}}
    error = spec_error(config)
    assert error.field == "sweep.axes.train.tokens" and "sweep.budgets" in str(error)
    config = experiment("tiny_grid")
    config.sweep.axes.train.tokens = (1024,)
    config.sweep.axes.train.steps = (4,)
    assert spec_error(config).field == "sweep.axes.train.steps"


def test_other_spec_errors_name_their_field():
    cases = [
        (lambda c: setattr(c.sweep, "mode", "random"), "sweep.mode"),
        (lambda c: setattr(c.sweep, "shapes", ((16, 1, 3, 1e-2), (32, 2, 2, 1e-2))),
         "sweep.shapes"),  # 16 % 3: the config check, traced back to the shapes
        (lambda c: setattr(c.sweep, "learning_rate", {"rule": "power_law"}),
         "sweep.learning_rate.rule"),  # the shapes carry learning rates: per_shape expected
        (lambda c: (setattr(c.sweep, "learning_rate", {"rule": "power_law"}),
                    setattr(c.sweep, "shapes", ((16, 1, 2),))),
         "sweep.learning_rate.ref_params"),
        (lambda c: setattr(c.base.model, "n_heads", 3), "base.model.d_model"),
        (lambda c: setattr(c, "scale", "tpu"), "scale"),
    ]
    for mutate, field in cases:
        config = experiment("tiny_grid")
        mutate(config)
        assert spec_error(config).field == field


def test_launcher_arguments_are_checked(tmp_path):
    spec = load_spec("experiments/tiny_grid.py")
    with pytest.raises(LauncherError, match="--launcher"):
        run_sweep(spec, tmp_path, launcher="kubernetes")
    with pytest.raises(LauncherError, match="--parallel"):
        run_sweep(spec, tmp_path, parallel=0)


def test_each_launcher_is_resolved_once_with_its_own_settings():
    from attnlab.sweep import launchers
    from attnlab.sweep.cli import FLAGS

    local = launchers.launcher_named("local", parallel=3, compile_ahead=True)
    assert (local.parallel, local.compile_ahead, local.longest_first()) == (3, True, True)
    assert not launchers.launcher_named("local").longest_first()  # one worker: plan order
    ray = launchers.launcher_named("ray", ray_address="auto")
    assert ray.address == "auto" and ray.longest_first()
    # Another launcher's setting is refused, not ignored.
    for name, settings, flag in (("local", {"ray_address": "auto"}, "--ray-address=auto"),
                                 ("ray", {"parallel": 3}, "--parallel=3"),
                                 ("ray", {"compile_ahead": True}, "--compile-ahead"),
                                 ("slurm", {"parallel": 2}, "--parallel=2"),
                                 ("slurm", {"ray_address": "auto"}, "--ray-address=auto")):
        with pytest.raises(launchers.LauncherError, match=f"{flag} applies to --launcher="):
            launchers.launcher_named(name, **settings)
    choices = next(flag.enum_values for flag in FLAGS if flag.name == "launcher")
    assert choices == tuple(launchers.LAUNCHERS) == ("local", "ray", "slurm")
    assert launchers.launcher_named("slurm").longest_first()


def test_cli_bad_input_exits_2_without_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "attnlab.cli", "sweep", "--config=experiments/tiny_grid.py",
         f"--sweep={tmp_path}/w", "--config.sweep.axes.train.seed=()"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "sweep.axes.train.seed" in result.stderr and "Traceback" not in result.stderr


def test_cli_dry_run_prints_the_plan(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "attnlab.cli", "sweep", "--config=experiments/tiny_isoflop.py",
         f"--sweep={tmp_path}/w", "--dry-run", "--probe=none"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for run in plan(load_spec("experiments/tiny_isoflop.py")):
        assert run.run_id in result.stdout
    assert "6 runs (6 to run)" in result.stdout
    assert "isoflop budgets use the '" in result.stdout
    assert not (tmp_path / "w").exists()  # a dry run writes nothing


def test_probe_estimate_interpolates_the_flop_rate_log_linearly():
    from attnlab.sweep.probe import ProbePoint, estimate_seconds

    runs = sorted(plan(load_spec("experiments/tiny_grid.py")),
                  key=lambda r: r.flops_per_token["chinchilla"])
    small, large = runs[0], runs[-1]
    lo = ProbePoint("lo", small.flops_per_token["chinchilla"], tokens_per_s=4e4,
                    overhead_seconds=1.0)
    hi = ProbePoint("hi", large.flops_per_token["chinchilla"], tokens_per_s=1e4,
                    overhead_seconds=1.0)

    def work_tokens(run):  # training tokens plus evaluations at a third of a step's cost
        t, d = run.cfg.train, run.cfg.data
        evals = -(-run.steps // t.eval_every)
        return run.tokens + evals * t.eval_batches * d.batch_size * d.seq_len / 3

    # at a probed shape: that probe's own rate
    assert estimate_seconds(small, [lo, hi]) == pytest.approx(work_tokens(small) / 4e4)
    assert estimate_seconds(large, [lo, hi]) == pytest.approx(work_tokens(large) / 1e4)
    # one probe: its FLOP rate for every shape
    assert estimate_seconds(large, [lo]) == pytest.approx(
        work_tokens(large) * hi.flops_per_token / lo.flops_per_s)
    # halfway in log FLOPs per token: the geometric mean of the two FLOP rates
    mid_fpt = math.sqrt(lo.flops_per_token * hi.flops_per_token)
    mid = dataclasses.replace(small, flops_per_token={"chinchilla": mid_fpt})
    assert estimate_seconds(mid, [lo, hi]) == pytest.approx(
        work_tokens(small) * mid_fpt / math.sqrt(lo.flops_per_s * hi.flops_per_s))
    # beyond the probes: flat at the nearer probe's FLOP rate
    big = dataclasses.replace(large, flops_per_token={"chinchilla": 10 * hi.flops_per_token})
    assert estimate_seconds(big, [lo, hi]) == pytest.approx(
        work_tokens(large) * 10 * hi.flops_per_token / hi.flops_per_s)


def test_base_may_be_a_config_file(tmp_path):
    experiment_file = tmp_path / "exp.py"
    experiment_file.write_text(
        "from ml_collections import ConfigDict\n"
        "def get_config():\n"
        "    return ConfigDict({'base': 'configs/tiny.py',\n"
        "                       'sweep': {'axes': {'train': {'seed': (0, 1)}}}})\n")
    spec = load_spec(str(experiment_file))  # found relative to the working directory
    runs = plan(spec)
    assert [r.cfg.train.seed for r in runs] == [0, 1]
    assert runs[0].cfg.model.d_model == 32 and runs[0].cfg.data.max_bytes == 1_000_000
    experiment_file.write_text(experiment_file.read_text().replace("configs/tiny.py",
                                                                    "configs/nope.py"))
    with pytest.raises(SweepSpecError) as info:
        load_spec(str(experiment_file))
    assert info.value.field == "base" and "nope.py" in str(info.value)


def test_centre_keeps_the_shapes_around_each_budgets_prior_optimum():
    """sweep.centre: each budget trains only the shapes within `span` of N*(C); the notes say
    which were left out and why; a centre no shape is near is one error naming the field."""
    spec = load_spec("experiments/quickstart.py")
    runs, notes = expand(spec)
    centre = spec.centre
    assert centre is not None and len(spec.budgets) == 3
    for run in runs:
        target = centre.target(run.budget)
        assert target / centre.span <= run.params["total"] <= target * centre.span
    per_budget = {b: sum(r.budget == b for r in runs) for b in spec.budgets}
    assert min(per_budget.values()) >= 6  # a profile on both sides of each minimum, kept
    # by a bootstrap replicate that drops a size or two
    assert any("outside the centred ladder" in note for note in notes)
    far = dataclasses.replace(spec, centre=dataclasses.replace(centre, n_opt=1e9))
    with pytest.raises(SweepSpecError, match="no shape of the sweep lies within") as error:
        expand(far)
    assert error.value.field == "sweep.centre"


@pytest.mark.parametrize("centre, field", [
    ({"n_opt": 1e4}, "sweep.centre.budget"),
    ({"n_opt": 1e4, "budget": 1e12, "span": 1.0}, "sweep.centre.span"),
    ({"n_opt": 1e4, "budget": 1e12, "width": 2}, "sweep.centre.width"),
    ({"n_opt": -1, "budget": 1e12}, "sweep.centre.n_opt"),
])
def test_bad_centre_names_the_field(centre, field):
    raw = load_raw_quickstart()
    raw.sweep.centre = ml_collections.ConfigDict(centre)
    with pytest.raises(SweepSpecError) as error:
        spec_from_config_dict(raw)
    assert error.value.field == field


def load_raw_quickstart():
    return load_module("experiments/quickstart.py").get_config("cpu")


@pytest.mark.parametrize("flags, message", [
    (["--probe=none"], "--probe applies with --dry-run only"),
    (["--ensemble=off", "--ensemble-max=4"], "--ensemble-max applies with --ensemble=on or auto only"),
])
def test_a_sweep_flag_that_would_be_ignored_is_one_error(flags, message, tmp_path, capsys):
    from attnlab import cli

    argv = ["sweep", "--config=experiments/tiny_grid.py", f"--sweep={tmp_path}/w", *flags]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "w").exists()
