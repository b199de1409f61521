"""Malformed input to every command, as a table: each case must exit 2 with exactly one line
(``error: ...``) that names the field, flag or file at fault, print no traceback, finish before
any JAX compilation (counted with jax.monitoring, nothing mocked), and leave every file in its
directory unchanged (compared by hash).

Cases run in-process through ``attnlab.cli.main`` (the dispatcher the console script calls), so
the table stays fast; a few are repeated as real processes at the end."""

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import jax.monitoring
import pytest

from attnlab import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
GRID = str(ROOT / "experiments" / "tiny_grid.py")
ISOFLOP = str(ROOT / "experiments" / "tiny_isoflop.py")
TUNED = str(ROOT / "experiments" / "architectures_tuned.py")
TINY = "configs/tiny.py"
REGRESSION = "configs/icl_regression.py"

_COMPILES: list[str] = []
jax.monitoring.register_event_duration_secs_listener(
    lambda name, *args, **kwargs: _COMPILES.append(name)
    if name == "/jax/core/compile/backend_compile_duration" else None)


# -- set-ups: each makes what its case needs under the case's directory ``d`` and returns nothing

def _file(d, name, text):
    path = d / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def configs(d):
    _file(d, "syntax.py", "def get_config(:\n    pass\n")
    _file(d, "importerr.py", "import no_such_module_xyz\n\ndef get_config():\n    return None\n")
    _file(d, "raises.py", "def get_config():\n    raise ValueError('boom from the user')\n")
    _file(d, "none.py", "def get_config():\n    return None\n")
    _file(d, "noget.py", "X = 1\n")
    _file(d, "adict.py", "def get_config():\n    return {'model': {}}\n")
    _file(d, "sweep_raises.py", "def get_config(scale='cpu'):\n    return 1 / 0\n")
    _file(d, "afile", "not a directory\n")
    (d / "adir").mkdir()


def hf_checkpoints(d):
    """Tiny Llama checkpoints (HF layout, NumPy-written): a good one and one broken per way."""
    import numpy as np
    from safetensors.numpy import save_file

    configs(d)
    config = {"model_type": "llama", "vocab_size": 300, "hidden_size": 16,
              "intermediate_size": 24, "num_hidden_layers": 1, "num_attention_heads": 2,
              "max_position_embeddings": 16, "tie_word_embeddings": True}
    shapes = {"model.embed_tokens.weight": (300, 16), "model.norm.weight": (16,),
              "model.layers.0.input_layernorm.weight": (16,),
              "model.layers.0.post_attention_layernorm.weight": (16,),
              **{f"model.layers.0.self_attn.{p}_proj.weight": (16, 16) for p in "qkvo"},
              "model.layers.0.mlp.gate_proj.weight": (24, 16),
              "model.layers.0.mlp.up_proj.weight": (24, 16),
              "model.layers.0.mlp.down_proj.weight": (16, 24)}
    good = {k: np.ones(v, np.float32) for k, v in shapes.items()}
    variants = {
        "good": (config, good),
        "missing": (config, {k: v for k, v in good.items() if "up_proj" not in k}),
        "shape": (config, {**good, "model.norm.weight": np.ones(17, np.float32)}),
        "falcon": ({**config, "model_type": "falcon"}, good),
        "unknown": ({**config, "rope_dim_mult": 2}, good),
        "llama3": ({**config, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, good),
    }
    for name, (cfg, tensors) in variants.items():
        (d / name).mkdir()
        (d / name / "config.json").write_text(json.dumps(cfg))
        save_file(tensors, str(d / name / "model.safetensors"))
    (d / "truncated").mkdir()
    (d / "truncated" / "config.json").write_text(json.dumps(config))
    data = (d / "good" / "model.safetensors").read_bytes()
    (d / "truncated" / "model.safetensors").write_bytes(data[:len(data) // 2])
    (d / "taken").mkdir()
    (d / "taken" / "file").write_text("x")


def train_run(d):
    """A run directory as training leaves it (config.json of configs/tiny.py, no checkpoint)."""
    configs(d)
    from attnlab.cli_flags import parse
    from attnlab.config import from_config_dict

    cfg = from_config_dict(parse([f"--config={TINY}"]).config)
    run = d / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    (run / "checkpoints").mkdir()


def task_run(d, config="configs/induction.py", overrides=()):
    """A run directory of a token task (config.json of ``config`` with ``overrides``, no
    checkpoint)."""
    configs(d)
    from attnlab.cli_flags import parse
    from attnlab.config import from_config_dict

    cfg = from_config_dict(parse([f"--config={config}", *overrides]).config)
    run = d / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    (run / "checkpoints").mkdir()


def mqar_run(d):
    task_run(d, "configs/mqar.py")


def regression_run(d):
    task_run(d, REGRESSION)


def span_run(d):
    """An encoder-decoder run directory (configs/tiny.py with the span objective)."""
    task_run(d, TINY, ["--config.model.objective=span", "--config.model.vocab_size=300"])


def eval_task_files(d):
    """A run directory (train_run) and task files with a bad line each."""
    train_run(d)
    good = '{"context": "x = ", "choices": ["1", "2"], "answer": 0}\n'
    _file(d, "no_choices.jsonl", good + '{"context": "x = ", "answer": 0}\n')
    _file(d, "out_of_range.jsonl", '{"context": "x = ", "choices": ["1", "2"], "answer": 2}\n')


def mlm_run(d):
    """A masked-LM run directory (config.json of configs/tiny.py with model.objective=mlm)."""
    from attnlab.cli_flags import parse
    from attnlab.config import from_config_dict

    cfg = from_config_dict(parse([f"--config={TINY}", "--config.model.objective=mlm",
                                  "--config.model.vocab_size=257"]).config)
    run = d / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    (run / "checkpoints").mkdir()


def other_sweep(d):
    configs(d)
    (d / "sw" / "runs").mkdir(parents=True)
    (d / "sw" / "sweep.json").write_text(json.dumps({"name": "someone_elses", "runs": []}))


def locked_sweep(d):
    """A sweep directory whose lock another live process holds."""
    configs(d)
    import fcntl

    (d / "sw").mkdir()
    lock = open(d / "sw" / ".sweep.lock", "a+")
    lock.write("pid 4242 on elsewhere, since earlier\n")
    lock.flush()
    # held by a child process for the duration of the test (flock locks are per open file, so
    # this process's own attempt must come from a separate open: the runner opens its own)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, sys, time
        handle = open({str(d / 'sw' / '.sweep.lock')!r}, 'a+')
        fcntl.flock(handle, fcntl.LOCK_EX)
        print('held', flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    lock.close()
    _HOLDERS.append(holder)
    del fcntl


_HOLDERS: list[subprocess.Popen] = []


def foreign_dir(d):
    """An existing directory of someone else's files (no run, no sweep)."""
    _file(d, "mine/notes.txt", "my notes\n")
    _file(d, "mine/data.csv", "a,b\n1,2\n")


def degenerate_results(d):
    _file(d, "header.csv", "params,tokens,loss\n")
    _file(d, "same.csv", "params,tokens,loss\n" + "1e5,1e7,3.0\n" * 8)


def results_file(d):
    configs(d)
    _file(d, "results.csv", "params,tokens,loss\n1e4,1e6,3.0\n2e4,1e6,2.9\n")


SWEEP = ["sweep", f"--config={GRID}"]
QUICK = ["quickstart", f"--config={ISOFLOP}"]

# (id, set-up, argv with {d} for the case's directory, words the error line must contain)
CASES = [
    # --- attnlab (the dispatcher)
    ("unknown-command", None, ["trian"], "unknown command 'trian'"),
    # --- train: the config file
    ("train-no-config", None, ["train", "--run={d}/w"], "--config is required"),
    ("train-config-missing", None, ["train", "--config={d}/nope.py", "--run={d}/w"],
     "nope.py"),
    ("train-config-dir", configs, ["train", "--config={d}/adir", "--run={d}/w"],
     "is a directory"),
    ("train-config-syntax", configs, ["train", "--config={d}/syntax.py", "--run={d}/w"],
     "syntax.py, line 1: SyntaxError"),
    ("train-config-import", configs, ["train", "--config={d}/importerr.py", "--run={d}/w"],
     "importerr.py, line 1 in <module>: ModuleNotFoundError"),
    ("train-config-raises", configs, ["train", "--config={d}/raises.py", "--run={d}/w"],
     "raises.py, line 2 in get_config: ValueError: boom from the user"),
    ("train-config-none", configs, ["train", "--config={d}/none.py", "--run={d}/w"],
     "get_config() returned None"),
    ("train-config-no-get", configs, ["train", "--config={d}/noget.py", "--run={d}/w"],
     "defines no get_config()"),
    ("train-config-dict", configs, ["train", "--config={d}/adict.py", "--run={d}/w"],
     "returned a dict"),
    # --- train: overrides
    ("train-typo-field", None, ["train", f"--config={TINY}", "--config.model.d_modle=3",
                                "--run={d}/w"], '--config.model.d_modle: no such field '
                                                    "'d_modle' (did you mean \"d_model\"?)"),
    ("train-typo-section", None, ["train", f"--config={TINY}", "--config.modle.d_model=3",
                                  "--run={d}/w"], "--config.modle.d_model: no such field"),
    ("train-not-an-int", None, ["train", f"--config={TINY}", "--config.model.d_model=abc",
                                "--run={d}/w"], "config.model.d_model"),
    ("train-d-model-zero", None, ["train", f"--config={TINY}", "--config.model.d_model=0",
                                  "--run={d}/w"], "model.d_model"),
    ("train-heads-divide", None, ["train", f"--config={TINY}", "--config.model.n_heads=3",
                                  "--run={d}/w"], "n_heads"),
    ("train-pos-encoding", None, ["train", f"--config={TINY}",
                                  "--config.model.pos_encoding=rotary", "--run={d}/w"],
     "pos_encoding"),
    ("train-negative-lr", None, ["train", f"--config={TINY}", "--config.train.learning_rate=-1",
                                 "--run={d}/w"], "learning_rate"),
    ("train-batch-zero", None, ["train", f"--config={TINY}", "--config.data.batch_size=0",
                                "--run={d}/w"], "batch_size"),
    ("train-steps-negative", None, ["train", f"--config={TINY}", "--config.train.steps=-5",
                                    "--run={d}/w"], "train.steps"),
    ("train-learned-too-short", None, ["train", f"--config={TINY}",
                                       "--config.model.pos_encoding=learned",
                                       "--config.data.seq_len=128", "--run={d}/w"],
     "seq_len"),
    ("train-bad-source", None, ["train", f"--config={TINY}", "--config.data.source=nosuch",
                                "--run={d}/w"], "data.source"),
    ("train-dropout", None, ["train", f"--config={TINY}", "--config.model.dropout=1.5",
                             "--run={d}/w"], "dropout"),
    ("train-document-mask-markov", None, ["train", f"--config={TINY}",
                                          "--config.data.source=markov",
                                          "--config.data.document_mask=true", "--run={d}/w"],
     "config.data.document_mask: data.source=markov is one stream without documents"),
    ("train-reset-positions-alone", None, ["train", f"--config={TINY}",
                                           "--config.data.reset_positions=true",
                                           "--run={d}/w"],
     "config.data.reset_positions: restarts positions at each document: it needs "
     "data.document_mask=true"),
    ("train-document-mask-span", None, ["train", f"--config={TINY}",
                                        "--config.model.objective=span",
                                        "--config.model.vocab_size=257",
                                        "--config.data.document_mask=true", "--run={d}/w"],
     "config.data.document_mask: is built for one stack reading tokens, not "
     "model.objective=span"),
    ("train-ffn", None, ["train", f"--config={TINY}", "--config.model.ffn=tanh",
                         "--run={d}/w"], "model.ffn"),
    ("train-norm", None, ["train", f"--config={TINY}", "--config.model.norm=batchnorm",
                          "--run={d}/w"], "model.norm"),
    ("train-moe-k-over-e", None, ["train", f"--config={TINY}", "--config.model.moe=token_choice",
                                  "--config.model.moe_experts=4", "--config.model.moe_top_k=5",
                                  "--run={d}/w"], "model.moe_top_k"),
    ("train-moe-one-expert-top2", None, ["train", f"--config={TINY}",
                                         "--config.model.moe=token_choice",
                                         "--config.model.moe_experts=1", "--run={d}/w"],
     "model.moe_top_k"),
    ("train-moe-capacity-zero", None, ["train", f"--config={TINY}",
                                       "--config.model.moe=token_choice",
                                       "--config.model.moe_dispatch=capacity",
                                       "--config.model.moe_capacity_factor=0",
                                       "--run={d}/w"], "model.moe_capacity_factor"),
    ("train-moe-ngpt", None, ["train", f"--config={TINY}", "--config.model.moe=token_choice",
                              "--config.model.ngpt=true",
                              "--config.model.ffn=swiglu", "--config.train.weight_decay=0",
                              "--config.train.warmup_steps=0", "--run={d}/w"], "model.moe"),
    ("train-moe-field-on-dense", None, ["train", f"--config={TINY}",
                                        "--config.model.moe_experts=16", "--run={d}/w"],
     "model.moe_experts"),
    ("train-expert-axis-zero", None, ["train", f"--config={TINY}",
                                      "--config.train.mesh_expert=0", "--run={d}/w"],
     "train.mesh_expert"),
    ("train-expert-axis-dense", None, ["train", f"--config={TINY}",
                                       "--config.train.mesh_expert=2", "--run={d}/w"],
     "train.mesh_expert"),
    ("train-expert-axis-indivisible", None, ["train", f"--config={TINY}",
                                             "--config.model.moe=token_choice",
                                             "--config.model.moe_experts=4",
                                             "--config.train.mesh_expert=3", "--run={d}/w"],
     "model.moe_experts"),
    ("train-schedule", None, ["train", f"--config={TINY}", "--config.train.schedule=linear",
                              "--run={d}/w"], "train.schedule"),
    ("train-cooldown", None, ["train", f"--config={TINY}", "--config.train.schedule=wsd",
                              "--config.train.cooldown=exp", "--run={d}/w"],
     "train.cooldown"),
    ("train-branch-no-trunk", None, ["train", f"--config={TINY}", "--config.train.schedule=wsd",
                                     "--config.train.branch_step=5", "--run={d}/w"],
     "train.branch_from"),
    ("train-branch-in-cooldown", None, ["train", f"--config={TINY}",
                                        "--config.train.schedule=wsd",
                                        "--config.train.branch_from=trunk",
                                        "--config.train.branch_step=19", "--run={d}/w"],
     "train.branch_step"),
    ("train-section-scalar", None, ["train", f"--config={TINY}", "--config.model=3",
                                    "--run={d}/w"], "--config.model=3"),
    # --- train: flags and the workdir
    ("train-no-workdir", None, ["train", f"--config={TINY}"], "--run is required"),
    ("train-unknown-flag", None, ["train", f"--config={TINY}", "--wrkdir={d}/w"], "wrkdir"),
    ("train-positional", None, ["train", f"--config={TINY}", "--run={d}/w", "extra"],
     "unexpected argument 'extra'"),
    ("train-scale-on-config", None, ["train", f"--config={TINY}", "--config.scale=gpu",
                                     "--run={d}/w"], "--config.scale=gpu"),
    ("train-workdir-file", configs, ["train", f"--config={TINY}", "--run={d}/afile"],
     "afile exists and is not a directory"),
    ("train-workdir-under-file", configs, ["train", f"--config={TINY}",
                                           "--run={d}/afile/run"], "is not a directory"),
    ("train-workdir-uncreatable", None, ["train", f"--config={TINY}", "--run=/proc/attnlab"],
     "--run /proc/attnlab: cannot create it in /proc"),
    ("train-workdir-foreign", foreign_dir, ["train", f"--config={TINY}", "--run={d}/mine"],
     "--run {d}/mine is not empty (2 entries: data.csv, notes.txt) and holds no attnlab "
     "run; pass an empty or new directory, or --allow-nonempty"),
    ("train-too-deep", None, ["train", f"--config={TINY}", "--config.model.n_layers=10000",
                              "--run={d}/w"], "config.model.n_layers=10000: building"),
    ("train-too-deep-unrolled", None, ["train", f"--config={TINY}", "--config.model.n_layers=200",
                                       "--run={d}/w"],
     "config.model.n_layers=200: unrolled, XLA compiles each layer apart"),
    ("train-workdir-sweep", other_sweep, ["train", f"--config={TINY}", "--run={d}/sw"],
     "is a sweep directory"),
    ("train-workdir-other-config", train_run, ["train", f"--config={TINY}",
                                               "--config.model.d_model=64", "--run={d}/run"],
     "holds a run with a different config"),
    ("train-too-large", None, ["train", f"--config={TINY}", "--config.model.d_model=1000000",
                               "--run={d}/w"], "--allow-large"),
    ("train-too-deep-and-wide", None, ["train", f"--config={TINY}", "--config.model.n_layers=4000",
                                       "--config.model.d_model=4096", "--config.model.n_heads=32",
                                       "--run={d}/w"], "--allow-large"),
    # --- encoders and encoder-decoders (#16)
    ("train-mlm-causal-mixer", None, ["train", f"--config={TINY}", "--config.model.objective=mlm",
                                      "--config.model.vocab_size=257",
                                      "--config.model.mixer=linear", "--run={d}/w"],
     "config.model.objective: mlm needs bidirectional softmax attention"),
    ("train-span-sliding-window", None, ["train", f"--config={TINY}",
                                         "--config.model.objective=span",
                                         "--config.model.vocab_size=257",
                                         "--config.model.attention_window=8", "--run={d}/w"],
     "causal sliding window"),
    ("train-mlm-no-mask-id", None, ["train", f"--config={TINY}", "--config.model.objective=mlm",
                                    "--run={d}/w"],
     "config.model.vocab_size: model.objective=mlm needs a [MASK] id"),
    ("train-objective-typo", None, ["train", f"--config={TINY}", "--config.model.objective=bert",
                                    "--run={d}/w"], "config.model.objective"),
    ("generate-mlm-no-mask", mlm_run, ["generate", "--run={d}/run", "--prompt=def f(x):"],
     "--prompt holds no [MASK]"),
    ("generate-mlm-temperature", mlm_run, ["generate", "--run={d}/run", "--prompt=d[MASK]f",
                                           "--temperature=0.5", "--max-new-tokens=3"],
     "--temperature, --max-new-tokens: model.objective=mlm fills each [MASK] greedily"),
    # --- muP (model.parameterization)
    ("train-mup-no-base", None, ["train", f"--config={TINY}",
                                 "--config.model.parameterization=mup",
                                 "--config.model.attention_scale=mup", "--run={d}/w"],
     "config.model.mup_base_d_model: muP needs the base width"),
    ("train-mup-rsqrt", None, ["train", f"--config={TINY}", "--config.model.parameterization=mup",
                               "--config.model.mup_base_d_model=16", "--run={d}/w"],
     "config.model.attention_scale: muP scales attention scores by 1/d_k"),
    ("train-mup-mamba", None, ["train", f"--config={TINY}", "--config.model.parameterization=mup",
                               "--config.model.mup_base_d_model=16", "--config.model.mixer=mamba",
                               "--config.model.pos_encoding=none", "--run={d}/w"],
     "config.model.mixer: mamba has no published muP rule"),
    ("train-mup-base-under-sp", None, ["train", f"--config={TINY}",
                                       "--config.model.mup_base_d_model=16", "--run={d}/w"],
     "config.model.mup_base_d_model: is read only by muP"),
    ("coord-check-one-width", None, ["coord-check", f"--config={TINY}", "--widths=64"],
     "--widths: needs at least two distinct positive widths"),
    ("coord-check-mamba", None, ["coord-check", f"--config={TINY}", "--config.model.mixer=mamba",
                                 "--config.model.pos_encoding=none", "--widths=32,64"],
     "config.model.mixer: mamba has no published muP rule"),
    # --- model-info
    ("model-info-no-config", None, ["model-info"], "--config is required"),
    ("model-info-syntax", configs, ["model-info", "--config={d}/syntax.py"], "syntax.py, line 1"),
    ("model-info-typo", None, ["model-info", f"--config={TINY}", "--config.train.stpes=3"],
     "--config.train.stpes"),
    ("model-info-config-and-run", train_run, ["model-info", f"--config={TINY}", "--run={d}/run"],
     "give --config or --run, not both"),
    ("model-info-not-a-run", configs, ["model-info", "--run={d}/adir"], "is not a run directory"),
    ("model-info-plot-nope", configs, ["model-info", f"--config={TINY}",
                                       "--config.model.pos_encoding=none",
                                       "--plot={d}/p.png"],
     "model.pos_encoding=none adds nothing that depends on position"),
    ("model-info-plot-two-stacks", configs, ["model-info", f"--config={TINY}",
                                             "--config.model.objective=span",
                                             "--config.model.vocab_size=300",
                                             "--plot={d}/p.png"],
     "has two stacks"),
    ("model-info-plot-no-dir", configs, ["model-info", f"--config={TINY}",
                                         "--plot={d}/nodir/p.png"],
     "--plot={d}/nodir/p.png: the directory {d}/nodir does not exist"),
    ("model-info-plot-no-checkpoint", train_run, ["model-info", "--run={d}/run",
                                                  "--plot={d}/p.png"],
     "has no checkpoint"),
    # --- generate
    ("generate-no-run", None, ["generate", "--prompt=x"], "--run is required"),
    ("generate-not-a-run", configs, ["generate", "--run={d}/adir", "--prompt=x"],
     "is not a run directory"),
    ("generate-no-checkpoint", train_run, ["generate", "--run={d}/run", "--prompt=x"],
     "has no checkpoint"),
    ("generate-config-override", train_run, ["generate", "--run={d}/run", "--prompt=x",
                                             "--config.model.d_model=3"],
     "--config.* overrides would not be applied"),
    ("generate-negative-tokens", train_run, ["generate", "--run={d}/run", "--prompt=x",
                                             "--max-new-tokens=-1"], "--max-new-tokens"),
    ("generate-negative-temperature", train_run, ["generate", "--run={d}/run", "--prompt=x",
                                                  "--temperature=-1"], "--temperature"),
    ("generate-greedy-seed", train_run, ["generate", "--run={d}/run", "--prompt=x",
                                         "--temperature=0", "--seed=3"],
     "--seed draws the samples; --temperature=0 is greedy"),
    ("generate-too-many-tokens", train_run, ["generate", "--run={d}/run", "--prompt=x",
                                             "--max-new-tokens=100000000000"], "--allow-large"),
    ("generate-tokens-not-int", train_run, ["generate", "--run={d}/run", "--prompt=x",
                                            "--max-new-tokens=lots"], "max-new-tokens"),
    # --- sweep
    ("sweep-no-workdir", None, [*SWEEP], "--sweep is required"),
    ("sweep-workdir-file", configs, [*SWEEP, "--sweep={d}/afile"], "not a directory"),
    ("sweep-cache-dir-file", configs, [*SWEEP, "--sweep={d}/sw", "--cache-dir={d}/afile"],
     "--cache-dir {d}/afile exists and is not a directory"),
    ("sweep-workdir-under-file", configs, [*SWEEP, "--sweep={d}/afile/sw"],
     "is not a directory"),
    ("sweep-workdir-uncreatable", None, [*SWEEP, "--sweep=/proc/attnlab"],
     "--sweep /proc/attnlab: cannot create it in /proc"),
    ("sweep-workdir-foreign", foreign_dir, [*SWEEP, "--sweep={d}/mine"],
     "holds no attnlab sweep; pass an empty or new directory, or --allow-nonempty"),
    ("sweep-other-sweep", other_sweep, [*SWEEP, "--sweep={d}/sw"],
     "holds sweep 'someone_elses', not 'tiny_grid'"),
    ("sweep-train-run-dir", train_run, [*SWEEP, "--sweep={d}/run"], "holds a training run"),
    ("sweep-locked", locked_sweep, [*SWEEP, "--sweep={d}/sw"],
     "in use by another sweep (pid 4242"),
    ("sweep-axis-typo", None, [*SWEEP, "--config.sweep.axes.model.d_modle=(1,)",
                               "--sweep={d}/sw"], "d_modle"),
    ("sweep-mode", None, [*SWEEP, "--config.sweep.mode=random", "--sweep={d}/sw"],
     "sweep.mode"),
    ("sweep-ladder-no-branches", None, [*SWEEP, "--config.sweep.mode=ladder",
                                        "--sweep={d}/sw"], "sweep.branches"),
    ("sweep-transfer-no-lr", None, [*SWEEP, "--config.sweep.learning_rate.rule=transfer",
                                    "--sweep={d}/sw"], "sweep.learning_rate.base_lr"),
    ("sweep-tuned-no-tune", None, ["sweep", f"--config={ISOFLOP}",
                                   "--config.sweep.learning_rate.rule=tuned",
                                   "--config.sweep.learning_rate.ref_d_model=0",
                                   "--sweep={d}/sw"], "sweep.tune: missing"),
    # a tuning stage's runs, and its study's, are planned before any flag is read: muP's base
    # width 16 takes no 3 heads (here with a flag that is wrong too, and a dry run's probe)
    ("sweep-tuned-proxy-unplannable", None, ["sweep", f"--config={TUNED}:small",
                                             "--config.sweep.tune.shapes=((24,2,3),(48,2,3))",
                                             "--sweep={d}/sw", "--dry-run", "--ensemble-max=0"],
     "16 is not divisible by model.n_heads=3"),
    ("sweep-tuned-study-unplannable", None, ["sweep", f"--config={TUNED}:small",
                                             "--config.sweep.shapes=((24,2,3),(48,2,3))",
                                             "--sweep={d}/sw"],
     "16 is not divisible by model.n_heads=3"),
    ("sweep-empty-axis", None, [*SWEEP, "--config.sweep.axes.train.seed=()", "--sweep={d}/sw"],
     "seed"),
    ("sweep-parallel-zero", None, [*SWEEP, "--parallel=0", "--sweep={d}/sw"], "--parallel"),
    ("sweep-launcher", None, [*SWEEP, "--launcher=kubernetes", "--sweep={d}/sw"], "launcher"),
    ("sweep-config-raises", configs, ["sweep", "--config={d}/sweep_raises.py", "--sweep={d}/sw"],
     "sweep_raises.py, line 2 in get_config: ZeroDivisionError"),
    ("sweep-too-large", None, [*SWEEP, "--config.sweep.shapes=((100000,1,2,1e-2),)",
                               "--sweep={d}/sw"], "--allow-large"),
    ("sweep-budget-too-small", None, ["sweep", f"--config={ISOFLOP}",
                                      "--config.sweep.budgets=(1e3,)", "--sweep={d}/sw"],
     "budget"),
    ("sweep-warmup-longer-than-runs", None, [*SWEEP, "--config.base.train.warmup_steps=100",
                                             "--sweep={d}/sw"],
     "train.warmup_steps: 100 is longer than the run (24 steps)"),
    ("model-info-warmup-longer-than-run", None, ["model-info", f"--config={TINY}",
                                                 "--config.train.warmup_steps=50"],
     "config.train.warmup_steps: 50 is longer than the run (20 steps)"),
    ("train-vector-model-on-tokens", None, ["train", f"--config={TINY}",
                                            "--config.model.inputs=vectors",
                                            "--config.model.input_dim=4", "--run={d}/w"],
     "config.model.inputs: vectors models cannot be trained on data.source=pystdlib"),
    ("sweep-scale-without-config", None, ["sweep", "--config.scale=gpu", "--sweep={d}/sw"],
     "--config.scale=gpu"),
    # --- quickstart
    ("quickstart-workdir-file", configs, [*QUICK, "--sweep={d}/afile"], "not a directory"),
    ("quickstart-workdir-uncreatable", None, [*QUICK, "--sweep=/proc/attnlab"],
     "--sweep /proc/attnlab: cannot create it in /proc"),
    ("quickstart-workdir-foreign", foreign_dir, [*QUICK, "--sweep={d}/mine"],
     "holds no attnlab sweep"),
    ("quickstart-bootstrap", None, [*QUICK, "--bootstrap=-1", "--sweep={d}/q"], "--bootstrap"),
    ("quickstart-other-sweep", other_sweep, [*QUICK, "--sweep={d}/sw"], "holds sweep"),
    ("quickstart-config-raises", configs, ["quickstart", "--config={d}/sweep_raises.py",
                                           "--sweep={d}/q"], "sweep_raises.py, line 2"),
    ("quickstart-parallel", None, [*QUICK, "--parallel=0", "--sweep={d}/q"], "--parallel"),
    ("quickstart-typo", None, [*QUICK, "--config.sweep.budgetz=(1e9,)", "--sweep={d}/q"],
     "budgetz"),
    # --- fit and plot: their output files
    ("fit-json-empty", results_file, ["fit", "--sweep={d}/results.csv", "--json="],
     "--json= names no file"),
    ("fit-json-dir", results_file, ["fit", "--sweep={d}/results.csv", "--json={d}/adir"],
     "--json={d}/adir is a directory"),
    ("fit-json-no-parent", results_file, ["fit", "--sweep={d}/results.csv",
                                          "--json={d}/nowhere/fit.json"], "does not exist"),
    ("fit-json-under-file", results_file, ["fit", "--sweep={d}/results.csv",
                                           "--json={d}/afile/fit.json"], "is a file, not a directory"),
    ("fit-json-uncreatable", results_file, ["fit", "--sweep={d}/results.csv",
                                            "--json=/proc/fit.json"],
     "--json=/proc/fit.json: cannot write a file in /proc"),
    # --- compare
    ("compare-no-by", results_file, ["compare", "--sweep={d}/results.csv", "--baseline=a"],
     "--by is required"),
    ("compare-missing-column", results_file, ["compare", "--sweep={d}/results.csv",
                                              "--by=schedule", "--baseline=cosine"],
     "column 'schedule' is not in the results table"),
    ("compare-unknown-baseline", results_file, ["compare", "--sweep={d}/results.csv",
                                                "--by=tokens", "--baseline=7", "--metric=loss"],
     "--baseline: '7' is not a value of column 'tokens'"),
    ("compare-nothing-matched", results_file, ["compare", "--sweep={d}/results.csv",
                                               "--by=params", "--baseline=10000.0", "--metric=loss"],
     "no point (params, tokens) has finished runs of both"),
    ("compare-ci-level", results_file, ["compare", "--sweep={d}/results.csv", "--by=params",
                                        "--baseline=10000.0", "--ci-level=1.5"], "--ci-level"),
    ("compare-json-uncreatable", results_file, ["compare", "--sweep={d}/results.csv",
                                                "--by=params", "--baseline=10000.0",
                                                "--json=/proc/x.json"], "/proc"),
    ("fit-no-results", None, ["fit", "--sweep={d}/nope.csv", "--law=chinchilla"], "nope.csv"),
    ("fit-multiplier-without-by", results_file, ["fit", "--sweep={d}/results.csv",
                                                 "--law=chinchilla", "--multiplier-against=gpt"],
     "--multiplier-against"),
    ("fit-multiplier-approach-2", results_file, ["fit", "--sweep={d}/results.csv",
                                                 "--law=chinchilla", "--approach=2",
                                                 "--by=params", "--multiplier-against=1e4"],
     "approach 3"),
    ("fit-header-only", degenerate_results, ["fit", "--sweep={d}/header.csv", "--law=kaplan"],
     "header.csv: the table has no rows"),
    ("fit-clark-no-experts", results_file, ["fit", "--sweep={d}/results.csv", "--law=clark"],
     "missing column 'experts'"),
    ("fit-clark-one-e", degenerate_results, ["fit", "--sweep={d}/same.csv", "--law=clark",
                                              "--columns=experts:tokens"],
     "at least 2 values of E"),
    ("fit-identical-rows-kaplan", degenerate_results, ["fit", "--sweep={d}/same.csv",
                                                       "--law=kaplan"],
     "only 1 distinct (N, D) pair"),
    ("fit-identical-rows-chinchilla", degenerate_results, ["fit", "--sweep={d}/same.csv",
                                                           "--law=chinchilla"],
     "only 1 distinct (N, D) pair"),
    ("plot-out-dir", results_file, ["plot", "--sweep={d}/results.csv",
                                    "--kind=loss-vs-params", "--plot={d}/adir"], "is a directory"),
    ("plot-out-no-parent", results_file, ["plot", "--sweep={d}/results.csv",
                                          "--kind=loss-vs-params", "--plot={d}/no/x.png"],
     "does not exist"),
    # --- import-hf / export-hf
    ("import-hf-no-from", None, ["import-hf", "--run={d}/run"], "--from is required"),
    ("import-hf-not-a-checkpoint", configs, ["import-hf", "--from={d}/adir", "--run={d}/run"],
     "adir/config.json: no such file"),
    ("import-hf-missing-tensor", hf_checkpoints, ["import-hf", "--from={d}/missing",
                                                  "--run={d}/run"],
     "missing tensor model.layers.0.mlp.up_proj.weight"),
    ("import-hf-wrong-shape", hf_checkpoints, ["import-hf", "--from={d}/shape",
                                               "--run={d}/run"],
     "tensor model.norm.weight has shape [17]"),
    ("import-hf-model-type", hf_checkpoints, ["import-hf", "--from={d}/falcon",
                                              "--run={d}/run"], "model_type='falcon'"),
    ("import-hf-unknown-key", hf_checkpoints, ["import-hf", "--from={d}/unknown",
                                               "--run={d}/run"], "rope_dim_mult"),
    ("import-hf-rope-type", hf_checkpoints, ["import-hf", "--from={d}/llama3",
                                             "--run={d}/run"],
     "rope_scaling.rope_type='llama3'"),
    ("import-hf-truncated", hf_checkpoints, ["import-hf", "--from={d}/truncated",
                                             "--run={d}/run"],
     "truncated/model.safetensors: not a readable safetensors file"),
    ("import-hf-workdir-taken", hf_checkpoints, ["import-hf", "--from={d}/good",
                                                 "--run={d}/taken"], "is not empty"),
    ("import-hf-workdir-proc", hf_checkpoints, ["import-hf", "--from={d}/good",
                                                "--run=/proc/attnlab_import"],
     "the output directory /proc/attnlab_import: cannot create it in /proc"),
    ("import-hf-model-override", hf_checkpoints, ["import-hf", "--from={d}/good",
                                                  "--run={d}/run", f"--config={TINY}",
                                                  "--config.model.d_model=64"],
     "--config.model.* cannot be set"),
    ("export-hf-unrepresentable", train_run, ["export-hf", "--run={d}/run", "--to={d}/out"],
     "model.norm='layernorm' has no Llama equivalent"),
    ("export-hf-not-a-run", configs, ["export-hf", "--run={d}/adir", "--to={d}/out"],
     "is not a run directory"),
    # --- in-context learning tasks, attnlab icl, attnlab attention
    ("train-mqar-too-many-pairs", None, ["train", "--config=configs/mqar.py",
                                         "--config.data.mqar_pairs=20", "--run={d}/w"],
     "config.data.mqar_pairs: 20 pairs and their 20 queries need 80 tokens"),
    ("train-induction-vocab", None, ["train", "--config=configs/induction.py",
                                     "--config.data.seq_len=200", "--run={d}/w"],
     "config.data.task_vocab: 64 ids cannot fill"),
    ("train-task-field-unused", None, ["train", f"--config={TINY}", "--config.data.mqar_pairs=4",
                                       "--run={d}/w"], "config.data.mqar_pairs: is read only"),
    ("train-loss-on-answers-induction", None, ["train", "--config=configs/induction.py",
                                               "--config.data.loss_on=answers",
                                               "--run={d}/w"],
     "config.data.loss_on: answers are mqar's"),
    ("train-loss-on-unknown", None, ["train", "--config=configs/mqar.py",
                                     "--config.data.loss_on=keys", "--run={d}/w"],
     "config.data.loss_on"),
    ("train-ssm-scan-unknown", None, ["train", "--config=configs/mqar.py",
                                      "--config.model.mixer=mamba",
                                      "--config.model.pos_encoding=none",
                                      "--config.model.ssm_scan=parallel", "--run={d}/w"],
     "config.model.ssm_scan: unknown scan 'parallel'"),
    ("train-task-vocab-model", None, ["train", "--config=configs/induction.py",
                                      "--config.model.vocab_size=32", "--run={d}/w"],
     "config.model.vocab_size: 32 is smaller than the task's"),
    ("train-ffn-none-span", None, ["train", f"--config={TINY}", "--config.model.ffn=none",
                                   "--config.model.objective=span",
                                   "--config.model.vocab_size=257", "--run={d}/w"],
     "config.model.ffn: none (attention-only layers)"),
    ("train-regression-token-model", None, ["train", f"--config={REGRESSION}",
                                            "--config.model.inputs=tokens",
                                            "--config.model.input_dim=0", "--run={d}/w"],
     "config.model.inputs: model.objective=regression reads prompts of vectors"),
    ("train-regression-clm", None, ["train", f"--config={REGRESSION}",
                                    "--config.model.objective=clm", "--run={d}/w"],
     "config.model.objective: clm cannot be trained on data.source=regression"),
    ("train-regression-input-dim", None, ["train", f"--config={REGRESSION}",
                                          "--config.model.input_dim=4", "--run={d}/w"],
     "config.model.input_dim: 4 differs from the regression prompts' data.icl_dim=8"),
    ("train-regression-seq-len", None, ["train", f"--config={REGRESSION}",
                                        "--config.data.seq_len=30", "--run={d}/w"],
     "config.data.seq_len: a regression prompt of data.icl_examples=16 pairs is 32 vectors"),
    ("train-regression-curriculum", None, ["train", f"--config={REGRESSION}",
                                           "--config.data.icl_dim_start=9", "--run={d}/w"],
     "config.data.icl_dim_start: 9 exceeds the task's 8"),
    ("train-regression-function", None, ["train", f"--config={REGRESSION}",
                                         "--config.data.icl_function=cubic", "--run={d}/w"],
     "config.data.icl_function: unknown function class 'cubic'"),
    ("train-regression-sparsity", None, ["train", f"--config={REGRESSION}",
                                         "--config.data.icl_function=sparse_linear",
                                         "--config.data.icl_sparsity=9", "--run={d}/w"],
     "config.data.icl_sparsity: must be in 1..data.icl_dim=8"),
    ("train-regression-hidden-unused", None, ["train", f"--config={REGRESSION}",
                                              "--config.data.icl_hidden=50", "--run={d}/w"],
     "config.data.icl_hidden: is read only by data.icl_function=relu_net"),
    ("train-regression-field-unused", None, ["train", "--config=configs/mqar.py",
                                             "--config.data.icl_noise=0.5", "--run={d}/w"],
     "config.data.icl_noise: is read only by data.source regression"),
    ("icl-pairs-on-regression", regression_run, ["icl", "--run={d}/run", "--pairs=1,2"],
     "--pairs applies to mqar runs"),
    ("attention-text-on-regression", regression_run, ["attention", "--run={d}/run",
                                                      "--text=hello"],
     "reads prompts of vectors (data.source=regression), not text; use --task-example"),
    ("extrapolate-regression-run", regression_run, ["extrapolate", "--run={d}/run"],
     "is an in-context learning task"),
    ("icl-run-and-sweep", task_run, ["icl", "--run={d}/run", "--sweep={d}/run"],
     "exactly one of --run=DIR and --sweep=DIR"),
    ("icl-sweep-not-a-sweep", configs, ["icl", "--sweep={d}/adir"], "not a sweep directory"),
    ("icl-sweep-step", configs, ["icl", "--sweep={d}/adir", "--step=3"],
     "--step applies to --run; --sweep evaluates every run at its last checkpoint"),
    ("icl-sweep-batches", configs, ["icl", "--sweep={d}/adir", "--batches=0"],
     "--batches must be >= 1"),
    ("icl-not-a-task", train_run, ["icl", "--run={d}/run"], "not an in-context learning task"),
    ("icl-no-checkpoint", task_run, ["icl", "--run={d}/run"], "has no checkpoint"),
    ("icl-pairs-on-induction", task_run, ["icl", "--run={d}/run", "--pairs=1,2"],
     "--pairs applies to mqar runs"),
    ("icl-pairs-too-many", mqar_run, ["icl", "--run={d}/run", "--pairs=2,30"],
     "--pairs=2,30: 30 pairs"),
    ("icl-pairs-not-ints", mqar_run, ["icl", "--run={d}/run", "--pairs=a,b"],
     "--pairs=a,b: give integers"),
    ("icl-json-dir", task_run, ["icl", "--run={d}/run", "--json={d}/adir"], "is a directory"),
    ("icl-config-override", task_run, ["icl", "--run={d}/run", "--config.data.seq_len=3"],
     "--config.* overrides would not be applied"),
    ("extrapolate-task-run", task_run, ["extrapolate", "--run={d}/run"],
     "is an in-context learning task"),
    ("attention-neither", task_run, ["attention", "--run={d}/run"], "exactly one of --text"),
    ("attention-encoder-decoder", span_run, ["attention", "--run={d}/run", "--text=abc"],
     "single stack's maps, not the encoder-decoder's"),
    ("attention-text-on-task", task_run, ["attention", "--run={d}/run", "--text=abc"],
     "which has no text; use --task-example"),
    ("attention-example-on-text", train_run, ["attention", "--run={d}/run", "--task-example"],
     "not a task; use --text"),
    ("attention-example-with-text", train_run, ["attention", "--run={d}/run", "--text=abc",
                                                "--example=2"],
     "--example picks a validation window of --task-example, not --text"),
    ("attention-out-no-parent", task_run, ["attention", "--run={d}/run", "--task-example",
                                           "--plot={d}/no/x.png"], "does not exist"),
    ("plot-out-uncreatable", results_file, ["plot", "--sweep={d}/results.csv",
                                            "--kind=loss-vs-params", "--plot=/proc/x.png"],
     "--plot=/proc/x.png: cannot write a file in /proc"),
    # --- attnlab eval
    ("eval-line-without-choices", eval_task_files,
     ["eval", "--run={d}/run", "--tasks={d}/no_choices.jsonl"], "no_choices.jsonl:2: no 'choices'"),
    ("eval-answer-out-of-range", eval_task_files,
     ["eval", "--run={d}/run", "--tasks={d}/out_of_range.jsonl"],
     "out_of_range.jsonl:1: 'answer' must be an index into the 2 choices, got 2"),
    ("eval-missing-task-file", train_run, ["eval", "--run={d}/run", "--tasks={d}/nope.jsonl"],
     "nope.jsonl' is neither a task"),
    ("eval-masked-run", mlm_run, ["eval", "--run={d}/run", "--tasks=stdlib_line_end"],
     "config.model.objective: mlm: the tasks are scored by a causal decoder"),
    ("eval-encoder-decoder-run", span_run, ["eval", "--run={d}/run", "--tasks=stdlib_line_end"],
     "config.model.objective: span: the tasks are scored by a causal decoder"),
    ("eval-examples", train_run, ["eval", "--run={d}/run", "--tasks=stdlib_line_end",
                                  "--examples=0"], "--examples must be >= 1"),
    # --- extrapolate
    ("extrapolate-not-a-run", configs, ["extrapolate", "--run={d}/adir"], "adir"),
    ("extrapolate-missing-run", None, ["extrapolate", "--run={d}/nope"], "nope"),
    ("extrapolate-no-checkpoint", train_run, ["extrapolate", "--run={d}/run"],
     "no finished checkpoint"),
]


def _hashes(directory: pathlib.Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): (hashlib.sha256(p.read_bytes()).hexdigest()
                                            if p.is_file() else "dir")
            for p in sorted(directory.rglob("*"))}


def test_the_table_is_large_and_distinct():
    assert len(CASES) >= 60
    assert len({case[0] for case in CASES}) == len(CASES)
    assert len({(case[1], tuple(case[2])) for case in CASES}) == len(CASES)


@pytest.mark.parametrize("name, setup, argv, words", CASES, ids=[c[0] for c in CASES])
def test_malformed_input_exits_2_in_one_line(name, setup, argv, words, tmp_path, capfd):
    d = tmp_path / "case"
    d.mkdir()
    if setup is not None:
        setup(d)
    before = _hashes(d)
    argv = [a.replace("{d}", str(d)) for a in argv]
    words = words.replace("{d}", str(d))
    capfd.readouterr()
    compiles = len(_COMPILES)
    start = time.perf_counter()
    try:
        code = cli.main(argv)
    finally:
        for holder in _HOLDERS:
            holder.kill()
            holder.wait()
        _HOLDERS.clear()
    seconds = time.perf_counter() - start
    out, err = capfd.readouterr()
    assert code == 2, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and words in lines[0], lines[0]
    assert "Traceback" not in out + err
    assert len(_COMPILES) == compiles, f"compiled {len(_COMPILES) - compiles} programs first"
    assert seconds < 60, f"took {seconds:.1f} s"
    assert _hashes(d) == before, "the case's directory changed"


@pytest.mark.parametrize("argv, words", [
    (["train", f"--config={TINY}", "--config.model.d_model=1000000", "--run={d}/w"],
     "--allow-large"),
    (["sweep", f"--config={GRID}", "--sweep={d}/afile"], "not a directory"),
    (["train", "--config={d}/raises.py", "--run={d}/w"], "raises.py, line 2"),
], ids=["too-large", "sweep-workdir-file", "config-raises"])
def test_as_a_process_one_line_and_exit_2(argv, words, tmp_path):
    configs(tmp_path)
    before = _hashes(tmp_path)
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    result = subprocess.run([sys.executable, "-m", "attnlab.cli", *argv], cwd=ROOT,
                            capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], result.stderr
    assert _hashes(tmp_path) == before


def test_memory_estimates_scale_with_the_config_and_can_be_overridden():
    from attnlab.cli_flags import parse
    from attnlab.config import from_config_dict
    from attnlab.train.memory import (TooLargeError, check_generation_fits,
                                      check_training_fits, generation_bytes, training_bytes)

    def cfg(*overrides):
        return from_config_dict(parse([f"--config={TINY}", *overrides]).config)

    small, wide = training_bytes(cfg()), training_bytes(cfg("--config.model.d_model=64"))
    assert small["state"] == 16 * small["params"]  # params, grads, two Adam moments
    assert 3 < wide["state"] / small["state"] < 4.5  # ~d_model^2 (embeddings grow ~d_model)
    assert small["total"] < 1e9
    huge = cfg("--config.model.d_model=1000000")
    with pytest.raises(TooLargeError, match=r"needs about .* GB .*--allow-large"):
        check_training_fits(huge)
    check_training_fits(huge, allow_large=True)  # the flag skips the check
    model = cfg().model
    assert generation_bytes(model, 2000)["cache"] == 2 * model.n_layers * model.kv_heads \
        * model.head_dim * 2000 * 4
    with pytest.raises(TooLargeError, match="--max-new-tokens"):
        check_generation_fits(model, 10**12)
