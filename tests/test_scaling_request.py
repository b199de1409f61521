"""One fit request (attnlab.scaling.request): every mode of ``attnlab fit`` reads its table once
and parses --columns once, and the request a notebook builds fits what the command fits."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from attnlab import results as sweep_results
from attnlab.scaling import FitInputError, FitRequest, request
from attnlab.scaling.cli import fit_main
from attnlab.scaling.synthetic import CHINCHILLA_PUBLISHED, isoflop_points

# Fits by the hundred: their programs run far longer than they compile (tests/conftest.py).
pytestmark = pytest.mark.optimized

SMALL_GRID = "--grid=a:0:20:10,b:0:20:10,e:-1:1:1,alpha:0:2:1,beta:0:2:1"


@pytest.fixture(scope="module")
def sweep_csv(tmp_path_factory):
    """An IsoFLOP suite of 3 budgets x 5 sizes, each point at two learning rates and two seeds
    (the worse rate 2% higher), in two arms; the loss column named as a user's table might."""
    frames = []
    for arm in ("rope", "alibi"):
        for lr, worse in ((1e-3, 1.0), (3e-3, 1.02)):
            for seed in (0, 1):
                frame = isoflop_points(CHINCHILLA_PUBLISHED, np.geomspace(1e18, 1e20, 3),
                                       sizes_per_budget=5, noise=0.003,
                                       rng=np.random.default_rng(seed + 7 * len(arm)))
                frames.append(frame.assign(**{"loss": frame["loss"] * worse,
                                              "train.learning_rate": lr, "train.seed": seed,
                                              "model.pos_encoding": arm}))
    path = tmp_path_factory.mktemp("request") / "results.csv"
    pd.concat(frames, ignore_index=True).rename(columns={"loss": "Loss"}).to_csv(path,
                                                                              index=False)
    return path


@pytest.fixture
def counted(monkeypatch):
    """How often the fit reads a results table and parses --columns."""
    counts = {"read": 0, "parse": 0}

    def counting(name, function):
        def wrapped(*args, **kwargs):
            counts[name] += 1
            return function(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(sweep_results, "load", counting("read", sweep_results.load))
    monkeypatch.setattr(request, "parse_columns", counting("parse", request.parse_columns))
    return counts


@pytest.mark.parametrize("mode", [
    ["--law=chinchilla", SMALL_GRID, "--best-over=train.learning_rate"],
    ["--law=chinchilla", SMALL_GRID, "--by=model.pos_encoding",
     "--best-over=train.learning_rate"],
    ["--law=chinchilla", SMALL_GRID, "--holdout=largest-budget",
     "--best-over=train.learning_rate"],
    ["--law=kaplan", "--best-over=train.learning_rate", "--pair=train.seed"],  # redraws
    ["--law=chinchilla", "--approach=2", "--by=model.pos_encoding"],
])
def test_every_mode_reads_the_table_once_and_parses_the_columns_once(sweep_csv, counted, mode,
                                                                    tmp_path):
    out = tmp_path / "fit.json"
    assert fit_main([f"--sweep={sweep_csv}", "--columns=loss:Loss", "--bootstrap=20",
                     f"--json={out}", *mode]) == 0
    assert counted == {"read": 1, "parse": 1}
    assert json.loads(out.read_text())


def test_a_request_from_python_fits_what_attnlab_fit_fits(sweep_csv, tmp_path):
    out = tmp_path / "fit.json"
    assert fit_main([f"--sweep={sweep_csv}", "--columns=loss:Loss", "--law=chinchilla",
                     "--approach=2", "--profile=akima", "--by=model.pos_encoding",
                     "--bootstrap=20", f"--json={out}"]) == 0
    grouped = FitRequest.of(sweep_csv, approach=2, columns="loss:Loss", by="model.pos_encoding",
                            flags={"profile": "akima"}, n_bootstrap=20).grouped()
    from_command = json.loads(out.read_text())["groups"]
    for group, fit in grouped.fits.items():
        assert fit.params == pytest.approx({k: from_command[group][k] for k in fit.params})
        assert fit.ci == pytest.approx({k: tuple(v) for k, v in
                                        from_command[group]["ci"].items()})


def test_a_request_refuses_what_the_law_declares_it_cannot_read(sweep_csv):
    with pytest.raises(FitInputError, match="--profile does not apply to --law=chinchilla "
                                            "--approach=3"):
        FitRequest.of(sweep_csv, approach=3, flags={"profile": "akima"})
    with pytest.raises(FitInputError, match="--pair applies to the picks of --best-over"):
        FitRequest.of(sweep_csv, pair="train.seed")
    with pytest.raises(FitInputError, match="--by and --holdout"):
        FitRequest.of(sweep_csv, by="model.pos_encoding", holdout="largest-budget")
