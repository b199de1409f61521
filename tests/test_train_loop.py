"""End-to-end training on a 200 kB slice of pystdlib: the files a run leaves, resuming,
divergence, bad input, and loading the parameters back (evaluation, generation)."""

import hashlib
import json
import math
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

import configs.tiny
from attnlab import cli
from attnlab.config import from_config_dict
from attnlab.data import prepare, validation_batches
from attnlab.errors import AttnlabError, ConfigError
from attnlab.model import param_counts
from attnlab.train import CheckpointError, WorkdirError, load_params, run
from attnlab.train.step import mean_loss

STEPS = 12


def tiny_config(cache_dir, **overrides):
    """configs/tiny.py on a 200 kB slice, 12 steps; ``overrides`` are dotted keys."""
    config = configs.tiny.get_config()
    config.data.cache_dir = str(cache_dir)
    config.data.max_bytes = 200_000
    config.train.steps = STEPS
    config.train.log_every = 4
    config.train.eval_every = 6
    config.train.checkpoint_every = 6
    config.train.eval_batches = 2
    for key, value in overrides.items():
        section, name = key.split(".")
        config[section][name] = value
    return from_config_dict(config)


def tree_files(directory: Path) -> dict[str, str]:
    """{relative path: sha256} of every file below ``directory``."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """(cfg, workdir, summary) of one uninterrupted 12-step run."""
    cfg = tiny_config(data_dir)
    workdir = tmp_path_factory.mktemp("runs") / "tiny"
    summary = run(cfg, workdir, progress=False)
    return cfg, workdir, summary


def test_run_leaves_config_metrics_summary_checkpoints(trained):
    cfg, workdir, summary = trained
    assert json.loads((workdir / "config.json").read_text()) == cfg.to_dict()
    assert summary == json.loads((workdir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["step"] == STEPS
    counts = param_counts(cfg.model)
    assert summary["params"] == {k: counts[k] for k in ("total", "non_embedding", "embedding")}
    tokens = STEPS * cfg.data.batch_size * cfg.data.seq_len
    assert summary["tokens"] == tokens
    # U_D and repeats of a data-constrained law, a single source's too
    assert summary["unique_tokens"] == prepare(cfg.data).num_tokens("train")
    assert summary["epochs"] == tokens / summary["unique_tokens"]
    assert summary["flops"]["6nd"] == pytest.approx(6 * counts["non_embedding"] * tokens)
    assert summary["flops"]["chinchilla"] > summary["flops"]["6nd"]
    assert summary["final_val_loss"] < math.log(256)  # it learned something in 12 steps
    assert summary["best_val_loss"] <= summary["final_val_loss"]
    assert math.isfinite(summary["final_train_loss_smoothed"])
    assert summary["tokens_per_s"] > 0 and 0 < summary["mfu"] < 1
    assert summary["wall_seconds"] > 0
    # wall time = compilation and init + timed steps + evaluations + checkpoint saves + the rest
    timed_steps = summary["tokens"] / summary["tokens_per_s"]
    assert summary["evaluation_seconds"] > 0 and summary["checkpoint_seconds"] > 0
    assert (timed_steps + summary["evaluation_seconds"] + summary["checkpoint_seconds"]
            < summary["wall_seconds"])
    assert summary["dataset"]["source"] == "pystdlib"

    lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if "loss" in r]
    val = [r for r in lines if "val_loss" in r]
    assert [r["step"] for r in train] == [1, 4, 8, 12]
    assert [r["step"] for r in val] == [6, 12]
    assert val[-1]["val_loss"] == summary["final_val_loss"]
    for record in train[1:]:
        assert set(record) >= {"step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s", "mfu"}
        assert record["tokens"] == record["step"] * cfg.data.batch_size * cfg.data.seq_len
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()) == [6, 12]
    assert any((workdir / "tensorboard").iterdir())


def test_load_params_reproduces_the_final_validation_loss(trained):
    cfg, workdir, summary = trained
    loaded_cfg, graphdef, params = load_params(workdir)
    assert loaded_cfg == cfg
    batches = validation_batches(prepare(cfg.data), cfg.data.seq_len, cfg.data.batch_size,
                                 cfg.train.eval_batches)
    loss_fn = jax.jit(lambda p, b: mean_loss(graphdef, p, b))
    loss = float(np.mean([loss_fn(params, b) for b in batches]))
    assert loss == pytest.approx(summary["final_val_loss"], rel=1e-6)


def test_the_preflight_draws_the_validation_windows_once_whatever_grad_accum(data_dir):
    """check_corpus draws the windows the loop evaluates on (handed over in the Preflight), in
    micro-batches: the same windows as eval_batches full batches, whatever grad_accum."""
    from attnlab.train.preflight import check_corpus

    whole = tiny_config(data_dir)
    corpus = prepare(whole.data)
    _, windows = check_corpus(whole, corpus)
    full = validation_batches(corpus, whole.data.seq_len, whole.data.batch_size,
                              whole.train.eval_batches)
    assert windows.shape == full.shape and np.array_equal(windows, full)
    _, micro = check_corpus(tiny_config(data_dir, **{"train.grad_accum": 2}), corpus)
    assert micro.shape == (2 * whole.train.eval_batches, whole.data.batch_size // 2,
                           whole.data.seq_len + 1)
    assert np.array_equal(micro.reshape(full.shape), full)


def test_rerunning_a_completed_run_changes_nothing(trained):
    cfg, workdir, summary = trained
    before = tree_files(workdir)
    assert run(cfg, workdir, progress=False) == summary
    assert tree_files(workdir) == before


def test_resume_after_lost_work_matches_uninterrupted_run(trained, tmp_path):
    """A run that lost everything after step 6 (checkpoint 12 gone, summary 'running', a log
    line torn) resumes from 6 and ends with bitwise the same parameters."""
    cfg, workdir, summary = trained
    resumed = tmp_path / "resumed"
    shutil.copytree(workdir, resumed)
    shutil.rmtree(resumed / "checkpoints" / "12")
    status = json.loads((resumed / "summary.json").read_text())
    (resumed / "summary.json").write_text(json.dumps({**status, "status": "running"}))
    with open(resumed / "metrics.jsonl", "a") as f:
        f.write('{"step": 13, "lo')
    result = run(cfg, resumed, progress=False)
    assert result["status"] == "completed"
    _, _, want = load_params(workdir)
    _, _, got = load_params(resumed)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert result["final_val_loss"] == summary["final_val_loss"]
    assert result["final_train_loss_smoothed"] == summary["final_train_loss_smoothed"]
    lines = [json.loads(x) for x in (resumed / "metrics.jsonl").read_text().splitlines()]
    steps = [(r["step"], "val_loss" in r) for r in lines]
    assert len(steps) == len(set(steps)) == 6  # no step logged twice, the torn line is gone


def test_generate_continues_a_prompt(trained, capsys):
    _, workdir, _ = trained
    code = cli.main(["generate", f"--run={workdir}", "--prompt=def ", "--max-new-tokens=20",
                     "--temperature=0"])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("def ")
    # greedy decoding is deterministic
    cli.main(["generate", f"--run={workdir}", "--prompt=def ", "--max-new-tokens=20",
              "--temperature=0"])
    assert capsys.readouterr().out == out


def test_divergence_is_a_result_with_exit_code_3(data_dir, tmp_path, capsys):
    workdir = tmp_path / "diverged"
    args = ["train", "--config=configs/tiny.py", f"--config.data.cache_dir={data_dir}",
            "--config.data.max_bytes=200000", "--config.train.learning_rate=1e30",
            "--config.train.schedule=constant", "--config.train.warmup_steps=0",
            f"--run={workdir}"]
    assert cli.main(args) == 3
    assert "diverged at step" in capsys.readouterr().err
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["status"] == "diverged"
    step = summary["diverged_at_step"]
    assert 1 < step <= 20  # step 1's loss comes from the initial (finite) weights
    last = json.loads((workdir / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == step and not math.isfinite(last["loss"])
    assert cli.main(args) == 3  # rerunning reports the same result


# -- bad input: one clear error each, nothing written ------------------------------------------

def assert_untouched(workdir: Path, before: dict | None):
    if before is None:
        assert not workdir.exists()
    else:
        assert tree_files(workdir) == before


@pytest.mark.parametrize("override, message", [
    ("--config.train.bogus=1", "bogus"),
    ("--config.train.schedule=linear", "config.train.schedule: unknown value 'linear'"),
    ("--config.train.mesh_fsdp=2", "config.train.mesh_fsdp: 2 does not divide the 1 available"),
    ("--config.train.warmup_steps=100", "config.train.warmup_steps: 100 is longer than the run"),
])
def test_bad_config_exits_2_before_writing(data_dir, tmp_path, capsys, override, message):
    workdir = tmp_path / "run"
    code = cli.main(["train", "--config=configs/tiny.py", f"--config.data.cache_dir={data_dir}",
                     override, f"--run={workdir}"])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert_untouched(workdir, None)


def test_workdir_with_another_config_is_refused(trained):
    cfg, workdir, _ = trained
    before = tree_files(workdir)
    other = tiny_config(cfg.data.cache_dir, **{"model.d_model": 48})
    with pytest.raises(WorkdirError, match=r"(?is)model.d_model: saved 32, given 48.*to resume"):
        run(other, workdir, progress=False)
    assert_untouched(workdir, before)


def test_checkpoint_of_another_model_is_refused(trained, tmp_path):
    cfg, workdir, _ = trained
    other = tiny_config(cfg.data.cache_dir, **{"model.d_model": 48})
    target = tmp_path / "mixed"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(other.to_dict()))
    shutil.copytree(workdir / "checkpoints", target / "checkpoints")
    before = tree_files(target)
    with pytest.raises(CheckpointError, match="incompatible model: model.d_model: checkpoint 32"):
        run(other, target, progress=False)
    assert_untouched(target, before)


def test_library_errors_are_attnlab_errors(data_dir, tmp_path):
    with pytest.raises(ConfigError) as info:
        run(tiny_config(data_dir, **{"train.grad_accum": 8, "data.batch_size": 8,
                                     "train.mesh_fsdp": 2}), tmp_path / "x", progress=False)
    assert isinstance(info.value, AttnlabError)
    assert not (tmp_path / "x").exists()


def test_a_document_masked_run_trains_and_continues_a_batch_of_prompts(data_dir, tmp_path,
                                                                      capsys):
    """data.document_mask + data.reset_positions end to end: the run trains (the preflight
    checks the corpus's separator), and ``generate --prompts-file`` continues prompts of
    different lengths as one padded batch, each as ``--prompt`` continues it alone."""
    cfg = tiny_config(data_dir, **{"data.document_mask": True, "data.reset_positions": True,
                                   "train.steps": 4, "train.eval_every": 4,
                                   "train.checkpoint_every": 4})
    summary = run(cfg, tmp_path / "run", progress=False)
    assert summary["status"] == "completed" and math.isfinite(summary["final_val_loss"])
    prompts = ["def f(x):", "import os", "class A:"]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    flags = [f"--run={tmp_path / 'run'}", "--max-new-tokens=8", "--temperature=0"]
    assert cli.main(["generate", *flags, f"--prompts-file={tmp_path / 'prompts.txt'}"]) == 0
    batch = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [b["prompt"] for b in batch] == prompts
    for prompt, out in zip(prompts, batch):
        assert cli.main(["generate", *flags, f"--prompt={prompt}"]) == 0
        assert capsys.readouterr().out == out["text"] + "\n"
