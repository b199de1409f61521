"""Clark et al. 2022's scaling law for routed language models (arXiv 2202.01169, eq. 1):

    log10 L(N, E) = a log10 N + b log10 Ê + c log10 N log10 Ê + d

N the parameters of the dense model the experts are added to (a mixture of experts' *active*
parameters), E the number of experts, all models trained on the same tokens. Ê is E itself, or
Clark et al.'s saturating transform of it (their eq. 1, with E_start and E_max fitted there and
given here):

    1/Ê = 1/(E - 1 + (1/E_start - 1/E_max)^-1) + 1/E_max

so that Ê(1) = E_start and Ê -> E_max as E grows. The logarithms are base 10, as in Clark et al.;
a and b do not depend on the base, c and d do (c_ln = c / ln 10, d_ln = d ln 10).

The law is linear in (a, b, c, d), so the fit is ordinary least squares on log10 L in float64,
and its intervals are Student t intervals from the least-squares covariance
s^2 (X^T X)^-1 with n - 4 degrees of freedom: exact coverage when the errors of log10 L are
independent, Gaussian and of one variance, checked in simulation (tests/test_scaling_clark.py).
A bootstrap over runs (pairs resampled with replacement, percentile intervals) is reported
beside them as a check that assumes less about the errors (heteroscedastic or non-Gaussian
residuals). Draws with too few values of E or N to fit are skipped and counted. In simulated
sweeps of ``experiments/moe.py``'s design both cover at about the nominal rate (docs/scaling.md);
the t interval is the headline because it is exact under its assumptions, free of resampling
noise, and gives any linear combination (the routing slope b + c log10 N) its own interval.

    fit = fit_clark(n, e, loss)
    fit.params["b"], fit.ci["b"], fit.expert_slope(1e5)
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
from scipy import stats

from attnlab.cli_vocab import Flag
from attnlab.scaling.bootstrap import MAX_FAILED_SHARE, percentile_interval
from attnlab.scaling.columns import pick_column
from attnlab.scaling.errors import FitInputError
from attnlab.scaling.law import Law

PARAMS = ("a", "b", "c", "d")
# Clark et al. 2022, Table 3: eq. 1 fitted to each routing technique (130B tokens; N the dense
# model's parameters, 15M-1.3B; E up to 512; log base 10).
CLARK_2022 = {
    "S-BASE": {"a": -0.082, "b": -0.108, "c": 0.009, "d": 1.104, "e_start": 1.847,
               "e_max": 314.478},
    "RL-R": {"a": -0.083, "b": -0.126, "c": 0.012, "d": 1.111, "e_start": 1.880,
             "e_max": 469.982},
    "HASH": {"a": -0.087, "b": -0.136, "c": 0.012, "d": 1.157, "e_start": 4.175,
             "e_max": 477.741},
}
LAW_NAME = "Clark et al. 2022: log10 L = a log10 N + b log10 E + c log10 N log10 E + d"
# Parameters of the fit plus at least one residual degree of freedom for the intervals.
MIN_POINTS = len(PARAMS) + 1


def _shifted(experts: np.ndarray, e_start: float | None, e_max: float | None) -> np.ndarray:
    """E - 1 + (1/E_start - 1/E_max)^-1, the denominator of eq. 1's Ê, with the range checked."""
    if e_start is None or e_max is None or not 1 <= e_start < e_max:
        raise FitInputError(f"--saturation: need 1 <= E_start < E_max, got E_start={e_start}, "
                            f"E_max={e_max}")
    return experts - 1.0 + 1.0 / (1.0 / e_start - 1.0 / e_max)


def saturate(experts, e_start: float | None = None, e_max: float | None = None) -> np.ndarray:
    """Ê (Clark et al. eq. 1): E itself when no saturation is given, else
    1/Ê = 1/(E - 1 + (1/E_start - 1/E_max)^-1) + 1/E_max. experts: [points], >= 1."""
    experts = np.asarray(experts, np.float64)
    if e_start is None and e_max is None:
        return experts
    return 1.0 / (1.0 / _shifted(experts, e_start, e_max) + 1.0 / e_max)


def saturation_log_slope(experts, e_start: float | None = None,
                         e_max: float | None = None) -> np.ndarray:
    """d log Ê / d log E at E: 1 without saturation; else, from eq. 1's Ê,
    dÊ/dE = Ê^2 / (E - 1 + shift)^2, so d log Ê / d log E = E Ê / (E - 1 + shift)^2."""
    experts = np.asarray(experts, np.float64)
    if e_start is None and e_max is None:
        return np.ones_like(experts)
    return experts * saturate(experts, e_start, e_max) / _shifted(experts, e_start, e_max) ** 2


def clark_log_loss(n, e_hat, a: float, b: float, c: float, d: float) -> np.ndarray:
    """log10 L of eq. 1 at parameters n [points] and (saturated) expert counts e_hat [points]."""
    log_n, log_e = np.log10(n), np.log10(e_hat)
    return a * log_n + b * log_e + c * log_n * log_e + d


def design_matrix(n, e_hat) -> np.ndarray:
    """[points, 4]: the columns of (a, b, c, d) in eq. 1."""
    log_n, log_e = np.log10(np.asarray(n, np.float64)), np.log10(np.asarray(e_hat, np.float64))
    return np.stack([log_n, log_e, log_n * log_e, np.ones_like(log_n)], axis=-1)


@dataclasses.dataclass(frozen=True)
class ClarkFit:
    """A fit of eq. 1.

    params: a, b, c, d; covariance: [4, 4] least-squares covariance of (a, b, c, d);
    ci: Student t intervals at ci_level (dof = n_points - 4); bootstrap_ci: percentile intervals
    of the pairs bootstrap (empty without one), from n_bootstrap usable of n_bootstrap_requested
    draws; residual_std: s, the residuals' standard deviation in log10 L (dof-corrected);
    experts, sizes: the distinct E and N fitted; saturation: (E_start, E_max) or None.
    """

    params: dict[str, float]
    covariance: np.ndarray
    ci: dict[str, tuple[float, float]]
    ci_level: float
    dof: int
    residual_std: float
    n_points: int
    experts: tuple[float, ...]
    sizes: tuple[float, ...]
    saturation: tuple[float, float] | None = None
    bootstrap_ci: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    n_bootstrap: int = 0
    n_bootstrap_requested: int = 0
    lack_of_fit: dict | None = None
    notes: tuple[str, ...] = ()

    @property
    def std_errors(self) -> dict[str, float]:
        return {name: float(math.sqrt(self.covariance[i, i])) for i, name in enumerate(PARAMS)}

    def _t_interval(self, gradient: np.ndarray) -> tuple[float, float, float]:
        """A linear combination g . (a, b, c, d): its estimate and t interval."""
        theta = np.array([self.params[p] for p in PARAMS])
        value = float(gradient @ theta)
        half = (stats.t.ppf(0.5 + self.ci_level / 2, self.dof)
                * math.sqrt(float(gradient @ self.covariance @ gradient)))
        return value, value - half, value + half

    def expert_slope(self, n: float, e: float | None = None) -> dict:
        """d log10 L / d log10 E at N = n: b + c log10 N (Clark et al. eq. 8) times
        d log10 Ê / d log10 E, which is 1 without saturation and depends on E = e with it;
        negative where more experts lower the loss; its t interval."""
        value, low, high = self._t_interval(np.array([0.0, 1.0, math.log10(n), 0.0]))
        if self.saturation is None:
            return {"N": float(n), "slope": value, "ci": (low, high)}
        factor = float(saturation_log_slope(e, *self.saturation))  # > 0: the interval keeps
        return {"N": float(n), "E": float(e), "slope": value * factor,
                "ci": (low * factor, high * factor)}

    def expert_slopes(self) -> list[dict]:
        """The routing slope at the smallest and largest N (and, saturated, E) fitted."""
        experts = (None,) if self.saturation is None else (min(self.experts), max(self.experts))
        return [self.expert_slope(n, e) for n in (min(self.sizes), max(self.sizes))
                for e in experts]

    def size_slope(self, e: float) -> dict:
        """d log10 L / d log10 N = a + c log10 Ê at Ê = e (Clark et al. eq. 8), t interval."""
        value, low, high = self._t_interval(np.array([1.0, 0.0, math.log10(e), 0.0]))
        return {"E": float(e), "slope": value, "ci": (low, high)}

    def predict(self, n, e) -> np.ndarray:
        """L (not its log) at n and raw expert counts e (saturated as in the fit)."""
        e_hat = saturate(e, *(self.saturation or (None, None)))
        return 10.0 ** clark_log_loss(n, e_hat, *(self.params[p] for p in PARAMS))

    def to_dict(self) -> dict:
        return {
            "law": "clark", "name": LAW_NAME, "log_base": 10, **self.params,
            "std_errors": self.std_errors, "ci": {k: list(v) for k, v in self.ci.items()},
            "ci_method": "student-t from the least-squares covariance",
            "bootstrap_ci": {k: list(v) for k, v in self.bootstrap_ci.items()},
            "n_bootstrap": self.n_bootstrap, "n_bootstrap_requested": self.n_bootstrap_requested,
            "resampling": {"unit": "row", "column": None, "clusters": self.n_points},
            "ci_level": self.ci_level, "dof": self.dof, "residual_std": self.residual_std,
            "n_points": self.n_points, "experts": list(self.experts), "sizes": list(self.sizes),
            "saturation": list(self.saturation) if self.saturation else None,
            "lack_of_fit": self.lack_of_fit,
            "expert_slopes": [_listed(slope) for slope in self.expert_slopes()],
            "notes": list(self.notes),
        }


def _listed(entry: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in entry.items()}


def _check_inputs(n, e, loss) -> None:
    for name, values in (("N", n), ("E", e), ("loss", loss)):
        bad = ~(np.isfinite(values) & (values > 0))
        if bad.any():
            raise FitInputError(f"Clark fit: {name} has {int(bad.sum())} non-positive or "
                                f"non-finite value(s); the law takes logarithms")
    if (e < 1).any():
        raise FitInputError(f"Clark fit: E must be >= 1 (a count of experts), got "
                            f"{sorted(set(e[e < 1].tolist()))[:3]}")
    if len(np.unique(e)) < 2:
        raise FitInputError(f"Clark fit needs at least 2 values of E, got {np.unique(e).tolist()}:"
                            f" b and c are not determined")
    if len(np.unique(n)) < 2:
        raise FitInputError(f"Clark fit needs at least 2 values of N, got {np.unique(n).tolist()}:"
                            f" a and c are not determined")
    if len(n) < MIN_POINTS:
        raise FitInputError(f"Clark fit needs at least {MIN_POINTS} runs (4 coefficients and one "
                            f"degree of freedom for the intervals), got {len(n)}")


def _solve(x: np.ndarray, y: np.ndarray) -> np.ndarray | None:
    """Least squares theta of y ~ x theta, or None when x has rank < 4."""
    theta, _, rank, _ = np.linalg.lstsq(x, y, rcond=None)
    return theta if rank == x.shape[1] else None


def fit_clark(n, e, loss, *, ci_level: float = 0.95, saturation: tuple[float, float] | None = None,
              n_bootstrap: int = 0, seed: int = 0, notes: tuple[str, ...] = ()) -> ClarkFit:
    """Fits eq. 1 to runs with parameters n, expert counts e and losses loss (each [points]) by
    least squares on log10 L, in float64. saturation: (E_start, E_max) for Ê, or None (Ê = E).
    Raises FitInputError, one line, for inputs that cannot determine the four coefficients."""
    if not 0.0 < ci_level < 1.0:
        raise FitInputError(f"--ci-level must lie in (0, 1), not {ci_level}")
    if n_bootstrap < 0:
        raise FitInputError(f"--bootstrap must be >= 0, not {n_bootstrap}")
    n, e, loss = (np.asarray(v, np.float64).ravel() for v in (n, e, loss))
    if not len(n) == len(e) == len(loss):
        raise FitInputError(f"Clark fit: N, E and loss differ in length "
                            f"({len(n)}, {len(e)}, {len(loss)})")
    _check_inputs(n, e, loss)
    x = design_matrix(n, saturate(e, *(saturation or (None, None))))
    y = np.log10(loss)
    theta = _solve(x, y)
    if theta is None:
        raise FitInputError("Clark fit: log N, log E and their product are collinear in these "
                            "runs (e.g. each N at a single E): vary E at two or more N")
    dof = len(y) - len(PARAMS)
    residual = y - x @ theta
    s2 = float(residual @ residual) / dof
    covariance = s2 * np.linalg.inv(x.T @ x)
    t = stats.t.ppf(0.5 + ci_level / 2, dof)
    half = t * np.sqrt(np.diag(covariance))
    params = {p: float(v) for p, v in zip(PARAMS, theta)}
    ci = {p: (float(v - h), float(v + h)) for p, v, h in zip(PARAMS, theta, half)}
    boot_ci, usable = _bootstrap(x, y, n_bootstrap, ci_level, seed)
    if n_bootstrap - usable > MAX_FAILED_SHARE * n_bootstrap:  # conditional on success
        boot_ci = {}
        notes = tuple(notes) + (f"bootstrap intervals not computed: {n_bootstrap - usable} of "
                                f"{n_bootstrap} draws had too few values of E or N (more than "
                                f"{100 * MAX_FAILED_SHARE:g}%)",)
    return ClarkFit(lack_of_fit=lack_of_fit(n, e, residual), params=params,
                    covariance=covariance, ci=ci, ci_level=ci_level, dof=dof,
                    residual_std=math.sqrt(s2), n_points=len(y),
                    experts=tuple(float(v) for v in np.unique(e)),
                    sizes=tuple(float(v) for v in np.unique(n)),
                    saturation=tuple(saturation) if saturation else None,
                    bootstrap_ci=boot_ci, n_bootstrap=usable, n_bootstrap_requested=n_bootstrap,
                    notes=tuple(notes))


def lack_of_fit(n: np.ndarray, e: np.ndarray, residual: np.ndarray) -> dict | None:
    """The lack-of-fit F test of a least-squares fit with replicates (runs at the same (N, E),
    e.g. seeds): the residual sum of squares splits into pure error (replicates about their
    point's mean, ``n - points`` degrees of freedom) and lack of fit (the points' means about
    the law, ``points - 4``). F = (SS_lof / df_lof) / (SS_pe / df_pe); a small p says the law
    misses the points by more than the replicates scatter. None without replicates."""
    _, point = np.unique(np.stack([n, e], axis=1), axis=0, return_inverse=True)
    point = point.ravel()
    points = int(point.max()) + 1
    df_pe, df_lof = len(residual) - points, points - len(PARAMS)
    if df_pe == 0 or df_lof == 0:
        return None
    means = np.bincount(point, weights=residual) / np.bincount(point)
    ss_pe = float(np.sum((residual - means[point]) ** 2))
    ss_lof = float(residual @ residual) - ss_pe
    if ss_pe == 0:
        return None
    f = (ss_lof / df_lof) / (ss_pe / df_pe)
    return {"F": f, "df_lack_of_fit": df_lof, "df_pure_error": df_pe,
            "p": float(stats.f.sf(f, df_lof, df_pe)),
            "pure_error_std": math.sqrt(ss_pe / df_pe)}


def _bootstrap(x: np.ndarray, y: np.ndarray, n_bootstrap: int, level: float,
               seed: int) -> tuple[dict[str, tuple[float, float]], int]:
    """Percentile intervals over refits on runs drawn with replacement (Efron 1979); draws
    whose design has rank < 4 (too few distinct E or N drawn) are skipped."""
    if n_bootstrap == 0:
        return {}, 0
    rng = np.random.default_rng(seed)
    thetas = []
    for _ in range(n_bootstrap):
        rows = rng.integers(0, len(y), size=len(y))
        theta = _solve(x[rows], y[rows])
        if theta is not None:
            thetas.append(theta)
    if not thetas:
        return {}, 0
    samples = np.array(thetas)
    return {p: percentile_interval(samples[:, i], level) for i, p in enumerate(PARAMS)}, len(thetas)


# --- the results table -------------------------------------------------------------------------

EXPERTS_COLUMN = "model.moe_experts"
# N: the dense model the experts are added to, without the embeddings (Kaplan's convention,
# which gives cleaner laws at small sizes); --columns=params:active_params counts them.
PARAMS_COLUMNS = ("active_non_embedding_params", "non_embedding_params", "params")


def table_points(df: pd.DataFrame, *, source: str, columns: dict[str, str] | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
    """(N, E, loss) of a results table's completed runs, and notes on what was read.
    columns: --columns renames (params, loss, experts)."""
    mapping = dict(columns or {})
    notes: list[str] = []
    if df.empty:
        raise FitInputError(f"{source}: the table has no rows")
    if "status" in df.columns:
        done = df["status"].astype(str) == "completed"
        if not done.any():
            raise FitInputError(f"{source}: none of the {len(df)} runs has status 'completed'")
        if not done.all():
            notes.append(f"dropped {int((~done).sum())} of {len(df)} runs whose status is not "
                         f"'completed'")
        df = df[done]

    def pick(name: str, candidates: tuple[str, ...], what: str) -> str:
        return pick_column(df, name, candidates, mapping, source, what)

    used = {"params": pick("params", PARAMS_COLUMNS, "N"),
            "experts": pick("experts", (EXPERTS_COLUMN, "experts"), "the number of experts E"),
            "loss": pick("loss", ("loss", "final_val_loss"), "the final loss L")}
    values = {}
    for name, column in used.items():
        values[name] = pd.to_numeric(df[column], errors="coerce").to_numpy(np.float64)
        bad = ~(np.isfinite(values[name]) & (values[name] > 0))
        if bad.any():
            raise FitInputError(f"{source}: column {column!r} ({name}) has {int(bad.sum())} "
                                f"non-numeric, non-positive or missing value(s), e.g. "
                                f"{df[column][bad].tolist()[:3]}")
    notes.append(f"N = {used['params']}, E = {used['experts']}, L = {used['loss']}")
    if "tokens" in df.columns:
        tokens = pd.to_numeric(df["tokens"], errors="coerce").dropna().unique()
        if len(tokens) > 1:
            notes.append(f"the runs trained on {len(tokens)} different token counts "
                         f"({min(tokens):.3g}-{max(tokens):.3g}); Clark et al. train every model "
                         f"on the same tokens, so here D varies with N or E too")
    return values["params"], values["experts"], values["loss"], tuple(notes)


# --- the report --------------------------------------------------------------------------------

def _cell(value: float) -> str:
    return f"{value:>12.4g}"


def _bootstrap_line(fit: ClarkFit) -> str:
    if not fit.n_bootstrap_requested:
        return ""
    skipped = fit.n_bootstrap_requested - fit.n_bootstrap
    return (f"; bootstrap over runs: {fit.n_bootstrap} of {fit.n_bootstrap_requested} draws "
            f"fitted" + (f" ({skipped} drew too few values of E or N)" if skipped else ""))


def format_clark(fit: ClarkFit, source: str) -> str:
    """The table printed by ``attnlab fit --law=clark``: the coefficients with their intervals
    next to Clark et al.'s, and the routing slope b + c log10 N at the smallest and largest N."""
    level = f"{100 * fit.ci_level:g}%"
    saturation = (f"Ê saturated with E_start = {fit.saturation[0]:g}, E_max = "
                  f"{fit.saturation[1]:g}" if fit.saturation else "Ê = E (no saturation)")
    lines = [LAW_NAME, f"source: {source} ({fit.n_points} runs; E in "
                       f"{', '.join(f'{v:g}' for v in fit.experts)}; N "
                       f"{min(fit.sizes):.3g}-{max(fit.sizes):.3g})",
             f"least squares on log10 L, {saturation}; residual std {fit.residual_std:.3g} "
             f"(log10 L), {fit.dof} degrees of freedom",
             f"intervals: {level} Student t from the least-squares covariance"
             + _bootstrap_line(fit), ""]
    header = f"  {'':<4}{'estimate':>12}{'low':>12}{'high':>12}"
    if fit.bootstrap_ci:
        header += f"{'boot low':>12}{'boot high':>12}"
    header += "".join(f"{name:>10}" for name in CLARK_2022)
    lines.append(header + "   (Clark et al. Table 3)")
    for p in PARAMS:
        row = f"  {p:<4}" + "".join(_cell(v) for v in (fit.params[p], *fit.ci[p]))
        if fit.bootstrap_ci:
            row += "".join(_cell(v) for v in fit.bootstrap_ci.get(p, (math.nan, math.nan)))
        row += "".join(f"{published[p]:>10g}" for published in CLARK_2022.values())
        lines.append(row)
    slope_of = ("b + c log10 N" if fit.saturation is None else
                "(b + c log10 N) d log10 Ê / d log10 E, per N and E")
    lines += ["", f"routing slope d log10 L / d log10 E = {slope_of} ({level}; negative: more "
                  f"experts, lower loss):"]
    for slope in fit.expert_slopes():
        low, high = slope["ci"]
        verdict = ("more experts lower the loss" if high < 0 else
                   "more experts raise the loss" if low > 0 else "undetermined: contains 0")
        at = f"N = {slope['N']:<10.3g}" + (f"E = {slope['E']:<6g}" if "E" in slope else "")
        lines.append(f"  {at}{slope['slope']:>10.4f}  [{low:.4f}, {high:.4f}]  {verdict}")
    for p, meaning in (("b", "the routing slope extrapolated to N = 1"),
                       ("c", "how the routing slope changes with N")):
        low, high = fit.ci[p]
        if low <= 0 <= high:
            lines.append(f"note: {p}'s interval contains 0: these runs do not determine its sign "
                         f"({meaning})")
    if fit.lack_of_fit:
        lof = fit.lack_of_fit
        lines.append(f"lack of fit (replicates at the same N, E): F = {lof['F']:.3g} on "
                     f"({lof['df_lack_of_fit']}, {lof['df_pure_error']}) degrees of freedom, "
                     f"p = {lof['p']:.3g}; replicate std {lof['pure_error_std']:.3g} (log10 L)"
                     + ("; the law misses the points by more than the replicates scatter "
                        "(its intervals assume it holds)" if lof["p"] < 0.05 else ""))
    lines += [f"note: {note}" for note in fit.notes]
    return "\n".join(lines) + "\n"


class Clark(Law):
    """Clark et al. 2022's law of routed models: log L over (N, E), not (N, D); fitted to a
    results table's runs by least squares with t intervals (its own fit, ``ClarkFit``)."""

    name = "clark"
    title = LAW_NAME
    n_parameters = 4
    capabilities = frozenset()  # its own fit and report, of the results table
    flags = (Flag("saturation", "string", None, "--law=clark: E_START,E_MAX of Clark et al.'s "
                  "saturating transform of E (e.g. 1.847,314.478, their S-BASE fit; default: "
                  "none)."),)
    refused = ("curves", "by", "budget", "train-longer", "multiplier-against", "fix", "holdout",
               "floor", "cluster")
    scope = "one fit of log L(N, E) over a sweep's runs"

    def options(self, given) -> dict:
        text = given.get("saturation")
        if not text:
            return {"saturation": None}
        try:
            e_start, e_max = (float(v) for v in text.split(","))
        except ValueError:
            raise FitInputError(f"--saturation: {text!r} is not E_START,E_MAX (e.g. "
                                f"1.847,314.478)") from None
        return {"saturation": (e_start, e_max)}

    def fit(self, frame, *, source: str, columns=None, **options) -> ClarkFit:
        """The fit to a results table's completed runs (``fit_clark``'s options)."""
        n, e, loss, notes = table_points(frame, source=source, columns=columns)
        return fit_clark(n, e, loss, notes=notes, **options)

    def report(self, fit: ClarkFit, source: str) -> str:
        return format_clark(fit, source)
