"""``attnlab train``, ``attnlab prepare`` and ``attnlab env``; the config a command line gives.

``attnlab model-info`` is :mod:`attnlab.train.model_info_cli`, ``attnlab generate``
:mod:`attnlab.train.generate_cli`. Each command is ``main(argv) -> exit code``;
:mod:`attnlab.cli` dispatches to them and turns :class:`attnlab.errors.AttnlabError` into exit
code 2.

Imports, in these three modules: every import stands at the top, but one. Importing any module
of ``attnlab.train`` imports the package, and with it the training loop, JAX and the model, so an
import inside a function would load nothing later (and the dispatcher imports a command's module
with interrupts held, so that no Ctrl-C cuts jaxlib's initialisation short). The one import
inside a function is of a module that the package does not load and that a single flag needs:
matplotlib's figures (``attnlab.plots``), for ``model-info --plot``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from attnlab import cli_vocab as vocab
from attnlab import outputs
from attnlab.cli_flags import parse
from attnlab.config import Config, from_config_dict
from attnlab.data import prepare
from attnlab.errors import AttnlabError
from attnlab.interrupts import EXIT_INTERRUPTED
from attnlab.model import resolve
from attnlab.rundir import CONFIG_FILE
from attnlab.train import environment
from attnlab.train.load import command_config, load_config
from attnlab.train.loop import EXIT_COMPLETED, EXIT_DIVERGED, run

TRAIN_FLAGS = [
    vocab.CONFIG.flag("Optional with a --run that holds its config.json (to resume, or to "
                      "fine-tune an imported run)."),
    vocab.RUN.flag("The run to write; rerunning with the same one resumes.", required=True,
                   old_names=("workdir",)),
    vocab.PROGRESS.flag("A bar on a terminal, plain lines otherwise.", default=True),
    vocab.ALLOW_LARGE.flag(default=False),
    vocab.ALLOW_NONEMPTY.flag(default=False),
]
PREPARE_FLAGS = [vocab.CONFIG.flag(required=True)]
ENV_FLAGS = [vocab.JSON.flag("The report, also printed.", default="")]


def _run_config(run_dir: str) -> Config:
    """Without ``--config``: the config a run directory already holds (a run to resume, or one
    written by ``attnlab import-hf`` to fine-tune)."""
    if not (Path(run_dir) / CONFIG_FILE).is_file():
        raise AttnlabError(f"--config is required: --run={run_dir} holds no {CONFIG_FILE} "
                           "to resume from")
    return load_config(run_dir)


def train_main(argv: list[str]) -> int:
    """``attnlab train --config=configs/x.py [--config.a.b=v ...] --run=DIR``, or
    ``attnlab train --run=DIR`` for a run directory that already holds its config."""
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
    _print_summary(summary, resolve(cfg.model).objective.loss_unit, values.run)
    return EXIT_COMPLETED


def _print_summary(summary: dict, unit: str, run_dir: str) -> None:
    tokens_per_s = summary.get("tokens_per_s")
    speed = f", {tokens_per_s:,.0f} tokens/s" if tokens_per_s else ""
    print(f"final validation loss: {summary['final_val_loss']:.4f} {unit} "
          f"(best {summary['best_val_loss']:.4f}) after {summary['step']} steps, "
          f"{summary['tokens']:,} tokens{speed}")
    print(f"summary: {run_dir}/summary.json")


def prepare_main(argv: list[str]) -> int:
    """``attnlab prepare --config=configs/x.py [--config.data.a=v ...]``: builds the corpus of
    the config's data section into the cache (once; an interrupted build resumes), as the first
    ``attnlab train`` would, and prints its token counts. An experiment file's: its base
    config's (``--config.base.data.a=v``)."""
    values = parse(argv, PREPARE_FLAGS, prog="attnlab prepare", description=prepare_main.__doc__)
    corpus = prepare(command_config(values, experiment_base=True).data)  # an experiment: its base's
    print(repr(corpus))
    return 0


def env_main(argv: list[str]) -> int:
    """``attnlab env [--json=FILE]``: package versions, backend and devices, the peak MFU is
    measured against, whether cuDNN's fused attention and bf16 matmuls work here."""
    values = parse(argv, ENV_FLAGS, prog="attnlab env", takes_config=False,
                   description=env_main.__doc__)
    found = environment.report()
    print("\n".join(environment.report_lines(found)))
    if values.json:
        outputs.write_json(values.json, found)
    return 0
