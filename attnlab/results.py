"""Sweep results as pandas tables, for notebooks and ``attnlab fit``.

A sweep directory holds ``runs/<run_id>/`` (one per run: ``run.json`` written by the sweep when it
plans the run; ``config.json``, ``metrics.jsonl``, ``summary.json``, ``checkpoints/`` written by
training; ``failure.json`` when a run crashed outside training) and ``results.parquet`` /
``results.csv``, one row per run, rebuilt from the run directories after every finished run.

    df = attnlab.results.load("sweeps/tiny_grid")      # one row per run
    steps = attnlab.results.curves("sweeps/tiny_grid")  # one row per (run, logged step)

Columns of the table (swept config fields keep their dotted names, e.g. ``model.d_model``):

  run_id, status, sweep, mode, [budget], [role, trunk, shared_flops], <swept fields...>,
  model.objective (always: clm, mlm or span, see attnlab/model/objectives.py), params,
  non_embedding_params,
  embedding_params, tokens, unique_tokens, epochs, steps, total_steps, flops,
  flops_chinchilla, final_val_loss, best_val_loss, final_train_loss, wall_seconds,
  tokens_per_s, mfu, error, [unique_tokens/<source>, tokens/<source>, epochs/<source>]

``unique_tokens`` is the training split's tokens (a mixture's: summed over its sources) and
``epochs`` = tokens / unique_tokens, the U_D and repeats of a data-constrained law; a mixture's
runs add those of each source, named as in ``data.mixture``.

``status`` is one of completed, diverged, failed (final), partial (started: a checkpoint, metrics
or an interrupted attempt exists; rerunning the sweep resumes it), pending (not started).
``flops`` is 6·N·D with N the non-embedding parameters (Kaplan's C); ``flops_chinchilla`` the full
count of Hoffmann et al. 2022 App. F (embeddings, attention and the output head included);
``budget`` is the isoflop target C, in the convention named by the spec's
``sweep.flops_per_token``. Before a run finishes, params/tokens/flops hold the planned values.
A ladder sweep's rows say their ``role``: ``trunk`` (the constant-LR phase its shape's branches
share; not a point of a scaling law) or ``branch`` (a cooldown from the trunk named in ``trunk``:
a point with its own D, whose ``flops`` count the trunk's FLOPs up to the branch point, of which
``shared_flops`` were spent once for all the trunk's branches).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from attnlab.config import ModelConfig
from attnlab.errors import AttnlabError
from attnlab.rundir import (CSV_FILE, DIVERGED, FAILED, FAILURE_FILE, FINAL_STATUSES,
                            METRICS_FILE, RUN_FILE, RUNS_DIR, SUMMARY_FILE, TABLE_FILE,
                            atomic_path, read_json_or_none, read_metrics, run_status)

_LEADING = ["run_id", "status", "sweep", "mode", "budget"]
CORPUS_COLUMN = "corpus"
CORPUS_ID_DIGITS = 12
OBJECTIVE_COLUMN = "model.objective"
LR_FACTOR_COLUMN = "lr_factor"  # a run's rate over its rule's, on a sweep's grid of rates
DEFAULT_OBJECTIVE = ModelConfig().objective
# Ladder sweeps: a trunk's or a cooldown branch's role, a branch's trunk (run id) and the 6ND
# FLOPs it shares with the trunk (its ``flops`` count them too: the compute of its result).
_LADDER = ["role", "trunk", "shared_flops"]
_TRAILING = ["params", "non_embedding_params", "embedding_params", "tokens", "unique_tokens",
             "epochs", "corpus", "steps", "total_steps", "flops", "flops_chinchilla",
             "final_val_loss", "best_val_loss", "final_train_loss", "wall_seconds",
             "tokens_per_s", "mfu", "error"]


# A mixture's columns per source, each name followed by the source's: unique_tokens/web, ...
# and a run's scores per task at its last evaluation (train.eval_tasks): eval/TASK/SCORE. Both
# are measured, never swept: they come last and group no points.
PER_SOURCE = ("unique_tokens/", "tokens/", "epochs/", "eval/")


class ResultsError(AttnlabError):
    """A results file or sweep directory is missing or unreadable."""


def run_dirs(workdir: str | Path) -> list[Path]:
    """The run directories of a sweep (those holding the sweep's ``run.json``)."""
    runs = Path(workdir) / RUNS_DIR
    if not runs.is_dir():
        return []
    return sorted(p for p in runs.iterdir() if (p / RUN_FILE).exists())


def corpus_id(manifest: dict | None) -> str | None:
    """``sha256:`` and the first 12 hex digits of the prepared corpus's sha256 (its
    manifest's): runs with the same id read the same bytes. pystdlib is the running Python's
    standard library, so its id changes with the Python version, and so do the losses. (The
    prefix keeps a table read back from CSV from taking an all-digit id for a number.)"""
    digest = corpus_digest(manifest)
    return f"sha256:{digest[:CORPUS_ID_DIGITS]}" if digest else None


def corpus_digest(manifest: dict | None) -> str | None:
    """The prepared corpus's sha256: its manifest's, or for shards (whose manifest hashes each
    file, not the whole) the sha256 of its files' hashes, text field and tokenizer."""
    manifest = manifest or {}
    if isinstance(manifest.get("sha256"), str):
        return manifest["sha256"]
    files = manifest.get("files")
    if not (isinstance(files, list) and files and all(
            isinstance(f, dict) and isinstance(f.get("sha256"), str) for f in files)):
        return None
    tokenizer = manifest.get("tokenizer") or {}
    parts = [sorted(f["sha256"] for f in files), manifest.get("text_field"),
             tokenizer.get("sha256") or tokenizer.get("name")]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def run_row(run_dir: str | Path) -> dict[str, Any]:
    """One table row: the planned record merged with the training summary (if any)."""
    run_dir = Path(run_dir)
    planned = read_json_or_none(run_dir / RUN_FILE) or {}
    summary = read_json_or_none(run_dir / SUMMARY_FILE) or {}
    failure = read_json_or_none(run_dir / FAILURE_FILE) or {}
    status = run_status(run_dir)
    row: dict[str, Any] = {"run_id": planned.get("run_id", run_dir.name), "status": status,
                           "sweep": planned.get("sweep"), "mode": planned.get("mode")}
    if planned.get("budget") is not None:
        row["budget"] = float(planned["budget"])
    row.update(planned.get("axes", {}))
    if planned.get("lr_factor") is not None:
        row[LR_FACTOR_COLUMN] = float(planned["lr_factor"])
    # The training objective, always recorded so that `attnlab fit
    # --by=model.objective` groups decoder, encoder and encoder-decoder runs.
    model = (planned.get("config") or {}).get("model") or {}
    row.setdefault(OBJECTIVE_COLUMN, model.get("objective", DEFAULT_OBJECTIVE))
    params = summary.get("params") or planned.get("params") or {}
    row["params"] = params.get("total")
    row["non_embedding_params"] = params.get("non_embedding")
    row["embedding_params"] = params.get("embedding")
    # A mixture of experts uses fewer parameters per token than it holds; older runs (dense)
    # recorded none: theirs are the totals.
    row["active_params"] = params.get("active", row["params"])
    row["active_non_embedding_params"] = params.get("active_non_embedding",
                                                    row["non_embedding_params"])
    finished = status in FINAL_STATUSES and bool(summary)
    row["tokens"] = summary.get("tokens") if finished else planned.get("tokens")
    row["steps"] = summary.get("step", 0) if summary else 0
    # The training split's tokens (recorded when the run starts) and the times it was read.
    row["unique_tokens"] = summary.get("unique_tokens")
    row["epochs"] = (row["tokens"] / row["unique_tokens"]
                     if row["tokens"] is not None and row["unique_tokens"] else None)
    row["corpus"] = corpus_id(summary.get("dataset"))
    if finished:
        row.update({k: v for k, v in summary.items() if k.startswith(PER_SOURCE)})
    row["total_steps"] = planned.get("steps")
    per_token = planned.get("flops_per_token", {})
    tokens = row["tokens"] or 0
    flops = summary.get("flops") if finished else None
    if isinstance(flops, dict):
        row["flops"], row["flops_chinchilla"] = flops.get("6nd"), flops.get("chinchilla")
    else:
        row["flops"] = per_token.get("kaplan_6n", math.nan) * tokens
        row["flops_chinchilla"] = per_token.get("chinchilla", math.nan) * tokens
    for key in ("final_val_loss", "best_val_loss", "wall_seconds", "tokens_per_s", "mfu"):
        row[key] = summary.get(key)
    if "final_val_span_bits" in summary:  # train.eval_masked_spans
        row["val_span_bits"] = summary["final_val_span_bits"]
    row["final_train_loss"] = summary.get("final_train_loss_smoothed",
                                          summary.get("final_train_loss"))
    error = failure.get("error") or (summary.get("error") if status == FAILED else None)
    if status == DIVERGED and summary.get("diverged_at_step"):
        error = f"diverged at step {summary['diverged_at_step']}"
    row["error"] = error
    if planned.get("role"):
        row["role"], row["trunk"] = planned["role"], planned.get("trunk")
        row["shared_flops"] = (per_token.get("kaplan_6n", math.nan)
                               * planned.get("shared_tokens", 0))
    return row


def build_table(workdir: str | Path) -> pd.DataFrame:
    """The results table of a sweep directory, built from its run directories (read only)."""
    rows = [run_row(d) for d in run_dirs(workdir)]
    if not rows:
        return pd.DataFrame(columns=[c for c in _LEADING if c != "budget"] + _TRAILING)
    swept: list[str] = []
    per_source: list[str] = []
    for row in rows:
        per_source += [k for k in row if k.startswith(PER_SOURCE) and k not in per_source]
        swept += [k for k in row if k not in _LEADING + _TRAILING + _LADDER + per_source
                  and k not in swept]
    has_budget = any("budget" in row for row in rows)
    ladder = [c for c in _LADDER if any(c in row for row in rows)]
    columns = ([c for c in _LEADING if c != "budget" or has_budget] + ladder + swept + _TRAILING
               + per_source)
    df = pd.DataFrame(rows, columns=columns)
    sort_by = (["budget"] if has_budget else []) + ["non_embedding_params", "tokens", "run_id"]
    return _uniform_columns(df.sort_values(sort_by, kind="stable").reset_index(drop=True))


def write_table(workdir: str | Path) -> pd.DataFrame:
    """Rebuilds ``results.parquet`` and ``results.csv`` atomically (a reader sees the old table
    or the new one) and returns the table."""
    workdir = Path(workdir)
    df = build_table(workdir)
    with atomic_path(workdir / TABLE_FILE) as tmp:
        df.to_parquet(tmp, index=False)
    with atomic_path(workdir / CSV_FILE) as tmp:
        df.to_csv(tmp, index=False)
    return df


def load(path: str | Path) -> pd.DataFrame:
    """The results table: ``path`` is a sweep directory or a results .parquet/.csv file.

    For a directory without a table yet (a sweep that never finished a run), the table is built
    from its run directories.
    """
    path = Path(path)
    if path.is_dir():
        if (path / TABLE_FILE).exists():
            return pd.read_parquet(path / TABLE_FILE)
        if (path / RUNS_DIR).is_dir():
            return build_table(path)
        raise ResultsError(f"{path} is not a sweep directory (no {TABLE_FILE} and no "
                           f"{RUNS_DIR}/)")
    suffix = path.suffix.lower()
    if not path.exists():
        raise ResultsError(f"{path}: no such results file or sweep directory (give a "
                           f"directory, a .parquet or a .csv)")
    if suffix == ".parquet":
        return pd.read_parquet(path)
    if suffix == ".csv":
        return pd.read_csv(path)
    raise ResultsError(f"{path}: attnlab reads a results table as .parquet or .csv, not "
                       f"{path.suffix or 'a file without a suffix'}")


def curves(path: str | Path) -> pd.DataFrame:
    """Per-step metrics of every run of a sweep directory: one row per (run_id, step).

    Columns: run_id, status, [budget], <swept fields>, params, non_embedding_params, step,
    tokens, loss, lr, grad_norm, tokens_per_s, mfu, val_loss (NaN where not evaluated),
    flops (6·N·tokens, N non-embedding) and flops_chinchilla at that step: enough for
    Kaplan's L(N, S) and Chinchilla's approach 1 (lower envelope of loss against FLOPs).
    """
    path = Path(path)
    if not (path / RUNS_DIR).is_dir():
        raise ResultsError(f"{path} is not a sweep directory (no {RUNS_DIR}/)")
    frames = []
    for run_dir in run_dirs(path):
        records = read_metrics(run_dir / METRICS_FILE)
        if not records:
            continue
        row = run_row(run_dir)
        planned = read_json_or_none(run_dir / RUN_FILE) or {}
        train = [r for r in records if "loss" in r]
        val = [r for r in records if "val_loss" in r]
        # A resumed run may have logged a step twice: keep the last record of each step.
        train_df = pd.DataFrame(train).drop_duplicates("step", keep="last") if train else None
        val_df = (pd.DataFrame(val)[["step", "val_loss"]].drop_duplicates("step", keep="last")
                  if val else None)
        if train_df is None:
            merged = val_df
        elif val_df is None:
            merged = train_df
        else:
            merged = train_df.merge(val_df, on="step", how="outer")
        merged = merged.sort_values("step").reset_index(drop=True)
        tokens_per_step = planned.get("tokens_per_step")
        if tokens_per_step:
            merged["tokens"] = merged["step"] * tokens_per_step
        per_token = planned.get("flops_per_token", {})
        merged["flops"] = merged["tokens"] * per_token.get("kaplan_6n", math.nan)
        merged["flops_chinchilla"] = merged["tokens"] * per_token.get("chinchilla", math.nan)
        keys = {k: v for k, v in row.items() if (k not in _TRAILING or
                k in ("params", "non_embedding_params")) and k != "shared_flops"
                and not k.startswith(PER_SOURCE)}  # per step in the metrics instead
        keys.pop("sweep", None)
        keys.pop("mode", None)
        for i, (key, value) in enumerate(keys.items()):
            merged.insert(i, key, [value] * len(merged))
        frames.append(merged)
    if not frames:
        return pd.DataFrame(columns=["run_id", "status", "params", "non_embedding_params",
                                     "step", "tokens", "loss", "val_loss"])
    return _uniform_columns(pd.concat(frames, ignore_index=True))


_NUMERIC = [c for c in _TRAILING if c not in ("error", CORPUS_COLUMN)] + ["shared_flops"] + [
    "budget", "step", "tokens", "loss", "val_loss", "lr", "grad_norm"]


def _uniform_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Numbers as numbers (missing ones NaN), and one type per column as parquet needs: an
    axis mixing e.g. ints and strings becomes text."""
    for column in df.columns:
        if column in _NUMERIC:
            df[column] = pd.to_numeric(df[column])
        elif df[column].dtype == object:
            kinds = {type(v) for v in df[column] if v is not None and not
                     (isinstance(v, float) and math.isnan(v))}
            if len(kinds) > 1 and not kinds <= {int, float}:
                df[column] = df[column].map(lambda v: None if v is None else str(v))
            elif kinds <= {int, float} and kinds:
                df[column] = pd.to_numeric(df[column])
    return df


SEED_COLUMNS = ("train.seed", "data.seed")


def seed_spread(df: pd.DataFrame, metric: str = "final_val_loss") -> pd.DataFrame:
    """Replicates: the runs equal in every swept field but the seeds, one row per such point
    with at least two finished runs. Columns: the point's fields, ``seeds`` (how many runs),
    ``mean``, ``std`` (ddof 1) and ``range`` (max - min) of ``metric``. Empty when no seed is
    swept. The fits treat each seed as its own point; this is the noise they see."""
    seeds = [c for c in SEED_COLUMNS if c in df.columns]
    done = df[df["status"] == "completed"]
    if not seeds or done[seeds].drop_duplicates().shape[0] < 2:
        return pd.DataFrame(columns=["seeds", "mean", "std", "range"])
    fixed = {"run_id", "status", "sweep", "mode", OBJECTIVE_COLUMN, *seeds, *_TRAILING}
    point = [c for c in df.columns if c not in fixed and not c.startswith(PER_SOURCE)]
    groups = done.groupby(point, dropna=False)[metric] if point else [((), done[metric])]
    rows = [dict(zip(point, key if isinstance(key, tuple) else (key,)),
                 seeds=len(values), mean=values.mean(), std=values.std(ddof=1),
                 range=values.max() - values.min())
            for key, values in groups if len(values) >= 2]
    return pd.DataFrame(rows, columns=[*point, "seeds", "mean", "std", "range"])


def describe_seed_spread(df: pd.DataFrame, metric: str = "final_val_loss") -> str | None:
    """One line for a study's report, or None when no point has two seeds."""
    spread = seed_spread(df, metric)
    if spread.empty:
        return None
    counts = sorted(set(spread["seeds"]))
    return (f"seeds: {'/'.join(map(str, counts))} per point at {len(spread)} points; the "
            f"seed-to-seed range of {metric}: median {spread['range'].median():.4f}, max "
            f"{spread['range'].max():.4f} (std median {spread['std'].median():.4f}); each seed "
            f"is a point of its own in the fits, and the bootstrap resamples runs")
