"""A whole extrapolation study: train a sweep, evaluate every finished run, table, plots, checks.

    study = run_study(load_spec("experiments/pe_extrapolation.py"), "sweeps/pe", EvalSettings())
    study.table        # DIR/extrapolation.csv: one row per (run, protocol, length)
    study.warnings     # red flags (see attnlab.extrapolation.checks)

Everything is resumable: the sweep skips finished runs, each run's evaluation is skipped when its
``extrapolation.json`` was made from the same checkpoint with the same settings, and the table,
plots and report are rebuilt from the run directories every time.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from attnlab.config import from_config_dict
from attnlab.extrapolation import checks
from attnlab.extrapolation.evaluate import (EVERY_SCALING, ROPE_SCALINGS, EvalSettings,
                                            evaluate_run)
from attnlab.extrapolation.protocol import EvaluationError, protocol_named
from attnlab.extrapolation.reports import results_frame
from attnlab.model import resolve
from attnlab.model.positions import UNSCALED

RUNS_DIR = "runs"
STUDY_STEM = "extrapolation"


@dataclasses.dataclass
class Study:
    """What :func:`run_study` produced (all of it is also on disk under ``workdir``)."""

    table: pd.DataFrame  # one row per (run, protocol, length)
    curves: pd.DataFrame  # one row per (run, position): the per-position loss
    warnings: list[str]
    files: list[Path]


def run_study(spec, workdir: str | Path, settings: EvalSettings = EvalSettings(), *,
              launcher: str = "local", parallel: int = 1, force: bool = False,
              progress: bool = True) -> Study:
    """Runs the sweep ``spec`` (resuming), evaluates its completed runs and writes the study.

    RoPE context extension (``settings.rope_scaling``) applies to RoPE runs only; their rows are
    labelled ``rope+<method>``, the other encodings are evaluated zero-shot as usual. With
    ``rope_scaling="all"`` every RoPE run is evaluated under each rescaling (none, ntk, pi,
    yarn) and the report compares them. Sliding-window runs are labelled ``<encoding>+w<w>``.

    Files in ``workdir``: ``extrapolation.csv`` (combined table), ``extrapolation_positions.csv``,
    ``extrapolation_ratio[_sliding].png/.pdf``, ``extrapolation_positions.png/.pdf`` and
    ``extrapolation_report.md`` (mean ratios per encoding and length, and the red flags).
    """
    from attnlab.sweep import run_sweep  # deferred: sweeps import the trainer (orbax, TFDS)

    settings.validate()
    workdir = Path(workdir)
    sweep_table = run_sweep(spec, workdir, launcher=launcher, parallel=parallel, progress=progress)
    say = tqdm.write if progress else (lambda _: None)
    warnings: list[str] = []
    reports = []
    for row in sweep_table.itertuples():
        if row.status != "completed":
            warnings.append(f"{row.run_id}: status {row.status}, not evaluated")
            continue
        run_dir = workdir / RUNS_DIR / row.run_id
        model_cfg = from_config_dict(json.loads((run_dir / "config.json").read_text())).model
        for run_settings in settings_per_run(settings, model_cfg):
            report = evaluate_run(run_dir, run_settings, force=force, progress=progress)
            say(f"{row.run_id}: evaluated ({report['pos_encoding']}, "
                f"{report['rope_scaling']['method']}, {report['seconds']:.1f} s)")
            reports.append((row.run_id, report))
    if not reports:
        raise_no_runs(workdir, warnings)
    table, curves = combine(reports)
    warnings += [w for _, r in reports for w in r.get("warnings", [])]
    warnings += checks.red_flags(table)
    stem = STUDY_STEM + ("" if settings.rope_scaling == UNSCALED else f"-rope_{settings.rope_scaling}")
    files = write_study(workdir, stem, table, curves, warnings, settings)
    for warning in warnings:
        say(f"WARNING: {warning}")
    return Study(table, curves, warnings, files)


def settings_per_run(settings: EvalSettings, model_cfg) -> list[EvalSettings]:
    """The evaluations of one run: ``settings`` as given; under every RoPE rescaling for
    ``rope_scaling="all"``; zero-shot for encodings without the rescaling asked."""
    methods = ROPE_SCALINGS if settings.rope_scaling == EVERY_SCALING else (settings.rope_scaling,)
    encoding = resolve(model_cfg).encoding
    out = []
    for method in methods:
        if not encoding.can_rescale(method):
            method = UNSCALED  # encodings without this rescaling are evaluated zero-shot
        run_settings = dataclasses.replace(
            settings, rope_scaling=method,
            rope_factor=0.0 if method == UNSCALED else settings.rope_factor)
        if run_settings not in out:
            out.append(run_settings)
    return out


def raise_no_runs(workdir: Path, warnings: list[str]) -> None:
    raise EvaluationError(f"--sweep: no completed run to evaluate in {workdir}"
                          + (": " + "; ".join(warnings) if warnings else ""))


def combine(reports: list[tuple[str, dict]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Stacks the runs' reports into one results table and one per-position table."""
    tables, curves = [], []
    for run_id, report in reports:
        label = report["pos_encoding"]
        if report.get("attention_window"):  # sliding-window runs of one encoding: their own rows
            label = f"{label}+w{report['attention_window']}"
        if report["rope_scaling"]["method"] != UNSCALED:
            label = f"{label}+{report['rope_scaling']['method']}"
        frame = results_frame({**report, "pos_encoding": label})
        frame.insert(0, "run_id", run_id)
        frame["train_length"] = report["train_length"]
        frame["max_len"] = report["max_len"]
        frame["checkpoint_step"] = report["checkpoint_step"]
        tables.append(frame)
        curve = report["per_position"]
        curves.append(pd.DataFrame({"run_id": run_id, "pos_encoding": label,
                                    "seed": report["seed"], "position": range(len(curve["loss"])),
                                    "loss": curve["loss"]}))
    return (pd.concat(tables, ignore_index=True), pd.concat(curves, ignore_index=True))


def write_study(workdir: Path, stem: str, table: pd.DataFrame, curves: pd.DataFrame,
                warnings: list[str], settings: EvalSettings) -> list[Path]:
    from attnlab.plots import extrapolation as plots  # full path: plots/__init__ is not ours

    files = [workdir / f"{stem}.csv", workdir / f"{stem}_positions.csv"]
    table.to_csv(files[0], index=False)
    curves.to_csv(files[1], index=False)
    for name in sorted(set(table["protocol"])):
        suffix = protocol_named(name).suffix
        files += plots.plot_perplexity_ratio(table, workdir / f"{stem}_ratio{suffix}",
                                             protocol=name)
    train_lengths = sorted(set(table["train_length"]))
    files += plots.plot_position_loss(curves, workdir / f"{stem}_positions",
                                      train_length=train_lengths[0])
    report = workdir / f"{stem}_report.md"
    report.write_text(markdown_report(table, warnings, settings))
    return files + [report]


def ratio_table(table: pd.DataFrame, protocol: str = "nonoverlapping") -> pd.DataFrame:
    """Mean r(k) over seeds (with the seed range) per encoding (rows) and multiplier (columns)."""
    from attnlab.plots.extrapolation import ratio_summary

    summary = ratio_summary(table, protocol)
    cells = {}
    for r in summary.itertuples():
        spread = f" [{r.low:.3g}, {r.high:.3g}]" if r.n_seeds > 1 else ""
        cells[r.pos_encoding, r.multiplier] = f"{r.mean:.3g}{spread}"
    encodings = list(dict.fromkeys(table["pos_encoding"]))
    multipliers = sorted(set(table.loc[table["protocol"] == protocol, "multiplier"]))
    out = pd.DataFrame(index=encodings, columns=[f"{m:g}x" for m in multipliers])
    for encoding in encodings:
        for m in multipliers:
            out.loc[encoding, f"{m:g}x"] = cells.get((encoding, m), "n/a")
    out.index.name = "encoding"
    return out


def markdown_report(table: pd.DataFrame, warnings: list[str], settings: EvalSettings) -> str:
    """The study's numbers and checks as Markdown (written to DIR/extrapolation_report.md)."""
    lines = ["# Length extrapolation study", ""]
    at_1x = table[(table["multiplier"] == 1.0) & (table["status"] == "ok")]
    for name in sorted(set(table["protocol"])):
        lines += [f"## Perplexity ratio r(k) = ppl(k L_train) / ppl(L_train), {name}",
                  "", "Mean over seeds [lowest, highest seed]; n/a: not applicable "
                  "(learned positions beyond their table).", "",
                  _markdown(ratio_table(table, name)), ""]
        base = at_1x[at_1x["protocol"] == name].groupby("pos_encoding")["perplexity"]
        lines += [f"Perplexity at L_train ({name}): " + ", ".join(
            f"{e} {m:.4g}" for e, m in base.mean().items()), ""]
    lines += ["## Checks", ""]
    lines += [f"- WARNING: {w}" for w in warnings] or ["- no red flags (NaN/inf, identical "
                                                       "perplexities across encodings, flat "
                                                       "RoPE, learned beyond its table)"]
    lines += ["", "## Settings", "", "```json", json.dumps(dataclasses.asdict(settings), indent=2),
              "```", ""]
    return "\n".join(lines)


def _markdown(frame: pd.DataFrame) -> str:
    header = [frame.index.name or "", *map(str, frame.columns)]
    rows = [[str(index), *map(str, values)] for index, values in zip(frame.index, frame.values)]
    return "\n".join(["| " + " | ".join(header) + " |",
                      "|" + "---|" * len(header),
                      *("| " + " | ".join(r) + " |" for r in rows)])

