"""A tuned width study under muP (Yang et al. 2022, muTransfer): every width trains at the one
learning rate that experiments/mup_transfer.py found best at the muP base width, read from its
report by the sweep rule ``learning_rate.rule = 'transfer'`` (docs/sweeps.md, docs/mup.md).

    attnlab sweep --config=experiments/mup_tuned.py --sweep=sweeps/mup_tuned
    attnlab sweep --config=experiments/mup_tuned.py --sweep=sweeps/mup_tuned64 \\
        --config.sweep.name=mup_tuned64 --config.sweep.learning_rate.tuned_d_model=64

Scale ``cpu``: the transfer sweep's model and data (2 layers, 2 heads, base width 16, 100 steps
of 8 x 32 pystdlib bytes), widths 16-512 (32x, 4x beyond the widths tuned), seeds 0 and 1, the
learning rate of docs/results/mup_transfer_cpu.json (its cpu-scale report). Its runs at widths
16-128 are configs the transfer sweep trained too (the same run ids). Scale ``gpu``: the
transfer sweep's gpu sizes, widths 64-2048; it reads docs/results/mup_transfer_gpu.json, which
``python experiments/mup_transfer.py SWEEP_DIR --json=...`` writes after that sweep's gpu scale
(not run yet).
"""

from __future__ import annotations

from ml_collections import ConfigDict

from attnlab.config import base_config_dict



def get_config(scale: str = "cpu") -> ConfigDict:
    config = ConfigDict()
    config.scale = scale
    gpu = scale == "gpu"

    # The base config of experiments/mup_transfer.py, under muP.
    config.base = base = base_config_dict()
    base.model.max_len = 128
    base.model.parameterization = "mup"
    base.model.mup_base_d_model = 64 if gpu else 16
    base.model.attention_scale = "mup"
    base.data.source = "pystdlib"
    base.data.max_bytes = 1_000_000
    base.data.seq_len = 128 if gpu else 32
    base.data.batch_size = 32 if gpu else 8
    base.train.steps = 1000 if gpu else 100
    base.train.warmup_steps = 100 if gpu else 10
    base.train.log_every = 50
    base.train.eval_every = base.train.steps
    base.train.eval_batches = 8
    base.train.checkpoint_every = base.train.steps

    config.sweep = sweep = ConfigDict()
    sweep.name = "mup_tuned"
    sweep.mode = "grid"
    layers = 4 if gpu else 2
    widths = (64, 128, 256, 512, 1024, 2048) if gpu else (16, 32, 64, 128, 256, 512)
    sweep.shapes = tuple((d, layers, 2) for d in widths)
    sweep.axes = ConfigDict({"train": {"seed": (0, 1)}})
    sweep.learning_rate = ConfigDict({
        "rule": "transfer",
        "report": f"docs/results/mup_transfer_{scale}.json",
        "tuned_d_model": 0,  # 0: the row at the base width
    })
    return config
