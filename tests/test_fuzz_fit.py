"""A property-based fuzz (hypothesis) of the results tables given to ``attnlab fit``: random
columns (missing, renamed, extra), rows with NaN, inf, zero, negative, huge, duplicate and
non-numeric values, every law and form. Each table either fits (exit 0) or is refused in one
``error:`` line (exit 2); never a traceback or another exit code. Run in-process through
:func:`attnlab.cli.main`, the console script's dispatcher."""

from __future__ import annotations

import collections
import contextlib
import io
import math
import pathlib
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnlab import cli

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized

FIT_EXAMPLES, SLOW_FIT_EXAMPLES = 80, 1000

# A small Approach-3 grid (2^5 starts instead of 4500): the fuzz is about the inputs, not the
# optimum.
SMALL_GRID = "e:0:1:1,a:4:5:1,b:4:5:1,alpha:0:0.5:0.5,beta:0:0.5:0.5"
LAWS = [["--law=kaplan"], ["--law=kaplan", "--form=n"], ["--law=kaplan", "--form=d"],
        ["--law=chinchilla", f"--grid={SMALL_GRID}"], ["--law=chinchilla", "--approach=2"],
        ["--law=clark", "--columns=experts:tokens"]]  # Clark's law: the tokens stand for E

BAD = st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -1.0, 1e300, 1e-300, "abc", ""])


def plausible(column: str, row: int, jitter: float):
    """A value of ``column`` for row ``row`` of a small grid of sizes and lengths (so that the
    rows are distinct even when hypothesis draws the same ``jitter``, in [0, 1))."""
    n, d = 1e5 * 2.0 ** (row % 5), 1e7 * 3.0 ** (row // 5 % 4)
    return {"params": n * (1 + 0.1 * jitter), "tokens": d * (1 + 0.1 * jitter),
            "loss": 1.7 + 400 / n ** 0.34 + 400 / d ** 0.28 + 0.01 * jitter,
            "flops": 6 * n * d}[column]


@st.composite
def cells(draw, column: str, row: int):
    """Mostly plausible values of ``column`` (1 in 25 a bad one)."""
    if column in ("params", "tokens", "loss", "flops") and draw(st.integers(0, 99)) < 96:
        return plausible(column, row, draw(st.floats(0, 1, exclude_max=True)))
    if column == "status":
        return draw(st.sampled_from(["completed", "completed", "diverged", "failed", ""]))
    return draw(BAD)


@st.composite
def tables(draw):
    """A CSV's text: a header of some canonical columns (maybe misspelt) and extra ones, then
    rows, some repeated."""
    # hypothesis starts from (and shrinks towards) draws of 0: here a well-formed table
    if draw(st.integers(0, 99)) < 80:
        names = ["params", "tokens", "loss", *draw(st.sampled_from([[], ["flops"], ["status"]]))]
    else:
        names = draw(st.lists(st.sampled_from(["params", "tokens", "loss", "flops", "status"]),
                              min_size=0, max_size=5, unique=True))
    names = [n if draw(st.integers(0, 99)) < 93 else draw(st.sampled_from([n.upper(), f"{n}_x"]))
             for n in names]
    if draw(st.booleans()):
        names.append("notes")
    rows = []
    for _ in range((8 + draw(st.integers(0, 14))) % 15):  # 8 rows first, then 0 to 14
        if rows and draw(st.integers(0, 99)) < 10:
            rows.append(draw(st.sampled_from(rows)))  # a duplicate row
            continue
        rows.append([draw(cells(n.lower(), len(rows))) for n in names])
    return "\n".join([",".join(names), *(",".join(map(str, r)) for r in rows)]) + "\n"


OUTCOMES: collections.Counter = collections.Counter()


def fit_one(text: str, law: list[str]) -> None:
    """The property: exit 0 with a fit printed, or exit 2 with one ``error:`` line."""
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "results.csv"
        path.write_text(text)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["fit", f"--sweep={path}", *law, "--bootstrap=0"])
    errors = [line for line in err.getvalue().splitlines() if line.startswith("error")]
    assert "Traceback" not in out.getvalue() + err.getvalue(), err.getvalue()
    if code == 2:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), err.getvalue()
        OUTCOMES["refused"] += 1
    else:
        assert code == 0 and not errors, (code, err.getvalue())
        assert out.getvalue().strip(), "a fit prints its parameters"
        OUTCOMES["fitted"] += 1


def _fuzz(examples: int):
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(tables(), st.sampled_from(LAWS))
    def fuzz(text, law):
        fit_one(text, law)

    OUTCOMES.clear()
    fuzz()
    return OUTCOMES


def _report(capsys, name, outcomes):
    with capsys.disabled():
        print(f"\n{name}: {dict(outcomes)}")
    assert outcomes["fitted"] and outcomes["refused"], outcomes  # both paths reached


def test_fit_fuzz(capsys):
    _report(capsys, "fit fuzz", _fuzz(FIT_EXAMPLES))


@pytest.mark.fuzz  # the same contract as the short run, which CI's slow lane runs
def test_fit_fuzz_long(capsys):
    _report(capsys, "fit fuzz (long)", _fuzz(SLOW_FIT_EXAMPLES))
