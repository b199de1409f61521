"""sweep.learning_rate.rule = 'law': each run's peak rate from a fitted hyperparameter law,
lr = c N^a D^b at the run's own active parameters and tokens (the JSON of attnlab fit
--law=hparams --json), checked in float64 on an IsoFLOP plan, whose runs differ in both."""

import json
import math
import pathlib
import runpy

import pytest

from attnlab.model.counting import param_counts
from attnlab.sweep import plan, spec_from_config_dict
from attnlab.sweep.rules import read_lr_law
from attnlab.sweep.sections import SweepSpecError

ROOT = pathlib.Path(__file__).resolve().parents[1]
ISOFLOP = ROOT / "experiments" / "tiny_isoflop.py"
LADDER = ROOT / "experiments" / "tiny_ladder.py"
COMMITTED = ROOT / "docs" / "results" / "hparams_cpu_fit.json"


def _law(tmp_path, coef=3.0, params=-0.5, tokens=0.1, name="law.json", **fields):
    path = tmp_path / name
    path.write_text(json.dumps({"lr": {"coef": coef, "exponents": {"params": params,
                                                                    "tokens": tokens}},
                                **fields}))
    return path


def _spec(experiment, rule):
    config = runpy.run_path(str(experiment))["get_config"]().to_dict()
    config["sweep"]["learning_rate"] = rule
    if "shapes" in config["sweep"]:  # the rule, not the shapes, gives the rates
        config["sweep"]["shapes"] = tuple(s[:3] for s in config["sweep"]["shapes"])
    return spec_from_config_dict(config)


def test_every_run_trains_at_the_law_of_its_own_size_and_tokens(tmp_path):
    runs = plan(_spec(ISOFLOP, {"rule": "law", "report": str(_law(tmp_path))}))
    sizes = {(r.cfg.model.d_model, r.cfg.total_steps) for r in runs}
    assert len(runs) > 3 and len(sizes) == len(runs)
    for run in runs:
        cfg = run.cfg
        n = param_counts(cfg.model)["active"]
        d = cfg.total_steps * cfg.data.batch_size * cfg.data.seq_len
        assert cfg.train.learning_rate == pytest.approx(3.0 * n**-0.5 * d**0.1, rel=1e-5)
    # The same N at two budgets: more tokens, a higher rate (b > 0).
    by_size = {}
    for run in runs:
        by_size.setdefault(run.cfg.model.d_model, []).append(
            (run.cfg.total_steps, run.cfg.train.learning_rate))
    assert any(len(v) > 1 and sorted(v)[0][1] < sorted(v)[-1][1] for v in by_size.values())


def test_the_committed_fit_is_a_law_the_rule_reads():
    coef, exponents, size = read_lr_law(str(COMMITTED), "f")
    payload = json.loads(COMMITTED.read_text())["lr"]
    assert coef == payload["coef"] and exponents["params"] == payload["exponents"]["params"]
    assert size == "total"


def test_an_undetermined_exponent_counts_as_zero(tmp_path):
    runs = plan(_spec(ISOFLOP, {"rule": "law", "report": str(_law(tmp_path, tokens=None))}))
    for run in runs:
        n = param_counts(run.cfg.model)["active"]
        assert run.cfg.train.learning_rate == pytest.approx(3.0 * n**-0.5, rel=1e-5)


def test_a_law_in_non_embedding_n_or_in_compute_is_applied_in_its_own_variable(tmp_path):
    """--size=non_embedding: N is the active non-embedding count; --size=compute: the law is
    c C^a with C = 6 N D in non-embedding N (the results' flops, which that fit reads)."""
    non_emb = plan(_spec(ISOFLOP, {"rule": "law", "report": str(
        _law(tmp_path, name="ne.json", size="non_embedding"))}))
    compute = plan(_spec(ISOFLOP, {"rule": "law", "report": str(
        _law(tmp_path, params=-0.2, tokens=None, name="c.json", size="compute"))}))
    for ne, c in zip(non_emb, compute):
        n = param_counts(ne.cfg.model)["active_non_embedding"]
        d = ne.cfg.total_steps * ne.cfg.data.batch_size * ne.cfg.data.seq_len
        assert ne.cfg.train.learning_rate == pytest.approx(3.0 * n**-0.5 * d**0.1, rel=1e-5)
        assert c.cfg.train.learning_rate == pytest.approx(3.0 * (6 * n * d)**-0.2, rel=1e-5)
    with pytest.raises(SweepSpecError, match="size 'params'"):
        _spec(ISOFLOP, {"rule": "law", "report": str(_law(tmp_path, name="x.json",
                                                             size="params"))})


@pytest.mark.parametrize("rule,field,words", [
    ({"rule": "law"}, "sweep.learning_rate.report", "missing"),
    ({"rule": "law", "report": "no/such.json"}, "sweep.learning_rate.report", "not found"),
    ({"rule": "inverse_width", "ref_d_model": 32, "report": "x.json"},
     "sweep.learning_rate.report", "only rules 'transfer' and 'law' read it"),
])
def test_bad_law_sections_are_one_error_naming_the_field(rule, field, words):
    with pytest.raises(SweepSpecError) as info:
        _spec(ISOFLOP, rule)
    assert info.value.field == field and words in str(info.value)


def test_a_file_that_is_not_a_law_is_refused_before_planning(tmp_path):
    wrong = tmp_path / "transfer.json"
    wrong.write_text(json.dumps({"best_learning_rates": []}))
    with pytest.raises(SweepSpecError) as info:
        _spec(ISOFLOP, {"rule": "law", "report": str(wrong)})
    assert info.value.field == "sweep.learning_rate.report"
    assert "is not a fitted hyperparameter law" in str(info.value)
    negative = _law(tmp_path, coef=-1.0, name="negative.json")
    with pytest.raises(SweepSpecError, match="coef -1"):
        _spec(ISOFLOP, {"rule": "law", "report": str(negative)})
    assert math.isfinite(read_lr_law(str(_law(tmp_path)), "f")[0])


def test_a_ladder_whose_branches_share_a_trunk_refuses_the_law(tmp_path):
    with pytest.raises(SweepSpecError) as info:
        plan(_spec(LADDER, {"rule": "law", "report": str(_law(tmp_path))}))
    assert info.value.field == "sweep.learning_rate.rule" and "trunk" in str(info.value)
