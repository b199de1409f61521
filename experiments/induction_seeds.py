"""Does the induction known answer hold at every seed? ``configs/induction.py``'s 2-layer
attention-only model and its 1-layer control, each at initialisation seeds 0, 1 and 2 (the same
task, data order and schedule):

    attnlab sweep --config=experiments/induction_seeds.py --sweep=sweeps/induction_seeds --ensemble=on
    attnlab icl --sweep=sweeps/induction_seeds      # repeat loss and induction score per run

The claim (docs/icl.md): the 2-layer model's loss on the repeat is at most 0.1 ln V with an
induction score of at least 0.5, and the 1-layer control's stays at least 0.8 ln V. The seeds
of one depth differ in ``train.seed`` alone, so ``--ensemble=on`` trains them as one program.
``configs/induction.py`` is sized for the CPU (about an hour here for the six runs), so both
scales plan the same runs.
"""

from ml_collections import ConfigDict


def get_config(scale: str = "cpu") -> ConfigDict:
    config = ConfigDict()
    config.scale = scale
    config.base = "configs/induction.py"
    config.sweep = sweep = ConfigDict()
    sweep.name = "induction_seeds"
    sweep.mode = "grid"
    sweep.learning_rate = ConfigDict({"rule": "per_shape"})
    # (d_model, n_layers, n_heads, learning_rate): configs/induction.py's model and its control
    sweep.shapes = ((64, 2, 4, 3e-3), (64, 1, 4, 3e-3))
    sweep.axes = ConfigDict()
    sweep.axes.train = ConfigDict({"seed": (0, 1, 2)})
    return config
