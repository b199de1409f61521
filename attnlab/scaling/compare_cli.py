"""``attnlab compare``: the arms of a sweep at matched points, with Welch's t intervals over
seeds (:mod:`attnlab.scaling.tables.compare` does the arithmetic; this parses, calls it and
prints)."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from attnlab import cli_flags
from attnlab import cli_vocab as vocab
from attnlab import outputs
from attnlab.cli_flags import Flag
from attnlab.errors import AttnlabError
from attnlab.scaling.columns import drop_unfinished
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.result import jsonable
from attnlab.scaling.tables.compare import (DEFAULT_MATCH, arm_named, format_differences,
                                            format_heldout, heldout_differences,
                                            paired_differences)
from attnlab.scaling.tables.picks import at_best, format_picks
from attnlab.scaling.tables.prepare import corpora_notes, pooled_columns
from attnlab.scaling.tables.read import read_table

COMPARE_HELP = """\
Compare the arms of a sweep at matched points: each value of --by minus --baseline, mean over
seeds, with Welch's t interval over seeds, per point and pooled.

    attnlab compare --sweep=sweeps/wsd_cosine --by=schedule --baseline=cosine \\
        --pair=train.seed
    attnlab compare --sweep=sweeps/pe --by=model.pos_encoding --baseline=rope \\
        --match=params,tokens --json=compare.json
    attnlab compare --sweep=sweeps/wsd_cosine_tuned --by=schedule --baseline=cosine \\
        --pair=train.seed --best-over=train.learning_rate"""

COMPARE_FLAGS = [
    vocab.SWEEP.flag("Or its results table (.parquet/.csv).", old_names=("results",)),
    vocab.BY.flag("Its values are the arms."),
    Flag("baseline", "string", None, "The arm the others are compared with."),
    Flag("match", "string", ",".join(DEFAULT_MATCH), "Columns that must be equal for two runs "
                                                     "to be compared (comma-separated)."),
    Flag("metric", "string", "final_val_loss", "The column compared."),
    vocab.PAIR.flag("Two arms' runs are paired by it and their per-pair differences compared; "
                    "with --best-over, a seed's runs at every value are drawn together in the "
                    "picks' stability, and each seed is also scored at the value its arm's "
                    "other seeds pick (held-out picks: no winner's curse)."),
    vocab.BEST_OVER.flag("Each arm is compared at its own best value, per point."),
    vocab.CI_LEVEL.flag(default=0.95),
    vocab.JSON.flag("The table."),
]


def _pooled_notes(table, by: str, match: tuple[str, ...], metric: str, pair: str | None):
    """A note when an arm's runs at one point differ in a config column other than --pair:
    they are compared as its seeds, which a rate or schedule grid is not."""
    keys = [*match, by]
    varied = pooled_columns(table, keys, (metric, pair)) if set(keys) <= set(table) else []
    if not varied:
        return []
    return [f"an arm's runs at one point differ in {', '.join(map(str, varied))}: compared as "
            f"its seeds; --best-over={varied[0]} takes each point's best, "
            f"--match={','.join(match)},{varied[0]} compares each value alone"]


def checked_metric(table: pd.DataFrame, metric: str, source: str) -> list[str]:
    """Notes on the runs read twice and those left out for not completing (diverged, failed),
    as fit makes them; FitInputError for a metric that is not a number where a run completed
    (a missing column is said where it is needed)."""
    notes: list[str] = []
    done = drop_unfinished(table, notes, source)
    if metric not in done:
        return notes
    bad = ~np.isfinite(pd.to_numeric(done[metric], errors="coerce"))
    if bad.any():
        row = bad.idxmax()
        raise FitInputError(f"{source}: --metric={metric} is not a finite number in "
                            f"{int(bad.sum())} completed run(s) (row {row}: "
                            f"{_shown(done.loc[row, metric])})")
    return notes


def compare_main(argv: list[str]) -> int:
    try:
        values = cli_flags.parse(argv, COMPARE_FLAGS, prog="attnlab compare", takes_config=False,
                                 description=COMPARE_HELP)
        for name in ("sweep", "by", "baseline"):
            if not values[name].value:
                raise FitInputError(f"--{name} is required")
        level = values["ci-level"].value
        if not 0 < level < 1:
            raise FitInputError(f"--ci-level must be in (0, 1), got {level}")
        match = tuple(c.strip() for c in values["match"].value.split(",") if c.strip())
        if not match:
            raise FitInputError("--match: give at least one column")
        by, baseline, metric = (values[n].value for n in ("by", "baseline", "metric"))
        table = read_table(values["sweep"].value)
        read_notes = checked_metric(table, metric, values["sweep"].value)
        over, pair, picks, held = values["best-over"].value, values["pair"].value, None, None
        if over:
            if pair:
                held = heldout_differences(table, by=by, baseline=baseline, match=match,
                                           metric=metric, over=over, pair=pair, level=level)
            table, picks = at_best(table, by=by, match=match, metric=metric, over=over,
                                   pair=pair)
        # --baseline=1 on a numeric column names the arm "1.0": the report and JSON say so
        if by in table.columns:
            baseline = arm_named(baseline, [str(arm) for arm in table[by].dropna().unique()])
        frame = paired_differences(table, by=by, baseline=baseline, match=match, metric=metric,
                                   level=level, pair=pair)
    except AttnlabError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if picks is not None:
        sys.stdout.write(format_picks(picks, over=over, metric=metric))
    sys.stdout.write(format_differences(frame, by=by, baseline=baseline, metric=metric,
                                        match=match, level=level, pair=pair))
    if held is not None:
        sys.stdout.write(format_heldout(held, by=by, baseline=baseline, metric=metric,
                                        match=match, level=level, pair=pair))
    for note in read_notes + corpora_notes(table) + _pooled_notes(table, by, match, metric,
                                                                   pair):
        print(f"note: {note}")
    if values["json"].value:
        payload = {"by": by, "baseline": baseline, "metric": metric, "match": list(match),
                   "pair": pair,
                   "ci_level": level, "rows": jsonable(frame.to_dict(orient="records"))}
        if picks is not None:
            payload |= {"best_over": over, "picks": jsonable(picks.to_dict(orient="records"))}
        if held is not None:
            payload |= {"heldout_rows": jsonable(held[0].to_dict(orient="records")),
                        "heldout_notes": held[1]}
        outputs.write_json(values["json"].value, payload, indent=1)
    return 0


def _shown(value) -> str:
    """A table cell as a user would write it (``nan``, not numpy's ``np.float64(nan)``)."""
    return repr(value.item() if hasattr(value, "item") else value)
