"""Cooldown branches: a branch trained from its trunk's checkpoint is the run it would be from
scratch (bitwise on CPU: same batches, same schedule up to the branch point, same programs); it
is a run of its own (files, summary with the shared tokens and FLOPs); a finished branch is not
retrained, a deleted one retrains alone; a trunk that does not fit is refused naming it."""

import hashlib
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

import configs.tiny
from attnlab import rundir
from attnlab.config import from_config_dict
from attnlab.errors import ConfigError
from attnlab.train import CheckpointError, load_params, run
from attnlab.train.branch import check_trunk
from attnlab.train.loop import training_flops_per_token

TRUNK_STEPS, SHORT, LONG = 16, 10, 15  # branches of 10 and 15 steps (20% cooldowns)
SHORT_START, LONG_START = 8, 12  # where their cooldowns start: round(0.2 * steps) before the end


def config(cache_dir, **overrides):
    """configs/tiny.py on a 200 kB slice; ``overrides`` are dotted keys."""
    c = configs.tiny.get_config()
    c.data.cache_dir = str(cache_dir)
    c.data.max_bytes = 200_000
    c.train.learning_rate = 3e-3
    c.train.log_every = 1
    c.train.eval_every = 5
    c.train.checkpoint_every = 5
    c.train.eval_batches = 2
    c.train.min_lr_ratio = 0.0
    for key, value in overrides.items():
        section, name = key.split(".")
        c[section][name] = value
    return from_config_dict(c)


def trunk_config(cache_dir, **overrides):
    return config(cache_dir, **{"train.schedule": "constant", "train.steps": TRUNK_STEPS,
                                "train.keep_steps": (SHORT_START, LONG_START), **overrides})


def branch_config(cache_dir, steps, start, trunk="trunk", **overrides):
    return config(cache_dir, **{"train.schedule": "wsd", "train.steps": steps,
                                "train.decay_fraction": 0.2, "train.cooldown": "1-sqrt",
                                "train.branch_from": trunk, "train.branch_step": start,
                                **overrides})


def files(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    """A trunk (keeping the branch points of a short and a long branch), the long branch, and
    the long branch's run from scratch."""
    data = tmp_path_factory.mktemp("data")
    root = tmp_path_factory.mktemp("runs")
    trunk = run(trunk_config(data), root / "trunk", progress=False)
    long = run(branch_config(data, LONG, LONG_START), root / "long", progress=False)
    alone_cfg = config(data, **{"train.schedule": "wsd", "train.steps": LONG,
                                "train.decay_fraction": 0.2, "train.cooldown": "1-sqrt"})
    alone = run(alone_cfg, root / "alone", progress=False)
    return data, root, {"trunk": trunk, "long": long, "alone": alone}


def test_branch_equals_the_run_from_scratch(ladder):
    _, root, summaries = ladder
    _, _, got = load_params(root / "long")
    _, _, want = load_params(root / "alone")
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert summaries["long"]["final_val_loss"] == summaries["alone"]["final_val_loss"]
    # The cooldown's logged learning rates are the schedule's, step for step.
    mine = {r["step"]: r["lr"] for r in rundir.read_metrics(root / "long" / "metrics.jsonl")
            if "lr" in r}
    theirs = {r["step"]: r["lr"] for r in rundir.read_metrics(root / "alone" / "metrics.jsonl")
              if "lr" in r}
    assert sorted(mine) == list(range(LONG_START + 1, LONG + 1))
    assert mine == {s: theirs[s] for s in mine}


def test_branch_is_a_run_with_its_own_tokens_and_shared_flops(ladder):
    data, root, summaries = ladder
    cfg = branch_config(data, LONG, LONG_START)
    per_token = training_flops_per_token(cfg)
    tokens_per_step = cfg.data.batch_size * cfg.data.seq_len
    long = summaries["long"]
    assert long["status"] == "completed" and long["step"] == LONG
    assert long["tokens"] == LONG * tokens_per_step
    assert long["flops"]["6nd"] == pytest.approx(per_token["6n"] * LONG * tokens_per_step)
    branch = long["branch"]
    assert Path(branch["trunk"]) == root / "trunk" and branch["step"] == LONG_START
    assert branch["tokens"] == LONG_START * tokens_per_step
    assert branch["flops"]["6nd"] == pytest.approx(per_token["6n"] * branch["tokens"])
    saved = rundir.read_json(root / "long" / rundir.CONFIG_FILE)["train"]
    assert (saved["branch_from"], saved["branch_step"]) == ("trunk", LONG_START)
    # The trunk kept both branch points besides its newest checkpoints.
    steps = sorted(int(p.name) for p in (root / "trunk" / "checkpoints").iterdir())
    assert {SHORT_START, LONG_START} <= set(steps)


def test_rerun_reuses_and_a_deleted_branch_retrains_alone(ladder):
    data, root, summaries = ladder
    trunk_files, alone_files = files(root / "trunk"), files(root / "alone")
    again = run(branch_config(data, LONG, LONG_START), root / "long", progress=False)
    assert again == summaries["long"]
    shutil.rmtree(root / "long")
    redone = run(branch_config(data, LONG, LONG_START), root / "long", progress=False)
    assert redone["final_val_loss"] == summaries["long"]["final_val_loss"]
    assert files(root / "trunk") == trunk_files and files(root / "alone") == alone_files


@pytest.mark.parametrize("overrides,message", [
    ({"train.learning_rate": 1e-3}, "train.learning_rate"),
    ({"train.warmup_steps": 3}, "train.warmup_steps"),
    ({"train.seed": 1}, "train.seed"),
])
def test_a_trunk_that_trains_another_run_is_refused(ladder, tmp_path, overrides, message):
    data, root, _ = ladder
    cfg = branch_config(data, SHORT, SHORT_START, trunk=str(root / "trunk"), **overrides)
    with pytest.raises(CheckpointError, match=message):
        run(cfg, tmp_path / "branch", progress=False)
    assert not (tmp_path / "branch").exists()


def test_a_trunk_whose_schedule_differs_before_the_branch_point_is_refused(tmp_path):
    """Equal configs but for the schedule: a trunk that already decays (wsd over its own
    length) is no constant-LR trunk for a branch past its decay's start."""
    decaying = trunk_config(tmp_path, **{"train.schedule": "wsd", "train.decay_fraction": 0.5})
    with pytest.raises(CheckpointError, match="learning rate .* at update 8"):
        check_trunk(branch_config(tmp_path, LONG, LONG_START), decaying, tmp_path)
    check_trunk(branch_config(tmp_path, SHORT, SHORT_START), decaying, tmp_path)  # before it


def test_missing_trunk_or_branch_point_is_refused(ladder, tmp_path):
    data, root, _ = ladder
    with pytest.raises(CheckpointError, match="holds no run yet"):
        run(branch_config(data, SHORT, SHORT_START, trunk="nowhere"), tmp_path / "b1",
            progress=False)
    # Step 9 is no checkpoint of the trunk: a 12-step branch with a 30% cooldown starts there.
    cfg = branch_config(data, 12, 9, trunk=str(root / "trunk"),
                        **{"train.decay_fraction": 0.25})
    with pytest.raises(CheckpointError, match="no checkpoint at step 9"):
        run(cfg, tmp_path / "b2", progress=False)


@pytest.mark.parametrize("overrides,field", [
    ({"train.branch_step": LONG_START + 1}, "train.branch_step"),  # inside its cooldown
    ({"train.schedule": "cosine"}, "train.schedule"),
    ({"train.branch_from": ""}, "train.branch_from"),
    ({"train.cooldown": "exp"}, "train.cooldown"),
])
def test_branch_settings_are_checked(tmp_path, overrides, field):
    with pytest.raises(ConfigError) as e:
        branch_config(tmp_path, LONG, LONG_START, **overrides)
    assert e.value.field == field
