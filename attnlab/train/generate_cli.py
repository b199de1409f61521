"""``attnlab generate``: text from a trained run, continued from prompts (a causal LM) or filled
in where a prompt has [MASK] (the masked objectives). ``main(argv) -> exit code``, dispatched by
:mod:`attnlab.cli`; its imports follow the rule in :mod:`attnlab.train.cli`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np

from attnlab import cli_vocab as vocab
from attnlab.cli_flags import Flag, parse
from attnlab.config import Config
from attnlab.data.tokenizer import MASK_TEXT, decode_with_masks, encode_with_masks
from attnlab.errors import AttnlabError
from attnlab.model import generate, resolve
from attnlab.model.decoding import decode_spans, fill_masks
from attnlab.model.objectives import mask_id
from attnlab.train.load import load_config, load_params, run_tokenizer
from attnlab.train.memory import check_generation_fits
from attnlab.train.step import packing_for

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


def generate_main(argv: list[str]) -> int:
    """``attnlab generate --run=DIR --prompt="def " [--max-new-tokens=200] [--temperature=0.8]``."""
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
    _write_texts(texts, _continuations(values, texts, (cfg, graphdef, params), tokenizer, parts))
    return 0


def _continuations(values, texts: list[str] | None, loaded, tokenizer, parts) -> list[str]:
    """The prompts (``--prompt``, or a prompts file's ``texts``) continued by the run
    (``loaded``: its config, graphdef and parameters) and decoded."""
    cfg, graphdef, params = loaded
    max_new = values["max-new-tokens"].value
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
    return [tokenizer.decode(np.asarray(out)).decode("utf-8", "replace") for out in outs]


def _write_texts(texts: list[str] | None, decoded: list[str]) -> None:
    """The continuation of ``--prompt`` as it is; those of a prompts file as JSON lines."""
    if texts is None:
        sys.stdout.write(decoded[0] + "\n")
        return
    for text, out in zip(texts, decoded):
        sys.stdout.write(json.dumps({"prompt": text, "text": out}) + "\n")


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
    if texts is not None and not objective.causal:
        raise AttnlabError(f"--prompts-file continues prompts with a causal LM; "
                           f"model.objective={name} fills masks: use --prompt")
    if objective.uses_mask and MASK_TEXT not in values.prompt:
        raise AttnlabError(f"--prompt holds no {MASK_TEXT}: model.objective={name}"
                           f" predicts masked tokens; write {MASK_TEXT} where they go")
    _refuse_unused_sampling(values, objective, name)


def _run_tokenizer(run: str, cfg: Config):
    """The run's tokenizer; a token task's run is pointed to attnlab attention."""
    try:
        return run_tokenizer(run, cfg)
    except AttnlabError as e:
        raise AttnlabError(f"{e}; use attnlab attention") from None


def _encode_prompts(tokenizer, texts: list[str], where: str) -> list:
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
    mask = mask_id(cfg.model.vocab_size)
    prompt = encode_with_masks(tokenizer, text, mask)[None]
    if objective.encoder_decoder:
        out = np.asarray(decode_spans(graphdef, params, cfg.model, prompt, max(1, max_new)))[0]
    else:
        out = np.asarray(fill_masks(graphdef, params, cfg.model, prompt))[0]
    out = out[(out < tokenizer.vocab_size) | (out == mask)]  # ids the tokenizer can write
    sys.stdout.write(decode_with_masks(tokenizer, out, mask).decode("utf-8", "replace") + "\n")
    return 0
