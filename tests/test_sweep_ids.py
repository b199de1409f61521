"""Run ids of the shipped experiments never change.

A sweep is idempotent because a rerun finds its old run directories by id (``runs/<run_id>``);
an id that changes silently retrains everything. The ids below were computed from the planner
before it moved from patching dicts to typed overrides of Config; if one of these tests fails,
a change altered what the planner resolves (or how the id is hashed).
"""

import hashlib
import json

import pytest

from attnlab.sweep import load_spec, plan

EXPERIMENTS = ("tiny_isoflop", "quickstart", "tiny_grid", "tiny_pe", "kaplan",
               "chinchilla_isoflop", "pe_extrapolation")

TINY_ISOFLOP_CPU = [
    "d16-l1-rope-t13.6k-s0-f45cac28", "d32-l2-rope-t3.58k-s0-dd589dd0",
    "d48-l3-rope-t1.54k-s0-54870a3a", "d16-l1-rope-t26.9k-s0-add82b26",
    "d32-l2-rope-t7.42k-s0-6b52a569", "d48-l3-rope-t2.82k-s0-29aebc2d",
]
QUICKSTART_CPU = [
    "d16-l1-rope-t965k-s0-2f91cc41", "d24-l1-rope-t583k-s0-27bcacd4",
    "d32-l1-rope-t402k-s0-20e4677a", "d32-l2-rope-t258k-s0-e63e61d4",
    "d48-l2-rope-t142k-s0-346efdda", "d64-l3-rope-t64.5k-s0-00cb6b1b",
    "d16-l1-rope-t3.22M-s0-c2ee2456", "d24-l1-rope-t1.94M-s0-35f42852",
    "d32-l1-rope-t1.34M-s0-49344d86", "d32-l2-rope-t860k-s0-8bacf26c",
    "d48-l2-rope-t473k-s0-90bce45c", "d64-l3-rope-t216k-s0-46fc654c",
    "d16-l1-rope-t9.65M-s0-9cbcfb7d", "d24-l1-rope-t5.83M-s0-5ec7719e",
    "d32-l1-rope-t4.03M-s0-393caec4", "d32-l2-rope-t2.58M-s0-d977e61e",
    "d48-l2-rope-t1.42M-s0-41fe277c", "d64-l3-rope-t647k-s0-0e5e5a91",
]
# sha256 of {"<experiment>:<scale>": [run ids in plan order]} for every experiment and scale.
ALL_IDS_SHA256 = "3219387cdad9109a589e74a1436b527dbd573892468128bd5c81cecd72f137c6"
# sha256 of every planned run in full (config identity, axes, budget, counts): what run.json
# records, less config fields added since the first release while at their defaults.
ALL_PLANS_SHA256 = "8e91271f8e754334e1e1f5586da4218eb1c2c5d947729ed2d621549b3259f250"


def planned(name: str, scale: str):
    return plan(load_spec(f"experiments/{name}.py:{scale}"))


def sha256(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("name, expected", [("tiny_isoflop", TINY_ISOFLOP_CPU),
                                            ("quickstart", QUICKSTART_CPU)])
def test_shipped_run_ids_are_unchanged(name, expected):
    assert [run.run_id for run in planned(name, "cpu")] == expected


def test_every_experiment_plans_the_same_runs_as_before():
    runs = {f"{name}:{scale}": planned(name, scale) for name in EXPERIMENTS
            for scale in ("cpu", "gpu")}
    assert sha256({key: [r.run_id for r in plan_] for key, plan_ in runs.items()}) == \
        ALL_IDS_SHA256
    records = {key: [{"id": r.run_id, "cfg": r.cfg.identity(), "axes": r.axes, "budget": r.budget,
                      "params": r.params, "fpt": r.flops_per_token} for r in plan_]
               for key, plan_ in runs.items()}
    assert sha256(records) == ALL_PLANS_SHA256
