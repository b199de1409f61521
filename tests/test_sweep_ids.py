"""Run ids of the shipped experiments never change.

A sweep is idempotent because a rerun finds its old run directories by id (``runs/<run_id>``);
an id that changes silently retrains everything. The ids below were computed from the planner
before it moved from patching dicts to typed overrides of Config; if one of these tests fails,
a change altered what the planner resolves (or how the id is hashed).
"""

import hashlib
import json
import pathlib

import pytest

from attnlab.identity import identity
from attnlab.sweep import load_spec, plan, tuning

EXPERIMENTS = ("tiny_isoflop", "quickstart", "tiny_grid", "tiny_pe", "kaplan",
               "chinchilla_isoflop", "pe_extrapolation", "markov_floor", "tiny_mixers", "architectures",
               "gpt_vs_bert", "icl", "tiny_ladder", "moe", "mup_transfer", "mup_tuned",
               "quickstart_ladder", "wsd_cosine", "markov_ladder",
               "moe_dense", "architectures_tuned", "mqar_seeds", "icl_regression_mixers",
               "hparams", "quickstart_shards", "data_constrained", "induction_seeds",
               "regression_seeds", "schedule_curves")

TINY_ISOFLOP_CPU = [
    "d16-l1-rope-t13.6k-s0-f45cac28", "d32-l2-rope-t3.58k-s0-dd589dd0",
    "d48-l3-rope-t1.54k-s0-54870a3a", "d16-l1-rope-t26.9k-s0-add82b26",
    "d32-l2-rope-t7.42k-s0-6b52a569", "d48-l3-rope-t2.82k-s0-29aebc2d",
]
# The quickstart's plan changed on purpose in issue #20: first four budgets with ladders centred
# on a prior optimum (sweep.centre), then three budgets with 6-7 sizes each; these are its ids.
QUICKSTART_CPU = [
    "d12-l1-rope-t1.8M-s0-2a20ab3e", "d16-l1-rope-t1.29M-s0-69a0a53f",
    "d20-l1-rope-t983k-s0-e23c60ab", "d24-l1-rope-t777k-s0-d83d5145",
    "d28-l1-rope-t639k-s0-89b50f23", "d32-l1-rope-t537k-s0-13cbbb0b",
    "d20-l1-rope-t2.46M-s0-4010c307", "d24-l1-rope-t1.94M-s0-35f42852",
    "d28-l1-rope-t1.6M-s0-13e7aa92", "d32-l1-rope-t1.34M-s0-49344d86",
    "d28-l2-rope-t1.04M-s0-9f46effd", "d32-l2-rope-t860k-s0-8bacf26c",
    "d36-l2-rope-t723k-s0-9768063c", "d28-l1-rope-t3.99M-s0-5dc37f3b",
    "d32-l1-rope-t3.36M-s0-59a87e6b", "d28-l2-rope-t2.59M-s0-7ecaac24",
    "d32-l2-rope-t2.15M-s0-cf78a17d", "d36-l2-rope-t1.81M-s0-e89c63f5",
    "d40-l2-rope-t1.56M-s0-4b7b91fd", "d48-l2-rope-t1.18M-s0-5c4d42b2",
]
# Per experiment and scale, the first 16 hex digits of the sha256 of (1) its run ids in plan
# order and (2) every planned run in full (config identity, axes, budget, counts: what run.json
# records, less config fields added since the first release while at their defaults). One digest
# per experiment, so a deliberate change to one experiment's plan is updated alone and the
# others stay guarded. (Checked equal to the single digest over all experiments that the
# previous version of this test held, for every experiment but the quickstart.)
PLAN_DIGESTS = {
    "tiny_isoflop:cpu": ("db1684d9e87ed14a", "6497715e4a7730c3"),
    "tiny_isoflop:gpu": ("db1684d9e87ed14a", "6497715e4a7730c3"),
    # The quickstart gained a one-value seed axis (its runs record train.seed among their axes):
    # the ids are unchanged, the records not.
    "quickstart:cpu": ("714625b649065f27", "1feca2663aba54a4"),
    # Changed on purpose: four budgets, each centred, two seeds, no data repeated (the design
    # check's targets met; the old plan read pystdlib 2.9 times).
    # Recentred on purpose on its first H200 run (docs/results/device_h200_2026-11-27b/): the
    # 20 runs both plans share keep their ids.
    "quickstart:gpu": ("8bf4d3a2a9363073", "92b1bcf0824fe437"),
    "tiny_grid:cpu": ("12716b60dc65c6fe", "7f9d63fd785960a4"),
    "tiny_grid:gpu": ("12716b60dc65c6fe", "7f9d63fd785960a4"),
    # tiny_pe and pe_extrapolation changed on purpose in issue #14 (T5 bias, a sliding-window
    # axis); their earlier runs keep their ids (test_pe_studies_keep_their_earlier_run_ids).
    "tiny_pe:cpu": ("33a18b123d366c67", "74b6222dd8b4a3c7"),
    "tiny_pe:gpu": ("33a18b123d366c67", "74b6222dd8b4a3c7"),
    "kaplan:cpu": ("0b3f54c19f101ede", "b3e823e5ce157fa5"),
    "kaplan:gpu": ("41c4ee628caf737a", "7c2efeeecea7ccd9"),
    "chinchilla_isoflop:cpu": ("2259048fb6802a9b", "9192317909e1aa28"),
    "chinchilla_isoflop:gpu": ("9763e9a9e6380219", "0d5962be2aadbef4"),
    "pe_extrapolation:cpu": ("b0712233fa124dcb", "b2c6584e8a6f0e7f"),
    "pe_extrapolation:gpu": ("23b47a93a0eec90f", "ff73f4e53bb1efb4"),
    "markov_floor:cpu": ("aea8b01ad48e0ed4", "4aa61d6fef3608d2"),
    "markov_floor:gpu": ("feaf2235235e724a", "d06a9186944e3ff6"),
    # Issue #15: the sequence-mixer sweep (new; model.mixer is in every run's identity).
    "tiny_mixers:cpu": ("6bd1dae233ddc1bf", "c4fa0d3f7777faab"),
    "tiny_mixers:gpu": ("6bd1dae233ddc1bf", "c4fa0d3f7777faab"),
    # Issue #17: the architecture study (new; one IsoFLOP ladder per sweep.variants entry).
    # Grown on purpose by the moe arm; its earlier 99 (cpu) and 76 (gpu) runs are planned
    # unchanged (ids, counts, FLOPs; test_architectures_keeps_its_earlier_runs).
    "architectures:cpu": ("4865817b263dee72", "4fcd37ee36b69b07"),
    "architectures:gpu": ("843e7720a9a3e03d", "4fa8a0511bb43ba8"),
    # Routed models over E at fixed tokens, for Clark et al.'s law. Changed on purpose from an
    # IsoFLOP sweep of variants (never run) to a grid at one token count, as Clark et al. train.
    "moe:cpu": ("3916d890fe455367", "9e5543ca3c8dc33d"),
    "moe:gpu": ("3185dcae431d3283", "83b82962e1047dda"),
    # Issue #16: decoder vs encoder vs encoder-decoder (new; model.objective per variant).
    "gpt_vs_bert:cpu": ("24f1affb1fb24896", "34ed1d16a2ccf3a9"),
    "gpt_vs_bert:gpu": ("da50a16ebf9e4b45", "0f4deae85b21fe89"),
    # ICL across mixers re-planned on purpose: MQAR at Zoology's setup (no FFN, loss on the answers).
    "icl:cpu": ("0b758315b400f57a", "65c383935834a5d3"),
    "icl:gpu": ("0929f6a5195cef97", "247305586a916dbe"),
    # A ladder sweep (new): per shape a constant-LR trunk and its cooldown branches.
    "tiny_ladder:cpu": ("a0ed108157a3c4ad", "45d4832a57ad4df7"),
    "tiny_ladder:gpu": ("a0ed108157a3c4ad", "45d4832a57ad4df7"),
    # muP learning-rate transfer (new; model.parameterization per variant).
    "mup_transfer:cpu": ("188cb432baafcf7c", "796be722d2253fd8"),
    "mup_transfer:gpu": ("17011a202feb0879", "2291a871c415a34d"),
    # A tuned muP width study (new): the learning rate read from the cpu transfer report
    # (docs/results/mup_transfer_cpu.json); its gpu scale needs the gpu report, not made yet.
    "mup_tuned:cpu": ("734434c0df30872e", "112246bcff503f49"),
    # The quickstart's question on a token ladder, and WSD + cooldown against cosine (new).
    "quickstart_ladder:cpu": ("5619ec9ea0449101", "fec7086b47e79670"),
    "quickstart_ladder:gpu": ("bc98a3c8e798b4d3", "981a900893e2c6cf"),
    "wsd_cosine:cpu": ("166d1d024f063469", "b0a2affeede37634"),
    "markov_ladder:cpu": ("15c5ac88dce5c03a", "bfc77885a8e98b3e"),
    # The gpu scale changed on purpose from the cpu plan to sizes past the loss's bend.
    "markov_ladder:gpu": ("fe49168fa661b3d2", "539ec24665d22753"),
    # MoE (8 experts, top-1) against dense on the quickstart's plan, two seeds (new).
    "moe_dense:cpu": ("10acd0e48b41c531", "f4d521b9a62ceb9a"),
    "moe_dense:gpu": ("10acd0e48b41c531", "f4d521b9a62ceb9a"),
    "wsd_cosine:gpu": ("aaadd495a75cccf3", "1f84a891fa64a9a8"),
    # The architecture study's arms, each tuned by the sweep's own tuning stage (new): its
    # proxies, then the study at the placeholder rates (its real ids follow from the picks).
    "architectures_tuned:cpu": ("9577d8af5cec2012", "a4a7c7c92387bff2"),
    "architectures_tuned:gpu": ("bf412dbb6a23ea30", "1e8885d53ec6260e"),
    "architectures_tuned:small": ("44594cdb4d09c7d1", "012ca33933736cbe"),  # docs/mup.md's run
    # MQAR's seed dependence (new): configs/mqar.py at eight seeds, and at Zoology's length.
    "mqar_seeds:cpu": ("0a57b79277f4d13e", "c9414df7410e2650"),
    "mqar_seeds:gpu": ("5c4f525e46577c2d", "c6ac80af4e7ce354"),
    # In-context regression across mixers (new).
    "icl_regression_mixers:cpu": ("62c5cb69d19d18cf", "c7eef07b0a48d0b8"),
    "icl_regression_mixers:gpu": ("f2a110566bcc3040", "a8854ca1ad26411d"),
    # configs/induction.py's two models at three seeds (new; one plan at both scales), changed
    # on purpose from 5,000 to 10,000 steps: at 5,000 one seed's induction head had not formed.
    "induction_seeds:cpu": ("3cb4c25fe35e93f0", "347fa04b367ef335"),
    "induction_seeds:gpu": ("3cb4c25fe35e93f0", "347fa04b367ef335"),
    # configs/icl_regression.py at three seeds (new; one plan at both scales).
    "regression_seeds:cpu": ("754b49bcac458ac4", "ee9055ae67ab6e41"),
    "regression_seeds:gpu": ("754b49bcac458ac4", "ee9055ae67ab6e41"),
    # The hyperparameter law's grid: learning rates x batch sizes per (N, D) (new).
    "hparams:cpu": ("c2810bff2cc8ba1c", "96e2e72ff7cf8d68"),
    "hparams:gpu": ("2f36f0e2194e2bc5", "0885d7cf5b484fae"),
    "hparams:cpu_refined": ("5321b4bce2b78ceb", "c78a95166d0aacc1"),  # the cpu grid moved
    "hparams:cpu_seeds": ("b1def3c89beca548", "e913506f34f3ef6e"),  # both grids' optima, 3 seeds
    # Each point or arm at several peak rates, for --best-over (new): the runs at factor 1 are
    # the untuned plan's (test_tuned_plans_keep_the_untuned_runs).
    "quickstart:cpu_tuned": ("aca22cf2aff2a6a3", "d73ea1173dc64d46"),
    # Changed on purpose: the gpu grid moved from 1/2 .. 4 to 1 .. 8 after its first lease.
    "quickstart:gpu_tuned": ("f8614e32d9f6aff4", "56580bac2b12e4f2"),
    "wsd_cosine:cpu_tuned": ("03f7a762895f5fd2", "bd37c7c8543a64fa"),
    "wsd_cosine:gpu_tuned": ("c1f2c8d2aaede9cf", "13723fbb983612cb"),
    "moe_dense:cpu_tuned": ("9abcd21376a1884b", "17aa2e0acbcf4031"),
    "chinchilla_isoflop:cpu_tuned": ("8add688c0f30185b", "e030e24c0af4b2ff"),
    "chinchilla_isoflop:gpu_tuned": ("437ef52158c28326", "9e6f9406368b39a6"),
    # Changed on purpose: Mamba's, ALiBi's and MoE's ladders reach past their best runs at the
    # ladders' tops (33 runs more), then ALiBi's wider still (15 more); the 336 earlier runs keep
    # their ids (test_a_grown_plan_keeps_its_earlier_runs).
    "architectures:cpu_tuned": ("fb09a0c39b02744d", "612c49e2cedbfcad"),
    "architectures:gpu_tuned": ("9be0d6d7a3b5bfef", "e8eee43041670fb7"),
    # The quickstart on shards (new): the quickstart's runs reading data.source=shards at the
    # path after the colon (the corpus benchmarks/data_shards.py --corpus writes).
    "quickstart_shards:runs/web_corpus": ("f30c683c96b29609", "84a50f75f2bd9cc1"),
    # Repeated data for Muennighoff et al.'s law (new): corpus slices read 1-16 times.
    "data_constrained:cpu": ("fb556db276512cce", "1fa86b2cb31dc634"),  # eval_batches 8 -> 6
    "data_constrained:gpu": ("a4112609097168f7", "e304faa5e060ebdc"),
    # Whole curves under five schedules for the multi-power and annealing laws (new).
    "schedule_curves:cpu": ("688ad0b5032e206e", "571efc7d1e1b0a7c"),
}


def planned(name: str, scale: str):
    """The experiment's runs; a sweep with a tuning stage (sweep.tune): the tuning runs, then
    the study planned at placeholder rates (its shapes, tokens and counts are the real ones)."""
    spec = load_spec(f"experiments/{name}.py:{scale}")
    if spec.tune is None:
        return plan(spec)
    return tuning.tuning_plan(spec) + plan(tuning.with_picks(spec, tuning.placeholder(spec)))


def sha256(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("name, expected", [("tiny_isoflop", TINY_ISOFLOP_CPU),
                                            ("quickstart", QUICKSTART_CPU)])
def test_shipped_run_ids_are_unchanged(name, expected):
    assert [run.run_id for run in planned(name, "cpu")] == expected


@pytest.mark.parametrize("key", sorted(PLAN_DIGESTS))
def test_every_experiment_plans_the_same_runs_as_before(key):
    name, scale = key.split(":")
    runs = planned(name, scale)
    ids, plans = PLAN_DIGESTS[key]
    assert sha256([r.run_id for r in runs])[:16] == ids
    records = [{"id": r.run_id, "cfg": identity(r.cfg), "axes": r.axes, "budget": r.budget,
                "params": r.params, "fpt": r.flops_per_token} for r in runs]
    assert sha256(records)[:16] == plans


# The plans of the positional-encoding studies before issue #14 added T5 bias and sliding windows.
PE_STUDIES_BEFORE_14 = {
    "pe_extrapolation:cpu": [
        "d128-l4-none-t983k-s0-235aa2cc", "d128-l4-none-t983k-s1-e9c28c2a",
        "d128-l4-sinusoidal-t983k-s0-0a84ff45", "d128-l4-sinusoidal-t983k-s1-6c624eff",
        "d128-l4-learned-t983k-s0-15d48038", "d128-l4-learned-t983k-s1-c911f225",
        "d128-l4-rope-t983k-s0-bd7d7b30", "d128-l4-rope-t983k-s1-66c5e1f8",
        "d128-l4-alibi-t983k-s0-9ad4ced4", "d128-l4-alibi-t983k-s1-b516b2e2"],
    "pe_extrapolation:gpu": [
        "d512-l8-none-t200M-s0-071bea2d", "d512-l8-none-t200M-s1-84a653db",
        "d512-l8-sinusoidal-t200M-s0-fb36ffe3", "d512-l8-sinusoidal-t200M-s1-a8bc28a5",
        "d512-l8-learned-t200M-s0-1940a6e0", "d512-l8-learned-t200M-s1-3d977415",
        "d512-l8-rope-t200M-s0-6680930f", "d512-l8-rope-t200M-s1-f6dd3bfb",
        "d512-l8-alibi-t200M-s0-2c48d260", "d512-l8-alibi-t200M-s1-07b78060"],
    "tiny_pe:cpu": [
        "d16-l1-none-t2.05k-s0-21866a74", "d16-l1-sinusoidal-t2.05k-s0-88964783",
        "d16-l1-learned-t2.05k-s0-64e68234", "d16-l1-rope-t2.05k-s0-728d2467",
        "d16-l1-alibi-t2.05k-s0-0839826c"],
}


# The architecture study's plan before the moe arm: the digest of its run ids in plan order.
ARCHITECTURES_BEFORE_MOE = {"architectures:cpu": "8540f53f3cedf1c1",
                            "architectures:gpu": "c7df946042c40cc5"}


@pytest.mark.parametrize("key", sorted(ARCHITECTURES_BEFORE_MOE))
def test_architectures_keeps_its_earlier_runs(key):
    name, scale = key.split(":")
    earlier = [r.run_id for r in planned(name, scale) if r.axes["architecture"] != "moe"]
    assert sha256(earlier)[:16] == ARCHITECTURES_BEFORE_MOE[key]


# Tuned plan -> (its untuned plan, how many of that plan's runs it trains again: all of them,
# or for moe_dense the largest budget's 20).
TUNED_PLANS = {"quickstart:cpu_tuned": ("quickstart:cpu", 20),
               "quickstart:gpu_tuned": ("quickstart:gpu", 42),
               "wsd_cosine:cpu_tuned": ("wsd_cosine:cpu", 27),
               "moe_dense:cpu_tuned": ("moe_dense:cpu", 20),
               "chinchilla_isoflop:cpu_tuned": ("chinchilla_isoflop:cpu", 21),
               "chinchilla_isoflop:gpu_tuned": ("chinchilla_isoflop:gpu", 19),
               "architectures:cpu_tuned": ("architectures:cpu", 112),
               "architectures:gpu_tuned": ("architectures:gpu", 85)}


@pytest.mark.parametrize("key", sorted(TUNED_PLANS))
def test_tuned_plans_keep_the_untuned_runs(key):
    """A tuned rerun reuses the untuned study's finished runs at factor 1, not retrains them."""
    untuned, shared = TUNED_PLANS[key]
    ids = {run.run_id for run in planned(*key.split(":"))}
    assert len(ids & {run.run_id for run in planned(*untuned.split(":"))}) == shared


@pytest.mark.parametrize("key", sorted(PE_STUDIES_BEFORE_14))
def test_pe_studies_keep_their_earlier_run_ids(key):
    """The full-attention runs of the five encodings resume in the grown studies."""
    name, scale = key.split(":")
    ids = [run.run_id for run in planned(name, scale)]
    assert set(PE_STUDIES_BEFORE_14[key]) <= set(ids)


def test_every_shipped_experiment_is_guarded():
    # Every sweep experiment (a file with get_config); plain scripts plan no runs.
    shipped = {path.stem for path in pathlib.Path("experiments").glob("*.py")
               if "def get_config(" in path.read_text()}
    assert {key.split(":")[0] for key in PLAN_DIGESTS} == set(EXPERIMENTS) == shipped


def test_a_grown_plan_keeps_its_earlier_runs():
    """The tuned architecture plan grew three arms' ladders, twice for ALiBi: its 336 runs from
    before keep their ids (their digest), so a rerun reuses them and trains only the 48 new ones."""
    grown = {"mamba": {(6e10, 26496), (1.5e11, 44736), (3.75e11, 65200), (3.75e11, 88992)},
             "alibi": {(6e10, 20672), (1.5e11, 49040), (3.75e11, 68064),  # span 3.2
                       (6e10, 2864), (6e10, 33088), (1.5e11, 4872), (1.5e11, 68064),
                       (3.75e11, 115328)},  # span 4
             "moe": {(6e10, 78272), (1.5e11, 148288), (1.5e11, 228880), (3.75e11, 326880)}}
    earlier = [r.run_id for r in planned("architectures", "cpu_tuned")
               if (r.budget, r.params["total"]) not in grown.get(r.axes["architecture"], ())]
    assert len(earlier) == 336 and sha256(earlier)[:16] == "cbde8fd9cbc8edac"

