"""The sweep rule ``learning_rate.rule = 'transfer'``: under muP one learning rate, tuned at the
base width (given as base_lr, or read from experiments/mup_transfer.py's JSON report), is every
width's; anything that would make it wrong is refused in one line naming the field.

Nothing here trains: specs are planned from small ConfigDicts."""

import json
import pathlib

import pandas as pd
import pytest
from ml_collections import ConfigDict

from attnlab.config import base_config_dict
from attnlab.sweep import SweepSpecError, plan, spec_from_config_dict
from repo_files import load_module

ROOT = pathlib.Path(__file__).resolve().parents[1]
WIDTHS = (16, 32, 64, 128)
MUP = {"parameterization": "mup", "mup_base_d_model": 16, "attention_scale": "mup"}


def transfer_report_module():
    return load_module("experiments/mup_transfer.py")


def study(learning_rate: dict, model: dict | None = MUP, **sweep) -> ConfigDict:
    """A grid over four widths (8x) of a 2-layer model; ``model`` overrides the base model."""
    config = ConfigDict()
    config.base = base = base_config_dict()
    base.model.max_len = 64
    base.data.seq_len = 32
    base.train.learning_rate = 1e-3  # what a transfer rule must not use
    for key, value in (model or {}).items():
        base.model[key] = value
    config.sweep = ConfigDict({"name": "tuned", "mode": "grid",
                               "shapes": tuple((d, 2, 2) for d in WIDTHS),
                               "learning_rate": learning_rate, **sweep})
    return config


def write_report(path, rows):
    """The JSON experiments/mup_transfer.py --json writes, from a results table whose
    ``{(parameterization, d_model, base width): {lr: [final loss per seed]}}`` is ``rows``."""
    frame = pd.DataFrame([
        dict(parameterization=p, d_model=d, mup_base_d_model=b, learning_rate=lr, seed=s,
             final_val_loss=v)
        for (p, d, b), by_lr in rows.items() for lr, values in by_lr.items()
        for s, v in enumerate(values)])
    path.write_text(json.dumps(transfer_report_module().report(frame, resamples=50)))
    return str(path)


# Best learning rates: mup 2^-7 at the base width, 2^-6 at 64; sp 2^-9 at 16.
ROWS = {
    ("mup", 16, 16): {2**-8: [3.2, 3.3], 2**-7: [3.1, 3.1], 2**-6: [3.2, 3.3]},
    ("mup", 64, 16): {2**-8: [3.1, 3.2], 2**-7: [3.0, 3.0], 2**-6: [2.9, 2.9]},
    ("mup", 32, 32): {2**-8: [3.0, 3.0], 2**-7: [3.1, 3.1], 2**-6: [3.2, 3.2]},
    ("sp", 16, 0): {2**-10: [3.0, 3.0], 2**-9: [2.9, 2.8], 2**-8: [3.1, 3.0]},
}


def learning_rates(runs):
    return {run.cfg.model.d_model: run.cfg.train.learning_rate for run in runs}


def test_every_width_trains_at_the_base_lr_under_mup():
    runs = plan(spec_from_config_dict(study({"rule": "transfer", "base_lr": 3e-3})))
    assert learning_rates(runs) == {d: 3e-3 for d in WIDTHS}
    for run in runs:
        assert run.axes["train.learning_rate"] == 3e-3
        assert (run.cfg.model.parameterization, run.cfg.model.mup_base_d_model) == ("mup", 16)


def test_the_report_gives_the_mup_row_at_the_base_width_or_the_tuned_width(tmp_path):
    report = write_report(tmp_path / "lr.json", ROWS)
    # A grid value is kept exactly (2^-10 would not survive six significant digits).
    runs = plan(spec_from_config_dict(study({"rule": "transfer", "report": report})))
    assert learning_rates(runs) == {d: 2**-7 for d in WIDTHS}
    runs = plan(spec_from_config_dict(study({"rule": "transfer", "report": report,
                                             "tuned_d_model": 64})))
    assert learning_rates(runs) == {d: 2**-6 for d in WIDTHS}
    # The same report read for a study at base width 32: that base's row.
    runs = plan(spec_from_config_dict(study({"rule": "transfer", "report": report},
                                            {**MUP, "mup_base_d_model": 32})))
    assert learning_rates(runs) == {d: 2**-8 for d in WIDTHS}


def test_a_report_path_is_found_next_to_the_experiment_file(tmp_path):
    write_report(tmp_path / "lr.json", ROWS)
    spec = spec_from_config_dict(study({"rule": "transfer", "report": "lr.json"}),
                                 source=str(tmp_path / "study.py"))
    assert spec.learning_rate.base_lr == 2**-7


def test_each_variant_reads_the_rate_of_its_own_base_width(tmp_path):
    report = write_report(tmp_path / "lr.json", ROWS)
    config = study({"rule": "transfer", "report": report},
                   variants={"base16": {}, "base32": {"model": {"mup_base_d_model": 32}}})
    by_variant = {}
    for run in plan(spec_from_config_dict(config)):
        by_variant.setdefault(run.axes["variant"], set()).add(run.cfg.train.learning_rate)
    assert by_variant == {"base16": {2**-7}, "base32": {2**-8}}


def _refusal(config, source=""):
    with pytest.raises(SweepSpecError) as info:
        plan(spec_from_config_dict(config, source=source))
    assert "\n" not in str(info.value)
    return info.value


@pytest.mark.parametrize("learning_rate, model, extra, field, words", [
    ({"rule": "transfer", "base_lr": 3e-3}, None, {}, "sweep.learning_rate.rule", "muP"),
    ({"rule": "transfer"}, MUP, {}, "sweep.learning_rate.base_lr", "missing"),
    ({"rule": "transfer", "base_lr": 3e-3, "report": "x.json"}, MUP, {},
     "sweep.learning_rate.report", "not both"),
    ({"rule": "transfer", "report": "no_such_report.json"}, MUP, {},
     "sweep.learning_rate.report", "not found"),
    ({"rule": "transfer", "base_lr": 3e-3, "tuned_d_model": 64}, MUP, {},
     "sweep.learning_rate.tuned_d_model", "report"),
    ({"rule": "inverse_width", "ref_d_model": 16, "base_lr": 3e-3}, MUP, {},
     "sweep.learning_rate.base_lr", "only rule 'transfer'"),
    ({"rule": "transfer", "base_lr": 3e-3}, MUP,
     {"axes": {"model": {"mup_base_d_model": (16, 32)}}},
     "sweep.learning_rate.rule", "model.mup_base_d_model = 32"),
    ({"rule": "transfer", "base_lr": 3e-3}, MUP,
     {"axes": {"train": {"learning_rate": (1e-3, 2e-3)}}},
     "sweep.axes.train.learning_rate", "sweep.learning_rate also sets"),
    ({"rule": "transfer", "base_lr": 3e-3}, None,
     {"variants": {"sp": {}, "mup": {"model": MUP}}}, "sweep.learning_rate.rule", "variant 'sp'"),
], ids=["sp", "no-lr", "both", "no-file", "tuned-without-report", "other-rule", "base-width-axis",
        "lr-axis", "sp-variant"])
def test_refusals_name_the_field(learning_rate, model, extra, field, words):
    error = _refusal(study(learning_rate, model, **extra))
    assert error.field == field and words in error.reason, (error.field, error.reason)


def test_a_report_without_the_base_widths_row_or_malformed_is_refused(tmp_path):
    report = write_report(tmp_path / "lr.json", {k: v for k, v in ROWS.items() if k[1] != 16})
    error = _refusal(study({"rule": "transfer", "report": report}))
    assert error.field == "sweep.learning_rate.report"
    assert "no mup row at d_model 16" in error.reason and "d_model 64 (base 16)" in error.reason
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"best_learning_rates": [{"parameterization": "mup"}]}))
    error = _refusal(study({"rule": "transfer", "report": str(bad)}))
    assert error.field == "sweep.learning_rate.report" and "not a transfer report" in error.reason


def test_the_shipped_tuned_study_reuses_the_transfer_sweeps_configs():
    from attnlab.sweep import load_spec

    tuned = plan(load_spec("experiments/mup_tuned.py"))
    best = json.loads((ROOT / "docs/results/mup_transfer_cpu.json").read_text())
    at_base = [r["learning_rate"] for r in best["best_learning_rates"]
               if (r["parameterization"], r["d_model"]) == ("mup", 16)]
    assert {run.cfg.train.learning_rate for run in tuned} == set(at_base)
    transfer = {run.run_id for run in plan(load_spec("experiments/mup_transfer.py"))}
    shared = {run.run_id for run in tuned if run.cfg.model.d_model <= 128}
    assert len(shared) == 8 and shared <= transfer
    # Its gpu scale needs a report that no run has written yet.
    with pytest.raises(SweepSpecError) as info:
        load_spec("experiments/mup_tuned.py:gpu")
    assert info.value.field == "sweep.learning_rate.report" and "not found" in info.value.reason
