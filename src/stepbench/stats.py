"""Statistics for step times: confidence intervals and the comparison of two setups.

Step times are not normally distributed (a floor with bursts of slow steps; see
docs/report.md), and a process's mean moves by several percent between identical processes, so
everything here is distribution-free: bootstrap intervals and the Mann-Whitney U test. Where
both setups ran several processes, the process is the unit of the test (`compare_processes`, a
hierarchical bootstrap), so that the spread between processes counts. Every random draw comes
from a seeded generator, so a report built twice from the same files says the same thing. Below
report/ and search/, so that a search decides with the same test the report then prints
(`compare_step_times`).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import scipy.stats

CONFIDENCE = 0.95
ALPHA = 0.05
N_BOOT = 4000
SEED = 0


@dataclass(frozen=True)
class Comparison:
    """How sample `a` compares with sample `b` (e.g. compiled step times against eager ones).

    ratio: median(a) / median(b); below 1 means `a` is smaller (a faster step).
    ci: bootstrap confidence interval of that ratio, or None with fewer than 2 values per side.
    p_value: two-sided Mann-Whitney U p-value, or None with fewer than 2 values per side.
    significant: True when p < alpha and the ratio's interval excludes 1; False when the data
        cannot tell the two apart; None when there is too little data to test at all (fewer
        than 2 values a side, or so few that even a complete separation gives p >= alpha).
    method: what was tested: "processes" (compare_processes: the ratio is of the means of
        per-process means, the p-value and interval a hierarchical bootstrap's), "means"
        (`compare` on per-process means) or "steps" (`compare` on the pooled step times).
    """

    ratio: float
    ci: tuple[float, float] | None
    p_value: float | None
    significant: bool | None
    method: str = "steps"


# scipy 1.15 renamed bootstrap's random_state to rng; older releases know only random_state.
_RNG = "rng" if "rng" in inspect.signature(scipy.stats.bootstrap).parameters else "random_state"


def _bootstrap(samples: tuple, statistic: Callable, confidence: float, n_boot: int,
               seed: int) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic` over `samples` (each resampled on its own)."""
    result = scipy.stats.bootstrap(samples, statistic, n_resamples=n_boot, vectorized=True,
                                   confidence_level=confidence, method="percentile",
                                   **{_RNG: np.random.default_rng(seed)})
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def bootstrap_ci(values: Sequence[float], stat: Callable = np.median, *,
                 confidence: float = CONFIDENCE, n_boot: int = N_BOOT,
                 seed: int = SEED) -> tuple[float, float] | None:
    """Percentile bootstrap interval of `stat(values)`; None for fewer than 2 values.

    `stat` must accept an `axis` keyword (np.median, np.mean).
    """
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return None
    return _bootstrap((x,), stat, confidence, n_boot, seed)


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
    return _bootstrap((x, y), _ratio_of_medians, confidence, n_boot, seed)


def _ratio_of_medians(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(x, axis=axis) / np.median(y, axis=axis)


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
    p_value = float(scipy.stats.mannwhitneyu(x, y, alternative="two-sided").pvalue)
    ci = bootstrap_ratio_ci(x, y, confidence=1 - alpha, n_boot=n_boot, seed=seed)
    if min_p_value(x.size, y.size) >= alpha:
        return Comparison(ratio, ci, p_value, None)
    significant = p_value < alpha and not (ci[0] <= 1.0 <= ci[1])
    return Comparison(ratio, ci, p_value, significant)


def min_p_value(n_a: int, n_b: int) -> float:
    """Smallest two-sided Mann-Whitney U p-value that samples of these sizes can give (no ties):
    2 / C(n_a + n_b, n_a). 3 processes against 3 can never reach 0.05 (0.10); 4 against 4 can."""
    return min(1.0, 2 / math.comb(n_a + n_b, n_a))


def compare_processes(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], *,
                      alpha: float = ALPHA, n_boot: int = N_BOOT,
                      seed: int = SEED) -> Comparison:
    """Compare two setups by their processes, each given as its timed steps: a hierarchical
    bootstrap (processes resampled with replacement, then the steps within each chosen process)
    of the ratio of the sides' means of per-process means.

    The process is the unit, since identical processes differ by more than the steps within one
    do; resampling the steps too keeps a process's own noise in the interval. Significant when
    the two-sided bootstrap p-value is below `alpha` and the (1 - alpha) percentile interval
    excludes 1; unlike a rank test on per-process means, 2 processes a side can reach that.
    Raises ValueError with fewer than 2 processes a side or a process without steps."""
    sides = [[np.asarray(p, dtype=float) for p in side] for side in (a, b)]
    if any(len(side) < 2 or any(p.size == 0 for p in side) for side in sides):
        raise ValueError("compare_processes() needs 2 or more processes a side, each with steps")
    rng = np.random.default_rng(seed)
    ratio = float(_mean_of_means(sides[0]) / _mean_of_means(sides[1]))
    boot = _resampled_means(sides[0], n_boot, rng) / _resampled_means(sides[1], n_boot, rng)
    low, high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    # Two-sided: twice the share of resamples on the far side of 1, counting the observed
    # data as one (so that p is never 0 from a finite number of resamples).
    tail = int(min(np.count_nonzero(boot <= 1.0), np.count_nonzero(boot >= 1.0)))
    p_value = min(1.0, 2 * (tail + 1) / (n_boot + 1))
    low, high = float(low), float(high)
    significant = p_value < alpha and not (low <= 1.0 <= high)
    return Comparison(ratio, (low, high), p_value, significant, "processes")


def _mean_of_means(processes: list[np.ndarray]) -> float:
    return float(np.mean([p.mean() for p in processes]))


# Resamples drawn at once are capped at this many step draws, so that many long processes do
# not allocate one huge array.
_DRAWS_PER_CHUNK = 2_000_000


def _resampled_means(processes: list[np.ndarray], n_boot: int,
                     rng: np.random.Generator) -> np.ndarray:
    """`n_boot` hierarchical resamples of the mean of per-process means: processes drawn with
    replacement, then as many steps as each chosen process timed, drawn from its own steps."""
    k = len(processes)
    sizes = np.array([p.size for p in processes])
    width = int(sizes.max())
    steps = np.zeros((k, width))            # one row per process, padded to the longest
    for i, p in enumerate(processes):
        steps[i, :p.size] = p
    flat = steps.ravel()
    out = np.empty(n_boot)
    chunk = max(1, _DRAWS_PER_CHUNK // (k * width))
    for start in range(0, n_boot, chunk):
        n = min(chunk, n_boot - start)
        chosen = rng.integers(k, size=(n, k))
        if (sizes == width).all():
            # Every process timed as many steps: whole rows of draws, no padding to mask.
            picks = rng.integers(width, size=(n, k, width))
            picks += (chosen * width)[..., None]
            out[start:start + n] = flat[picks].mean(axis=-1).mean(axis=-1)
            continue
        size = sizes[chosen][..., None]                      # (n, k, 1): steps of each pick
        picks = (rng.random((n, k, width)) * size).astype(np.intp)
        picks += (chosen * width)[..., None]
        drawn = np.where(np.arange(width) < size, flat[picks], 0.0)   # only its own count
        out[start:start + n] = (drawn.sum(axis=-1) / size[..., 0]).mean(axis=-1)
    return out


def compare_step_times(a_means: Sequence[float], b_means: Sequence[float],
                       a_steps: Sequence[Sequence[float]], b_steps: Sequence[Sequence[float]], *,
                       a_tokens: int = 1, b_tokens: int = 1) -> Comparison | None:
    """Setup a's step times against b's; None when nothing can be tested.

    `*_means`: each process's mean step time; `*_steps`: each process's timed steps (empty for
    a process that kept none). Where both setups ran 2 or more processes with steps, the
    processes are compared (`compare_processes`), since identical processes differ by more than
    the steps within one do. Otherwise per-process means are tested where there are enough of
    them for the test to reach p < alpha (4 against 4, say), else the pooled step times, which
    miss the spread between processes. With `*_tokens` (tokens per step) the times are per
    token: setups of different batches compare by what a token costs.
    """
    timed = [[s for s in steps if len(s)] for steps in (a_steps, b_steps)]
    if len(timed[0]) >= 2 and len(timed[1]) >= 2:
        return compare_processes([np.asarray(s, dtype=float) / a_tokens for s in timed[0]],
                                 [np.asarray(s, dtype=float) / b_tokens for s in timed[1]])
    pooled = [[t for s in side for t in s] for side in timed]
    for method, xa, xb in (("means", a_means, b_means), ("steps", *pooled)):
        if len(xa) >= 2 and len(xb) >= 2:
            result = compare([t / a_tokens for t in xa], [t / b_tokens for t in xb])
            if result.significant is not None:
                return dataclasses.replace(result, method=method)
    return None


def compare_records(a: Sequence, b: Sequence, per_token: bool = False) -> Comparison | None:
    """`compare_step_times` of two setups' records (stepbench.record.Record; those that ran),
    per token with `per_token`."""
    a_ok, b_ok = [r for r in a if r.ok], [r for r in b if r.ok]
    if not a_ok or not b_ok:
        return None
    tokens = ((a_ok[0].setup.tokens_per_step, b_ok[0].setup.tokens_per_step) if per_token
              else (1, 1))
    return compare_step_times([r.step_ms for r in a_ok], [r.step_ms for r in b_ok],
                              [r.step_times_ms for r in a_ok], [r.step_times_ms for r in b_ok],
                              a_tokens=tokens[0], b_tokens=tokens[1])
