"""The coordinate check (Yang et al. 2022, "Tensor Programs V", Fig. 5 and App. D.1): train one
config at several widths for a few steps at one learning rate, under the standard
parameterisation and under muP, and record how large each layer type's activations are.

Under muP every activation, and its change since init, stays the same size as the width grows;
under SP the change of the logits (and of the hidden states, with Adam) grows with width. For
layer type ``T``, step ``t`` and width ``n``:

    size[T][t][n]   = mean |x|           over the coordinates of T's outputs (all its layers)
    change[T][t][n] = mean |x_t - x_0|   same input batch, x_0 at init
    slope[T]        = d log change[T][last step] / d log n   (least squares over the widths)

A slope near 0 is muP's prediction; SP's logits grow like ``n`` (slope ~ 1) under Adam.

    report = coord_check(cfg, widths=(64, 128, 256, 512), steps=4)
    report.slopes()     # {"sp": {"logits": 0.9, ...}, "mup": {"logits": 0.05, ...}}

Layer types: ``embedding`` (token + position embedding), ``attention_output`` (each mixer's
output, before the residual add), ``ffn_hidden`` (the FFN's first projection), ``block_output``
(the residual stream after each layer), ``logits``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from attnlab import outputs
from attnlab.config import Config, ModelConfig
from attnlab.errors import AttnlabError
from attnlab.model.architecture import PARAMETERIZATIONS as _KINDS
from attnlab.model.architecture import SCORE_SCALES

LAYER_TYPES = ("embedding", "attention_output", "ffn_hidden", "block_output", "logits")
PARAMETERIZATIONS = tuple(_KINDS)  # the arms: every model.parameterization
# Where each layer type's outputs are in ``nnx.capture(..., method_outputs=...)``: the module
# path (its attribute names, which are also its checkpoint path; None: any layer index) and the
# index of the array in the captured output.
_CAPTURE = {
    "embedding": (("embed",), (0,)),
    "attention_output": (("blocks", None, "attn", "__call__"), (0, 0)),
    "ffn_hidden": (("blocks", None, "ffn", "w_in", "__call__"), (0,)),
    "block_output": (("blocks", None, "__call__"), (0, 0)),
    "logits": (("logits",), (0,)),
}


def arm(cfg: Config, parameterization: str, width: int, base: int, lr: float,
        steps: int) -> Config:
    """``cfg`` at ``d_model = width`` under ``parameterization`` (mup: relative to ``base``,
    attention scaled ``1/d_k``; sp: ``1/sqrt(d_k)``), trained ``steps`` steps at a constant
    ``lr`` without warmup, layers unrolled (the check reads every layer's outputs)."""
    # A parameterization defined relative to a base width (muP) takes the score scale muP's
    # rule is written for; the others the default one.
    relative = "mup_base_d_model" in _KINDS[parameterization].fields
    scale = (next(name for name, kind in SCORE_SCALES.items() if kind.mup_rule) if relative
             else ModelConfig().attention_scale)
    d_ff = None if cfg.model.d_ff is None else cfg.model.d_ff * width // cfg.model.d_model
    model = dataclasses.replace(
        cfg.model, d_model=width, d_ff=d_ff, parameterization=parameterization,
        mup_base_d_model=base if relative else 0, attention_scale=scale,
        scan_layers=False, remat="none")
    train = dataclasses.replace(cfg.train, learning_rate=lr, schedule="constant",
                                warmup_steps=0, steps=max(1, steps))
    return dataclasses.replace(cfg, model=model, train=train)


def activations(graphdef: nnx.GraphDef, params: nnx.State, tokens: jax.Array
                ) -> dict[str, list[jax.Array]]:
    """Every layer type's outputs on ``tokens [batch, seq]``: ``{type: [array, ...]}`` (one array
    per layer; float32)."""
    model = nnx.merge(graphdef, params)
    _, captured = nnx.capture(model, nnx.Intermediate, method_outputs=nnx.Intermediate)(tokens)
    found = {kind: [] for kind in LAYER_TYPES}
    for path, leaf in _captured(captured):
        for kind, (suffix, index) in _CAPTURE.items():
            if _matches(path, suffix):
                value = leaf
                for i in index:
                    value = value[i]
                found[kind].append(jnp.asarray(value, jnp.float32))
    missing = [kind for kind, values in found.items() if not values]
    if missing:
        raise ValueError(f"the model has no outputs of layer types {missing}")
    return found


def _captured(tree) -> list[tuple[tuple[str, ...], object]]:
    """``(path of module names, captured tuple)`` of each method output."""
    out = []
    for path, node in nnx.to_flat_state(tree):
        names = tuple(str(k) for k in path)
        out.append((names, node.get_value() if hasattr(node, "get_value") else node.value))
    return out


def _matches(path: tuple[str, ...], pattern: tuple) -> bool:
    """``path`` is ``pattern``, ``None`` in the pattern standing for any layer index."""
    return len(path) == len(pattern) and all(s is None or s == p for s, p in zip(pattern, path))


@dataclasses.dataclass
class CoordReport:
    """``size[p][kind]`` and ``change[p][kind]``: arrays ``[steps + 1, widths]`` (step 0 = init;
    ``change`` is 0 there), for each parameterisation ``p``."""

    widths: tuple[int, ...]
    steps: int
    lr: float
    base: int
    size: dict[str, dict[str, np.ndarray]]
    change: dict[str, dict[str, np.ndarray]]

    def slopes(self) -> dict[str, dict[str, float]]:
        """``{p: {kind: slope}}``: least-squares slope of log change after the last step
        against log width (the JSON schema of ``attnlab coord-check --json``)."""
        x = np.log(np.asarray(self.widths, np.float64))
        return {p: {kind: float(np.polyfit(x, np.log(values[-1]), 1)[0])
                    for kind, values in kinds.items()}
                for p, kinds in self.change.items()}

    def ratios(self) -> dict[str, dict[str, float]]:
        """``{p: {kind: max / min}}`` of the change after the last step across the widths."""
        return {p: {kind: float(values[-1].max() / values[-1].min())
                    for kind, values in kinds.items()}
                for p, kinds in self.change.items()}


def coord_check(cfg: Config, widths: tuple[int, ...], *, steps: int = 4, lr: float | None = None,
                base: int | None = None, seeds: int = 1,
                batches: Callable[[int], np.ndarray] | None = None,
                parameterizations: tuple[str, ...] = PARAMETERIZATIONS,
                allow_large: bool = False) -> CoordReport:
    """Trains ``cfg`` at each width of ``widths`` for ``steps`` Adam steps (its optimizer at a
    constant ``lr``, default ``cfg.train.learning_rate``) and measures activations on one fixed
    batch after each step (averaged over ``seeds`` initialisations).

    Args:
      base: muP's base width (default the smallest width).
      allow_large: skip the memory estimate that refuses a widest model larger than the
        machine (attnlab.train.memory).
      batches: ``i -> int32 [batch, seq + 1]``, batch ``i`` (default the config's training
        data); the probe batch is batch 0's inputs.

    Raises:
      ConfigError: a width the config cannot be built at (naming the field).
    """
    from attnlab.checks import check
    from attnlab.model import init_model
    from attnlab.train.memory import check_training_fits

    widths = tuple(sorted(widths))
    if len(widths) < 2:
        raise AttnlabError("--widths: needs at least two widths")
    base = widths[0] if base is None else base
    lr = cfg.train.learning_rate if lr is None else lr
    arms = {(p, w): arm(cfg, p, w, base, lr, steps) for p in parameterizations for w in widths}
    for arm_cfg in arms.values():
        check(arm_cfg)  # every width's config, before any data is read or anything compiled
    check_training_fits(arms[(parameterizations[0], widths[-1])], allow_large=allow_large,
                        where="--widths: ")
    if batches is None:
        batches = _config_batches(cfg)
    probe = jnp.asarray(batches(0)[:, :-1])
    size = {p: {k: np.zeros((steps + 1, len(widths))) for k in LAYER_TYPES}
            for p in parameterizations}
    change = {p: {k: np.zeros((steps + 1, len(widths))) for k in LAYER_TYPES}
              for p in parameterizations}
    for (p, width), arm_cfg in arms.items():
        column = widths.index(width)
        step = _measured_step(arm_cfg, probe)
        for seed in range(seeds):
            _, params = init_model(arm_cfg.model, seed)
            params0, opt_state = params, step.optimizer.init(params)
            for t in range(1, steps + 1):
                params, opt_state, before, after, moved = step(
                    params, opt_state, jnp.asarray(batches(t - 1)), params0)
                for k in LAYER_TYPES:
                    if t == 1:
                        size[p][k][0, column] += float(before[k]) / seeds
                    size[p][k][t, column] += float(after[k]) / seeds
                    change[p][k][t, column] += float(moved[k]) / seeds
    return CoordReport(widths, steps, lr, base, size, change)


def _measured_step(cfg: Config, probe: jax.Array) -> Callable:
    """One jitted function per arm: ``(params, opt_state, batch, params0) -> (params,
    opt_state, size before, size after, change after)``, one Adam step of ``cfg``'s optimizer
    on ``batch`` and the layer types' mean |x| and mean |x - x_0| on ``probe`` (each averaged
    over the type's layers). Its ``optimizer`` attribute initialises the optimizer state."""
    from attnlab.model import init_model
    from attnlab.train.optimizer import optimizer_for
    from attnlab.train.step import mean_loss

    graphdef, _ = init_model(cfg.model, 0)
    optimizer, _ = optimizer_for(cfg)

    def mean_abs(outputs, reference=None):
        return {k: jnp.mean(jnp.stack([
            jnp.abs(x if reference is None else x - x0).mean()
            for x, x0 in zip(xs, xs if reference is None else reference[k])]))
            for k, xs in outputs.items()}

    @jax.jit
    def step(params, opt_state, batch, params0):
        before = activations(graphdef, params, probe)
        grads = jax.grad(lambda q: mean_loss(graphdef, q, batch))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        after = activations(graphdef, params, probe)
        start = activations(graphdef, params0, probe)
        return params, opt_state, mean_abs(before), mean_abs(after), mean_abs(after, start)

    step.optimizer = optimizer
    return step


def _config_batches(cfg: Config) -> Callable[[int], np.ndarray]:
    """Batch ``i`` of the config's training data."""
    from attnlab.data import prepare

    # The corpus's own batches: a mixture's draw across its sources.
    train = prepare(cfg.data).train_batches(cfg.data.seq_len, cfg.data.batch_size,
                                            cfg.data.seed)
    return lambda i: np.asarray(train[i])


def plot(report: CoordReport):
    """Yang et al. Fig. 5: for each parameterisation, a row of the mean |x| of each layer type
    (columns) and a row of its mean |change since init|, against width, one line per step
    (step 0, init, in the size rows); a ``matplotlib`` Figure."""
    from matplotlib.figure import Figure

    rows = [(p, what) for p in report.change for what in ("size", "change")]
    fig = Figure(figsize=(3.0 * len(LAYER_TYPES), 2.4 * len(rows)), layout="constrained")
    axes = fig.subplots(len(rows), len(LAYER_TYPES), squeeze=False)
    slopes = report.slopes()
    for r, (p, what) in enumerate(rows):
        values = report.size[p] if what == "size" else report.change[p]
        for c, kind in enumerate(LAYER_TYPES):
            ax = axes[r][c]
            for t in range(0 if what == "size" else 1, report.steps + 1):
                ax.plot(report.widths, values[kind][t], marker="o", ms=3, label=f"step {t}",
                        color=_shade(t, report.steps))
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            title = f"{p}: {kind}"
            if what == "change":
                title += f"\nchange slope {slopes[p][kind]:+.2f}"
            ax.set_title(title, fontsize=9)
            if c == 0:
                ax.set_ylabel("mean |x_t|" if what == "size" else "mean |x_t - x_0|")
            if r == len(rows) - 1:
                ax.set_xlabel("width (d_model)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"coordinate check: lr {report.lr:g}, base width {report.base}", fontsize=10)
    return fig


def _shade(t: int, steps: int):
    from matplotlib import colormaps

    return colormaps["viridis"](0.1 + 0.8 * t / max(1, steps))


__all__ = ["LAYER_TYPES", "CoordReport", "activations", "arm", "coord_check", "plot"]


def command_flags():
    """The flags of ``attnlab coord-check`` (made on call: absl loads only for the command)."""
    from attnlab import cli_vocab as vocab
    from attnlab.cli_flags import Flag

    return [
        vocab.CONFIG.flag(required=True),
        Flag("widths", "string", "64,128,256,512", "Comma-separated d_model values (>= 2)."),
        Flag("steps", "integer", 4, "Adam steps per width."),
        Flag("lr", "float", None, "Learning rate (default the config's train.learning_rate)."),
        Flag("base", "integer", None, "muP's base width (default the smallest width)."),
        Flag("seeds", "integer", 1, "Initialisations averaged per width."),
        vocab.JSON.flag("The slopes, {sp: {layer type: slope}, mup: {...}}.", default=""),
        vocab.PLOT.flag("PNG or PDF.", default=""),
        vocab.ALLOW_LARGE.flag("The widest model is the one estimated.", default=False),
    ]


def parse_widths(text: str) -> tuple[int, ...]:
    """``"64,128"`` -> ``(64, 128)``; raises AttnlabError naming ``--widths``."""
    try:
        widths = tuple(int(w) for w in text.split(",") if w.strip())
    except ValueError:
        raise AttnlabError(f"--widths: expected comma-separated integers, got {text!r}") from None
    if len(set(widths)) < 2 or min(widths) <= 0:
        raise AttnlabError(f"--widths: needs at least two distinct positive widths, got {text!r}")
    return widths


def coord_check_main(argv: list[str]) -> int:
    """``attnlab coord-check --config=configs/x.py --widths=64,128,256,512 [--steps=4]
    [--lr=...] [--json=FILE] [--plot=FILE]``: prints each layer type's slope and
    max/min ratio across widths under sp and mup."""
    from attnlab.cli_flags import parse
    from attnlab.config import from_config_dict

    values = parse(argv, command_flags(), prog="attnlab coord-check")
    cfg = from_config_dict(values.config)
    widths = parse_widths(values.widths)
    if values.steps < 1:
        raise AttnlabError(f"--steps must be >= 1, got {values.steps}")
    if values.seeds < 1:
        raise AttnlabError(f"--seeds must be >= 1, got {values.seeds}")
    report = coord_check(cfg, widths, steps=values.steps, lr=values.lr, base=values.base,
                         seeds=values.seeds, allow_large=values["allow-large"].value)
    slopes, ratios = report.slopes(), report.ratios()
    print(f"coordinate check: widths {', '.join(map(str, report.widths))}, {report.steps} steps "
          f"at lr {report.lr:g}, muP base width {report.base}")
    print(f"{'layer type':<18}" + "".join(f"{p + ' slope':>12}{p + ' max/min':>13}"
                                          for p in slopes))
    for kind in LAYER_TYPES:
        print(f"{kind:<18}" + "".join(f"{slopes[p][kind]:>12.3f}{ratios[p][kind]:>13.2f}"
                                      for p in slopes))
    if values.json:
        outputs.write_json(values.json, dict(sorted(slopes.items())))
    if values.plot:
        outputs.save_figure(plot(report), values.plot, dpi=120)
    return 0
