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

import functools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from stepbench.hierarchical import _TIE, _hierarchical_ratios, _quantile, _ranks

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


def _bootstrap(samples: tuple, statistic: Callable, confidence: float, n_boot: int,
               seed: int) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic` over `samples` (each resampled on its own,
    in order, from one generator seeded with `seed`).

    The draws and the interval are scipy.stats.bootstrap's (method="percentile", vectorized; a
    test holds the two equal), without its per-call validation, which cost more than the
    resampling for the report's thousands of small samples; the draws depend only on the
    samples' sizes, so they are made once per sizes (`_draws`). A median (or a ratio of
    medians) of the resamples is read from how often each value was drawn (`_resampled_medians`)
    rather than by partitioning every resample, and a mean from a product with those counts
    (`_mean_quantiles`); both give the same bits as the resampled values would."""
    ends = _ends(confidence)
    sizes = tuple(x.size for x in samples)
    if len(samples) == 1 and _together(samples[0], statistic, n_boot):
        (low, high), = _quantiles_together(samples[0][None], statistic, n_boot, seed, ends)
        return float(low), float(high)
    quick = (n_boot * max(sizes) <= _MAX_COUNTS
             and all(np.isfinite(x).all() for x in samples))
    if quick and statistic in _MEDIANS and min(sizes) > 3:    # _median is quicker below
        values = [_medians(x.tobytes(), sizes[:i + 1], n_boot, seed)
                  for i, x in enumerate(samples)]
        boot = values[0] if len(values) == 1 else values[0] / values[1]
    else:
        boot = statistic(*[x[..., i] for x, i in zip(samples, _draws(sizes, n_boot, seed))],
                         axis=-1)
    low, high = _quantile(boot, ends)
    return float(low), float(high)


def _ends(confidence: float) -> np.ndarray:
    alpha = (1 - confidence) / 2
    return np.array([alpha, 1 - alpha])


def _together(x: np.ndarray, statistic: Callable, n_boot: int) -> np.ndarray:
    """Per row of `x` (samples of one size), whether its interval takes `_quantiles_together`'s
    path, which `bootstrap_cis` takes for many samples of one size at once: a mean (its draws
    counted, no value NaN or infinite) or a median of 2 or 3 values (`_median`)."""
    size = x.shape[-1]
    if (statistic is np.mean and n_boot * size <= _MAX_COUNTS
            or statistic is _median and size <= 3):
        return np.isfinite(x).all(axis=-1)
    return np.zeros(x.shape[:-1], dtype=bool)


def _quantiles_together(samples: np.ndarray, statistic: Callable, n_boot: int, seed: int,
                        ends: np.ndarray) -> np.ndarray:
    """The `ends` quantiles of the resampled `statistic` of each row of `samples` (rows of one
    size, `_together`'s), one row of quantiles per sample: the numbers `_bootstrap` gives each
    row alone, from the same draws."""
    if statistic is np.mean:
        return _mean_quantiles(samples, n_boot, seed, ends)
    drawn, = _draws((samples.shape[1],), n_boot, seed)
    return _quantile(statistic(samples[:, drawn], axis=-1), ends)


@functools.lru_cache(maxsize=512)
def _medians(data: bytes, sizes: tuple[int, ...], n_boot: int, seed: int) -> np.ndarray:
    """The resamples' medians of the last of the samples of these sizes, whose values are
    `data` (float64): kept, since a row's steps are resampled the same way in every
    comparison it is the first side of (the draws of a sample depend only on the sizes of the
    samples up to it) and in its own interval."""
    x = np.frombuffer(data)
    out = _resampled_medians(x, _draw_counts(sizes, n_boot, seed)[-1])
    out.flags.writeable = False
    return out


def _mean_quantiles(x: np.ndarray, n_boot: int, seed: int, ends: np.ndarray) -> np.ndarray:
    """`_quantile` of the resamples' means of each row of `x` (`_draws((size,), n_boot, seed)`),
    to the bit: every mean is taken from the draw counts (a matrix product, which adds in
    another order and may differ in the last bits), and those that could be the order
    statistics the quantiles read (within `_TIE` of them, relative to the row's largest value)
    are taken again as np.mean adds the resampled values, one resample at a time: which
    resamples those are depends on the product only through errors far below `_TIE`, so all
    rows' products at once give the same numbers as one row's."""
    rows, size = x.shape
    drawn, = _draws((size,), n_boot, seed)
    # einsum rather than a matrix product: OpenBLAS would spread this one over threads that
    # then spin, costing more CPU time than the product itself.
    approx = np.einsum("ij,jk->ik", x, _draw_weights(size, n_boot, seed)) / size
    j, jp1, g = _ranks(n_boot, tuple(ends))
    ranked = np.sort(approx, axis=-1)
    slack = 2 * _TIE * np.abs(x).max(axis=-1, keepdims=True)
    low, high = np.empty((rows, len(j))), np.empty((rows, len(j)))
    every = np.arange(rows)
    for i, (a, b) in enumerate(zip(j.tolist(), jp1.tolist())):
        # Per row, the resamples that may be the a-th to b-th smallest, and how many surely
        # come before them.
        start, end = ranked[:, a:a + 1] - slack, ranked[:, b:b + 1] + slack
        below = _below(ranked, approx, a, start)
        # by row, in order (a 2-D nonzero costs 20 times this)
        row, near = np.divmod(np.flatnonzero((approx >= start) & (approx <= end)), n_boot)
        exact = np.mean(x[row[:, None], drawn[near]], axis=-1)
        exact = exact[np.lexsort((exact, row))]          # each row's, sorted, rows in order
        first = np.searchsorted(row, every) - below
        low[:, i], high[:, i] = exact[first + a], exact[first + b]
    return (1 - g) * low + g * high


def _below(ranked: np.ndarray, approx: np.ndarray, a: int, start: np.ndarray) -> np.ndarray:
    """Per row, how many of `approx` (`ranked`: each row sorted) are below its `start`, which
    is at most its a-th smallest: counted among the 16 values before the a-th where the first
    of them is below (then all before it are too), else over the whole row."""
    first = max(0, a - 16)
    below = first + np.count_nonzero(ranked[:, first:a] < start, axis=-1)
    if first:
        whole = np.flatnonzero(ranked[:, first] >= start[:, 0])
        below[whole] = np.count_nonzero(approx[whole] < start[whole], axis=-1)
    return below


# Resamples of at most this many draws in all (n_boot x the sample's size) are counted
# (`_draw_counts`, kept per size, 2 bytes a count); a longer sample is resampled and partitioned.
_MAX_COUNTS = 4_000_000


def _resampled_medians(x: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The median of each resample of `x`, given how often each of x's values was drawn in it
    (`counts`, one column per resample): the middle value(s) of the resample are the values of
    x, in sorted order, where the running count first reaches the middle; the same numbers as
    np.median of the resampled values (the mean of the middle two for an even size), from a
    pass over the counts instead of a partition of every resample (5 ms a sample of 20)."""
    order = np.argsort(x, kind="stable")
    ranked, n = x[order], x.size
    # The running count over the sorted values, one row per value: a loop of row additions,
    # quicker than np.cumsum of the whole array, whichever its axis and dtype.
    running = counts[order]
    for i in range(1, n):
        np.add(running[i - 1], running[i], out=running[i])

    def kth(k: int) -> np.ndarray:       # the k-th smallest (1-based) of each resample
        # Counted in int16 (a count never exceeds the size): a sum of booleans into intp
        # costs four times as much; take(), since indexing with int16 costs twice as much.
        return ranked.take(np.add.reduce((running < k).view(np.uint8), axis=0, dtype=np.int16))

    if n % 2:
        return kth(n // 2 + 1)
    return (kth(n // 2) + kth(n // 2 + 1)) / 2      # np.median's mean of the middle two


@functools.lru_cache(maxsize=8)
def _draw_weights(size: int, n_boot: int, seed: int) -> np.ndarray:
    """`_draw_counts` of one sample, as floats (a product with them gives the resamples'
    sums)."""
    out = _draw_counts((size,), n_boot, seed)[0].astype(float)
    out.flags.writeable = False
    return out


@functools.lru_cache(maxsize=32)
def _draw_counts(sizes: tuple[int, ...], n_boot: int, seed: int) -> tuple[np.ndarray, ...]:
    """How often each index was drawn in each resample of `_draws(sizes, n_boot, seed)`: one
    (size, n_boot) array per sample, a column per resample (read-only: they are shared)."""
    out = []
    for size, drawn in zip(sizes, _draws(sizes, n_boot, seed)):
        at = (drawn * n_boot + np.arange(n_boot)[:, None]).ravel()
        counted = np.bincount(at, minlength=n_boot * size).reshape(size, n_boot)
        # A running count up to the size fits (in a byte: half the memory to add and compare).
        counted = counted.astype(np.uint8 if size < 256 else np.int16)
        counted.flags.writeable = False
        out.append(counted)
    return tuple(out)


@functools.lru_cache(maxsize=32)
def _draws(sizes: tuple[int, ...], n_boot: int, seed: int) -> tuple[np.ndarray, ...]:
    """The resampling indices of a bootstrap of samples of these sizes: one (n_boot, size)
    array per sample, drawn in order from one generator (read-only: they are shared)."""
    rng = np.random.default_rng(seed)
    out = []
    for size in sizes:
        drawn = rng.integers(0, size, (n_boot, size))
        drawn.flags.writeable = False
        out.append(drawn)
    return tuple(out)


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


def bootstrap_cis(samples: Sequence[Sequence[float]], stat: Callable = np.median, *,
                  confidence: float = CONFIDENCE, n_boot: int = N_BOOT,
                  seed: int = SEED) -> list[tuple[float, float] | None]:
    """`bootstrap_ci` of each of `samples`, the same numbers: the samples of one size whose
    intervals take one path (`_together`: a mean, a median of 2 or 3 values) are resampled
    together, in slices of `_SLICE` (one product and one sort for a slice of a report's rows
    rather than one per row)."""
    out: list[tuple[float, float] | None] = [None] * len(samples)
    sizes: dict[int, list[int]] = {}
    for i, values in enumerate(samples):
        sizes.setdefault(len(values), []).append(i)
    for size, found in sizes.items():
        if size < 2:
            continue
        values = np.array([samples[i] for i in found], dtype=float)
        together = _together(values, stat, n_boot)
        for k in np.flatnonzero(~together).tolist():
            out[found[k]] = _bootstrap((values[k],), stat, confidence, n_boot, seed)
        ready = np.flatnonzero(together)
        for first in range(0, ready.size, _SLICE):
            part = ready[first:first + _SLICE]
            ends = _quantiles_together(values[part], stat, n_boot, seed, _ends(confidence))
            for k, (low, high) in zip(part.tolist(), ends.tolist()):
                out[found[k]] = (low, high)
    return out


# Samples resampled at once by `bootstrap_cis`: 256 x 4,000 resampled means are 8 MB.
_SLICE = 256


def median_cis(samples: Sequence[Sequence[float]]) -> list[tuple[float, float] | None]:
    """`median_ci` of each of `samples` (`bootstrap_cis`)."""
    return bootstrap_cis(samples, _median)


def mean_cis(samples: Sequence[Sequence[float]]) -> list[tuple[float, float] | None]:
    """`mean_ci` of each of `samples` (`bootstrap_cis`)."""
    return bootstrap_cis(samples, np.mean)


def median_ci(values: Sequence[float], *, confidence: float = CONFIDENCE, n_boot: int = N_BOOT,
              seed: int = SEED) -> tuple[float, float] | None:
    """Bootstrap confidence interval of the median of `values`; None for fewer than 2 values."""
    return bootstrap_ci(values, _median, confidence=confidence, n_boot=n_boot, seed=seed)


def _median(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """np.median along the last axis, the same numbers, quicker for the 2 or 3 processes of a
    row: np.median partitions each of 4,000 short resamples on its own (0.5 ms a row)."""
    if axis not in (-1, x.ndim - 1) or x.shape[-1] > 3:
        return np.median(x, axis=axis)
    if x.shape[-1] == 2:
        return (x[..., 0] + x[..., 1]) / 2          # np.median's mean of the middle two
    if x.shape[-1] == 3:
        a, b, c = x[..., 0], x[..., 1], x[..., 2]
        return np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c))
    return x[..., 0].astype(float)


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


# The statistics `_bootstrap` reads from draw counts: a median of one sample, a ratio of two.
_MEDIANS = (np.median, _median, _ratio_of_medians)


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
    ratio = float(np.float64(_plain_median(x)) / _plain_median(y))
    if x.size < 2 or y.size < 2:
        return Comparison(ratio, None, None, None)
    p_value = mann_whitney_p(x, y)
    ci = bootstrap_ratio_ci(x, y, confidence=1 - alpha, n_boot=n_boot, seed=seed)
    if min_p_value(x.size, y.size) >= alpha:
        return Comparison(ratio, ci, p_value, None)
    significant = p_value < alpha and not (ci[0] <= 1.0 <= ci[1])
    return Comparison(ratio, ci, p_value, significant)


def mann_whitney_p(x: np.ndarray, y: np.ndarray) -> float:
    """The two-sided Mann-Whitney U p-value of scipy.stats.mannwhitneyu (method "auto", with
    its continuity and tie corrections). Where scipy takes the normal approximation (both
    samples over 8 values, or ties) it is computed here with scipy's arithmetic, the same bits
    without the 2-3 ms scipy spends on each call's validation (a test holds the two equal);
    the exact test of small samples without ties is scipy's own."""
    n1, n2 = x.size, y.size
    n = n1 + n2
    ranked = np.sort(np.concatenate((x, y)))
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(ranked[1:], ranked[:-1], out=new[1:])
    starts = np.flatnonzero(new)                         # where each group of equals begins
    tied = starts.size < n
    if (not tied and (n1 <= 8 or n2 <= 8)) or np.isnan(ranked[-1]):
        # Imported here: it takes most of a second, and most reports never need it.
        import scipy.stats

        return float(scipy.stats.mannwhitneyu(x, y, alternative="two-sided").pvalue)
    from scipy.special import ndtr

    # x's ranks (1-based; the average of its group's where values are equal) add up to r1:
    # multiples of 0.5, exact in any order.
    at = np.searchsorted(ranked, x, side="left")
    if tied:
        ties = np.diff(starts, append=n)                 # values in each group of equals
        average = starts + (ties + 1) / 2
        r1 = float(np.sum(average[np.searchsorted(starts, at)]))
        tie_term = float(np.sum(ties.astype(float) ** 3 - ties))
    else:
        r1, tie_term = float(np.sum(at)) + n1, 0.0
    u1 = r1 - n1 * (n1 + 1) / 2
    u = max(u1, n1 * n2 - u1)
    spread = math.sqrt(n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1))))
    numerator = u - n1 * n2 / 2
    numerator -= 0.5                                     # scipy's continuity correction
    if spread:
        z = np.float64(numerator / spread)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):   # all values equal: no spread
            z = np.float64(numerator) / np.float64(spread)
    # np.clip's bounds without its cost for one number (a NaN stays NaN)
    return min(max(float(ndtr(-z) * 2), 0.0), 1.0)


def _plain_median(x: np.ndarray) -> float:
    """np.median of a 1-D sample without NaN, with its arithmetic (the mean of the middle two
    for an even size), without its per-call cost."""
    ranked, half = np.sort(x), x.size // 2
    if np.isnan(ranked[-1]):                 # np.median's answer where a value is NaN
        return math.nan
    return float(ranked[half]) if x.size % 2 else float((ranked[half - 1] + ranked[half]) / 2)


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
    ratio = float(_mean_of_means(sides[0]) / _mean_of_means(sides[1]))
    boot, (low, high) = _hierarchical_ratios(sides[0], sides[1], n_boot, seed,
                                             [alpha / 2, 1 - alpha / 2])
    # Two-sided: twice the share of resamples on the far side of 1, counting the observed
    # data as one (so that p is never 0 from a finite number of resamples).
    tail = int(min(np.count_nonzero(boot <= 1.0), np.count_nonzero(boot >= 1.0)))
    p_value = min(1.0, 2 * (tail + 1) / (n_boot + 1))
    low, high = float(low), float(high)
    significant = p_value < alpha and not (low <= 1.0 <= high)
    return Comparison(ratio, (low, high), p_value, significant, "processes")


def _mean_of_means(processes: list[np.ndarray]) -> float:
    # np.mean's arithmetic (a sum, then a division) without its per-call overhead: this is
    # made for every comparison of a report.
    return float(np.add.reduce([np.add.reduce(p) / p.size for p in processes]) / len(processes))


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
            if result.significant is not None:       # (dataclasses.replace costs 5 us)
                return Comparison(result.ratio, result.ci, result.p_value, result.significant,
                                  method)
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
