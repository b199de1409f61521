"""Red-flag checks of a study table and the ratio summary behind the plots."""

import math

import numpy as np
import pandas as pd
import pytest

from attnlab.extrapolation import checks
from attnlab.extrapolation.study import markdown_report, ratio_table
from attnlab.extrapolation.evaluate import EvalSettings
from attnlab.plots.extrapolation import binned_curve, plot_perplexity_ratio, plot_position_loss, \
    ratio_summary


def study_table(ratios: dict[tuple[str, int], list[float]], base_ppl=None) -> pd.DataFrame:
    """Rows of a combined table from {(encoding, seed): [r(1), r(2), r(4), ...]}."""
    rows = []
    for (encoding, seed), values in ratios.items():
        ppl1 = (base_ppl or {}).get(encoding, 3.1 + 0.1 * len(rows))
        for k, ratio in enumerate(values):
            length = 64 * 2 ** k
            ok = ratio is not None
            rows.append({
                "run_id": f"{encoding}-s{seed}", "pos_encoding": encoding, "seed": seed,
                "protocol": "nonoverlapping", "length": length, "multiplier": float(2 ** k),
                "status": "ok" if ok else "not_applicable", "max_len": 64,
                "perplexity": ppl1 * ratio if ok else None,
                "loss": math.log(ppl1 * ratio) if ok else None, "ppl_ratio": ratio})
    return pd.DataFrame(rows)


HEALTHY = {("sinusoidal", 0): [1, 2.5, 7.0], ("rope", 0): [1, 1.5, 2.2],
           ("rope", 1): [1, 1.7, 2.6], ("alibi", 0): [1, 0.98, 0.97],
           ("learned", 0): [1, None, None]}


def test_a_healthy_study_raises_no_flags():
    assert checks.red_flags(study_table(HEALTHY)) == []


def test_nan_loss_is_flagged():
    table = study_table(HEALTHY)
    table.loc[3, "loss"] = float("nan")
    [warning] = checks.nonfinite(table)
    assert "NaN/inf" in warning and "rope-s0" in warning


def test_identical_perplexities_across_encodings_are_flagged():
    table = study_table(HEALTHY, base_ppl={"rope": 3.0, "alibi": 3.0})
    warnings = checks.identical_across_encodings(table)
    assert len(warnings) == 1 and "rope and alibi" in warnings[0] and "L=64" in warnings[0]


def test_rescalings_of_one_run_are_not_compared_as_encodings():
    table = study_table(HEALTHY)
    rescaled = table[table["pos_encoding"] == "rope"].assign(pos_encoding="rope+pi")
    table = pd.concat([table, rescaled], ignore_index=True)  # same run ids, same perplexities
    assert checks.identical_across_encodings(table) == []


def test_flat_rope_is_flagged_but_not_flat_alibi():
    table = study_table({**HEALTHY, ("rope", 1): [1, 1.0002, 0.9999]})
    [warning] = checks.flat_rope(table)
    assert "rope-s1" in warning and "4x" in warning


def test_learned_result_beyond_its_table_is_flagged():
    table = study_table({**HEALTHY, ("learned", 0): [1, 5.0, 9.0]})
    warnings = checks.learned_beyond_table(table)
    assert [w.split(" ")[0] for w in warnings] == ["learned-s0", "learned-s0"]


def test_ratio_summary_is_the_mean_and_range_over_seeds():
    summary = ratio_summary(study_table(HEALTHY)).set_index(["pos_encoding", "length"])
    assert summary.loc[("rope", 128), "mean"] == pytest.approx(np.mean([1.5, 1.7]))
    assert summary.loc[("rope", 256), "low"] == 2.2 and summary.loc[("rope", 256), "high"] == 2.6
    assert summary.loc[("rope", 256), "n_seeds"] == 2
    assert ("learned", 128) not in summary.index  # not applicable rows are not averaged
    table = ratio_table(study_table(HEALTHY))
    assert table.loc["rope", "2x"] == "1.6 [1.5, 1.7]" and table.loc["learned", "4x"] == "n/a"
    report = markdown_report(study_table(HEALTHY), ["a red flag"], EvalSettings())
    assert "| alibi | 1 | 0.98 | 0.97 |" in report and "- WARNING: a red flag" in report


def test_binned_curve_averages_consecutive_positions():
    centres, means = binned_curve(np.arange(10.0), 4)
    np.testing.assert_allclose(means, [1.5, 5.5, 8.5])
    np.testing.assert_allclose(centres, [1.5, 5.5, 9.5])


def test_plots_write_png_and_pdf(tmp_path):
    paths = plot_perplexity_ratio(study_table(HEALTHY), tmp_path / "ratio")
    assert [p.name for p in paths] == ["ratio.png", "ratio.pdf"]
    assert paths[0].read_bytes()[:4] == b"\x89PNG" and paths[1].read_bytes()[:4] == b"%PDF"
    curves = pd.DataFrame({"pos_encoding": "rope", "seed": 0, "position": np.arange(256),
                           "loss": np.linspace(3, 2, 256)})
    paths = plot_position_loss(curves, tmp_path / "positions", train_length=64)
    assert all(p.stat().st_size > 1000 for p in paths)
    with pytest.raises(ValueError, match="no evaluated rows for protocol 'sliding'"):
        plot_perplexity_ratio(study_table(HEALTHY), tmp_path / "x", protocol="sliding")
