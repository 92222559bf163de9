"""The hierarchical bootstrap of stats.compare_processes: two setups' ratio of means of
per-process means, resampling processes, then each process's steps, from one seeded generator;
drawn once per shape of step counts as weights, so that a report's many comparisons are matrix
products (stats.py says what is compared and why); and the quantiles both use."""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np


def _quantile(values: np.ndarray, p: np.ndarray) -> np.ndarray:
    """The `p` quantiles of `values` along its last axis (one row per sample), linearly
    interpolated (Hyndman and Fan's type 7), with scipy.stats.quantile's arithmetic, which
    differs from numpy's in the last bit."""
    n = values.shape[-1]
    j, jp1, g = _ranks(n, tuple(p))
    # A sort, though only the ranks read need their place: numpy 2.4's sort of 4,000 doubles
    # (vectorized) takes a third of a partition at those four ranks (16 vs 47 us a row on
    # the 2-core EPYC of benchmarks/README.md i4), and gives the same values there.
    y = np.sort(values, axis=-1)
    return (1 - g) * y[..., j] + g * y[..., jp1]


@functools.lru_cache(maxsize=32)
def _ranks(n: int, p: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ranks below and above each `p` quantile of `n` values, and the weight of the upper
    one (`_quantile`): the same for every interval of a report, so made once."""
    p = np.asarray(p)
    jg = p * n + (1 - p)
    jp1 = jg // 1
    j = jp1 - 1
    g = np.where(j < 0, 0.0, jg % 1)
    return np.clip(j, 0, n - 1).astype(np.intp), np.clip(jp1, 0, n - 1).astype(np.intp), g


def _hierarchical_ratios(a: list[np.ndarray], b: list[np.ndarray], n_boot: int, seed: int,
                        ends: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """`n_boot` resampled ratios of a's mean of per-process means to b's (`_resampled_means`
    of a, then of b, from one generator seeded with `seed`), and their `ends` quantiles.

    A resampled mean is a weighted sum of the steps, and the weights depend only on the
    processes' step counts and the seed, not on the times: they are drawn once per such shape
    (`_weights`) and every comparison of that shape is two matrix-vector products, from the
    same draws as `_resampled_means`. The sums run in another order, so a ratio may differ from
    `_resampled_means`' in the last bit of a double: the ratios within `_TIE` of 1 (step times
    rounded to 0.01 ms give exact ties) are taken again from the same draws as
    `_resampled_means` adds them (`_means`), so that the tail counts and whether the interval
    holds 1 are always the same. Where a quantile `ends` of the interval lies within `_TIE` of
    1, or a shape's weights would take too much memory, the ratios are resampled directly."""
    shapes = tuple(tuple(p.size for p in side) for side in (a, b))
    drawn = _weights(*shapes, n_boot, seed)
    if drawn is not None:
        (weights_a, picks_a), (weights_b, picks_b) = drawn
        steps_a, steps_b = _padded(a).ravel(), _padded(b).ravel()
        boot = (weights_a @ steps_a) / (weights_b @ steps_b)
        tied = np.flatnonzero(np.abs(boot - 1.0) <= _TIE)
        if tied.size:
            boot[tied] = (_means(steps_a, picks_a[tied], np.array(shapes[0]))
                          / _means(steps_b, picks_b[tied], np.array(shapes[1])))
        quantiles = _quantile(boot, np.asarray(ends))
        if not np.any(np.abs(quantiles - 1.0) <= _TIE):
            return boot, quantiles
    rng = np.random.default_rng(seed)
    boot = _resampled_means(a, n_boot, rng) / _resampled_means(b, n_boot, rng)
    return boot, np.quantile(boot, ends)


# Ratios this close to 1 are taken from the draws as `_resampled_means` adds them
# (`_hierarchical_ratios`): a weighted sum in another order differs by a few units of the last
# bit (about 1e-15 here), never by this much.
_TIE = 1e-9


def _padded(processes: list[np.ndarray]) -> np.ndarray:
    """One row per process, padded with zeros to the longest."""
    steps = np.zeros((len(processes), max(p.size for p in processes)))
    for i, p in enumerate(processes):
        steps[i, :p.size] = p
    return steps


# Weights of at most this many entries (8 bytes each; their draws' indices in as few bytes as
# they need) are kept for reuse (`_weights`); a larger shape (many long processes) is
# resampled directly.
_MAX_WEIGHTS = 4_000_000


@functools.lru_cache(maxsize=16)
def _weights(a_sizes: tuple[int, ...], b_sizes: tuple[int, ...], n_boot: int,
             seed: int) -> tuple[tuple[np.ndarray, np.ndarray], ...] | None:
    """Per side (a's, then b's), the (n_boot, processes x longest) weight matrix whose product
    with the side's padded steps gives `_resampled_means`' resamples for processes of these
    step counts, and the (n_boot, processes, longest) draws it counts (`_means` reads them),
    drawn as `_hierarchical_ratios` draws them; None when they would be too large."""
    if any(n_boot * len(s) * max(s) > _MAX_WEIGHTS for s in (a_sizes, b_sizes)):
        return None
    rng = np.random.default_rng(seed)
    out = []
    for sizes in (a_sizes, b_sizes):
        k, width = len(sizes), max(sizes)
        matrix = np.zeros((n_boot, k * width))
        picks = np.empty((n_boot, k, width), dtype=np.min_scalar_type(k * width - 1))
        counts = np.array(sizes)
        for start, drawn in _draw(counts, n_boot, rng):
            n = len(drawn)
            if (counts == width).all():
                each = np.full(drawn.shape, 1.0 / (k * width))
            else:
                size = counts[drawn[..., :1] // width]       # (n, k, 1): steps of each pick
                each = np.where(np.arange(width) < size, 1.0 / (k * size), 0.0)
            _count(matrix[start:start + n], drawn, each)
            picks[start:start + n] = drawn
        matrix.flags.writeable = picks.flags.writeable = False
        out.append((matrix, picks))
    return out[0], out[1]


# Resamples drawn at once are capped at this many step draws, so that many long processes do
# not allocate one huge array.
_DRAWS_PER_CHUNK = 2_000_000


def _resampled_means(processes: list[np.ndarray], n_boot: int,
                     rng: np.random.Generator) -> np.ndarray:
    """`n_boot` hierarchical resamples of the mean of per-process means: processes drawn with
    replacement, then as many steps as each chosen process timed, drawn from its own steps."""
    sizes = np.array([p.size for p in processes])
    steps = _padded(processes).ravel()
    out = np.empty(n_boot)
    for start, picks in _draw(sizes, n_boot, rng):
        out[start:start + len(picks)] = _means(steps, picks, sizes)
    return out


def _draw(sizes: np.ndarray, n_boot: int, rng: np.random.Generator):
    """The draws of `_resampled_means` from `rng`, in chunks: (first resample, picks), picks an
    (n, processes, longest) array of indices into the padded steps, raveled (`_padded`): for
    each resample the processes chosen with replacement and, in each chosen process's row,
    as many steps as it timed, drawn from its own steps (the rest of a shorter process's row
    is not read: `_means` masks it)."""
    k, width = len(sizes), int(sizes.max())
    chunk = max(1, _DRAWS_PER_CHUNK // (k * width))
    for start in range(0, n_boot, chunk):
        n = min(chunk, n_boot - start)
        chosen = rng.integers(k, size=(n, k))
        if (sizes == width).all():
            picks = rng.integers(width, size=(n, k, width))
        else:
            picks = (rng.random((n, k, width)) * sizes[chosen][..., None]).astype(np.intp)
        picks += (chosen * width)[..., None]
        yield start, picks


def _means(steps: np.ndarray, picks: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The resampled means of per-process means at `picks` (`_draw`'s) of the padded `steps`,
    one per resample, each added up on its own (so a few resamples give the same bits as all)."""
    width = int(sizes.max())
    if (sizes == width).all():
        # Every process timed as many steps: whole rows of draws, no padding to mask.
        return steps[picks].mean(axis=-1).mean(axis=-1)
    size = sizes[picks[..., :1] // width]                # (n, k, 1): steps of each pick
    drawn = np.where(np.arange(width) < size, steps[picks], 0.0)   # only its own count
    return (drawn.sum(axis=-1) / size[..., 0]).mean(axis=-1)


def _count(rows: np.ndarray, picks: np.ndarray, each: np.ndarray) -> None:
    """Add `each` weight per pick to its resample's row of `rows` (n, columns)."""
    n, columns = rows.shape
    at = (np.arange(n)[:, None, None] * columns + picks).ravel()
    rows += np.bincount(at, weights=each.ravel(), minlength=n * columns).reshape(n, columns)
