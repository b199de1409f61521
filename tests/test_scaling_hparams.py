"""attnlab fit --law=hparams: the optimal learning rate and batch size as power laws of N and D,
recovered from tables generated from a known law (loss quadratic in log lr and log batch around
the law's optimum, as Porian et al. 2024's fits assume), through the library and the CLI."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from attnlab.scaling import hparams, registry

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized

LR = (2.0, {"params": -0.3, "tokens": 0.1})  # lr* = 2 N^-0.3 D^0.1
BATCH = (0.5, {"params": 0.1, "tokens": 0.3})  # batch* = 0.5 N^0.1 D^0.3 tokens per step


def law(coef_exponents, n, d):
    coef, e = coef_exponents
    return coef * n ** e["params"] * d ** e["tokens"]


def table(noise=0.0, seed=0, sizes=(1e5, 3e5, 1e6, 3e6), tokens=(1e8, 1e9), shift=0.0):
    """Runs on a 5 x 5 grid of lr and batch (factors of 2) per (N, D), centred off the optimum
    by a random fraction of a step (by ``shift`` steps more for the smallest size)."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in sizes:
        for d in tokens:
            lr_opt, b_opt = law(LR, n, d), law(BATCH, n, d)
            off = rng.uniform(-0.4, 0.4, 2) + (shift if n == sizes[0] else 0.0)
            for i in range(-2, 3):
                for j in range(-2, 3):
                    lr, b = lr_opt * 2.0 ** (i + off[0]), b_opt * 2.0 ** (j + off[1])
                    loss = (3.0 + 50 * n ** -0.3 + 0.02 * np.log(lr / lr_opt) ** 2
                            + 0.01 * np.log(b / b_opt) ** 2 + rng.normal(0, noise))
                    rows.append({"params": n, "tokens": d, "train.learning_rate": lr,
                                 "steps": int(d / b), "batch": b, "final_val_loss": loss,
                                 "status": "completed"})
    return pd.DataFrame(rows)


def fit(frame, **options):
    return registry.law_named("hparams").fit(frame, source="t", **{
        "method": "smooth", "near": 0.0025, "n_bootstrap": 0, "seed": 0, "ci_level": 0.95,
        **options})


def test_the_smooth_optimum_recovers_a_known_law_exactly_without_noise():
    result = fit(table())
    for target, truth in (("lr", LR), ("batch", BATCH)):
        got = result.laws[target]
        assert got.coef == pytest.approx(truth[0], rel=1e-6)
        for name, value in truth[1].items():
            assert got.exponents[name] == pytest.approx(value, abs=1e-6)
    regret = [row["regret"] for row in result.regret()]
    assert len(regret) == 8 and max(regret) < 0.01  # the nearest grid run is near the best


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_with_noise_the_intervals_hold_the_truth(seed):
    result = fit(table(noise=0.002, seed=seed), n_bootstrap=100, seed=seed)
    assert result.failed <= 10
    for target, truth in (("lr", LR), ("batch", BATCH)):
        for name, value in truth[1].items():
            low, high = result.intervals[target][name]
            assert low < high and high - low < 0.3
            assert abs(result.laws[target].exponents[name] - value) < 0.1


def test_the_near_method_finds_the_law_to_within_the_grid():
    result = fit(table(), method="near", near=0.002)
    for target, truth in (("lr", LR), ("batch", BATCH)):
        for name, value in truth[1].items():
            assert abs(result.laws[target].exponents[name] - value) < 0.15


def test_an_optimum_beyond_its_grid_is_flagged_and_left_out():
    result = fit(table(shift=3.0))  # the smallest size's grid lies 3 steps off its optimum
    edges = {key: o.edge for key, o in result.optima.items() if o.edge}
    assert {key[0] for key in edges} == {1e5}
    assert any("grid's edge" in note for note in result.notes)
    assert result.laws["lr"].exponents["params"] == pytest.approx(-0.3, abs=1e-6)


def test_n_and_d_that_vary_together_fit_n_alone_and_say_so():
    frame = table(tokens=(1e9,))
    frame["tokens"] = frame["params"] * 20.0  # D = 20 N in every group
    result = fit(frame)
    assert result.laws["lr"].exponents["tokens"] is None
    assert any("vary together" in note for note in result.notes)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "attnlab.cli", "fit", *args],
                          capture_output=True, text=True, timeout=300)


def test_attnlab_fit_law_hparams_writes_the_documented_json(tmp_path):
    path = tmp_path / "runs.csv"
    table(noise=0.001).drop(columns=["batch"]).to_csv(path, index=False)  # batch from steps
    out = _cli(f"--sweep={path}", "--law=hparams", "--bootstrap=50",
               f"--json={tmp_path / 'fit.json'}")
    assert out.returncode == 0, out.stderr
    assert "lr*" in out.stdout and "batch = tokens / steps" in out.stdout
    payload = json.loads((tmp_path / "fit.json").read_text())
    assert set(payload["lr"]) == {"coef", "exponents", "ci"}
    assert set(payload["lr"]["ci"]) == {"params", "tokens"}
    assert payload["batch"]["exponents"]["tokens"] == pytest.approx(0.3, abs=0.05)
    assert len(payload["groups"]) == 8


def test_the_cli_refuses_what_the_law_cannot_read(tmp_path):
    path = tmp_path / "runs.csv"
    table().drop(columns=["train.learning_rate"]).to_csv(path, index=False)
    out = _cli(f"--sweep={path}", "--law=hparams")
    assert out.returncode == 2 and "missing column 'lr'" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    out = _cli(f"--sweep={path}", "--law=chinchilla", "--optimum=near")
    assert out.returncode == 2 and "--optimum applies to --law=hparams only" in out.stderr
    out = _cli(f"--sweep={path}", "--law=hparams", "--budget=1e18")
    assert out.returncode == 2 and "--budget does not apply" in out.stderr


def test_too_few_groups_is_one_clear_error():
    with pytest.raises(hparams.FitInputError, match="3 or more"):
        fit(table(sizes=(1e5, 3e5), tokens=(1e8,)))


def test_token_counts_rounded_per_batch_size_form_one_group():
    """D = 1M rounded to whole batches of 8, 16 or 32 sequences of 64 tokens differs by < 0.1%:
    one (N, D) group, said in a note."""
    frame = table()
    frame["tokens"] = frame["tokens"] - (frame["tokens"] % (frame["batch"].round() * 64))
    runs, notes = hparams.read_runs(frame, "t", None)
    assert runs.groupby(["params", "tokens"]).ngroups == 8
    assert any("one group" in note for note in notes)
    assert hparams.merge_close(np.array([100.0, 100.5, 103.0])).tolist() == pytest.approx(
        [np.sqrt(100 * 100.5)] * 2 + [103.0])


def test_two_tables_comma_separated_are_read_as_one(tmp_path):
    """A sweep and the sweep that widened its grid: one table, a run in both read once."""
    frame = table().assign(run_id=lambda f: [f"r{i}" for i in range(len(f))])
    frame.to_csv(tmp_path / "all.csv", index=False)
    frame.iloc[:120].to_csv(tmp_path / "a.csv", index=False)
    frame.iloc[100:].to_csv(tmp_path / "b.csv", index=False)  # rows 100-119 in both
    whole = _cli(f"--sweep={tmp_path / 'all.csv'}", "--law=hparams", "--bootstrap=0")
    parts = _cli(f"--sweep={tmp_path / 'a.csv'},{tmp_path / 'b.csv'}", "--law=hparams",
                 "--bootstrap=0")
    assert whole.returncode == parts.returncode == 0, parts.stderr
    assert whole.stdout.split("\n", 1)[1] == parts.stdout.split("\n", 1)[1]
