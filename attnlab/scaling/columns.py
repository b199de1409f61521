"""Reading a results table's columns, for every law that reads one: which column holds a
quantity (``--columns`` first), and the completed runs."""

from __future__ import annotations

import pandas as pd

from attnlab.scaling.errors import FitInputError

CANONICAL = ("params", "tokens", "loss", "flops", "budget", "run_id", "step", "experts",
             "unique_tokens", "epochs")
# Columns read as numbers, each finite and > 0.


def pick_column(df: pd.DataFrame, name: str, candidates: tuple[str, ...],
                mapping: dict[str, str], source: str, why: str,
                required: bool = True) -> str | None:
    """The column that holds ``name``: the one ``--columns`` maps to it, else the first of
    ``candidates`` with a value; None, or FitInputError naming the flag, when there is none."""
    if name in mapping:
        if mapping[name] not in df.columns:
            raise FitInputError(f"{source}: no column {mapping[name]!r} (mapped to {name} by "
                                f"--columns); columns are: {', '.join(map(str, df.columns))}")
        return mapping[name]
    for candidate in candidates:
        if candidate in df.columns and df[candidate].notna().any():
            return candidate
    if required:
        empty = [c for c in candidates if c in df.columns]
        if empty:  # there, but not a number in any row
            raise FitInputError(f"{source}: column {empty[0]!r} ({why}) holds no value in any "
                                f"row (all empty or NaN); map another column with "
                                f"--columns={name}:NAME")
        raise FitInputError(f"{source}: missing column {name!r} ({why}; looked for "
                            f"{' or '.join(repr(c) for c in candidates)}); columns are: "
                            f"{', '.join(map(str, df.columns))}. Map another column with "
                            f"--columns={name}:NAME")
    return None


def completed(df: pd.DataFrame) -> pd.Series:
    """True for the rows whose status is ``completed`` (all, without a status column)."""
    if "status" not in df.columns:
        return pd.Series(True, index=df.index)
    return df["status"].astype(str) == "completed"


def drop_unfinished(df: pd.DataFrame, notes: list[str],
                    source: str = "results") -> pd.DataFrame:
    """The rows whose status is ``completed`` (all, without a status column), with a note on
    those dropped; FitInputError for an empty table or one with none completed."""
    if df.empty:  # say so, rather than "missing column" for a table that has its header
        raise FitInputError(f"{source}: the table has no rows (columns: "
                            f"{', '.join(map(str, df.columns)) or 'none'})")
    notes.extend(df.attrs.get("read_notes", ()))
    done = completed(df)
    if not done.all():
        counts = df.loc[~done, "status"].astype(str).value_counts()
        if not done.any():
            # Say so plainly: otherwise the all-NaN loss column reads as a "missing column".
            raise FitInputError(
                f"{source}: none of the {len(df)} runs has status 'completed' ("
                + ", ".join(f"{k}: {v}" for k, v in counts.items())
                + "); see the 'error' column or each run's train.log")
        notes.append(f"dropped {int((~done).sum())} of {len(df)} rows whose status is not "
                     f"'completed' (" + ", ".join(f"{k}: {v}" for k, v in counts.items()) + ")")
    return df[done]


def parse_columns(spec: str | None, names: tuple[str, ...] = CANONICAL) -> dict[str, str]:
    """``"params:Model Size,tokens:Tokens"`` -> {"params": "Model Size", "tokens": "Tokens"};
    ``names``: the NAMEs the reading law knows."""
    mapping: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in (spec or "").split(","))):
        name, sep, column = item.partition(":")
        name, column = name.strip(), column.strip()
        if not sep or not column or name not in names:
            raise FitInputError(f"--columns: {item!r} is not NAME:COLUMN with NAME one of "
                                f"{', '.join(names)}")
        if name in mapping or column in mapping.values():
            twice = name if name in mapping else repr(column)
            raise FitInputError(f"--columns: {twice} is mapped twice in {spec!r}")
        mapping[name] = column
    return mapping


def positive_column(table, name: str, why: str):
    """[rows] a checked table's column ``name`` as float64; FitInputError naming its source
    column when a value is not finite and > 0 (``why``: what takes its logarithm)."""
    values = pd.to_numeric(table.frame[name], errors="coerce").to_numpy("float64")
    bad = ~((values > 0) & (values < float("inf")))
    if bad.any():
        raise FitInputError(f"{table.source}: column {table.columns[name]!r} ({name}) has "
                            f"{int(bad.sum())} non-positive or non-finite value(s): {why}")
    return values
