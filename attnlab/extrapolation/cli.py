"""``attnlab extrapolate``: evaluate one run, or a whole sweep, at longer context lengths.

    attnlab extrapolate --run=RUN_DIR [--multipliers=1,2,4,8,16 | --lengths=64,128,...]
                        [--protocol=nonoverlapping|sliding|both] [--stride=S]
    attnlab extrapolate --sweep=experiments/pe_extrapolation.py --workdir=DIR
                        [--config.sweep.axes.train.seed=(0,1)]   # spec overrides, as for sweep

Exit codes: 0 done; 1 done, but the study raised red flags (see its report); 2 bad input
(nothing written).
"""

from __future__ import annotations

from pathlib import Path

from attnlab import cli_flags
from attnlab.cli_flags import Flag, UsageError
from attnlab.extrapolation.evaluate import (EVERY_SCALING, ROPE_SCALINGS, EvalSettings,
                                            evaluate_run)
from attnlab.extrapolation.reports import report_paths, results_frame
from attnlab.extrapolation.study import ratio_table, run_study
from attnlab.sweep import load_spec

FLAGS = [
    Flag("run", "string", "", "A trained run directory to evaluate."),
    Flag("sweep", "string", "", "An experiment file (experiments/*.py[:gpu]): run its sweep "
                                "(resuming), evaluate every completed run, write table and plots."),
    Flag("workdir", "string", "", "Sweep directory (with --sweep)."),
    Flag("multipliers", "string", "1,2,4,8,16", "Evaluation lengths as multiples of the "
                                                "training length."),
    Flag("lengths", "string", "", "Absolute evaluation lengths (comma separated); replaces "
                                  "--multipliers. The training length is always added."),
    Flag("protocol", "enum", "nonoverlapping", "nonoverlapping chunks, a sliding window "
                                               "(stride --stride), or both.",
         enum_values=("nonoverlapping", "sliding", "both")),
    Flag("stride", "integer", 0, "Sliding-window stride; 0 = half the shortest length."),
    Flag("max-tokens", "integer", 0, "Use only the first N validation tokens (0 = all)."),
    Flag("batch-tokens", "integer", 16384, "Tokens per forward pass."),
    Flag("attention-chunk", "integer", 512, "Query-block size of the attention for lengths "
                                            "above it (memory linear in length); 0 = never."),
    Flag("rope-scaling", "enum", "none", "RoPE context extension at evaluation: none (zero-shot), "
                                         "ntk (NTK-aware base), pi (position interpolation), "
                                         "yarn (NTK-by-parts + temperature), or all (with "
                                         "--sweep: each of them, compared in one report).",
         enum_values=(*ROPE_SCALINGS, EVERY_SCALING)),
    Flag("rope-factor", "float", 0.0, "Scale factor s of --rope-scaling; 0 = longest length / "
                                      "training length."),
    Flag("force", "bool", False, "Re-evaluate even when extrapolation.json is current."),
    Flag("launcher", "enum", "local", "With --sweep: where runs train.",
         enum_values=("local", "ray")),
    Flag("parallel", "integer", 1, "With --sweep and the local launcher: runs at a time."),
    Flag("progress", "bool", True, "Show progress bars."),
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
        protocols=("nonoverlapping", "sliding") if protocol == "both" else (protocol,),
        stride=values["stride"].value,
        max_tokens=values["max-tokens"].value,
        batch_tokens=values["batch-tokens"].value,
        attention_chunk=values["attention-chunk"].value,
        rope_scaling=values["rope-scaling"].value,
        rope_factor=values["rope-factor"].value,
    )
    settings.validate()
    return settings


def extrapolate_main(argv: list[str]) -> int:
    # --config.* overrides belong to the sweep spec (as in `attnlab sweep`); the rest are ours.
    overrides = [a for a in argv if a.startswith("--config.")]
    if any(a == "--config" or a.startswith("--config=") for a in argv):
        raise UsageError("--config: name the experiment with --sweep=FILE (or a run with --run)")
    values = cli_flags.parse([a for a in argv if not a.startswith("--config.")], FLAGS,
                             prog="attnlab extrapolate", takes_config=False,
                             description=__doc__)
    run, sweep = values["run"].value, values["sweep"].value
    if bool(run) == bool(sweep):
        raise UsageError("give exactly one of --run=RUN_DIR or --sweep=experiments/FILE.py")
    if overrides and not sweep:
        raise UsageError(f"{overrides[0].split('=')[0]}: spec overrides need --sweep")
    settings = settings_from_flags(values)
    progress = values["progress"].value
    if run:
        return _evaluate_one(run, settings, force=values["force"].value, progress=progress)
    if not values["workdir"].value:
        raise UsageError("--workdir is required with --sweep")
    return _evaluate_sweep(sweep, overrides, values, settings, progress)


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


def _evaluate_sweep(sweep: str, overrides: list[str], values, settings, progress: bool) -> int:
    spec = load_spec(sweep, overrides)
    study = run_study(spec, values["workdir"].value, settings, launcher=values["launcher"].value,
                      parallel=values["parallel"].value, force=values["force"].value,
                      progress=progress)
    for name in sorted(set(study.table["protocol"])):
        print(f"perplexity ratio r(k), {name}:")
        print(ratio_table(study.table, name).to_string())
    for path in study.files:
        print(f"wrote {path}")
    return 1 if study.warnings else 0
