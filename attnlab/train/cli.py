"""``attnlab train``, ``attnlab model-info`` and ``attnlab generate``.

Each is ``main(argv) -> exit code``; :mod:`attnlab.cli` dispatches to them and turns
:class:`attnlab.errors.AttnlabError` into exit code 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from attnlab import cli_vocab as vocab
from attnlab.cli_flags import Flag, parse
from attnlab.config import Config, check_warmup, from_config_dict
from attnlab.errors import AttnlabError

TRAIN_FLAGS = [
    vocab.CONFIG.flag("Optional with a --run that holds its config.json (to resume, or to "
                      "fine-tune an imported run)."),
    vocab.RUN.flag("The run to write; rerunning with the same one resumes.", required=True,
                   old_names=("workdir",)),
    vocab.PROGRESS.flag("A bar on a terminal, plain lines otherwise.", default=True),
    vocab.ALLOW_LARGE.flag(default=False),
    vocab.ALLOW_NONEMPTY.flag(default=False),
]
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
GENERATE_FLAGS = [
    vocab.RUN.flag("Its latest checkpoint is used.", required=True),
    Flag("prompt", "string", "", "Text to continue; for masked-objective runs (model.objective "
         "mlm / span) text with [MASK] where tokens are to be filled in. Give it or "
         "--prompts-file."),
    Flag("prompts-file", "string", "", "A text file of prompts, one per line, continued as one "
         "left-padded batch (a causal LM run); prints one JSON line {\"prompt\", \"text\"} "
         "per prompt."),
    Flag("max-new-tokens", "integer", 200, "Tokens to generate."),
    Flag("temperature", "float", 0.8, "Sampling temperature; 0 is greedy."),
    vocab.SEED.flag(default=0),
    vocab.STEP.flag(),
    vocab.ALLOW_LARGE.flag("The estimate counts the KV cache.", default=False),
]
PREPARE_FLAGS = [vocab.CONFIG.flag(required=True)]
ENV_FLAGS = [vocab.JSON.flag("The report, also printed.", default="")]


def _config(values, *, experiment_base: bool = False) -> Config:
    """The command line's config, every rule between its parts checked (before compiling); an
    experiment file (a sweep: ``base`` and ``sweep``) is refused in one line, or with
    ``experiment_base`` read as its base config."""
    from attnlab.checks import check

    raw = values.config
    if "sweep" in raw and "base" in raw:
        if not experiment_base:
            raise AttnlabError("--config names an experiment (its sweep and base sections): "
                               "this command takes one run's config (configs/*.py); attnlab "
                               "sweep --config=... --dry-run plans the experiment's runs")
        raw = raw.base
    cfg = from_config_dict(raw)
    check(cfg)
    check_warmup(cfg.train, cfg.total_steps)
    return cfg


def _run_config(run: str) -> Config:
    """Without ``--config``: the config a run directory already holds (a run to resume, or one
    written by ``attnlab import-hf`` to fine-tune)."""
    from pathlib import Path

    from attnlab.rundir import CONFIG_FILE
    from attnlab.train.load import load_config

    if not (Path(run) / CONFIG_FILE).is_file():
        raise AttnlabError(f"--config is required: --run={run} holds no {CONFIG_FILE} "
                           "to resume from")
    return load_config(run)


def train_main(argv: list[str]) -> int:
    """``attnlab train --config=configs/x.py [--config.a.b=v ...] --run=DIR``, or
    ``attnlab train --run=DIR`` for a run directory that already holds its config."""
    from attnlab.interrupts import EXIT_INTERRUPTED
    from attnlab.train.loop import EXIT_COMPLETED, EXIT_DIVERGED, run

    values = parse(argv, TRAIN_FLAGS, prog="attnlab train")
    # run() checks every rule first, before it writes or compiles anything
    cfg = (from_config_dict(values.config) if values.config is not None
           else _run_config(values.run))
    try:
        summary = run(cfg, values.run, progress=values.progress,
                      allow_large=values["allow-large"].value,
                      allow_nonempty=values["allow-nonempty"].value)
    except KeyboardInterrupt:
        sys.stderr.write(f"\ninterrupted; rerun the same command to resume from the latest "
                         f"checkpoint in {values.run}\n")
        return EXIT_INTERRUPTED
    if summary["status"] == "diverged":
        sys.stderr.write(f"diverged at step {summary.get('diverged_at_step')}: non-finite loss or "
                         f"gradient; see {values.run}/summary.json\n")
        return EXIT_DIVERGED
    tokens_per_s = summary.get("tokens_per_s")
    speed = f", {tokens_per_s:,.0f} tokens/s" if tokens_per_s else ""
    from attnlab.model import resolve

    unit = resolve(cfg.model).objective.loss_unit
    print(f"final validation loss: {summary['final_val_loss']:.4f} {unit} "
          f"(best {summary['best_val_loss']:.4f}) after {summary['step']} steps, "
          f"{summary['tokens']:,} tokens{speed}")
    print(f"summary: {values.run}/summary.json")
    return EXIT_COMPLETED


def _format_count(n: float) -> str:
    return f"{n:,.0f}" if n < 1e9 else f"{n:.3e}"


def model_info_main(argv: list[str]) -> int:
    """``attnlab model-info --config=configs/x.py [overrides] | --run=DIR [--forward]
    [--plot=PNG]``: counts from the config alone (nothing is compiled), optionally one
    forward pass on real data and the positional encoding's pictures."""
    from attnlab.model import flops_per_token, param_counts, resolve

    values = parse(argv, MODEL_INFO_FLAGS, prog="attnlab model-info")
    if values.run and values.config is not None:
        raise AttnlabError("give --config or --run, not both: --run uses the run's own config")
    if not values.run and values.config is None:
        raise AttnlabError("--config is required (or --run=DIR, a run directory)")
    if values.run:
        from attnlab.train.load import load_config

        cfg = load_config(values.run)
    else:
        cfg = _config(values)
    m, seq_len = cfg.model, cfg.data.seq_len
    arch = resolve(m)
    plot_path = _positions_plot_path(cfg, arch, values.plot)
    counts = param_counts(m)
    flops = flops_per_token(m, seq_len)
    tokens = cfg.total_steps * cfg.data.batch_size * seq_len
    print(f"model {cfg.name}: d_model={m.d_model} n_layers={m.n_layers} n_heads={m.n_heads} "
          f"kv_heads={m.kv_heads} d_ff={arch.ffn.width} vocab={m.vocab_size} "
          f"pos={m.pos_encoding} ffn={m.ffn} norm={m.norm}/{m.norm_position} dtype={m.dtype}")
    names = " ".join(mixer.name for mixer in arch.stack.mixers)
    print(f"{arch.block.title} blocks, mask {arch.mask.name}; sequence mixers by layer: {names}")
    if counts["active"] != counts["total"]:
        print(f"mixture of experts: {m.moe_experts} experts of width {arch.ffn.width}, top "
              f"{m.moe_top_k} ({m.moe_dispatch} dispatch), {m.moe_shared_experts} shared")
    print("parameters:")
    keys = ("total", "non_embedding", "embedding")
    if counts["active"] != counts["total"]:  # the FLOPs below count the active ones
        keys += ("active", "active_non_embedding")
    for key in keys:
        print(f"  {key:<21}{_format_count(counts[key]):>18}")
    objective = arch.objective
    predicted = objective.predicted_per_input(seq_len)
    print(f"objective: {m.objective} = {objective.title}; {predicted:.3g} predicted tokens per "
          "input token")
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
    if values.forward:
        loss = forward_loss(cfg)
        reference, meaning = objective.uninformed_loss()
        print(f"forward pass on one validation batch ({cfg.data.batch_size} x {seq_len} tokens, "
              f"untrained, seed {cfg.train.seed}): loss {loss:.4f} {objective.loss_unit} "
              f"({meaning} = {reference:.4f})")
    if plot_path is not None:
        plot_positions(cfg, values.run, plot_path)
    return 0


def _positions_plot_path(cfg: Config, arch, path: str) -> Path | None:
    """``--plot``'s file, refused before anything is built when it cannot be
    written or the model (``arch``, the resolved ``cfg.model``) has nothing to draw."""
    from attnlab.model.inspect import has_position_pictures

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
    from flax import nnx

    from attnlab.model import init_model
    from attnlab.model.inspect import position_pictures
    from attnlab.plots.positions import plot_positions as draw
    from attnlab.train.load import load_params

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
    import jax
    import numpy as np

    from attnlab.data import prepare
    from attnlab.model import init_model
    from attnlab.train.step import mean_loss, packing_for

    corpus = prepare(cfg.data)
    batch = np.asarray(corpus.validation_set(cfg.data.seq_len, cfg.data.batch_size, 1)[0])
    graphdef, params = init_model(cfg.model, cfg.train.seed)
    packing = packing_for(cfg)
    loss = jax.jit(lambda p, b: mean_loss(graphdef, p, b, packing=packing))(params, batch)
    return float(loss)


def generate_main(argv: list[str]) -> int:
    """``attnlab generate --run=DIR --prompt="def " [--max-new-tokens=200] [--temperature=0.8]``."""
    import jax
    import numpy as np

    from attnlab.model import generate, resolve
    from attnlab.train.load import load_config, load_params
    from attnlab.train.memory import check_generation_fits
    from attnlab.train.step import packing_for

    values, texts = _generate_flags(argv)
    max_new = values["max-new-tokens"].value
    run_model = load_config(values.run).model
    parts = resolve(run_model)  # the run's model, resolved once for every check below
    _refuse_for_objective(values, texts, parts.objective, run_model.objective)
    check_generation_fits(run_model, max_new + 1024, allow_large=values["allow-large"].value)
    cfg, graphdef, params = load_params(values.run, values.step)
    tokenizer = _run_tokenizer(values.run, cfg)
    if parts.objective.uses_mask:
        return _fill_in(cfg, graphdef, params, tokenizer, parts.objective, values.prompt,
                        max_new)
    prompts = _encode_prompts(tokenizer, [values.prompt] if texts is None else texts,
                              "--prompt" if texts is None else "--prompts-file")
    _check_prompt_lengths(prompts, max_new, parts, cfg.model)
    # A batch samples each row with its own key: a prompt's text does not depend on the others.
    keys = jax.random.key(values.seed)
    if texts is not None:
        keys = jax.random.split(keys, len(prompts))
    outs = generate(graphdef, params, cfg.model, prompts, max_new, rng=keys,
                    temperature=values.temperature, packing=packing_for(cfg))
    # Bytes that are not valid UTF-8 (a cut multi-byte character) print as U+FFFD.
    decoded = [tokenizer.decode(np.asarray(out)).decode("utf-8", "replace") for out in outs]
    if texts is None:
        sys.stdout.write(decoded[0] + "\n")
    else:
        for text, out in zip(texts, decoded):
            sys.stdout.write(json.dumps({"prompt": text, "text": out}) + "\n")
    return 0


def _generate_flags(argv: list[str]):
    """generate's flags, checked before anything loads; (values, the prompts file's lines or
    None)."""
    if any(a.startswith("--config") for a in argv):
        raise AttnlabError("generate uses the run's own config (its config.json): --config and "
                           "--config.* overrides would not be applied, so they are refused")
    values = parse(argv, GENERATE_FLAGS, prog="attnlab generate", takes_config=False)
    if bool(values.prompt) == bool(values["prompts-file"].value):
        raise AttnlabError("give exactly one of --prompt and --prompts-file")
    texts = _read_prompts(values["prompts-file"].value) if values["prompts-file"].value else None
    if values["max-new-tokens"].value < 0:
        raise AttnlabError(f"--max-new-tokens must be >= 0, got {values['max-new-tokens'].value}")
    if values.temperature < 0:
        raise AttnlabError(f"--temperature must be >= 0, got {values.temperature}")
    if values.temperature == 0 and values["seed"].present:  # else it would be ignored
        raise AttnlabError("--seed draws the samples; --temperature=0 is greedy and draws none")
    return values, texts


def _refuse_for_objective(values, texts, objective, name: str) -> None:
    """Prompts the run's objective cannot take: a prompts file for a masked model, a prompt
    without a mask for one, sampling flags it would ignore."""
    from attnlab.data.tokenizer import MASK_TEXT

    if texts is not None and not objective.causal:
        raise AttnlabError(f"--prompts-file continues prompts with a causal LM; "
                           f"model.objective={name} fills masks: use --prompt")
    if objective.uses_mask and MASK_TEXT not in values.prompt:
        raise AttnlabError(f"--prompt holds no {MASK_TEXT}: model.objective={name}"
                           f" predicts masked tokens; write {MASK_TEXT} where they go")
    _refuse_unused_sampling(values, objective, name)


def _run_tokenizer(run: str, cfg: Config):
    """The tokenizer a run was trained with: an imported run's (attnlab import-hf brings its
    model's), else its corpus's."""
    from attnlab.data import prepare
    from attnlab.data.tokenizer import HubTokenizer
    from attnlab.rundir import TOKENIZER_FILE

    hub = Path(run) / TOKENIZER_FILE
    tokenizer = HubTokenizer(hub) if hub.is_file() else prepare(cfg.data).tokenizer
    if tokenizer is None:
        raise AttnlabError(f"--run={run} was trained on the token task data.source="
                           f"{cfg.data.source}, which has no text; use attnlab attention")
    return tokenizer


def _encode_prompts(tokenizer, texts: list[str], where: str) -> list:
    import numpy as np

    prompts = [np.asarray(tokenizer.encode(text), np.int32) for text in texts]
    if min(len(p) for p in prompts) == 0:
        raise AttnlabError(f"{where}: a prompt encodes to no tokens; give some text to continue")
    return prompts


def _check_prompt_lengths(prompts: list, max_new: int, parts, model) -> None:
    """Prompt + continuation within the encoding's positions; one length when the first
    indices are global (left padding would fill them)."""
    limit = parts.encoding.max_positions()
    longest = max(len(p) for p in prompts)
    if limit is not None and longest + max_new > limit:
        raise AttnlabError(
            f"prompt ({longest} tokens) + --max-new-tokens ({max_new}) exceeds the "
            f"{limit} positions of the {parts.encoding.range_name}")
    if len({len(p) for p in prompts}) > 1 and parts.mask.global_keys:
        raise AttnlabError(f"--prompts-file: model.attention_global_tokens="
                           f"{model.attention_global_tokens} makes the first indices global, "
                           "which left padding fills; give prompts of one length")


def _read_prompts(path: str) -> list[str]:
    """The non-empty lines of ``path`` (a prompt each); raises AttnlabError naming the flag."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise AttnlabError(f"--prompts-file={path}: cannot read it ({e})") from None
    prompts = [line for line in lines if line.strip()]
    if not prompts:
        raise AttnlabError(f"--prompts-file={path} holds no prompt (one per line)")
    return prompts


def _refuse_unused_sampling(values, objective, name: str) -> None:
    """A masked objective fills its masks greedily: a sampling temperature given to it would be
    ignored, and so would --max-new-tokens by the encoder alone (the encoder-decoder's spans
    take it): both are refused rather than ignored. --temperature=0, greedy, is what it does."""
    if not objective.uses_mask:
        return
    given = ["--temperature"] if values["temperature"].present and values.temperature else []
    if not objective.encoder_decoder and values["max-new-tokens"].present:
        given.append("--max-new-tokens")
    if given:
        raise AttnlabError(f"{', '.join(given)}: model.objective={name} fills each [MASK] "
                           f"greedily, so it takes no {' or '.join(given)}")


def _fill_in(cfg: Config, graphdef, params, tokenizer, objective, text: str, max_new: int) -> int:
    """``generate`` for the masked objectives: an encoder (mlm) fills every [MASK] of the
    prompt in one pass; an encoder-decoder (span) decodes ``[MASK] span ...`` greedily (the
    spans in the order of the prompt's [MASK]s)."""
    import numpy as np

    from attnlab.data.tokenizer import decode_with_masks, encode_with_masks
    from attnlab.model.decoding import decode_spans, fill_masks
    from attnlab.model.objectives import mask_id

    mask = mask_id(cfg.model.vocab_size)
    prompt = encode_with_masks(tokenizer, text, mask)[None]
    if objective.encoder_decoder:
        out = np.asarray(decode_spans(graphdef, params, cfg.model, prompt, max(1, max_new)))[0]
    else:
        out = np.asarray(fill_masks(graphdef, params, cfg.model, prompt))[0]
    out = out[(out < tokenizer.vocab_size) | (out == mask)]  # ids the tokenizer can write
    sys.stdout.write(decode_with_masks(tokenizer, out, mask).decode("utf-8", "replace") + "\n")
    return 0


def prepare_main(argv: list[str]) -> int:
    """``attnlab prepare --config=configs/x.py [--config.data.a=v ...]``: builds the corpus of
    the config's data section into the cache (once; an interrupted build resumes), as the first
    ``attnlab train`` would, and prints its token counts. An experiment file's: its base
    config's (``--config.base.data.a=v``)."""
    from attnlab.data import prepare

    values = parse(argv, PREPARE_FLAGS, prog="attnlab prepare", description=prepare_main.__doc__)
    corpus = prepare(_config(values, experiment_base=True).data)  # an experiment: its base's
    print(repr(corpus))
    return 0


def env_main(argv: list[str]) -> int:
    """``attnlab env [--json=FILE]``: package versions, backend and devices, the peak MFU is
    measured against, whether cuDNN's fused attention and bf16 matmuls work here."""
    from attnlab import outputs
    from attnlab.train import environment

    values = parse(argv, ENV_FLAGS, prog="attnlab env", takes_config=False,
                   description=env_main.__doc__)
    found = environment.report()
    print("\n".join(environment.report_lines(found)))
    if values.json:
        outputs.write_json(values.json, found)
    return 0
