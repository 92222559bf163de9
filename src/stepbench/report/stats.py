"""Statistics for step times: confidence intervals, comparisons and noise flags.

Step times are not normally distributed (a floor with bursts of slow steps; see
docs/report.md), and a process's mean moves by several percent between identical processes, so
everything here is distribution-free: bootstrap intervals and the Mann-Whitney U test. Every
random draw comes from a seeded generator, so a report built twice from the same files says the
same thing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

CONFIDENCE = 0.95
ALPHA = 0.05
N_BOOT = 4000
SEED = 0
CV_THRESHOLD = 0.05


@dataclass(frozen=True)
class Comparison:
    """How sample `a` compares with sample `b` (e.g. compiled step times against eager ones).

    ratio: median(a) / median(b); below 1 means `a` is smaller (a faster step).
    ci: bootstrap confidence interval of that ratio, or None with fewer than 2 values per side.
    p_value: two-sided Mann-Whitney U p-value, or None with fewer than 2 values per side.
    significant: True when p < alpha and the ratio's interval excludes 1; False when the data
        cannot tell the two apart; None when there is too little data to test at all (fewer
        than 2 values a side, or so few that even a complete separation gives p >= alpha).
    """

    ratio: float
    ci: tuple[float, float] | None
    p_value: float | None
    significant: bool | None


def bootstrap_ci(values: Sequence[float], stat: Callable = np.median, *,
                 confidence: float = CONFIDENCE, n_boot: int = N_BOOT,
                 seed: int = SEED) -> tuple[float, float] | None:
    """Percentile bootstrap interval of `stat(values)`; None for fewer than 2 values.

    `stat` must accept an `axis` keyword (np.median, np.mean).
    """
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return None
    rng = np.random.default_rng(seed)
    return _percentile_interval(_resampled(x, stat, rng, n_boot), confidence)


def _resampled(x: np.ndarray, stat: Callable, rng: np.random.Generator,
               n_boot: int) -> np.ndarray:
    """`stat` of each of n_boot resamples of x drawn with replacement."""
    return stat(x[rng.integers(0, x.size, size=(n_boot, x.size))], axis=1)


def _percentile_interval(draws: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(draws, [tail, 1 - tail])
    return float(lo), float(hi)


def median_ci(values: Sequence[float], *, confidence: float = CONFIDENCE, n_boot: int = N_BOOT,
              seed: int = SEED) -> tuple[float, float] | None:
    """Bootstrap confidence interval of the median of `values`; None for fewer than 2 values."""
    return bootstrap_ci(values, np.median, confidence=confidence, n_boot=n_boot, seed=seed)


def mean_ci(values: Sequence[float], *, confidence: float = CONFIDENCE, n_boot: int = N_BOOT,
            seed: int = SEED) -> tuple[float, float] | None:
    """Bootstrap confidence interval of the mean of `values`; None for fewer than 2 values."""
    return bootstrap_ci(values, np.mean, confidence=confidence, n_boot=n_boot, seed=seed)


def bootstrap_ratio_ci(a: Sequence[float], b: Sequence[float], *,
                       confidence: float = CONFIDENCE, n_boot: int = N_BOOT,
                       seed: int = SEED) -> tuple[float, float] | None:
    """Bootstrap interval of median(a) / median(b), resampling each side independently.

    None when either side has fewer than 2 values (a single value has no spread to resample).
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size < 2 or y.size < 2:
        return None
    rng = np.random.default_rng(seed)
    num = _resampled(x, np.median, rng, n_boot)
    den = _resampled(y, np.median, rng, n_boot)
    return _percentile_interval(num / den, confidence)


def compare(a: Sequence[float], b: Sequence[float], *, alpha: float = ALPHA,
            n_boot: int = N_BOOT, seed: int = SEED) -> Comparison:
    """Compare two samples of times: ratio of medians, its bootstrap CI and a Mann-Whitney U test.

    A difference counts as significant only when both agree: p < alpha and the (1 - alpha)
    interval of the ratio excludes 1. With samples too small for the test ever to reach alpha
    (2 against 4, 3 against 3: see min_p_value) `significant` is None rather than False, so
    that "not tested" is not reported as "no difference". Raises ValueError on an empty sample.
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size == 0 or y.size == 0:
        raise ValueError("compare() needs at least one value on each side")
    ratio = float(np.median(x) / np.median(y))
    if x.size < 2 or y.size < 2:
        return Comparison(ratio, None, None, None)
    from scipy.stats import mannwhitneyu

    p_value = float(mannwhitneyu(x, y, alternative="two-sided").pvalue)
    ci = bootstrap_ratio_ci(x, y, confidence=1 - alpha, n_boot=n_boot, seed=seed)
    if min_p_value(x.size, y.size) >= alpha:
        return Comparison(ratio, ci, p_value, None)
    significant = p_value < alpha and not (ci[0] <= 1.0 <= ci[1])
    return Comparison(ratio, ci, p_value, significant)


def min_p_value(n_a: int, n_b: int) -> float:
    """Smallest two-sided Mann-Whitney U p-value that samples of these sizes can give (no ties):
    2 / C(n_a + n_b, n_a). 3 processes against 3 can never reach 0.05 (0.10); 4 against 4 can."""
    return min(1.0, 2 / math.comb(n_a + n_b, n_a))


def coefficient_of_variation(values: Sequence[float]) -> float | None:
    """Sample standard deviation over mean; None for fewer than 2 values or a zero mean."""
    x = np.asarray(values, dtype=float)
    if x.size < 2 or x.mean() == 0:
        return None
    return float(x.std(ddof=1) / x.mean())


def noise_flags_for(step_times_ms: Sequence[float],
                    cv_threshold: float = CV_THRESHOLD) -> list[str]:
    """Noise flags that the step times alone justify: ["high_cv"] when CV > cv_threshold.

    The 5% default follows the spread seen between identical eager processes on an H200
    (docs/report.md); fewer than 2 step times give no flag, since there is no spread to judge.
    """
    cv = coefficient_of_variation(step_times_ms)
    return ["high_cv"] if cv is not None and cv > cv_threshold else []
