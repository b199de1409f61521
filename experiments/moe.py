"""Mixture of experts against dense at equal training compute: one IsoFLOP ladder per expert
count E (Clark et al. 2022, "Unified Scaling Laws for Routed Language Models").

    attnlab sweep --config=experiments/moe.py --workdir=sweeps/moe --dry-run
    attnlab quickstart --config=experiments/moe.py --workdir=sweeps/moe

Each E is a named variant of one sweep (``sweep.variants``, column ``experts``): the same
budgets, shapes, data order and learning-rate rules as the architecture study's cpu scale
(experiments/architectures.py), the FFN of every layer replaced by E experts of the dense FFN's
width with Switch's top-1 routing (``model.moe_top_k=1``), so that a shape's *active*
parameters and FLOPs per token are the dense model's plus the router (``2 d E`` FLOPs): the
runs at one budget and one shape differ only in how many experts the router chooses from.
E = 1 is the dense model with a (trivial) router; ``dense`` is the baseline itself.

FLOPs are counted per token by ``attnlab.model.flops_per_token`` (Chinchilla's full count with
the router, the chosen expert and the combine; the capacity buffers' empty slots are not
training compute of the model and are left out, as in Clark et al.). The fit of Clark et al.'s
form ``log L = a log N + b log E + c log N log E + d`` (N = active non-embedding parameters) is
not in attnlab yet; ``attnlab fit --by=experts`` fits one Chinchilla law per E. Not run. Its
``--dry-run`` on 2026-11-25 (2-core VM shared with other jobs): 70 runs, 1.46e13 FLOPs,
estimated 32 min of training and 63 min with start-up and compilation.
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict

EXPERTS = (1, 2, 4, 8, 16)
_PRIOR = {"n_opt": 39e3, "budget": 9e11, "exponent": 0.6}  # experiments/architectures.py's


def variants() -> dict:
    out = {"dense": {}}
    for e in EXPERTS:
        out[f"E{e}"] = {"model": {"moe": "token_choice", "moe_experts": e, "moe_top_k": 1}}
    return out


def get_config(scale: str = "cpu") -> ConfigDict:
    config = ConfigDict()
    config.scale = scale

    config.base = base = base_config_dict()
    base.data.source = "pystdlib"
    base.data.seq_len = 128
    base.data.batch_size = 8
    base.train.learning_rate = 1e-2  # at d_model = ref_d_model below
    base.train.b2 = 0.99
    base.train.eval_every = 1_000_000  # isoflop runs are scored once, at their end
    base.train.eval_batches = 16
    base.train.log_every = 25
    base.train.checkpoint_every = 1000

    config.sweep = sweep = ConfigDict()
    sweep.name = "moe"
    sweep.mode = "isoflop"
    sweep.flops_per_token = "chinchilla"
    sweep.learning_rate = ConfigDict({"rule": "inverse_width", "ref_d_model": 32})
    sweep.warmup = ConfigDict({"rule": "fraction", "fraction": 0.05})
    sweep.min_steps = 50
    sweep.variant_column = "experts"
    sweep.variants = ConfigDict(variants())
    sweep.budgets = (6e10, 1.5e11, 3.75e11)
    sweep.shapes = ((8, 1, 1), (12, 1, 1), (16, 1, 1), (20, 1, 1), (24, 1, 2), (32, 1, 2),
                    (32, 2, 2), (40, 2, 2), (48, 2, 3), (64, 2, 4))
    sweep.centre = ConfigDict({**_PRIOR, "span": 2.5})
    return config
