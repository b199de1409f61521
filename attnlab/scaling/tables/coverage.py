"""How often a fit's intervals hold the truth at the table's own design (``attnlab fit
--coverage=S``).

A bootstrap interval is nominal: over few clusters (a ladder's 4-5 trunks) it covers less than
it says, and a design check that assumes independent noise is too optimistic when a trunk's
branches share its noise. So the fitted law itself is made the truth: S tables are simulated
at the table's own (N, D) points with the residual structure estimated from its residuals (a
normal effect per cluster, shared by the cluster's rows, and a normal effect per row, on log L;
the variance components by the one-way ANOVA estimator), each is refitted exactly as the table
was (the same law, settings, clusters and bootstrap), and the share of simulations whose interval
holds the truth is counted per parameter. A simulation whose intervals are refused is counted
apart. An interval whose simulated coverage falls below ``FLAG_BELOW`` is flagged.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
from scipy import stats

from attnlab.scaling.errors import FitError, FitInputError, GridEdgeWarning
from attnlab.scaling.points import ScalingTable
from attnlab.scaling.result import ScalingFit
from attnlab.scaling.tables.fitting import fit_table

FLAG_BELOW = 0.90


def fitted_loss(table: ScalingTable, fit: ScalingFit) -> np.ndarray:
    """[rows] the fitted law's loss of each of the table's runs."""
    columns = {c: table.array(c) for c in fit.part.run_columns}
    return np.asarray(fit.run_loss(table.array("params"), table.array("tokens"), **columns),
                      np.float64)


def residual_structure(table: ScalingTable, fit: ScalingFit) -> dict:
    """Residuals of log L about the fitted law split into a cluster effect and a row effect:
    {"cluster_sd", "row_sd", "clusters"} (one-way ANOVA; without clusters all is row noise)."""
    residual = np.log(table.array("loss")) - np.log(fitted_loss(table, fit))
    clusters = table.clusters
    if clusters is None:
        return {"cluster_sd": 0.0, "row_sd": float(np.std(residual, ddof=1)),
                "clusters": len(residual)}
    count = np.bincount(clusters)
    means = np.bincount(clusters, residual) / count
    within = residual - means[clusters]
    row_var = float(np.sum(within**2) / max(len(residual) - len(count), 1))
    cluster_var = max(float(np.var(means, ddof=1) - np.mean(row_var / count)), 0.0)
    return {"cluster_sd": float(np.sqrt(cluster_var)), "row_sd": float(np.sqrt(row_var)),
            "clusters": len(count)}


def simulated_table(table: ScalingTable, fit: ScalingFit, structure: dict,
                    rng: np.random.Generator) -> ScalingTable:
    """The table with its losses drawn from the fitted law and the residual structure."""
    truth = fitted_loss(table, fit)
    clusters = table.clusters
    clusters = np.arange(len(table)) if clusters is None else clusters
    shared = structure["cluster_sd"] * rng.standard_normal(int(clusters.max()) + 1)
    noise = shared[clusters] + structure["row_sd"] * rng.standard_normal(len(table))
    return dataclasses.replace(table, frame=table.frame.assign(loss=truth * np.exp(noise)))


@dataclasses.dataclass(frozen=True)
class Coverage:
    """Per parameter: the simulations whose interval held the truth (``covered``) among those
    with an interval (``with_interval``); ``refused``: simulations whose intervals were refused;
    ``failed``: simulations whose fit raised."""

    sims: int
    level: float
    structure: dict
    covered: dict
    with_interval: int
    refused: int
    failed: int

    def rate(self, name: str) -> tuple[float, float, float]:
        """(coverage, low, high): the share and its 95% Clopper-Pearson interval."""
        k, n = self.covered[name], self.with_interval
        if not n:
            return (float("nan"),) * 3
        ci = stats.binomtest(k, n).proportion_ci(0.95)
        return k / n, float(ci.low), float(ci.high)

    def flagged(self) -> list[str]:
        """The parameters whose simulated coverage is below FLAG_BELOW."""
        return [name for name in self.covered if self.rate(name)[0] < FLAG_BELOW]

    def to_dict(self) -> dict:
        return {"sims": self.sims, "level": self.level, "structure": self.structure,
                "with_interval": self.with_interval, "refused": self.refused,
                "failed": self.failed, "flag_below": FLAG_BELOW, "flagged": self.flagged(),
                "coverage": {name: dict(zip(("rate", "low", "high"), self.rate(name)))
                             for name in self.covered}}


def check_coverage(request, sims: int) -> None:
    """Refuses, in one line and before any fit, a --coverage the request cannot check."""
    if sims < 0:
        raise FitInputError(f"--coverage must be >= 0 tables, not {sims}")
    if request.by or request.holdout:
        raise FitInputError("--coverage checks one fit's intervals: leave out --by and --holdout")
    if not request.law.can("run-loss"):
        raise FitInputError(f"--coverage needs a law of each run's loss; "
                            f"{request.law.short_title} predicts none (use --law=chinchilla "
                            f"--approach=3)")
    if request.n_bootstrap < 1:
        raise FitInputError("--coverage checks the bootstrap's intervals: --bootstrap must be "
                            ">= 1")


def simulated_coverage(table: ScalingTable, fit: ScalingFit, *, sims: int, n_bootstrap: int,
                       seed: int = 0, **options) -> Coverage:
    """The coverage of ``fit``'s intervals at ``table``'s design (module docstring); options:
    ``fit_table``'s (the law's settings, ci_level, fixed), as the fit was made."""
    law = fit.part
    structure = residual_structure(table, fit)
    rng = np.random.default_rng(seed)
    names = [n for n, v in fit.params.items()
             if n not in (options.get("fixed") or {}) and np.isfinite(v)]
    covered, with_interval, refused, failed = dict.fromkeys(names, 0), 0, 0, 0
    for sim in range(sims):
        drawn = simulated_table(table, fit, structure, rng)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", GridEdgeWarning)
                refit = fit_table(drawn, law=law, n_bootstrap=n_bootstrap, seed=seed + 1 + sim,
                                  **options)
        except FitError:  # a simulated table the law cannot fit counts, it is not skipped
            failed += 1
            continue
        if refit.intervals_refused or not refit.ci:
            refused += 1
            continue
        with_interval += 1
        for name in names:
            low, high = refit.ci.get(name, (np.nan, np.nan))
            covered[name] += bool(low <= fit.params[name] <= high)
    return Coverage(sims, fit.ci_level, structure, covered, with_interval, refused, failed)


def format_coverage(result: Coverage) -> str:
    """The coverage table as text, with what it simulated and what it flags."""
    s = result.structure
    lines = [f"coverage at this design: {result.sims} tables simulated from the fitted law "
             f"with its residual structure (cluster effect sd {s['cluster_sd']:.3g}, row sd "
             f"{s['row_sd']:.3g} on log L, {s['clusters']} clusters), each refitted as this "
             f"table was; {result.with_interval} with intervals, {result.refused} refused, "
             f"{result.failed} failed",
             f"  {'parameter':<10}{'coverage':>10}{'95% low':>10}{'95% high':>10}"
             f"   (nominal {100 * result.level:g}%)"]
    for name in result.covered:
        rate, low, high = result.rate(name)
        mark = f"   below {100 * FLAG_BELOW:g}%: flagged" if rate < FLAG_BELOW else ""
        lines.append(f"  {name:<10}{rate:>10.1%}{low:>10.1%}{high:>10.1%}{mark}")
    flagged = result.flagged()
    if flagged:
        lines.append(f"warning: at this design the {100 * result.level:g}% intervals of "
                     f"{', '.join(flagged)} cover less than {100 * FLAG_BELOW:g}% of the time: "
                     f"read them as narrower than they say (flagged, not widened)")
    return "\n".join(lines) + "\n"
