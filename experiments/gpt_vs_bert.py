"""GPT vs BERT vs T5: a causal decoder (next-token), a bidirectional encoder (masked
LM, Devlin et al. 2019) and an encoder-decoder (span corruption, Raffel et al. 2020) on the same
data, at the same compute, with one IsoFLOP ladder each.

    attnlab sweep --config=experiments/gpt_vs_bert.py --sweep=sweeps/gpt_vs_bert --dry-run
    attnlab sweep --config=experiments/gpt_vs_bert.py --sweep=sweeps/gpt_vs_bert
    attnlab fit --sweep=sweeps/gpt_vs_bert --law=chinchilla --approach=2 --by=model.objective

Each objective is a named variant of one sweep (``sweep.variants``; the ``stack`` column names it,
``model.objective`` is recorded in every row): the same corpus (pystdlib, bytes), data order,
shapes, budgets, learning-rate and warmup rules. Every model has 257 ids (256 bytes + [MASK]) so
that embeddings match; the decoder never sees [MASK].

Matched compute: a budget C is counted by each model's own Chinchilla FLOPs per *input* token
(``attnlab model-info``: the encoder-decoder runs its encoder over the corrupted ~0.95 L tokens
and its decoder over the ~0.2 L span tokens, so per input token it costs about as much as the
decoder of the same shape while holding about twice the parameters), and a run trains for D =
C / (its FLOPs per input token) input tokens. Matched parameters: the shapes are the same list
for all three; the encoder-decoder's N (both stacks and cross-attention) is what ``params``
records, so the fitted laws compare at equal N and C.

Each objective's own validation loss measures something different (next-token nats; nats of the
15% BERT-selected tokens; nats of the decoder's sentinel + span tokens), so the runs also record
one common measure (``train.eval_masked_spans``, results column ``val_span_bits``): on the same
validation windows, T5's noise spans (15% of tokens, mean length 3, fixed positions) are scored
by each model in its own way: the decoder predicts each span token from everything to its left
(true tokens), the encoder sees every span [MASK]ed and predicts each token independently, the
encoder-decoder's decoder writes the spans after their sentinels (sentinels not counted). Bits
per token of those tokens; with bytes, bits per byte. This is the "each model scores masked spans
its own way" comparison; note it favours the models that see the right context (encoder,
encoder-decoder) on an infilling task, and the decoder on nothing: read it next to each
objective's own law.

Scale ``cpu``: three budgets (1e10, 3e10, 1e11 FLOPs), seven shapes (0.9k-56k non-embedding
parameters for the single stacks, 2k-130k for the encoder-decoder), three objectives: 60 runs of
seq_len 64 (shapes with fewer than 50 steps left out), about 25 minutes on 2 cores, most of it
compilation (`--dry-run` prints the plan with counts and a time estimate); measured in
docs/results.md. Scale ``gpu``: three budgets, 0.1M-3M parameters, seq_len 256; not measured.
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict

# One named variant per objective; vocab 257 everywhere: 256 bytes + [MASK] (the model's last id).
OBJECTIVES = {
    "decoder": {"model": {"objective": "clm"}},
    "encoder": {"model": {"objective": "mlm"}},
    "encoder_decoder": {"model": {"objective": "span"}},
}


def get_config(scale: str = "cpu") -> ConfigDict:
    config = ConfigDict()
    config.scale = scale

    config.base = base = base_config_dict()
    base.model.vocab_size = 257
    base.model.pos_encoding = "rope"  # bidirectional as is; relative, so enc and dec alike
    base.data.source = "pystdlib"
    base.train.learning_rate = 1e-2  # at d_model = ref_d_model below
    base.train.b2 = 0.99
    base.train.eval_every = 1_000_000  # isoflop runs are scored once, at their end
    base.train.eval_batches = 8
    base.train.eval_masked_spans = True  # the common measure, val_span_bits
    base.train.log_every = 25
    base.train.checkpoint_every = 1000

    config.sweep = sweep = ConfigDict()
    sweep.name = "gpt_vs_bert"
    sweep.mode = "isoflop"
    sweep.flops_per_token = "chinchilla"  # each model's own full count, per input token
    sweep.learning_rate = ConfigDict({"rule": "inverse_width", "ref_d_model": 32})
    sweep.warmup = ConfigDict({"rule": "fraction", "fraction": 0.05})
    sweep.variant_column = "stack"
    sweep.variants = ConfigDict(OBJECTIVES)

    if scale == "gpu":
        base.data.seq_len = 256
        base.data.batch_size = 32
        base.model.dtype = "bfloat16"
        base.train.learning_rate = 3e-3
        base.train.eval_batches = 32
        sweep.learning_rate.ref_d_model = 128
        sweep.min_steps = 100
        sweep.budgets = (1e13, 3e13, 1e14)
        sweep.shapes = ((64, 2, 2), (96, 2, 3), (128, 2, 4), (128, 4, 4), (192, 4, 6),
                        (256, 6, 8))
    else:
        base.data.max_bytes = 2_000_000
        base.data.seq_len = 64
        base.data.batch_size = 8
        sweep.min_steps = 50
        sweep.budgets = (1e10, 3e10, 1e11)
        # (d_model, n_layers, n_heads), head_dim 8-16
        sweep.shapes = ((8, 1, 1), (12, 1, 1), (16, 1, 2), (24, 1, 2), (32, 1, 2), (32, 2, 2),
                        (48, 2, 3))
    return config
