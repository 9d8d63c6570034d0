"""The statistics every report uses: over seeds, paired over seeds, multiple comparisons, and curve fits.

A seed fixes a run's initialisation and data order, so two modes trained with the same seed form a pair.
:func:`paired` and :func:`combine` build a :class:`Paired` difference from per-seed values
(``{seed: value}``); its p-value is a two-sided one-sample t-test and its interval a Student t interval.
scipy is imported inside the functions that need it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

ALPHA = 0.05  # significance level of every test, and 1 - the confidence level of every interval


# --------------------------------------------------------------------------------------------- over seeds

@dataclass
class Stat:
    """Mean and sample standard deviation of one value over seeds."""

    mean: float
    std: float  # nan for one seed
    n: int


def stat(values: Iterable[float]) -> Stat | None:
    """The :class:`Stat` of the values, or None when there are none."""
    v = np.asarray(list(values), dtype=float)
    if v.size == 0:
        return None
    return Stat(float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else math.nan, int(v.size))


def t_half_width(std: float, n: int) -> float:
    """Half the width of the (1 - ALPHA) Student t interval of the mean of n values of sample std ``std``; nan
    for n < 2."""
    if n < 2:
        return math.nan
    from scipy.stats import t

    return float(t.ppf(1 - ALPHA / 2, n - 1)) * std / math.sqrt(n)


# ---------------------------------------------------------------------------------------- paired over seeds

@dataclass
class Paired:
    """A difference paired over seeds: mean and std of the per-seed differences, a (1 - ALPHA) Student t
    interval and a two-sided t-test p-value.

    ``tested`` holds what the t-test is run on: the per-seed differences themselves, or (for a relative
    difference of two groups, see :func:`combine`) the raw differences a - b, which makes it
    scipy.stats.ttest_rel(a, b).
    """

    mean: float
    std: float                        # nan when n < 2
    n: int                            # paired seeds; 0 when computed from the groups' means (no seed shared)
    per_seed: np.ndarray | None       # None when n = 0
    tested: np.ndarray | None = None  # defaults to per_seed

    @cached_property
    def p(self) -> float | None:
        """Two-sided t-test p-value; None with fewer than 2 paired seeds; 0 or 1 when there is no spread."""
        values = self.per_seed if self.tested is None else self.tested
        if self.n < 2 or values is None:
            return None
        if self.tested is None and self.std == 0.0:  # no spread: the difference is exact
            return 1.0 if self.mean == 0 else 0.0
        from scipy.stats import ttest_1samp

        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            p = float(ttest_1samp(values, 0.0).pvalue)
        if not math.isfinite(p):  # no spread in the tested values
            p = 1.0 if self.mean == 0 else 0.0
        return p

    @cached_property
    def half_width(self) -> float:
        """Half the width of the (1 - ALPHA) t interval of the mean; nan with fewer than 2 paired seeds."""
        return t_half_width(self.std, self.n)

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def significant(self, alpha: float = ALPHA) -> bool:
        return self.p is not None and self.p < alpha

    def tost_p(self, margin: float) -> float | None:
        """Two one-sided t-tests of equivalence within +-margin (Schuirmann): the larger of the p-values of
        H0: mean <= -margin and H0: mean >= +margin; None with fewer than 2 paired seeds. Below alpha: the
        (1 - 2 alpha) t interval lies inside (-margin, +margin). Tested on the per-seed differences."""
        if self.n < 2 or self.per_seed is None:
            return None
        if not margin > 0:
            raise ValueError(f"the equivalence margin must be > 0, got {margin!r}")
        if self.std == 0.0:
            return 0.0 if abs(self.mean) < margin else 1.0
        from scipy.stats import t

        se = self.std / math.sqrt(self.n)
        lower = float(t.sf((self.mean + margin) / se, self.n - 1))   # H0: mean <= -margin
        upper = float(t.cdf((self.mean - margin) / se, self.n - 1))  # H0: mean >= +margin
        return max(lower, upper)

    def equivalent(self, margin: float, alpha: float = ALPHA) -> bool:
        """Whether TOST at ``alpha`` finds the difference within +-margin."""
        p = self.tost_p(margin)
        return p is not None and p < alpha


def equivalence_verdict(c: Paired | None, margin: float, holm_survives: bool | None = None,
                        ahead: tuple[str, str] = ("the first", "the second")) -> str:
    """A paired difference judged by its test and by TOST within +-margin: "equivalent within ±margin" (noting who
    is ahead, and the test, when it is also significant), else "better" (significant and positive) or "worse",
    else "inconclusive"; "too few pairs" under 2. ``holm_survives``: whether it survives the Holm correction of its
    family, where it has one (else the uncorrected t-test at ALPHA); ``ahead``: who leads when the mean is
    positive, and when it is negative."""
    if c is None or c.n < 2:
        return "too few pairs"
    significant = c.significant() if holm_survives is None else holm_survives
    if c.equivalent(margin):
        test = "p < 0.05" if holm_survives is None else "significant after Holm"
        return f"equivalent within ±{margin:g}" + (f" ({ahead[c.mean <= 0]} ahead, {test})" if significant else "")
    if significant:
        return "better" if c.mean > 0 else "worse"
    return "inconclusive"


def paired(a: dict[int, float], b: dict[int, float], fn: Callable[[float, float], float]) -> Paired | None:
    """fn(a_s, b_s) over the seeds s present in both (None when they share no seed)."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    d = np.array([fn(a[s], b[s]) for s in seeds], dtype=float)
    return Paired(float(d.mean()), float(d.std(ddof=1)) if d.size > 1 else math.nan, int(d.size), d)


def combine(values: list[dict[int, float]], fn: Callable[..., float]) -> Paired | None:
    """``fn`` of several groups' values, per seed present in all of them; from their means (n = 0, untested)
    when they share no seed; None when one has no values. With two groups the t-test is on the raw paired
    values (scipy.stats.ttest_rel)."""
    if any(not v for v in values):
        return None
    common = sorted(set.intersection(*(set(v) for v in values)))
    if not common:
        return Paired(float(fn(*(np.mean(list(v.values())) for v in values))), math.nan, 0, None)
    cols = [np.array([v[s] for s in common]) for v in values]
    d = np.array([fn(*row) for row in zip(*cols)], dtype=float)
    tested = cols[0] - cols[1] if len(cols) == 2 else None
    return Paired(float(d.mean()), float(d.std(ddof=1)) if d.size > 1 else math.nan, int(d.size), d, tested)


def holm(p_values: list[float | None], alpha: float = ALPHA) -> list[bool]:
    """Which p-values stay below ``alpha`` after the Holm-Bonferroni correction (None counts as not rejected)."""
    indexed = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    rejected = [False] * len(p_values)
    m = len(indexed)
    for rank, (p, i) in enumerate(indexed):
        if p >= alpha / (m - rank):
            break
        rejected[i] = True
    return rejected


# ----------------------------------------------------------------------------------- differences per seed

def relative(reference: float, other: float) -> float:
    """(reference - other) / reference x 100: positive when ``other`` is lower (better for PPL and loss)."""
    return (reference - other) / reference * 100.0


def points(reference: float, other: float) -> float:
    """(other - reference) x 100: accuracy points, positive when ``other`` is better."""
    return (other - reference) * 100.0


def millinats(reference: float, other: float) -> float:
    """(reference - other) x 1000: a loss difference in millinats, positive when ``other`` is lower. (A
    relative difference would explode where the losses are near 0, as on saturated brackets.)"""
    return (reference - other) * 1000.0


def relative_improvement(softmax: dict[int, float], mode: dict[int, float]) -> Paired | None:
    """(PPL_softmax - PPL_mode) / PPL_softmax * 100 paired over seeds: positive when the mode is better."""
    return combine([softmax, mode], relative)


def point_difference(reference: dict[int, float], other: dict[int, float]) -> Paired | None:
    """(accuracy_other - accuracy_reference) in percentage points (accuracies in [0, 1]), paired over seeds."""
    return combine([reference, other], points)


# ------------------------------------------------------------------------------------------------ curve fits

@dataclass
class Line:
    """Least-squares line y = intercept + slope * x; stderr and p (slope = 0, two-sided) are None when the
    fit has no degrees of freedom left (fewer than 3 points, or fewer than 2 distinct x)."""

    slope: float
    intercept: float
    stderr: float | None
    p: float | None
    dof: int


def fit_line(x: Iterable[float], y: Iterable[float]) -> Line | None:
    """The least-squares line through the points; None with fewer than 2 distinct x."""
    from scipy.stats import linregress

    x, y = np.asarray(list(x), dtype=float), np.asarray(list(y), dtype=float)
    if np.unique(x).size < 2:
        return None
    fit = linregress(x, y)
    dof = int(x.size) - 2
    if dof < 1:
        return Line(float(fit.slope), float(fit.intercept), None, None, dof)
    return Line(float(fit.slope), float(fit.intercept), float(fit.stderr), float(fit.pvalue), dof)


@dataclass
class Fit:
    """PPL(T) = a * exp(-b * T) + c; params/errors None when not fitted (see message)."""

    params: tuple | None   # (a, b, c)
    errors: tuple | None   # sqrt(diag(pcov)) of (a, b, c); inf when undetermined
    rms: float | None      # root mean square residual
    n_T: int
    message: str = ""


def fit_exponential(T: Iterable[float], y: Iterable[float]) -> Fit:
    """Least-squares fit of y = a * exp(-b * T) + c over all points (several seeds per T allowed).

    Fitted as A * exp(-b * (T - T0)) + c with T0 the smallest T (better conditioned), then a = A * exp(b * T0)
    with its error propagated. Needs at least 4 distinct T; never raises on a failed fit.
    """
    from scipy.optimize import curve_fit

    T = np.asarray(list(T), dtype=float)
    y = np.asarray(list(y), dtype=float)
    distinct = np.unique(T)
    if distinct.size < 4:
        values = f"{distinct.size} T value{'s' if distinct.size != 1 else ''}"
        return Fit(None, None, None, int(distinct.size), f"not fitted: {values}, at least 4 needed")
    T0, span = distinct[0], distinct[-1] - distinct[0]
    first, last = y[T == distinct[0]].mean(), y[T == distinct[-1]].mean()
    drop = first - last
    c0 = max(last - 0.1 * drop, 0.0)
    A0 = first - c0
    b0 = math.log(11.0) / span if drop != 0 else 1.0 / span
    bounds = ([-np.inf, 1e-6, 0.0], [np.inf, 10.0, np.inf])
    p0 = [A0, float(np.clip(b0, 1e-5, 9.0)), c0]

    def model(t, A, b, c):
        return A * np.exp(-b * (t - T0)) + c

    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            (A, b, c), pcov = curve_fit(model, T, y, p0=p0, bounds=bounds, maxfev=20000)
    except (RuntimeError, ValueError) as e:
        return Fit(None, None, None, int(distinct.size), f"fit failed: {e}")
    e0 = math.exp(b * T0)
    jac = np.array([[e0, A * T0 * e0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    with np.errstate(all="ignore"):
        cov = jac @ pcov @ jac.T if np.all(np.isfinite(pcov)) else np.full((3, 3), np.inf)
    errors = tuple(float(math.sqrt(v)) if math.isfinite(v) and v >= 0 else math.inf for v in np.diag(cov))
    rms = float(np.sqrt(np.mean((model(T, A, b, c) - y) ** 2)))
    message = "" if all(math.isfinite(e) for e in errors) else "uncertainty undetermined"
    return Fit((float(A * e0), float(b), float(c)), errors, rms, int(distinct.size), message)


# -------------------------------------------------------------------------------- structure of couplings J

def distance_profile(J: np.ndarray) -> np.ndarray:
    """Mean J_jk over the pairs with |j - k| = d, for d = 1 .. T-1."""
    T = J.shape[0]
    d = np.abs(np.arange(T)[:, None] - np.arange(T)[None, :])
    return np.array([J[d == k].mean() for k in range(1, T)])


def distance_r2(J: np.ndarray) -> float:
    """Share of the variance of the off-diagonal J explained by the distance |j - k| alone (nan without
    variance)."""
    T = J.shape[0]
    d = np.abs(np.arange(T)[:, None] - np.arange(T)[None, :])
    off = d > 0
    total = float(((J[off] - J[off].mean()) ** 2).sum())
    if total <= 1e-30:
        return math.nan
    fitted = distance_profile(J)[d[off] - 1]
    return 1.0 - float(((J[off] - fitted) ** 2).sum()) / total


def seed_correlation(Js: list[np.ndarray]) -> float:
    """Mean Pearson correlation of the off-diagonal J between every pair of seeds (nan for < 2 seeds or
    without variance)."""
    if len(Js) < 2:
        return math.nan
    off = ~np.eye(Js[0].shape[0], dtype=bool)
    flat = [J[off] for J in Js]
    corrs = [np.corrcoef(a, b)[0, 1] for i, a in enumerate(flat) for b in flat[i + 1:]
             if a.std() > 0 and b.std() > 0]
    return float(np.mean(corrs)) if corrs else math.nan
