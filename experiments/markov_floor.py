"""A known-answer scaling study: an IsoFLOP sweep on the `markov` corpus, whose entropy rate is
known exactly, so the irreducible loss E that approach 3 fits can be checked against the truth.

    attnlab sweep --config=experiments/markov_floor.py --sweep=runs/markov_floor --dry-run
    attnlab quickstart --config=experiments/markov_floor.py --sweep=runs/markov_floor
    attnlab fit --sweep=runs/markov_floor --law=chinchilla --approach=3 --bootstrap=1000

The corpus is a seeded order-1 Markov chain over bytes in which each byte can be followed by 64
others (attnlab.data.markov): its entropy rate H = 3.7384 nats per byte is the loss of the best
possible predictor, written in the corpus manifest (`entropy_rate_nats`). An order-1 chain makes
the floor reachable at every position of a window (the least mean loss over a 64-byte window is
H itself; an order-k chain adds a few bits of start-up loss), and its 255 x 64 transition table
is something a model of a few thousand parameters begins to represent and a model of a few
hundred thousand represents well: the loss falls with N (rank of the learned bigram table) and
with D (tokens seen per transition), towards E = H.

None of the anchor codebases can check a fitted E against a known answer. On natural text, E
mixes the entropy of language with everything a finite model family cannot learn; here, what
the fit returns for E tells how far to trust E elsewhere (docs/scaling.md has the result).

Scale `cpu`: 3 budgets (3e11, 1e12, 3e12 FLOPs) x 7 sizes from 5k to 300k parameters, batches
of 16 x 64 bytes, the same training rules as experiments/chinchilla_isoflop.py (5% warmup, cosine
matched to each run, beta2 0.99, learning rate falling as 1/width).
Scale `gpu`: the same chain at ~100x the compute.
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict


def get_config(scale: str = "cpu") -> ConfigDict:
    config = ConfigDict()
    config.scale = scale

    config.base = base = base_config_dict()
    base.data.source = "markov"
    base.data.markov_order = 1
    base.data.markov_branching = 64
    base.data.markov_seed = 0
    base.train.b2 = 0.99
    base.train.eval_every = 1_000_000  # scored once, at the end
    base.train.eval_batches = 32
    base.train.log_every = 50
    base.train.checkpoint_every = 1000

    config.sweep = sweep = ConfigDict()
    sweep.name = "markov_floor"
    sweep.mode = "isoflop"
    sweep.flops_per_token = "chinchilla"
    sweep.min_steps = 50
    sweep.warmup = ConfigDict({"rule": "fraction", "fraction": 0.05})

    if scale == "gpu":
        base.data.seq_len = 128
        base.data.batch_size = 64
        base.data.markov_tokens = 200_000_000
        base.train.learning_rate = 3e-3  # at d_model = 128
        sweep.min_steps = 100
        sweep.budgets = (3e13, 1e14, 3e14)
        sweep.shapes = ((64, 2, 2), (96, 2, 3), (128, 2, 4), (128, 4, 4), (192, 4, 6),
                        (256, 4, 8), (256, 8, 8))
        sweep.learning_rate = ConfigDict({"rule": "inverse_width", "ref_d_model": 128})
    else:
        base.data.seq_len = 64
        base.data.batch_size = 16
        base.data.markov_tokens = 20_000_000
        base.train.learning_rate = 1e-2  # at d_model = 32
        sweep.budgets = (3e11, 1e12, 3e12)
        # (d_model, n_layers, n_heads): about 2x apart in parameters.
        sweep.shapes = ((12, 1, 1), (16, 1, 1), (24, 1, 2), (32, 1, 2), (48, 1, 3), (64, 2, 4),
                        (96, 2, 6))
        sweep.learning_rate = ConfigDict({"rule": "inverse_width", "ref_d_model": 32})
    return config
