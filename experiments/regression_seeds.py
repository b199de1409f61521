"""Does the in-context regression known answer hold at every seed? ``configs/icl_regression.py``
(d = 8, k up to 16, Garg et al.'s curriculum, 24000 steps of 256 prompts) at initialisation
seeds 0, 1 and 2 (the same task stream, curriculum and schedule):

    attnlab sweep --config=experiments/regression_seeds.py --sweep=sweeps/regression_seeds --ensemble=on
    attnlab icl --sweep=sweeps/regression_seeds     # error per k against the baselines, per run

The claim (docs/icl.md): within 0.05 of least squares at every k >= d + 2, and below one step of
gradient descent at every k >= d. The seeds differ in ``train.seed`` alone, so ``--ensemble=on``
trains them as one program. The config is sized for the CPU (one seed took 75 minutes here; the
three as one ensemble 7.6 h beside other studies, resumed 4 times; docs/icl.md has the result),
so both scales plan the same runs; a lent accelerator runs the gpu scale
(benchmarks/device_session.sh, stage regression). ``smoke`` is a CPU-sized stand-in for that script's --smoke: 2 seeds of a 1-layer
model for 30 steps, which tests the plumbing, not the claim.
"""

from ml_collections import ConfigDict


def get_config(scale: str = "cpu") -> ConfigDict:
    config = ConfigDict()
    config.scale = "cpu" if scale == "smoke" else scale
    config.base = "configs/icl_regression.py"
    config.sweep = sweep = ConfigDict()
    sweep.name = "regression_seeds"
    sweep.mode = "grid"
    sweep.learning_rate = ConfigDict({"rule": "per_shape"})
    # (d_model, n_layers, n_heads, learning_rate): configs/icl_regression.py's model
    sweep.shapes = ((64, 4, 4, 1e-3),)
    sweep.axes = ConfigDict()
    sweep.axes.train = ConfigDict({"seed": (0, 1, 2)})
    if scale == "smoke":
        sweep.shapes = ((16, 1, 2, 1e-3),)
        sweep.axes.train = ConfigDict({"seed": (0, 1), "steps": (30,), "warmup_steps": (3,)})
    return config
