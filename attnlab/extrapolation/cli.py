"""``attnlab extrapolate``: evaluate one run, or a whole sweep, at longer context lengths.

    attnlab extrapolate --run=RUN_DIR [--multipliers=1,2,4,8,16 | --lengths=64,128,...]
                        [--protocol=nonoverlapping|sliding|both] [--stride=S]
    attnlab extrapolate --config=experiments/pe_extrapolation.py --sweep=DIR
                        [--config.sweep.axes.train.seed=(0,1)]   # spec overrides, as for sweep

Exit codes: 0 done; 1 done, but the study raised red flags (see its report); 2 bad input
(nothing written).
"""

from __future__ import annotations

from pathlib import Path

from attnlab import cli_flags
from attnlab import cli_vocab as vocab
from attnlab.cli_flags import Flag, OldName, UsageError
from attnlab.extrapolation.evaluate import (EVERY_SCALING, ROPE_SCALINGS, EvalSettings,
                                            evaluate_run)
from attnlab.extrapolation.protocol import PROTOCOLS
from attnlab.extrapolation.reports import report_paths, results_frame
from attnlab.extrapolation.study import ratio_table, run_study
from attnlab.sweep import spec_from_config_dict
from attnlab.sweep.launchers import LAUNCHERS
from attnlab.sweep.spec import config_source

# Before --sweep named the sweep directory it named the experiment file (now --config).
_OLD_SWEEP = " (an experiment file; --sweep names the sweep directory now, as --workdir did)"
BOTH = "both"  # --protocol: every protocol

FLAGS = [
    vocab.RUN.flag("A trained one to evaluate.", default=""),
    vocab.CONFIG.flag("The experiment (experiments/*.py[:gpu]): its sweep is run (resuming) "
                      "in --sweep, every completed run evaluated, table and plots written.",
                      old_names=(OldName("sweep", vocab.is_experiment_file, _OLD_SWEEP),)),
    vocab.SWEEP.flag("Where the experiment of --config runs (rerunning resumes).", default="",
                     old_names=("workdir",)),
    Flag("multipliers", "string", "1,2,4,8,16", "Evaluation lengths as multiples of the "
                                                "training length."),
    Flag("lengths", "string", "", "Absolute evaluation lengths (comma separated); replaces "
                                  "--multipliers. The training length is always added."),
    Flag("protocol", "enum", "nonoverlapping", "nonoverlapping chunks, a sliding window "
                                               "(stride --stride), or both.",
         enum_values=(*PROTOCOLS, BOTH)),
    Flag("stride", "integer", 0, "Sliding-window stride; 0 = half the shortest length."),
    Flag("max-tokens", "integer", 0, "Use only the first N validation tokens (0 = all)."),
    Flag("batch-tokens", "integer", 16384, "Tokens per forward pass."),
    Flag("attention-chunk", "integer", 512, "Query-block size of the attention for lengths "
                                            "above it (memory linear in length); 0 = never."),
    Flag("rope-scaling", "enum", "none", "RoPE context extension at evaluation: none (zero-shot), "
                                         "ntk (NTK-aware base), pi (position interpolation), "
                                         "yarn (NTK-by-parts + temperature), or all (with "
                                         "--config: each of them, compared in one report).",
         enum_values=(*ROPE_SCALINGS, EVERY_SCALING)),
    Flag("rope-factor", "float", 0.0, "Scale factor s of --rope-scaling; 0 = longest length / "
                                      "training length."),
    Flag("force", "bool", False, "Re-evaluate even when extrapolation.json is current."),
    vocab.LAUNCHER.flag("With --config.", default="local", enum_values=tuple(LAUNCHERS)),
    vocab.PARALLEL.flag("With --config.", default=1),
    vocab.PROGRESS.flag("As bars.", default=True),
]


def _int_list(flag: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"--{flag}: expected comma-separated integers, got {text!r}") from None


def settings_from_flags(values):
    protocol = values["protocol"].value
    settings = EvalSettings(
        multipliers=_int_list("multipliers", values["multipliers"].value),
        lengths=_int_list("lengths", values["lengths"].value),
        protocols=tuple(PROTOCOLS) if protocol == BOTH else (protocol,),
        stride=values["stride"].value,
        max_tokens=values["max-tokens"].value,
        batch_tokens=values["batch-tokens"].value,
        attention_chunk=values["attention-chunk"].value,
        rope_scaling=values["rope-scaling"].value,
        rope_factor=values["rope-factor"].value,
    )
    settings.validate()
    return settings


def _refuse_overrides_without_config(argv: list[str]) -> None:
    """``--config.*`` overrides belong to the experiment's spec: without ``--config`` they are
    refused here, before absl calls them unknown flags."""
    renamed, _ = cli_flags.rename_old_flags(argv, FLAGS)  # parse prints the notices
    overrides = [a.split("=")[0] for a in renamed if a.startswith("--config.")]
    if overrides and not any(a == "--config" or a.startswith("--config=") for a in renamed):
        raise UsageError(f"{overrides[0]}: spec overrides need --config=experiments/FILE.py")


def extrapolate_main(argv: list[str]) -> int:
    _refuse_overrides_without_config(argv)
    values = cli_flags.parse(argv, FLAGS, prog="attnlab extrapolate", description=__doc__)
    run, sweep, config = values["run"].value, values["sweep"].value, values.config
    if not run and config is None and sweep:
        raise UsageError(f"--sweep={sweep} is the sweep directory; name the experiment with "
                         f"--config=experiments/FILE.py")
    if bool(run) == (config is not None):
        raise UsageError("give exactly one of --run=RUN_DIR or --config=experiments/FILE.py")
    settings = settings_from_flags(values)
    progress = values["progress"].value
    if run:
        if sweep:
            raise UsageError("--sweep is the sweep directory of --config; --run evaluates one "
                             "run")
        cli_flags.refuse_given(values, ("launcher", "parallel"), "runs the sweep of --config; "
                               "--run evaluates one run in this process")
        return _evaluate_one(run, settings, force=values["force"].value, progress=progress)
    if not sweep:
        raise UsageError("--sweep is required with --config (the sweep directory)")
    return _evaluate_sweep(values, settings, progress)


def _evaluate_one(run: str, settings, *, force: bool, progress: bool) -> int:
    report = evaluate_run(run, settings, force=force, progress=progress)
    columns = ["protocol", "length", "multiplier", "status", "loss", "perplexity",
               "bits_per_byte", "ppl_ratio", "n_scored"]
    print(results_frame(report)[columns].to_string(index=False))
    for row in report["results"]:
        if row["status"] != "ok":
            print(f"# L={row['length']} not applicable: {row['reason']}")
    for warning in report["warnings"]:
        print(f"WARNING: {warning}")
    tag = settings.tag(report["train_length"], tuple(report["lengths"]))
    print(f"wrote {report_paths(Path(run), tag)['json']}")
    return 1 if report["warnings"] else 0


def _evaluate_sweep(values, settings, progress: bool) -> int:
    spec = spec_from_config_dict(values.config,
                                 source=config_source(values["config"].config_filename))
    study = run_study(spec, values["sweep"].value, settings, launcher=values["launcher"].value,
                      parallel=values["parallel"].value, force=values["force"].value,
                      progress=progress)
    for name in sorted(set(study.table["protocol"])):
        print(f"perplexity ratio r(k), {name}:")
        print(ratio_table(study.table, name).to_string())
    for path in study.files:
        print(f"wrote {path}")
    return 1 if study.warnings else 0
