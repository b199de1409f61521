"""Reading the results and curves tables a fit starts from: a sweep directory or a .parquet /
.csv (several, comma-separated, read as one), each run once."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from attnlab import results as sweep_results
from attnlab.errors import AttnlabError
from attnlab.scaling.columns import completed
from attnlab.scaling.curves import scheduled_rates
from attnlab.scaling.errors import FitInputError

CURVES_FILES = ("curves.parquet", "curves.csv")


@dataclasses.dataclass(frozen=True)
class Inputs:
    """The tables a fit request reads, each once: ``runs`` the results as read (None for
    learning curves alone), ``kept`` the runs fitted (with --best-over, each point's runs at
    its best value), ``picks`` those picks (None without --best-over), ``curves`` approach
    1's."""

    runs: pd.DataFrame | None
    kept: pd.DataFrame | None
    picks: pd.DataFrame | None = None
    curves: pd.DataFrame | None = None


def read_table(path: str | Path) -> pd.DataFrame:
    """A results table: a sweep directory, or a .parquet / .csv file; several, comma-separated,
    are read as one (a sweep and the sweep that widened its grid), a run in two once
    (:func:`one_row_per_run`; its note in ``attrs["read_notes"]``)."""
    if isinstance(path, str) and "," in path and not Path(path).exists():
        frames = [_read_one(part) for part in path.split(",") if part]
        return one_row_per_run(pd.concat(frames, ignore_index=True), path)
    return one_row_per_run(_read_one(path), str(path))


def _read_one(path: str | Path) -> pd.DataFrame:
    try:
        return sweep_results.load(path)
    except AttnlabError as error:
        raise FitInputError(str(error)) from None
    except (OSError, ValueError) as error:
        raise FitInputError(f"{path}: cannot read the table ({error})") from None


def one_row_per_run(table: pd.DataFrame, source: str) -> pd.DataFrame:
    """One row per ``run_id``: a run read twice (in two tables, or a row repeated) counts once,
    its completed copy over a failed one; copies of a completed run with different final
    losses are refused, naming the run. Said in ``attrs["read_notes"]``."""
    if "run_id" not in table.columns or not table["run_id"].duplicated().any():
        return table
    done = completed(table)
    loss = next((c for c in ("final_val_loss", "loss") if c in table.columns), None)
    if loss is not None:
        values = table[done].groupby("run_id")[loss].nunique(dropna=False)
        if (values > 1).any():
            run = values[values > 1].index[0]
            raise FitInputError(f"{source}: run {run} appears more than once with different "
                                f"{loss} values; keep one copy of each run")
    kept = table.assign(_done=done).sort_values("_done", ascending=False, kind="stable")
    kept = kept.drop_duplicates("run_id").sort_index().drop(columns="_done")
    kept.attrs["read_notes"] = [f"{len(table) - len(kept)} row(s) repeat a run_id already read "
                                f"(a run in two tables, or a row repeated): each run counts "
                                f"once, its completed copy first"]
    return kept


def read_curves(path: str | Path) -> pd.DataFrame:
    """A curves table: a .parquet / .csv file, a directory holding curves.parquet / curves.csv, or
    a sweep directory (its runs' metrics.jsonl, via ``attnlab.results.curves``)."""
    path = Path(path)
    if path.is_dir():
        for name in CURVES_FILES:
            if (path / name).exists():
                return read_curves(path / name)
        try:
            table = sweep_results.curves(path)
        except AttnlabError as error:
            raise FitInputError(f"{error} and no {' or '.join(CURVES_FILES)}") from None
        table.attrs["rates"] = scheduled_rates(path)  # each update's, from each run's config
        return table
    if not path.exists():
        raise FitInputError(f"{path}: no such curves file or directory")
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        if path.suffix == ".csv":
            return pd.read_csv(path)
    except (OSError, ValueError) as error:
        raise FitInputError(f"{path}: cannot read the table ({error})") from None
    raise FitInputError(f"{path}: curves must be a .parquet or .csv file or a directory")
