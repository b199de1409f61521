"""The three objectives (decoder, BERT encoder, T5 encoder-decoder) through the real training loop
on a 200 kB slice of pystdlib: files written, finite and falling loss, masked accuracy in
evaluation, resuming reproduces the uninterrupted run (batch i masked identically), and
``model-info`` / ``generate`` / the results table for each. Contracts only: last-bit values
differ across CPUs."""

import json
import math
import shutil

import numpy as np
import pytest

import configs.tiny
from attnlab import cli
from attnlab.config import from_config_dict
from attnlab.results import DEFAULT_OBJECTIVE, OBJECTIVE_COLUMN, run_row
from attnlab.model import ModelConfig
from attnlab.train import run

STEPS = 30


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


def config(cache_dir, objective, **overrides):
    c = configs.tiny.get_config()
    c.data.cache_dir = str(cache_dir)
    c.data.max_bytes = 200_000
    c.model.objective = objective
    c.model.vocab_size = 257  # room for [MASK] after the byte tokenizer's 256 ids
    c.train.steps = STEPS
    c.train.learning_rate = 3e-3
    c.train.log_every = 1
    c.train.eval_every = 15
    c.train.checkpoint_every = 15
    c.train.eval_batches = 2
    for key, value in overrides.items():
        section, name = key.split(".")
        c[section][name] = value
    return from_config_dict(c)


def losses(workdir):
    lines = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {l["step"]: l["loss"] for l in lines if "loss" in l}, [l for l in lines
                                                                 if "val_loss" in l]


@pytest.mark.parametrize("objective", ["clm", *(pytest.param(o, marks=pytest.mark.slow)
                                               for o in ("mlm", "span"))])
def test_each_objective_trains_through_the_loop(objective, cache_dir, tmp_path, capsys):
    cfg = config(cache_dir, objective, **{"model.pos_encoding": "t5",
                                          "train.eval_masked_spans": True})
    summary = run(cfg, tmp_path / "w", progress=False)
    assert summary["status"] == "completed"
    for name in ("config.json", "summary.json", "metrics.jsonl"):
        assert (tmp_path / "w" / name).exists()
    train, val = losses(tmp_path / "w")
    values = [train[s] for s in sorted(train)]
    assert all(math.isfinite(v) for v in values)
    # falling: the last five steps average below the first five (from ~ln 257 = 5.55)
    assert np.mean(values[-5:]) < np.mean(values[:5]) - 0.3, values
    assert math.isfinite(summary["final_val_loss"])
    # the common measure: bits per token of the masked spans, below uniform (log2 257 = 8.0)
    assert 0 < summary["final_val_span_bits"] < math.log2(257)
    assert val[-1]["val_span_bits"] == summary["final_val_span_bits"]
    if objective == "clm":
        assert "val_accuracy" not in val[-1] and "final_val_accuracy" not in summary
    else:  # accuracy on the predicted positions
        assert 0.0 <= val[-1]["val_accuracy"] <= 1.0
        assert summary["final_val_accuracy"] == val[-1]["val_accuracy"]
    saved = json.loads((tmp_path / "w" / "config.json").read_text())
    assert saved["model"]["objective"] == objective

    # model-info states FLOPs per input and (masked objectives) per predicted token
    code = cli.main(["model-info", "--config=configs/tiny.py",
                     f"--config.model.objective={objective}", "--config.model.vocab_size=257"])
    out = capsys.readouterr().out
    assert code == 0 and f"objective: {objective}" in out
    assert "per input token" in out
    assert ("per predicted token" in out) == (objective != "clm")

    # generate: fills masks / decodes spans; without [MASK] one clear error
    prompt = "def f(x):\n    return [MASK] + 1\n" if objective != "clm" else "def "
    length = ["--max-new-tokens=8"] if objective != "mlm" else []  # mlm fills in place
    code = cli.main(["generate", f"--run={tmp_path / 'w'}", f"--prompt={prompt}", *length,
                     "--temperature=0"])
    out, err = capsys.readouterr()
    assert code == 0, err
    if objective == "mlm":
        assert out.startswith("def f(x):\n    return ") and "[MASK]" not in out
    elif objective == "span":
        assert out.strip()  # the decoder's [MASK] span ... (untrained enough to be anything)
    if objective != "clm":
        code = cli.main(["generate", f"--run={tmp_path / 'w'}", "--prompt=def f(x):"])
        _, err = capsys.readouterr()
        assert code == 2 and "[MASK]" in err and err.strip().count("\n") == 0

        # extrapolation scores next-token loss: a masked-objective run gets one clear line
        code = cli.main(["extrapolate", f"--run={tmp_path / 'w'}", "--multipliers=1,2",
                         "--noprogress"])
        _, err = capsys.readouterr()
        assert code == 2 and f"model.objective={objective} is not a causal decoder" in err
        assert err.strip().count("\n") == 0


@pytest.mark.parametrize("objective", ["mlm", pytest.param("span", marks=pytest.mark.slow)])
def test_resuming_masks_batch_i_as_the_uninterrupted_run(objective, cache_dir, tmp_path):
    """A run cut after its step-10 checkpoint and rerun logs the losses of the uninterrupted
    run: every batch after the restart is corrupted as before (the masks depend on (seed,
    batch index) only)."""
    cfg = config(cache_dir, objective, **{"train.steps": 20, "train.checkpoint_every": 10,
                                          "train.eval_every": 10})
    straight = run(cfg, tmp_path / "a", progress=False)
    cut = tmp_path / "c"
    shutil.copytree(tmp_path / "a", cut)
    shutil.rmtree(cut / "checkpoints" / "20")  # as if killed between steps 10 and 20
    (cut / "summary.json").unlink()
    resumed = run(cfg, cut, progress=False)
    assert straight["status"] == resumed["status"] == "completed"
    a, _ = losses(tmp_path / "a")
    c, _ = losses(cut)
    assert sorted(c) == list(range(1, 21))
    np.testing.assert_allclose([c[s] for s in range(11, 21)], [a[s] for s in range(11, 21)],
                               rtol=1e-5)


def test_results_table_records_the_objective(tmp_path):
    assert DEFAULT_OBJECTIVE == ModelConfig().objective
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"run_id": "r1", "axes": {},
                                                  "config": {"model": {"objective": "span"}}}))
    assert run_row(run_dir)[OBJECTIVE_COLUMN] == "span"
    (run_dir / "run.json").write_text(json.dumps({"run_id": "r1", "axes": {}, "config": {}}))
    assert run_row(run_dir)[OBJECTIVE_COLUMN] == "clm"  # runs planned before the field
