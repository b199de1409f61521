"""Positional encodings and length extrapolation (Press et al. 2022, Figure 1, at CPU scale).

    attnlab extrapolate --config=experiments/pe_extrapolation.py --sweep=sweeps/pe_extrapolation \
        --multipliers=1,2,4,8,16 --max-tokens=32768 --parallel=2

One command trains the 24 runs (resumable), evaluates each finished run at 1-16 x L_train on the
validation split, and writes DIR/extrapolation.csv, the plots and DIR/extrapolation_report.md.
Every run has the same shape, data (pystdlib, bytes), token budget, data order (data.seed = 0)
and schedule; only model.pos_encoding (six encodings, T5 bias included), model.attention_window
(0 = full causal attention, or a sliding window of L_train / 4) and the initialisation seed
(train.seed) vary. The learned table has exactly L_train rows, so learned positions are not
applicable beyond 1x. RoPE's context extensions are evaluation settings: add
``--rope-scaling=all`` to evaluate every RoPE run zero-shot and under NTK, PI and YaRN in one
report (``rope+ntk``, ``rope+pi``, ``rope+yarn`` rows). The ten full-attention runs of the first
version keep their run ids; ``--config.sweep.axes.model.attention_window='(0,)'`` plans only
them and the T5 runs.

Scales: ``cpu`` (default) trains d_model 128 x 4 layers (0.82M parameters) at L_train = 64 on
0.98M tokens per run (24 runs x 480 steps). Measured on 2026-11-23 with ``--parallel=2`` and
``--rope-scaling=all`` on a 2-core VM shared with other jobs (load 5-10): 186 min of training
time (about 1 h 45 min of wall time) and ~10 min of evaluation; results in
docs/extrapolation.md. More tokens:
``--config.base.train.tokens=2621440``. ``gpu`` (``--config.scale=gpu``)
trains d_model 512 x 8 layers at L_train = 128 on 200M tokens per run (not run yet).
"""

from ml_collections import ConfigDict

from attnlab.config import base_config_dict


def get_config(scale: str = "cpu") -> ConfigDict:
    config = ConfigDict()
    config.scale = scale

    config.base = base = base_config_dict()
    base.model.vocab_size = 256
    base.model.ffn = "gelu"
    base.model.norm = "layernorm"
    base.data.source = "pystdlib"
    base.data.tokenizer = "byte"
    base.data.seed = 0  # one data order for every run
    base.train.schedule = "cosine"
    base.train.eval_batches = 8
    base.train.log_every = 50
    if scale == "gpu":
        base.model.d_model, base.model.n_layers, base.model.n_heads = 512, 8, 8
        base.data.seq_len = base.model.max_len = 128
        base.data.batch_size = 128
        base.train.tokens = 200_000_000
        base.train.learning_rate = 1e-3
        base.train.warmup_steps = 500
        base.train.eval_every = base.train.checkpoint_every = 2000
    else:
        base.model.d_model, base.model.n_layers, base.model.n_heads = 128, 4, 4
        base.data.seq_len = base.model.max_len = 64
        base.data.batch_size = 32
        base.train.tokens = 983_040  # 480 steps of 32 x 64
        base.train.learning_rate = 3e-3
        base.train.warmup_steps = 50
        base.train.eval_every = base.train.checkpoint_every = 160

    config.sweep = sweep = ConfigDict()
    sweep.name = "pe_extrapolation"
    sweep.mode = "grid"
    sweep.axes = ConfigDict()
    # Every encoding with full causal attention (0) and with a sliding window of L_train / 4
    # (a baseline that never sees a relative distance beyond w). The window-0 runs
    # keep the ids they had before the window axis existed.
    window = base.data.seq_len // 4
    sweep.axes.model = ConfigDict(
        {"pos_encoding": ("none", "sinusoidal", "learned", "rope", "alibi", "t5"),
         "attention_window": (0, window)})
    sweep.axes.train = ConfigDict({"seed": (0, 1)})
    return config
