"""``attnlab import-hf --from=DIR --run=RUN`` and ``attnlab export-hf --run=RUN --to=DIR``."""

from __future__ import annotations

from attnlab import cli_vocab as vocab
from attnlab.cli_flags import Flag, parse

IMPORT_HELP = """Reads a Hugging Face checkpoint directory into a new run directory (config.json
and a step-0 checkpoint; the tokenizer.json too). The run's model section comes from the
checkpoint; its data and train sections from --config (default: attnlab's defaults), so that
`attnlab train --run=RUN` fine-tunes it."""
IMPORT_FLAGS = [
    vocab.CONFIG.flag("Its data and train sections (default: attnlab's defaults)."),
    Flag("from", "string", None, "HF checkpoint directory (config.json, model.safetensors or "
         "its sharded index, optionally tokenizer.json).", required=True),
    vocab.RUN.flag("The new one to write (must not exist, or be empty).", required=True,
                   old_names=("workdir",)),
]
EXPORT_FLAGS = [
    vocab.RUN.flag("Its latest checkpoint is exported.", required=True),
    Flag("to", "string", None, "New HF checkpoint directory to write (must not exist, or be "
         "empty).", required=True),
    vocab.STEP.flag(),
]


def import_main(argv: list[str]) -> int:
    from attnlab.config import from_config_dict
    from attnlab.errors import AttnlabError
    from attnlab.hf.convert import import_hf

    if any(a.startswith("--config.model.") for a in argv):  # before the parse says "unknown"
        raise AttnlabError("--config.model.* cannot be set: the model section comes from the "
                           "checkpoint's config.json")
    values = parse(argv, IMPORT_FLAGS, prog="attnlab import-hf", description=IMPORT_HELP)
    base = None if values.config is None else from_config_dict(values.config)
    notes: list[str] = []
    cfg = import_hf(values["from"].value, values.run, base, notes)
    m = cfg.model
    print(f"imported {cfg.name} into {values.run}: d_model {m.d_model}, {m.n_layers} layers, "
          f"{m.n_heads} heads, vocabulary {m.vocab_size}")
    for note in notes:
        print(f"note: {note}")
    return 0


def export_main(argv: list[str]) -> int:
    from attnlab.hf.convert import export_hf

    values = parse(argv, EXPORT_FLAGS, prog="attnlab export-hf", takes_config=False)
    hf = export_hf(values.run, values.to, values.step)
    print(f"exported {values.run} to {values.to} as model_type={hf['model_type']}")
    return 0
