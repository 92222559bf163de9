"""Statistics helpers: intervals cover what they should, tests tell signal from noise."""

import numpy as np
import pytest

from stepbench import hierarchical, noise, stats

# Real per-step times of one eager+sdpa and one compile+sdpa process on an H200
# (/work/shared/anchors/h200-variance-2026-11-30.jsonl, first 20 steps of each).
EAGER_H200 = [94.36, 96.79, 95.92, 102.65, 98.64, 97.42, 101.19, 90.25, 88.77, 92.98,
              88.82, 88.82, 88.81, 93.07, 95.58, 94.03, 93.41, 92.53, 92.49, 93.62]
COMPILED_H200 = [70.12, 67.14, 67.46, 67.61, 67.63, 67.85, 67.81, 69.31, 69.14, 71.64,
                 70.91, 70.73, 69.82, 71.08, 69.62, 68.95, 68.33, 67.88, 67.99, 67.99]


def test_median_ci_contains_true_median_of_known_distribution():
    rng = np.random.default_rng(123)
    sample = rng.normal(loc=100.0, scale=2.0, size=200)   # true median 100
    lo, hi = stats.median_ci(sample)
    assert lo < 100.0 < hi
    assert hi - lo < 1.5          # a 200-value sample pins the median down to about +-0.4


def test_median_ci_is_reproducible_and_none_for_one_value():
    sample = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert stats.median_ci(sample) == stats.median_ci(sample)
    assert stats.median_ci([5.0]) is None
    assert stats.mean_ci([]) is None


def test_mean_ci_brackets_sample_mean():
    lo, hi = stats.mean_ci(EAGER_H200)
    assert lo < np.mean(EAGER_H200) < hi


def test_compare_real_compile_speedup_is_significant():
    result = stats.compare(COMPILED_H200, EAGER_H200)
    assert result.significant is True
    assert result.p_value < 1e-6
    assert result.ratio == pytest.approx(np.median(COMPILED_H200) / np.median(EAGER_H200))
    assert result.ci[1] < 1.0


def test_compare_two_draws_of_the_same_process_is_not_significant():
    # Two halves of the same eager process: any difference is noise.
    result = stats.compare(EAGER_H200[:10], EAGER_H200[10:])
    assert result.significant is False
    assert result.p_value >= 0.05 or result.ci[0] <= 1.0 <= result.ci[1]


def test_compare_small_shift_inside_spread_is_not_significant():
    rng = np.random.default_rng(7)
    a = rng.normal(100.0, 8.0, size=20)
    b = rng.normal(101.0, 8.0, size=20)      # 1% shift under 8% spread
    assert stats.compare(a, b).significant is False


def test_compare_with_single_values_cannot_test():
    result = stats.compare([215.0], [196.0])
    assert result.significant is None
    assert result.p_value is None and result.ci is None
    assert result.ratio == pytest.approx(215 / 196)


def test_compare_too_few_processes_to_test_is_unknown_not_noise():
    # 2 against 4 per-process means, completely separated: the exact test cannot go below
    # p = 2/15, so the comparison must say "cannot tell", not "no difference".
    result = stats.compare([69.3, 69.6], [95.6, 96.0, 92.3, 96.7])
    assert stats.min_p_value(2, 4) == pytest.approx(2 / 15)
    assert result.significant is None
    assert result.ratio < 0.75
    assert stats.compare([1.0, 1.1, 1.2, 1.3], [2.0, 2.1, 2.2, 2.3]).significant is True


def test_min_p_value():
    assert stats.min_p_value(3, 3) == pytest.approx(0.1)
    assert stats.min_p_value(4, 4) == pytest.approx(2 / 70)
    assert stats.min_p_value(1, 1) == 1.0


def test_compare_rejects_empty_sample():
    with pytest.raises(ValueError):
        stats.compare([], [1.0])


def test_bootstrap_ratio_ci_contains_true_ratio():
    rng = np.random.default_rng(1)
    a = rng.normal(50.0, 1.0, size=100)
    b = rng.normal(100.0, 2.0, size=100)
    lo, hi = stats.bootstrap_ratio_ci(a, b)
    assert lo < 0.5 < hi
    assert stats.bootstrap_ratio_ci([1.0], b) is None


def test_noise_flags_for_flags_noisy_sample_only():
    noisy = [100.0, 100.0, 120.0, 90.0, 100.0, 130.0, 95.0, 100.0]   # CV about 13%
    quiet = [100.0, 100.5, 99.5, 100.2, 99.8, 100.1]                 # CV about 0.4%
    assert noise.noise_flags_for(noisy) == ["high_cv"]
    assert noise.noise_flags_for(quiet) == []
    assert noise.noise_flags_for(quiet, cv_threshold=0.001) == ["high_cv"]
    assert noise.noise_flags_for([100.0]) == []


def test_noise_flags_for_real_h200_eager_process():
    # The eager process's bursts (88.8 to 102.7 ms) give a CV of 4.2%; compiled about 2%.
    assert noise.coefficient_of_variation(EAGER_H200) == pytest.approx(0.0425, abs=0.0005)
    assert noise.noise_flags_for(EAGER_H200) == []
    assert noise.noise_flags_for(EAGER_H200, cv_threshold=0.03) == ["high_cv"]
    assert noise.noise_flags_for(COMPILED_H200) == []


# ---------------------------------------------------------------- processes that disagree

def process(median: float, cv: float, n: int = 20):
    """A record-like process: `n` steps around `median` with about this coefficient of
    variation (alternating above and below it, so the median stays put)."""
    from types import SimpleNamespace

    steps = [median * (1 + cv * (1 if i % 2 else -1)) for i in range(n)]
    return SimpleNamespace(step_times_ms=steps, step_ms=sum(steps) / n)


def test_processes_that_agree_do_not_disagree():
    assert not noise.processes_disagree([process(100.0, 0.01), process(102.0, 0.01)])
    assert not noise.processes_disagree([process(100.0, 0.01)])       # one cannot disagree
    assert not noise.processes_disagree([])


def test_processes_3_percent_apart_but_within_their_noise_agree():
    # 5% apart: beyond the floor, but within twice the noisier process's 3% spread.
    assert not noise.processes_disagree([process(100.0, 0.01), process(105.0, 0.03)])


def test_processes_apart_beyond_their_noise_disagree():
    assert noise.processes_disagree([process(100.0, 0.01), process(105.0, 0.01)])
    # The H200's identical eager+sdpa processes: 90 and 110 ms, each with a CV about 4%.
    assert noise.processes_disagree([process(90.0, 0.04), process(110.0, 0.04)])
    # Any two of three: the third agreeing with one does not hide the other's gap.
    assert noise.processes_disagree([process(100.0, 0.01), process(100.5, 0.01),
                                     process(110.0, 0.01)])


def test_a_process_without_step_times_is_judged_by_its_mean():
    from types import SimpleNamespace

    bare = SimpleNamespace(step_times_ms=[], step_ms=110.0)
    assert noise.processes_disagree([process(100.0, 0.01), bare])
    assert not noise.processes_disagree([process(100.0, 0.01), SimpleNamespace(
        step_times_ms=[], step_ms=102.0)])


# ---------------------------------------------------------------- the hierarchical bootstrap

def steps(mean: float, n: int = 20, seed: int = 0, sd: float = 2.0) -> list[float]:
    return list(np.random.default_rng(seed).normal(mean, sd, n))


def test_two_processes_a_side_clearly_apart_are_significant():
    a = [steps(70.0, seed=1), steps(71.0, seed=2)]
    b = [steps(95.0, seed=3), steps(97.0, seed=4)]
    result = stats.compare_processes(a, b)
    assert result.significant is True and result.method == "processes"
    assert result.p_value < 0.01
    assert result.ratio == pytest.approx(np.mean([np.mean(p) for p in a])
                                         / np.mean([np.mean(p) for p in b]))
    lo, hi = result.ci
    assert lo < result.ratio < hi < 1.0


def test_processes_that_overlap_are_not_significant():
    # Each side has a fast and a slow process; their means are a few percent apart, but the
    # processes of either side span the other's.
    a = [steps(90.0, seed=1), steps(110.0, seed=2)]
    b = [steps(92.0, seed=3), steps(112.0, seed=4)]
    result = stats.compare_processes(a, b)
    assert result.significant is False
    assert result.ci[0] < 1.0 < result.ci[1] and result.p_value > 0.05


def test_the_hierarchical_bootstrap_says_the_same_twice():
    a = [steps(90.0, seed=1), steps(110.0, seed=2), steps(100.0, n=7, seed=5)]
    b = [steps(92.0, seed=3), steps(112.0, seed=4)]
    assert stats.compare_processes(a, b) == stats.compare_processes(a, b)


def test_compare_processes_needs_two_processes_with_steps_a_side():
    with pytest.raises(ValueError, match="2 or more processes"):
        stats.compare_processes([steps(1.0)], [steps(1.0), steps(1.0)])
    with pytest.raises(ValueError, match="2 or more processes"):
        stats.compare_processes([steps(1.0), []], [steps(1.0), steps(1.0)])


def test_compare_step_times_tests_processes_where_both_sides_ran_two():
    a = [steps(70.0, seed=1), steps(71.0, seed=2)]
    b = [steps(95.0, seed=3), steps(97.0, seed=4)]
    means = lambda side: [float(np.mean(p)) for p in side]  # noqa: E731
    assert stats.compare_step_times(means(a), means(b), a, b).method == "processes"
    # One process on a side: today's per-step test, on the steps pooled.
    one = stats.compare_step_times(means(a)[:1], means(b), a[:1], b)
    assert one.method == "steps" and one.significant is True
    # Per token: a's batch is twice b's, so its time per token is about a third of b's.
    per_token = stats.compare_step_times(means(a), means(b), a, b, a_tokens=2, b_tokens=1)
    assert per_token.ratio == pytest.approx(stats.compare_processes(a, b).ratio / 2)
    # Processes without step times (old records): the means, when there are enough of them.
    assert stats.compare_step_times([1.0, 1.1, 1.2, 1.3], [2.0, 2.1, 2.2, 2.3],
                                    [[]] * 4, [[]] * 4).method == "means"
    assert stats.compare_step_times([1.0, 1.1], [2.0, 2.1], [[], []], [[], []]) is None


# ---------------------------------------------------------------- the quick paths say the same

@pytest.mark.parametrize("size", [2, 3, 4, 7, 40])
def test_intervals_are_scipys_percentile_bootstrap(size):
    """stats draws and interpolates as scipy.stats.bootstrap (percentile, vectorized, seeded)
    did before it took them over for speed: the same numbers, to the last bit."""
    import inspect

    import scipy.stats

    # scipy 1.15 renamed random_state to rng
    seeded = "rng" if "rng" in inspect.signature(scipy.stats.bootstrap).parameters else \
        "random_state"
    rng = np.random.default_rng(size)
    x, y = rng.normal(100, 5, size), rng.normal(90, 5, size + 3)

    def scipys(samples, statistic):
        result = scipy.stats.bootstrap(samples, statistic, n_resamples=stats.N_BOOT,
                                       vectorized=True, confidence_level=stats.CONFIDENCE,
                                       method="percentile",
                                       **{seeded: np.random.default_rng(stats.SEED)})
        return float(result.confidence_interval.low), float(result.confidence_interval.high)

    assert stats.median_ci(x) == scipys((x,), np.median)
    assert stats.mean_ci(x) == scipys((x,), np.mean)
    assert stats.bootstrap_ratio_ci(x, y) == scipys(
        (x, y), lambda a, b, axis: np.median(a, axis=axis) / np.median(b, axis=axis))


@pytest.mark.parametrize("decimals", [3, 1, 0])
def test_medians_from_draw_counts_are_numpys(decimals):
    """The resamples' medians read from draw counts are np.median of the resampled values, to
    the last bit, for odd and even sizes and with ties (step times rounded)."""
    rng = np.random.default_rng(decimals)
    for size in (2, 5, 20, 21, 64, 255, 256):       # counts in a byte up to 255 values
        x = np.round(rng.normal(90, 5, size), decimals)
        (drawn,), (counts,) = stats._draws((size,), 500, 3), stats._draw_counts((size,), 500, 3)
        assert np.array_equal(stats._resampled_medians(x, counts),
                              np.median(x[..., drawn], axis=-1)), size
    assert stats.median_ci([1.0, float("nan"), 2.0]) is not None    # the partition's path


def test_intervals_of_many_samples_are_each_ones_to_the_bit():
    """bootstrap_cis (a report's rows resampled together: one product and one sort per slice)
    gives each sample's bootstrap_ci to the last bit: mixed sizes, ties (step times rounded),
    more samples of one size than a slice, and samples that take another path (NaN, infinity,
    too few values, a median of more than 3)."""
    rng = np.random.default_rng(11)
    samples = [np.round(rng.normal(90, spread, size), decimals).tolist()
               for size in (2, 3, 4, 20) for spread in (0.01, 3.0) for decimals in (3, 0)
               for _ in range(3)]
    samples += [np.round(rng.normal(50, 2, 20), 2).tolist() for _ in range(stats._SLICE + 9)]
    samples += [[1.0, float("nan"), 3.0], [2.0, float("inf")] * 3, [7.0], [], [5.0, 5.0]]
    for many, one in ((stats.mean_cis, stats.mean_ci), (stats.median_cis, stats.median_ci)):
        # repr: a NaN end equals itself
        assert repr(many(samples)) == repr([one(x) for x in samples]), many.__name__


def test_mann_whitney_is_scipys():
    """stats' Mann-Whitney p-value is scipy's to the last bit: the normal approximation (both
    sides over 8 values, or ties) computed here, the exact test of small samples by scipy."""
    import scipy.stats

    rng = np.random.default_rng(7)
    for n1, n2, decimals in [(20, 20, 3), (20, 20, 0), (9, 30, 1), (3, 40, 0), (3, 4, 3),
                             (8, 8, 3), (2, 2, 0), (25, 12, 2)]:
        x, y = (np.round(rng.normal(m, 3, n), decimals) for m, n in ((90, n1), (91, n2)))
        assert stats.mann_whitney_p(x, y) == float(
            scipy.stats.mannwhitneyu(x, y, alternative="two-sided").pvalue), (n1, n2)
    same = np.full(10, 5.0)
    assert stats.mann_whitney_p(same, same) == 1.0


def _direct(a, b):
    """compare_processes' resamples drawn one comparison at a time, as before they were
    shared (hierarchical._resampled_means)."""
    rng = np.random.default_rng(stats.SEED)
    a, b = [np.asarray(p, float) for p in a], [np.asarray(p, float) for p in b]
    return hierarchical._resampled_means(a, stats.N_BOOT, rng) / hierarchical._resampled_means(b, stats.N_BOOT,
                                                                               rng)


@pytest.mark.parametrize("sizes", [((20, 20), (20, 20)), ((20, 20, 20), (20, 20)),
                                   ((5, 20), (20, 12, 7)), ((40, 40, 40, 40), (3, 3))])
@pytest.mark.parametrize("shift", [1.0, 1.004, 1.03, 1.3])
def test_shared_resampling_weights_give_the_direct_resamples(sizes, shift):
    rng = np.random.default_rng(len(sizes[0]) * 100 + sizes[1][0])
    a = [rng.normal(100, 4, n) for n in sizes[0]]
    b = [rng.normal(100 * shift, 4, n) for n in sizes[1]]
    boot, ends = hierarchical._hierarchical_ratios(
        [np.asarray(p) for p in a], [np.asarray(p) for p in b], stats.N_BOOT, stats.SEED,
        [0.025, 0.975])
    direct = _direct(a, b)
    assert np.allclose(boot, direct, rtol=1e-12, atol=0)
    assert np.count_nonzero(boot <= 1) == np.count_nonzero(direct <= 1)
    assert np.count_nonzero(boot >= 1) == np.count_nonzero(direct >= 1)
    assert np.allclose(ends, np.quantile(direct, [0.025, 0.975]), rtol=1e-12, atol=0)


@pytest.mark.parametrize("a, b", [
    ([[10.0, 10.01, 10.02, 10.0], [10.01, 10.0, 10.02, 10.01]],
     [[10.01, 10.0, 10.0, 10.02], [10.0, 10.02, 10.01, 10.01]]),
    ([[10.0, 10.01, 10.02, 10.0], [10.01, 10.0, 10.02]],           # steps counts differ
     [[10.01, 10.0, 10.0], [10.0, 10.02, 10.01, 10.01], [10.01, 10.0]])])
def test_resamples_at_a_tie_are_the_direct_ones_to_the_bit(a, b):
    """Step times rounded to 0.01 ms give resampled means exactly equal on both sides: a sum
    in another order would put such a ratio a bit off 1 and move the p-value. Those
    resamples are taken from the draws as the direct resampling adds them."""
    boot, ends = hierarchical._hierarchical_ratios([np.asarray(p) for p in a],
                                            [np.asarray(p) for p in b], stats.N_BOOT,
                                            stats.SEED, [0.025, 0.975])
    direct = _direct(a, b)
    tied = np.abs(direct - 1.0) <= hierarchical._TIE
    assert np.count_nonzero(direct == 1.0) > 0
    assert np.array_equal(boot[tied], direct[tied])
    assert np.count_nonzero(boot == 1.0) == np.count_nonzero(direct == 1.0)
    assert np.count_nonzero(boot <= 1) == np.count_nonzero(direct <= 1)
    assert np.count_nonzero(boot >= 1) == np.count_nonzero(direct >= 1)
    assert np.allclose(ends, np.quantile(direct, [0.025, 0.975]), rtol=1e-12, atol=0)


def test_median_of_two_or_three_is_numpys():
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 5):
        x = rng.normal(0, 1, (1000, n))
        assert np.array_equal(stats._median(x), np.median(x, axis=-1))


def test_processes_disagree_as_the_exact_coefficients_of_variation_say(monkeypatch):
    """noise weighs two processes' gap against their coefficients of variation in floating
    point and asks the exact ones (statistics.stdev, slow) only within a rounding error of the
    line: the same verdicts, on both sides of it and on it."""
    import statistics
    from types import SimpleNamespace

    exact, asked = noise.coefficient_of_variation, []
    monkeypatch.setattr(noise, "coefficient_of_variation",
                        lambda values: asked.append(1) or exact(values))

    def exact_rule(x, y):
        fast, slow = sorted((x, y), key=statistics.median)
        gap = statistics.median(slow) / statistics.median(fast) - 1
        return gap > noise.SPREAD_FLOOR and gap > noise.SPREAD_CVS * max(exact(x), exact(y))

    def disagree(x, y):
        return noise.processes_disagree([SimpleNamespace(step_times_ms=x, step_ms=None),
                                         SimpleNamespace(step_times_ms=y, step_ms=None)])

    rng = np.random.default_rng(7)
    verdicts = []
    for _ in range(300):
        x = list(np.round(rng.normal(50, rng.uniform(0.1, 3), 20), 3))
        y = list(np.round(rng.normal(50 * rng.uniform(0.9, 1.1), rng.uniform(0.1, 3), 20), 3))
        verdicts.append(disagree(x, y))
        assert verdicts[-1] == exact_rule(x, y)
    assert any(verdicts) and not all(verdicts)
    assert not asked                       # none of these came near the line
    # On the line: y is x made slower by exactly twice its (and so y's) variation.
    x = [100.0 * (1 + 0.02 * (1 if i % 2 else -1)) for i in range(20)]
    y = [t * (1 + noise.SPREAD_CVS * exact(x)) for t in x]
    assert disagree(x, y) == exact_rule(x, y)
    assert asked
