"""``attnlab model-info``: a config's shape, parameter counts and FLOPs per token, optionally one
forward pass and the positional encoding's pictures. ``main(argv) -> exit code``, dispatched by
:mod:`attnlab.cli`; its imports follow the rule in :mod:`attnlab.train.cli`."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
from flax import nnx

from attnlab import cli_vocab as vocab
from attnlab.cli_flags import Flag, parse
from attnlab.config import Config
from attnlab.data import prepare
from attnlab.errors import AttnlabError
from attnlab.model import flops_per_token, init_model, param_counts, resolve
from attnlab.model.inspect import has_position_pictures, position_pictures
from attnlab.train.load import command_config, load_config, load_params
from attnlab.train.step import mean_loss, packing_for

MODEL_INFO_FLAGS = [
    vocab.CONFIG.flag("Give it or --run."),
    Flag("forward", "bool", False, "Also build the model and print the loss of one forward "
         "pass over a validation batch (untrained weights)."),
    vocab.RUN.flag("Instead of --config: its config, and its latest checkpoint's weights for "
                   "--plot.", default=""),
    vocab.PLOT.flag("Draws the positional encoding over data.seq_len positions (PNG): the "
                    "similarity of the positions' vectors (sinusoidal, learned), the q/k kernel "
                    "against distance (RoPE), the score bias against distance per head (ALiBi, "
                    "T5).", default="", old_names=("plot-positions",)),
]


def model_info_main(argv: list[str]) -> int:
    """``attnlab model-info --config=configs/x.py [overrides] | --run=DIR [--forward]
    [--plot=PNG]``: counts from the config alone (nothing is compiled), optionally one
    forward pass on real data and the positional encoding's pictures."""
    values = parse(argv, MODEL_INFO_FLAGS, prog="attnlab model-info")
    if values.run and values.config is not None:
        raise AttnlabError("give --config or --run, not both: --run uses the run's own config")
    if not values.run and values.config is None:
        raise AttnlabError("--config is required (or --run=DIR, a run directory)")
    cfg = load_config(values.run) if values.run else command_config(values)
    arch = resolve(cfg.model)
    plot_path = _positions_plot_path(cfg, arch, values.plot)
    _print_model(cfg, arch)
    _print_counts(cfg)
    _print_flops(cfg, arch.objective)
    if values.forward:
        _print_forward(cfg, arch.objective)
    if plot_path is not None:
        plot_positions(cfg, values.run, plot_path)
    return 0


def _format_count(n: float) -> str:
    return f"{n:,.0f}" if n < 1e9 else f"{n:.3e}"


def _print_model(cfg: Config, arch) -> None:
    """The model's shape and parts (``arch``: the resolved ``cfg.model``)."""
    m = cfg.model
    print(f"model {cfg.name}: d_model={m.d_model} n_layers={m.n_layers} n_heads={m.n_heads} "
          f"kv_heads={m.kv_heads} d_ff={arch.ffn.width} vocab={m.vocab_size} "
          f"pos={m.pos_encoding} ffn={m.ffn} norm={m.norm}/{m.norm_position} dtype={m.dtype}")
    names = " ".join(mixer.name for mixer in arch.stack.mixers)
    print(f"{arch.block.title} blocks, mask {arch.mask.name}; sequence mixers by layer: {names}")
    counts = param_counts(m)
    if counts["active"] != counts["total"]:
        print(f"mixture of experts: {m.moe_experts} experts of width {arch.ffn.width}, top "
              f"{m.moe_top_k} ({m.moe_dispatch} dispatch), {m.moe_shared_experts} shared")


def _print_counts(cfg: Config) -> None:
    counts = param_counts(cfg.model)
    print("parameters:")
    keys = ("total", "non_embedding", "embedding")
    if counts["active"] != counts["total"]:  # the FLOPs below count the active ones
        keys += ("active", "active_non_embedding")
    for key in keys:
        print(f"  {key:<21}{_format_count(counts[key]):>18}")


def _print_flops(cfg: Config, objective) -> None:
    """FLOPs per input token (and per predicted one where they differ), and the run's total."""
    seq_len = cfg.data.seq_len
    flops = flops_per_token(cfg.model, seq_len)
    tokens = cfg.total_steps * cfg.data.batch_size * seq_len
    predicted = objective.predicted_per_input(seq_len)
    print(f"objective: {cfg.model.objective} = {objective.title}; {predicted:.3g} predicted "
          "tokens per input token")
    print(f"training FLOPs per input token (forward + backward, seq_len={seq_len}):")
    for key, value in flops.items():
        print(f"  {key:<20}{_format_count(value):>18}")
    if predicted != 1.0:
        print("training FLOPs per predicted token:")
        for key, value in flops.items():
            print(f"  {key:<20}{_format_count(value / predicted):>18}")
    print(f"run: {cfg.total_steps} steps x {cfg.data.batch_size * seq_len:,} tokens = "
          f"{tokens:,} tokens; C = 6ND = {flops['kaplan_6n'] * tokens:.3e}, "
          f"Chinchilla C = {flops['chinchilla'] * tokens:.3e} FLOPs")


def _print_forward(cfg: Config, objective) -> None:
    loss = forward_loss(cfg)
    reference, meaning = objective.uninformed_loss()
    print(f"forward pass on one validation batch ({cfg.data.batch_size} x {cfg.data.seq_len} "
          f"tokens, untrained, seed {cfg.train.seed}): loss {loss:.4f} {objective.loss_unit} "
          f"({meaning} = {reference:.4f})")


def _positions_plot_path(cfg: Config, arch, path: str) -> Path | None:
    """``--plot``'s file, refused before anything is built when it cannot be
    written or the model (``arch``, the resolved ``cfg.model``) has nothing to draw."""
    if not path:
        return None
    out = Path(path)
    if out.is_dir() or not out.parent.is_dir():
        raise AttnlabError(f"--plot={path}: not a file in an existing directory")
    if arch.decoder is not None:
        raise AttnlabError(f"--plot: model.objective={cfg.model.objective} has two "
                           "stacks; it draws a single stack's encoding")
    if not has_position_pictures(arch.stack.encoding):
        raise AttnlabError(f"--plot: model.pos_encoding={cfg.model.pos_encoding} adds "
                           "nothing that depends on position; there is nothing to draw")
    return out


def plot_positions(cfg: Config, run: str, path: Path) -> None:
    """The encoding's pictures (:func:`attnlab.model.inspect.position_pictures`) over
    ``data.seq_len`` positions, of the run's trained weights or the config's initial ones."""
    from attnlab.plots.positions import plot_positions as draw

    if run:
        _, graphdef, params = load_params(run)
    else:
        graphdef, params = init_model(cfg.model, cfg.train.seed)
    pictures = position_pictures(nnx.merge(graphdef, params), cfg.data.seq_len)
    draw(pictures, path)
    weights = f"{run}'s trained" if run else "initial"
    print(f"positions ({weights} weights, {cfg.data.seq_len} positions): {path}")


def forward_loss(cfg: Config) -> float:
    """Mean loss (the objective's) of freshly initialised weights on the first validation
    batch."""
    corpus = prepare(cfg.data)
    batch = np.asarray(corpus.validation_set(cfg.data.seq_len, cfg.data.batch_size, 1)[0])
    graphdef, params = init_model(cfg.model, cfg.train.seed)
    packing = packing_for(cfg)
    loss = jax.jit(lambda p, b: mean_loss(graphdef, p, b, packing=packing))(params, batch)
    return float(loss)
