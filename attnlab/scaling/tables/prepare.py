"""Reading and checking the tables that the fits consume.

A table is a sweep directory or a results .parquet/.csv (one row per run), or a curves table (one
row per logged step of a run). Columns are found by their canonical names, with fallbacks that
match ``attnlab.results``' sweep tables, and can be renamed with ``--columns=params:Model Size``:

  params  Kaplan: ``non_embedding_params`` when present, else ``params``; Chinchilla: ``params``
          (a mixture of experts: all its experts; ``--columns=params:active_params`` or
          ``params:active_non_embedding_params`` fit on the parameters a token uses, and the
          notes say which was used)
  tokens  ``tokens``
  loss    ``loss``, else ``final_val_loss`` (results); curves: ``val_loss`` when every run has
          at least MIN_VALIDATION_POINTS evaluations (approach 1's envelope then runs through
          validation points, interpolated in log C), else the training ``loss`` with a note
  flops   optional. Kaplan: ``flops`` (6·N·D with N non-embedding); Chinchilla:
          ``flops_chinchilla`` when present, else ``flops``; absent: C = 6·N·D
  budget  optional, ``budget``: the IsoFLOP target of each run (approach 2)
  run_id, step  curves only
  experts  Clark et al.'s law only (``attnlab.scaling.laws.clark``): ``model.moe_experts``
  unique_tokens, epochs  the data-constrained law only (``attnlab.scaling.laws.data_constrained``):
          the distinct tokens a run saw, or its epochs (tokens / unique_tokens)
  cluster  optional: the unit a bootstrap resamples whole (``cluster`` below). A ladder's
          ``trunk`` column by default (a trunk's branches share its initialisation, data order
          and stable phase); ``--cluster=COLUMN`` names another (e.g. a seed shared by an
          ensemble's members), ``--cluster=none`` resamples rows. Rows with no value are their
          own clusters.

Rows whose ``status`` is not ``completed`` are dropped with a note. Every used value must be
finite and positive: one bad value raises FitInputError naming the file, column and rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnlab import results as sweep_results
from attnlab import rundir
from attnlab.scaling import equations
from attnlab.scaling.columns import drop_unfinished, pick_column
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.law import Law
from attnlab.scaling.points import ScalingTable

POSITIVE = ("params", "tokens", "loss", "flops", "budget", "unique_tokens", "epochs")
# The column whose value a ladder's branches share with their trunk: the default cluster.
TRUNK_COLUMN = "trunk"
NO_CLUSTER = "none"  # --cluster=none: every row its own unit
# Evaluations a run needs for approach 1 to read its validation curve rather than the training
# loss (a noisy minibatch estimate that also lags the weights by the averaging of the log).
MIN_VALIDATION_POINTS = 4




def _check_positive(frame: pd.DataFrame, columns: dict[str, str], source: str,
                    loss_name: str = "loss") -> None:
    for name in POSITIVE:
        if name not in frame:
            continue
        values = pd.to_numeric(frame[name], errors="coerce").to_numpy(np.float64)
        bad = ~(np.isfinite(values) & (values > 0))
        if bad.any():
            rows = frame.index[bad]
            shown = ", ".join(str(r) for r in rows[:5]) + (", ..." if len(rows) > 5 else "")
            examples = ", ".join(repr(v) for v in frame[name][bad].tolist()[:3])
            named = loss_name if name == "loss" else name  # the law's name for its loss
            raise FitInputError(f"{source}: column {columns[name]!r} ({named}) has "
                                f"{int(bad.sum())}"
                                f" non-positive or non-finite value(s) (rows {shown}: {examples});"
                                f" scaling fits take logarithms, so every value must be finite "
                                f"and > 0")


def _drop_trunks(df: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    """A ladder sweep's trunks trained at a constant learning rate, a schedule cut short: the
    points of the law are their cooldown branches (``role`` branch)."""
    if "role" not in df.columns:
        return df
    trunk = df["role"].astype(str) == rundir.TRUNK
    if trunk.any():
        count = df.loc[trunk, "run_id"].nunique() if "run_id" in df.columns else trunk.sum()
        notes.append(f"dropped {count} ladder trunk(s) (constant learning rate): their "
                     f"branches are the points")
    return df[~trunk]


def _optional(used, df, name, candidates, mapping, source) -> str | None:
    """The column holding ``name``, added to ``used``, when the table has one."""
    column = pick_column(df, name, candidates, mapping, source, "", required=False)
    if column:
        used[name] = column
    return column


def prepare_points(df: pd.DataFrame, *, law: Law, source: str = "results",
                   columns: dict[str, str] | None = None,
                   cluster: str | None = None) -> ScalingTable:
    """Checks a results table (one row per run) and returns its canonical columns: those
    ``law`` reads. cluster: the column whose rows a
    bootstrap resamples together (default: ``trunk`` when the table has one; ``"none"``:
    rows)."""
    mapping = dict(columns or {})
    notes: list[str] = []
    df = _drop_trunks(drop_unfinished(df, notes, source), notes)
    used = point_columns(df, law, mapping, source)
    _optional(used, df, "flops", law.flops_columns, mapping, source)
    _optional(used, df, "budget", ("budget",), mapping, source)
    used.update(law.table_columns(df, mapping, source))
    _cluster_column(df, cluster, used, source, notes)
    _repeats_note(df, used, notes)
    if not law.run_columns:  # else a run's loss reads more than N and D: rows may differ
        notes += pooled_notes(df, used)
    notes += corpora_notes(df)
    return law.check_table(_finish(df, used, law, source, notes))


def point_columns(df: pd.DataFrame, law: Law, mapping: dict[str, str],
                  source: str) -> dict[str, str]:
    """The columns holding each run's N, D and final loss L (FitInputError naming a missing
    one); L is the law's ``loss_name``, which --columns must map when it has no default."""
    if not law.loss_columns and law.loss_name not in mapping:
        raise FitInputError(f"{source}: --law={law.name} needs --columns={law.loss_name}:COLUMN "
                            f"({law.loss_what})")
    return {
        "params": pick_column(df, "params", law.params_columns, mapping, source,
                              "model parameters N"),
        "tokens": pick_column(df, "tokens", ("tokens",), mapping, source, "training tokens D"),
        "loss": pick_column(df, law.loss_name, law.loss_columns, mapping, source,
                            law.loss_what),
    }


def corpora_notes(df: pd.DataFrame) -> list[str]:
    """A note when the rows trained on different corpora (the results table's corpus column,
    a hash of the bytes): their losses are not on one scale, e.g. pystdlib built by two Python
    versions."""
    column = sweep_results.CORPUS_COLUMN
    counts = df[column].dropna().value_counts() if column in df.columns else []
    if len(counts) < 2:
        return []
    found = ", ".join(f"{k} x {v}" for k, v in counts.items())
    return [f"the runs trained on {len(counts)} different corpora (column {column!r}: {found}), "
            f"whose losses need not be comparable: fit or compare each corpus's runs alone "
            f"(attnlab fit --by={column})"]


def pooled_columns(df: pd.DataFrame, keys, known=()) -> list[str]:
    """The config columns (``section.key``, seeds and ``known`` aside) whose values differ among
    rows sharing the values of ``keys``: what a command that reads those rows as replicates of
    one point pools, e.g. a point's runs at several learning rates."""
    groups = df.groupby([df[key] for key in keys], sort=False, dropna=False)
    return [column for column in df.columns
            if "." in str(column) and not str(column).endswith(".seed")
            and column not in set(keys) | set(known)
            and (groups[column].nunique(dropna=False) > 1).any()]


def pooled_notes(df: pd.DataFrame, used: dict[str, str]) -> list[str]:
    """A note when rows at one (N, D) differ in a config column: the law fits them as
    replicates of one point, which averages a bad learning rate into the point's loss."""
    if not {"params", "tokens"} <= set(used):
        return []
    varied = pooled_columns(df, [used["params"], used["tokens"]], used.values())
    if not varied:
        return []
    return [f"rows at one (N, D) differ in {', '.join(map(str, varied))}: fitted as replicates "
            f"of one point; --best-over={varied[0]} keeps each point's best run, "
            f"--by={varied[0]} fits each value alone"]


def _repeats_note(df, used, notes) -> None:
    """A note when runs read their training data more than once and the law does not model it:
    repeated tokens are worth less than fresh ones (Muennighoff et al. 2023), which bends the
    fitted exponents."""
    if "epochs" not in df.columns or {"epochs", "unique_tokens"} & set(used):
        return
    epochs = pd.to_numeric(df["epochs"], errors="coerce")
    repeated = epochs > 1 + 1e-9
    if repeated.any():
        notes.append(f"{int(repeated.sum())} of {len(df)} runs read their training data more "
                     f"than once (up to {epochs.max():.2f} epochs), which this law does not "
                     "model (--law=data_constrained does)")


def _cluster_column(df, cluster, used, source, notes) -> None:
    """Adds the cluster column to ``used`` (--cluster=COLUMN, else a ladder's trunk)."""
    if cluster == NO_CLUSTER:
        return
    if cluster is not None and cluster not in df.columns:
        raise FitInputError(f"{source}: no column {cluster!r} (--cluster); columns are: "
                            f"{', '.join(map(str, df.columns))}")
    column = cluster or (TRUNK_COLUMN if TRUNK_COLUMN in df.columns else None)
    if column is None or not df[column].notna().any():
        return
    groups = df[column].nunique()
    if groups == len(df):  # every row its own cluster: the row bootstrap
        return
    used["cluster"] = column
    notes.append(f"bootstrap resamples clusters of rows sharing {column!r} ({groups} "
                 + ("trunks, each with its branches, chosen automatically; --cluster=none "
                    "resamples rows" if cluster is None else "values, --cluster")
                 + ")")


def prepare_curves(df: pd.DataFrame, *, law: Law, source: str = "curves",
                   columns: dict[str, str] | None = None,
                   runs: pd.DataFrame | None = None) -> ScalingTable:
    """Checks a curves table (one row per logged step) for approach 1. Rows of steps where the
    chosen loss was not logged (NaN, e.g. val_loss between evaluations) and step-0 rows (no
    tokens yet) are dropped. ``params`` missing from the curves is joined from ``runs`` (a
    results table) on run_id."""
    mapping = dict(columns or {})
    notes: list[str] = []
    df = _drop_trunks(drop_unfinished(df, notes, source), notes)
    run_column = pick_column(df, "run_id", ("run_id",), mapping, source,
                             "which run a step belongs to")
    params_candidates = law.params_columns
    if runs is not None and not any(c in df.columns for c in params_candidates) \
            and "params" not in mapping and "run_id" in runs.columns:
        joined = [c for c in params_candidates if c in runs.columns]
        df = df.merge(runs[["run_id"] + joined], left_on=run_column, right_on="run_id",
                      how="left", suffixes=("", "_runs"))
    used = {
        "run_id": run_column,
        "params": pick_column(df, "params", params_candidates, mapping, source,
                              "model parameters N"),
        "tokens": pick_column(df, "tokens", ("tokens",), mapping, source, "tokens seen D"),
        "loss": pick_column(df, "loss", _curve_loss_columns(df, run_column, mapping, notes, source),
                      mapping, source, "loss L"),
    }
    flops = _optional(used, df, "flops", law.flops_columns, mapping, source)
    step = _optional(used, df, "step", ("step",), mapping, source)
    logged = df[used["loss"]].notna() & (pd.to_numeric(df[used["tokens"]], errors="coerce") != 0)
    if flops:
        logged &= pd.to_numeric(df[flops], errors="coerce") != 0
    if not logged.all():
        notes.append(f"dropped {int((~logged).sum())} step rows without a logged "
                     f"{used['loss']!r} or with zero tokens")
    if "role" in df.columns:  # a cooldown's steps before its last are no schedule's end
        branch = df["role"].astype(str) == rundir.BRANCH
        last = df[used["step"]] == df.groupby(run_column)[used["step"]].transform("max") \
            if step else branch
        logged &= ~branch | last
        if branch.any():
            notes.append("ladder branches: only each branch's last step is a point (its "
                         "cooldown's earlier steps end no schedule)")
    return _finish(df[logged], used, law, source, notes)


def _curve_loss_columns(df, run_column, mapping, notes, source) -> tuple[str, ...]:
    """The loss columns to try for a curves table, best first: ``val_loss`` when every run was
    evaluated at least MIN_VALIDATION_POINTS times, else ``loss`` (and a note saying why)."""
    if "loss" in mapping or "val_loss" not in df.columns:
        return ("loss", "val_loss")
    evaluations = df["val_loss"].notna().groupby(df[run_column]).sum()
    if len(evaluations) and evaluations.min() >= MIN_VALIDATION_POINTS:
        notes.append(f"{source}: approach 1 reads the validation loss ('val_loss', at least "
                     f"{int(evaluations.min())} evaluations per run)")
        return ("val_loss", "loss")
    if "loss" in df.columns:
        notes.append(f"{source}: the training loss is used: some run has only "
                     f"{int(evaluations.min()) if len(evaluations) else 0} validation points "
                     f"(approach 1 reads 'val_loss' from {MIN_VALIDATION_POINTS}); evaluate more "
                     f"often (train.eval_every) for a validation envelope")
    return ("loss", "val_loss")


def _finish(df, used, law, source, notes) -> ScalingTable:
    frame = pd.DataFrame({name: df[column].to_numpy() for name, column in used.items()},
                         index=df.index)
    _check_positive(frame, used, source, law.loss_name)
    for name in POSITIVE + ("step",):
        if name in frame:
            frame[name] = pd.to_numeric(frame[name]).astype(np.float64)
    if "cluster" in frame:  # a row without a value is its own unit
        missing = frame["cluster"].isna()
        frame["cluster"] = frame["cluster"].astype(object)
        frame.loc[missing, "cluster"] = [f"row {i}" for i in frame.index[missing]]
        frame["cluster"] = frame["cluster"].astype(str)
    if "flops" not in frame:
        frame["flops"] = equations.training_flops(frame["params"], frame["tokens"])
        notes.append("no FLOPs column: C = 6·N·D")
    elif used["flops"] != "flops":
        notes.append(f"FLOPs from column {used['flops']!r}")
    if used["params"] == law.params_columns[0] == "non_embedding_params":
        notes.append("N = non_embedding_params (Kaplan's convention)")
    if used["params"].startswith("active_"):  # --columns=params:active_params
        notes.append(f"N = {used['params']}: the parameters a token uses (a mixture of experts' "
                     "router, routed and shared experts), not all it holds")
    elif "active_params" in df.columns and "params" in df.columns and not np.array_equal(
            df["active_params"].to_numpy(), df["params"].to_numpy()):
        notes.append(f"N = {used['params']}: every expert of a mixture of experts counts; "
                     "--columns=params:active_params (or active_non_embedding_params) "
                     "fits on the active ones")
    if len(frame) == 0:
        raise FitInputError(f"{source}: no usable rows" + (f" ({notes[0]})" if notes else ""))
    return ScalingTable(frame=frame.reset_index(drop=True), source=source, columns=used,
                        notes=tuple(notes))
