"""The checked points a fit reads (``ScalingTable``), and which budget each run belongs to."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from attnlab.scaling.bootstrap import cluster_index

# Runs whose FLOPs differ by less than this factor belong to one budget when the table has no
# budget column (rounding of steps makes a budget's runs differ by a few percent).
BUDGET_TOLERANCE = 1.25

@dataclasses.dataclass(frozen=True)
class ScalingTable:
    """Checked points for a fit.

    frame: canonical columns params, tokens, loss, flops (always), and budget / run_id / step
    when present; one row per run (results) or per logged step (curves).
    source: the file or directory read; columns: canonical name -> column used in the source;
    notes: what was dropped or assumed, for the report.
    """

    frame: pd.DataFrame
    source: str
    columns: dict[str, str]
    notes: tuple[str, ...] = ()

    @property
    def clusters(self) -> np.ndarray | None:
        """[rows] cluster indices for the bootstrap (None: every row its own cluster)."""
        if "cluster" not in self.frame:
            return None
        index = cluster_index(self.frame["cluster"])
        return None if index.max() + 1 == len(index) else index

    def resampling(self) -> dict:
        """What a bootstrap of this table draws: {"unit", "column", "clusters"}."""
        clusters = self.clusters
        if clusters is None:
            return {"unit": "row", "column": None, "clusters": len(self.frame)}
        column = self.columns.get("cluster")
        return {"unit": "cluster", "column": column, "clusters": int(clusters.max()) + 1}

    def __len__(self) -> int:
        return len(self.frame)

    def array(self, name: str) -> np.ndarray:
        return self.frame[name].to_numpy()

    @property
    def budget(self) -> np.ndarray | None:
        return self.array("budget") if "budget" in self.frame else None


def budget_labels(flops: np.ndarray, budget: np.ndarray | None = None) -> np.ndarray:
    """[points] the budget of each run: the ``budget`` column when given, else clusters of
    ``flops`` (sorted values split wherever consecutive ones differ by > BUDGET_TOLERANCE),
    each labelled by its geometric mean."""
    if budget is not None:
        return np.asarray(budget, np.float64)
    log_c = np.log(np.asarray(flops, np.float64))
    order = np.argsort(log_c)
    cluster = np.concatenate([[0], np.cumsum(np.diff(log_c[order]) > np.log(BUDGET_TOLERANCE))])
    labels = np.empty_like(log_c)
    for k in np.unique(cluster):
        members = order[cluster == k]
        labels[members] = np.exp(log_c[members].mean())
    return labels
