"""Automatic checks on an extrapolation study whose failure means a bug, not science.

Each returns human-readable warnings (empty when all is well); the sweep command prints them and
writes them into the study's report. The thresholds are far below seed noise (1-2% of
perplexity at 1x, see docs/extrapolation.md), so a hit is never a plausible result.
"""

from __future__ import annotations

import itertools
import math

import pandas as pd

from attnlab.model.positions import LearnedPositions
from attnlab.model.rope import RoPE

# Perplexities of two differently trained models agreeing to this relative precision are the
# same number computed twice (e.g. the encoding was never applied).
IDENTICAL_RTOL = 1e-6
# RoPE within this of its 1x perplexity at every length up to >= 4x means positions never reached
# the model (Press et al. 2022 measure 5.5x at 16x; no published RoPE model is flat).
FLAT_ATOL = 1e-3


def red_flags(table: pd.DataFrame) -> list[str]:
    """All checks on a combined table (columns run_id, pos_encoding, seed, protocol, length,
    multiplier, status, loss, perplexity, ppl_ratio; max_len optional)."""
    return [*nonfinite(table), *identical_across_encodings(table), *flat_rope(table),
            *learned_beyond_table(table)]


def nonfinite(table: pd.DataFrame) -> list[str]:
    """Any NaN or inf loss among evaluated rows."""
    ok = table[table["status"] == "ok"]
    bad = ok[~ok["loss"].map(lambda x: x is not None and math.isfinite(float(x)))]
    return [f"{r.run_id} ({r.pos_encoding}) {r.protocol} L={r.length}: loss is {r.loss}; "
            "NaN/inf means a bug (e.g. an out-of-range embedding lookup)" for r in bad.itertuples()]


def identical_across_encodings(table: pd.DataFrame) -> list[str]:
    """Two different encodings with the same perplexity (same seed, protocol and length).
    Rows of one run under different RoPE rescalings (``rope`` / ``rope+pi``, same ``run_id``)
    are not compared: a rescaling may change a weakly position-dependent model very little."""
    ok = table[table["status"] == "ok"]
    warnings = []
    for (seed, name, length), group in ok.groupby(["seed", "protocol", "length"]):
        # Pairs of different encodings: every row of one against every row of the other.
        encodings = [rows for _, rows in group.groupby("pos_encoding", sort=False)]
        for rows_a, rows_b in itertools.combinations(encodings, 2):
            for a, b in itertools.product(rows_a.itertuples(), rows_b.itertuples()):
                if a.run_id == b.run_id:
                    continue
                if math.isclose(a.perplexity, b.perplexity, rel_tol=IDENTICAL_RTOL):
                    warnings.append(
                        f"{a.pos_encoding} and {b.pos_encoding} (seed {seed}) have identical "
                        f"perplexity {a.perplexity:.6g} at {name} L={length}: the encodings are "
                        "probably not being applied")
    return warnings


def flat_rope(table: pd.DataFrame) -> list[str]:
    """A RoPE run whose ratio stays within FLAT_ATOL of 1 at every length up to >= 4x."""
    ok = table[(table["status"] == "ok") & (table["pos_encoding"] == RoPE.name)]  # not +ntk
    warnings = []
    for (run_id, name), group in ok.groupby(["run_id", "protocol"]):
        longer = group[group["multiplier"] > 1]
        if not longer.empty and longer["multiplier"].max() >= 4 and (
                (longer["ppl_ratio"] - 1).abs() < FLAT_ATOL).all():
            warnings.append(
                f"{run_id} (rope) {name}: perplexity ratio within {FLAT_ATOL} of 1 up to "
                f"{longer['multiplier'].max():g}x; RoPE does not extrapolate flat, so positions "
                "are probably not reaching the model (clamped, reset per window, or rounded)")
    return warnings


def learned_beyond_table(table: pd.DataFrame) -> list[str]:
    """A learned-position run with a number beyond its table: something clamped positions."""
    if "max_len" not in table:
        return []
    bad = table[(table["pos_encoding"] == LearnedPositions.name) & (table["status"] == "ok")
                & (table["length"] > table["max_len"])]
    return [f"{r.run_id} (learned) has a result at L={r.length} > max_len={r.max_len}: positions "
            "must have been clamped" for r in bad.itertuples()]
